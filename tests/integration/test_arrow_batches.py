"""Arrow batches cut by count alone (`--arrow_batch_bytes`, plan/arrow_batches.py): the same
output as FnApiRunner whatever the byte limit and however many rows a batch holds, and the
limits are the job's own (properties of the Spark jobs its thread starts), never the
session's."""
from __future__ import annotations

import threading

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.fn_api_runner import FnApiRunner

from sparkbeam import SparkRunner
from sparkbeam.execute.dataset import ARROW_BATCH_BYTES, ARROW_BATCH_ROWS, Datasets
from sparkbeam.plan.arrow_batches import (
    MAX_BATCH_ROWS,
    NO_BYTE_LIMIT,
    SPARK_BATCH_ROWS,
    batch_limits,
    batch_rows,
    largest_row,
)
from sparkbeam.runner import prepare
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
    with ds.arrow_batch_limits(NO_BYTE_LIMIT):
        assert sc.getLocalProperty(ARROW_BATCH_BYTES) == str(NO_BYTE_LIMIT)
        other = threading.Thread(target=lambda: seen.append(sc.getLocalProperty(
            ARROW_BATCH_BYTES)))
        other.start()
        other.join()
        assert spark.conf.get(ARROW_BATCH_BYTES) != str(NO_BYTE_LIMIT)  # not the session's
    assert sc.getLocalProperty(ARROW_BATCH_BYTES) is None
    assert seen == [None]  # a thread that was not started under it
    with ds.arrow_batch_limits(None):  # Spark's own: nothing set
        assert sc.getLocalProperty(ARROW_BATCH_BYTES) is None


def _many_small_pairs(p):  # type: ignore[no-untyped-def]
    # 60,000 small typed pairs of ~30,000 keys: each of the two partitions' rows past Spark's
    # 10,000 a batch, counted per key (`plan/packed_rows.py`) or not.
    return (p | beam.Impulse() | beam.FlatMap(lambda _: range(60_000)).with_output_types(int)
            | beam.Map(lambda x: (x % 30_011, x)).with_output_types(tuple[int, int])
            | beam.GroupByKey()
            | beam.MapTuple(lambda k, vs: (k, len(vs), sum(vs), min(vs), max(vs))))


def test_batches_of_more_rows_than_sparks_default_give_fnapis_output(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # The job `run_and_collect` runs is one whose rows are provably small.
    p = beam.Pipeline(options=PipelineOptions([]))
    _ = (_many_small_pairs(p) | beam.Map(repr) | beam.io.WriteToText(str(tmp_path / "out")))
    # Its GroupByKey's input counted (`plan/packed_rows.py`): rows of up to ~1 KB, so as many
    # as fit 64 MB.
    plan = prepare(p.to_runner_api(), p.options)
    assert plan.packed
    assert batch_limits("auto", plan)[:2] == (NO_BYTE_LIMIT, batch_rows(largest_row(plan)))
    expected = run_and_collect(_many_small_pairs, FnApiRunner())
    assert run_and_collect(_many_small_pairs, SparkRunner(), ["--parallelism=2"]) == expected


def test_the_row_limit_is_this_threads_jobs_and_spark_cuts_batches_at_it(spark) -> None:  # type: ignore[no-untyped-def]
    def sizes(batches):  # type: ignore[no-untyped-def]
        import pyarrow as pa

        yield pa.RecordBatch.from_pydict({"rows": [b.num_rows for b in batches]})

    ds = Datasets(spark)
    sc = spark.sparkContext
    df = spark.range(0, 60_000, 1, 1)

    def cut() -> list[int]:
        return [r.rows for r in df.mapInArrow(sizes, "rows long").collect()]

    assert cut() == [10_000] * 6  # Spark's own: the session sets no row limit
    with ds.arrow_batch_limits(NO_BYTE_LIMIT, 25_000):
        assert sc.getLocalProperty(ARROW_BATCH_ROWS) == "25000"
        assert cut() == [25_000, 25_000, 10_000]
    assert sc.getLocalProperty(ARROW_BATCH_ROWS) is None
    assert cut() == [10_000] * 6


def test_a_job_sets_its_rows_unless_the_session_cuts_at_more_than_fit(spark, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # What the runner hands `Datasets.arrow_batch_limits`: the job's row limit; and Spark's
    # byte limit kept when the session's own row limit (which wins) is more than fits 64 MB.
    seen: list[tuple[int | None, int | None]] = []
    original = Datasets.arrow_batch_limits

    def recorded(self, limit, rows=None):  # type: ignore[no-untyped-def]
        seen.append((limit, rows))
        return original(self, limit, rows)

    monkeypatch.setattr(Datasets, "arrow_batch_limits", recorded)
    expected = run_and_collect(_many_small_pairs, FnApiRunner())
    assert run_and_collect(_many_small_pairs, SparkRunner()) == expected
    assert len(seen) == 1 and seen[0][0] == NO_BYTE_LIMIT
    assert SPARK_BATCH_ROWS < (seen[0][1] or 0) <= MAX_BATCH_ROWS
    spark.conf.set(ARROW_BATCH_ROWS, str(MAX_BATCH_ROWS * 10))
    try:
        assert run_and_collect(_many_small_pairs, SparkRunner()) == expected
    finally:
        spark.conf.unset(ARROW_BATCH_ROWS)
    assert seen[1:] == [(None, None)]
