"""Beam and Spark side by side: Parquet read by Spark, summed per shop by Beam, written by Spark.

    python examples/spark_tables.py [--source DIR] --target DIR

Without --source it writes a small sample of sales as Parquet first. Runs on sparkbeam by
default; any Beam runner can run it (`--runner=FnApiRunner`: a local SparkSession reads and
writes in the worker process).
"""
from __future__ import annotations

import argparse
import tempfile
import typing

import sparkbeam  # noqa: F401 - first: it quiets Beam's harmless import warnings

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from sparkbeam.io import ReadFromSpark, WriteToSpark, spark_session

# Beam needs the output's schema: a NamedTuple type coded by Beam's RowCoder (or
# ReadFromSpark's rows as they are).
ShopTotal = typing.NamedTuple("ShopTotal", [("shop", str), ("units", int)])  # noqa: UP014
beam.coders.registry.register_coder(ShopTotal, beam.coders.RowCoder)


def build(p: beam.Pipeline, source: str, target: str) -> None:
    _ = (p
         | ReadFromSpark(format="parquet", path=source)
         | beam.Map(lambda sale: (sale.shop, sale.units))
         | beam.CombinePerKey(sum)
         | beam.MapTuple(ShopTotal).with_output_types(ShopTotal)
         | WriteToSpark(format="parquet", path=target, mode="overwrite"))


def write_sample(p: beam.Pipeline, path: str) -> None:
    spark = spark_session(p)  # the session the pipeline's runner uses
    spark.sql("SELECT element_at(array('north', 'south', 'east'), CAST(id % 3 AS INT) + 1) "
              "AS shop, id % 7 AS units FROM range(1000)").write.mode("overwrite").parquet(path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--source", help="Parquet data with columns shop and units")
    parser.add_argument("--target", default="out/shop_totals", help="where the totals go")
    args, beam_args = parser.parse_known_args(argv)
    options = PipelineOptions(beam_args or ["--runner=sparkbeam.SparkRunner"])
    with beam.Pipeline(options=options) as p:
        source = args.source
        if source is None:
            source = tempfile.mkdtemp(prefix="sparkbeam-sales-")
            write_sample(p, source)
        build(p, source, args.target)
    print(f"shop totals written as Parquet to {args.target}")


if __name__ == "__main__":
    main()
