"""The same computations written by hand as PySpark RDD code: "the limit".

Each job reads the data set's text inputs and writes ``KEY<TAB>VALUE`` lines
with ``saveAsTextFile(out_dir)``. They use the same per-record Python
functions as the Beam pipelines, so the difference measured is the runner's
overhead, not the user code.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import add

from pyspark import RDD, SparkContext

from bench import records
from bench.workloads import Dataset


def _wordcount(sc: SparkContext, ds: Dataset) -> RDD:
    return (
        sc.textFile(ds.inputs["main"])
        .flatMap(records.split_words)
        .map(records.pair_one)
        .reduceByKey(add)
    )


def _combine(sc: SparkContext, ds: Dataset) -> RDD:
    return sc.textFile(ds.inputs["main"]).map(records.parse_int_pair).reduceByKey(add)


def _gbk_skew(sc: SparkContext, ds: Dataset) -> RDD:
    return (
        sc.textFile(ds.inputs["main"])
        .map(records.parse_int_pair)
        .groupByKey()
        .map(records.summarise_group)
    )


def _side_input(sc: SparkContext, ds: Dataset) -> RDD:
    table = sc.broadcast(sc.textFile(ds.inputs["table"]).map(records.parse_int_pair).collectAsMap())
    return (
        sc.textFile(ds.inputs["main"])
        .map(lambda line: records.join_lookup(line, table.value))
        .reduceByKey(add)
    )


def _sessions(sc: SparkContext, ds: Dataset) -> RDD:
    return (
        sc.textFile(ds.inputs["main"])
        .map(records.parse_event)
        .map(lambda e: (e[0], (e[1], e[2])))
        .groupByKey()
        .flatMap(records.session_lines)
    )


def _stateful(sc: SparkContext, ds: Dataset) -> RDD:
    # Bag state + a timer that fires after the last event == group, then emit.
    return (
        sc.textFile(ds.inputs["main"])
        .map(records.parse_event)
        .map(lambda e: (e[0], e[2]))
        .groupByKey()
        .map(records.summarise_group)
    )


JOBS: dict[str, Callable[[SparkContext, Dataset], RDD]] = {
    "wordcount": _wordcount,
    "combine": _combine,
    "gbk_skew": _gbk_skew,
    "side_input": _side_input,
    "sessions": _sessions,
    "stateful": _stateful,
}

#: Jobs whose RDD already holds formatted lines (others hold (key, value)).
_FORMATTED = {"sessions"}


def run(sc: SparkContext, ds: Dataset, out_dir: str) -> None:
    """Runs workload ``ds.workload`` and saves its lines under ``out_dir``."""
    rdd = JOBS[ds.workload](sc, ds)
    if ds.workload not in _FORMATTED:
        rdd = rdd.map(records.format_kv)
    rdd.saveAsTextFile(out_dir)
