"""Arrow batches cut by count alone (`--arrow_batch_bytes`, plan/arrow_batches.py): the same
output as FnApiRunner whatever the byte limit, and the limit is the job's own (a property of
the Spark jobs its thread starts), never the session's."""
from __future__ import annotations

import threading

import apache_beam as beam
import pytest
from apache_beam.runners.portability.fn_api_runner import FnApiRunner

from sparkbeam import SparkRunner
from sparkbeam.execute.dataset import ARROW_BATCH_BYTES, Datasets
from sparkbeam.plan.arrow_batches import NO_BYTE_LIMIT
from tests.integration.conftest import run_and_collect


def _numbers_and_words(p):  # type: ignore[no-untyped-def]
    # Small typed pairs through one grouping, strings (some long) through another.
    pairs = (p | beam.Impulse() | beam.FlatMap(lambda _: range(3000)).with_output_types(int)
             | beam.Map(lambda x: (x % 17, x)).with_output_types(tuple[int, int])
             | beam.GroupByKey() | beam.MapTuple(lambda k, vs: (k, sum(vs))))
    return (pairs | beam.MapTuple(lambda k, s: (str(k % 3), "w" * (k * 400) + str(s)))
            .with_output_types(tuple[str, str])
            | "Words" >> beam.GroupByKey()
            | beam.MapTuple(lambda k, vs: (k, sorted(len(v) for v in vs))))


@pytest.mark.parametrize("setting", ["auto", "rows", "1"])
def test_any_byte_limit_gives_fnapis_output(setting: str) -> None:
    # "1": every batch one row (Spark always takes the first).
    expected = run_and_collect(_numbers_and_words, FnApiRunner())
    assert run_and_collect(_numbers_and_words, SparkRunner(),
                           [f"--arrow_batch_bytes={setting}"]) == expected


def test_the_limit_is_a_property_of_this_threads_jobs(spark) -> None:  # type: ignore[no-untyped-def]
    ds = Datasets(spark)
    sc = spark.sparkContext
    seen: list[str | None] = []
    with ds.arrow_batch_bytes(NO_BYTE_LIMIT):
        assert sc.getLocalProperty(ARROW_BATCH_BYTES) == str(NO_BYTE_LIMIT)
        other = threading.Thread(target=lambda: seen.append(sc.getLocalProperty(
            ARROW_BATCH_BYTES)))
        other.start()
        other.join()
        assert spark.conf.get(ARROW_BATCH_BYTES) != str(NO_BYTE_LIMIT)  # not the session's
    assert sc.getLocalProperty(ARROW_BATCH_BYTES) is None
    assert seen == [None]  # a thread that was not started under it
    with ds.arrow_batch_bytes(None):  # Spark's own: nothing set
        assert sc.getLocalProperty(ARROW_BATCH_BYTES) is None
