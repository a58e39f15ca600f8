"""Word count and combine written with PySpark DataFrames: the engine's own limit.

Spark's operators end to end, no Python per record: its text source, `split` and `explode`
(word count) or `split` and casts (combine), its hash aggregation with partial aggregation
before the shuffle, and its text writer of ``KEY<TAB>VALUE`` lines. The RDD jobs in
`handwritten.py` run the same per-record Python functions as the Beam pipelines, which is
what a Beam user's code costs; these rows show how far that is from what Spark does alone
(issue 17's reference row). Only these two workloads: the others' user code (sorting a
group's values, sessions, a timer) has no such one-line equivalent.
"""
from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from bench.workloads import Dataset


def _wordcount(spark: SparkSession, ds: Dataset) -> DataFrame:
    # `str.split()` splits at runs of whitespace and drops empty words: the same here.
    words = spark.read.text(ds.inputs["main"]).select(
        F.explode(F.split(F.col("value"), r"\s+")).alias("key"))
    return words.where(F.col("key") != "").groupBy("key").agg(F.count(F.lit(1)).alias("total"))


def _combine(spark: SparkSession, ds: Dataset) -> DataFrame:
    parts = F.split(F.col("value"), ",")
    pairs = spark.read.text(ds.inputs["main"]).select(
        parts.getItem(0).cast("long").alias("key"), parts.getItem(1).cast("long").alias("v"))
    return pairs.groupBy("key").agg(F.sum("v").alias("total"))


JOBS: dict[str, Callable[[SparkSession, Dataset], DataFrame]] = {
    "wordcount": _wordcount,
    "combine": _combine,
}


def run(spark: SparkSession, ds: Dataset, out_dir: str) -> None:
    """Runs workload ``ds.workload`` and writes its lines under ``out_dir``."""
    totals = JOBS[ds.workload](spark, ds)
    totals.select(F.concat_ws("\t", F.col("key").cast("string"),
                              F.col("total").cast("string"))).write.text(out_dir)
