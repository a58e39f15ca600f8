"""ReadFromSpark of a stream and WriteToSpark in streaming jobs: Spark's `readStream` sources
as roots of the query, each committed micro-batch's rows written once (`streaming/
spark_streams.py`, `streaming/spark_writes.py`)."""
from __future__ import annotations

import dataclasses
import datetime
import json
import os
import time
import typing

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.runners.runner import PipelineState
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import window
from apache_beam.utils.timestamp import Timestamp

from sparkbeam import SparkRunner
from sparkbeam.errors import ExecutionError, UnsupportedFeatureError
from sparkbeam.io import ReadFromSpark, WriteToSpark
from sparkbeam.mode import BATCH_EXPERIMENT
from sparkbeam.runner import prepare

SCHEMA = "user string, ts timestamp, n long"
EPOCH = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


# Spelled out: under `from __future__ import annotations` Beam would see the fields as text.
WindowCount = typing.NamedTuple("WindowCount", [  # noqa: UP014
    ("user", str), ("start", int), ("count", int)])
Value = typing.NamedTuple("Value", [("value", int)])  # noqa: UP014


beam.coders.registry.register_coder(WindowCount, beam.coders.RowCoder)
beam.coders.registry.register_coder(Value, beam.coders.RowCoder)


def _per_window(kv, w=beam.DoFn.WindowParam):  # type: ignore[no-untyped-def]
    return WindowCount(kv[0], int(w.start), kv[1])


def _counted(rows):  # type: ignore[no-untyped-def]
    """The windowed count both runners compute."""
    return (rows | beam.WindowInto(window.FixedWindows(10))
            | beam.Map(lambda r: (r.user, 1)) | beam.CombinePerKey(sum)
            | beam.Map(_per_window).with_output_types(WindowCount))


def _events(count: int) -> list[dict]:
    """Ten to a file, each file's ten seconds in a shuffled order, users interleaved: with a
    15 s delay no row is late, and 10 s windows fire as the files arrive."""
    seconds = [10 * (j // 10) + (j * 7) % 10 for j in range(count)]
    return [{"user": f"u{j % 3}", "ts": (EPOCH + datetime.timedelta(seconds=s)).isoformat(),
             "n": j} for j, s in enumerate(seconds)]


def _land(directory: str, name: str, rows: list[dict]) -> None:
    """A file appears whole in the landing directory (written aside, then renamed)."""
    aside = os.path.join(os.path.dirname(directory), f".{name}")
    with open(aside, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    os.rename(aside, os.path.join(directory, name))


def _files_read(ckpt: str) -> int:
    """Files Spark's file source has read so far (its own log in the checkpoint)."""
    count = 0
    for root, _, names in os.walk(os.path.join(ckpt, "sources")):
        for name in names:
            if name.isdigit():
                with open(os.path.join(root, name)) as f:
                    count += sum(1 for line in f if '"path"' in line)
    return count


def _rows_written(spark, out: str) -> int:  # type: ignore[no-untyped-def]
    if not os.path.isdir(out) or not any(n.startswith("part-sb-") for n in os.listdir(out)):
        return 0
    return int(spark.read.parquet(out).count())


def _table_rows(spark, table: str) -> int:  # type: ignore[no-untyped-def]
    if not spark.catalog.tableExists(table):
        return 0
    # The job runs on a session of its own: this one's listing of the table's files is stale.
    spark.catalog.refreshTable(table)
    return int(spark.read.table(table).count())


def _wait(condition, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _run_until_drained(p: beam.Pipeline, condition, what: str) -> None:  # type: ignore[no-untyped-def]
    """Runs `p` until `condition` holds (two minutes at most), then drains it."""
    result = p.run()
    try:
        _wait(condition, 120, what)
    finally:
        result.drain()
    assert result.wait_until_finish(120_000) == PipelineState.DRAINED


def _assert_fnapi_runner_counts(events: list[dict], expected: list[WindowCount]) -> None:
    """FnApiRunner, the same count over the same rows (timestamped by their `ts`), gives
    `expected`."""
    with beam.Pipeline(runner=FnApiRunner()) as p:
        rows = (p | beam.Create(events)
                | beam.Map(lambda e: beam.window.TimestampedValue(
                    beam.Row(user=e["user"], n=e["n"]),
                    Timestamp.from_rfc3339(e["ts"].replace("+00:00", "Z")))))
        assert_that(_counted(rows), equal_to(expected))


def test_a_landing_directory_streams_into_windowed_counts_written_once(spark, tmp_path) -> None:
    """Files land while the job runs; each window's count (event time from a column) is
    written once to Parquet, equal to FnApiRunner's over the same rows, and windows fire as the
    watermark passes them, before the job is drained."""
    events = _events(40)
    landing, out, ckpt = tmp_path / "landing", str(tmp_path / "out"), str(tmp_path / "ckpt")
    landing.mkdir()
    _land(str(landing), "part-0.json", events[:10])
    p = beam.Pipeline(runner=SparkRunner(), options=PipelineOptions([
        "--streaming", f"--checkpoint_dir={ckpt}", "--parallelism=2",
        "--trigger_interval=0.2 seconds"]))
    rows = p | ReadFromSpark(format="json", path=str(landing), schema=SCHEMA,
                             timestamp_column="ts", watermark_delay=15)
    _ = _counted(rows) | WriteToSpark(format="parquet", path=out, mode="append")
    result = p.run()
    try:
        for n in range(1, 4):
            _wait(lambda n=n: _files_read(ckpt) >= n, 120, f"file {n} to be read")
            _land(str(landing), f"part-{n}.json", events[10 * n:10 * (n + 1)])
        _wait(lambda: _files_read(ckpt) >= 4, 120, "the last file to be read")
        # Event time has passed the first windows (latest 39 s, less 15 s): they are written.
        _wait(lambda: _rows_written(spark, out) >= 3, 120, "the first windows to fire")
    finally:
        result.drain()
    assert result.wait_until_finish(120_000) == PipelineState.DRAINED
    got = sorted(WindowCount(*r) for r in spark.read.parquet(out).collect())
    assert len(got) == len(set(got)) == 12, got
    _assert_fnapi_runner_counts(events, got)
    names = [n for n in os.listdir(out) if not n.startswith(("_", "."))]
    assert names and all(n.startswith("part-sb-") for n in names)
    assert not os.listdir(os.path.join(ckpt, "spark-staged", "0"))


def test_processing_time_rows_of_the_rate_source_reach_a_table_once(spark, tmp_path) -> None:
    """Spark's rate source (no timestamp column: processing time) into a table the first
    micro-batch creates: every value read is in the table exactly once."""
    table = f"rates_{os.getpid()}"
    ckpt = str(tmp_path / "ckpt")
    p = beam.Pipeline(runner=SparkRunner(), options=PipelineOptions([
        "--streaming", f"--checkpoint_dir={ckpt}", "--trigger_interval=0.3 seconds"]))
    _ = (p | ReadFromSpark(format="rate", options={"rowsPerSecond": 200, "numPartitions": 2})
         | beam.Map(lambda r: Value(r.value)).with_output_types(Value)
         | WriteToSpark(table, mode="append"))
    _run_until_drained(p, lambda: _table_rows(spark, table) >= 300, "300 rows in the table")
    spark.catalog.refreshTable(table)
    values = sorted(r.value for r in spark.read.table(table).collect())
    assert values == list(range(len(values))), "a value missing or written twice"
    spark.sql(f"DROP TABLE {table}")


def test_a_row_without_its_event_time_fails_the_job_naming_the_read(tmp_path) -> None:
    landing = tmp_path / "landing"
    landing.mkdir()
    _land(str(landing), "part-0.json", [{"user": "a", "n": 1}])
    p = beam.Pipeline(runner=SparkRunner(), options=PipelineOptions([
        "--streaming", f"--checkpoint_dir={tmp_path / 'ckpt'}"]))
    _ = (p | "Events" >> ReadFromSpark(format="json", path=str(landing), schema=SCHEMA,
                                       timestamp_column="ts")
         | beam.Map(print))
    with pytest.raises(ExecutionError, match="^Events/Read: ValueError: a row of a stream of "
                                             "json data at .* has no ts \\(null\\)"):
        p.run().wait_until_finish(120_000)


def test_what_a_stream_cannot_do_is_refused_at_prepare_all_at_once(tmp_path) -> None:
    landing = str(tmp_path)
    p = beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(["--streaming"]))
    rows = p | "Stream" >> ReadFromSpark(format="json", path=landing, schema=SCHEMA)
    _ = (rows | beam.Map(lambda r: Value(r.n)).with_output_types(Value)
         | "Overwrite" >> WriteToSpark(format="parquet", path=landing + "/o", mode="overwrite"))
    _ = (p | "Snapshot" >> ReadFromSpark(format="json", path=landing, schema=SCHEMA,
                                         streaming=False)
         | beam.Map(lambda r: Value(r.n)).with_output_types(Value)
         | "Jdbc" >> WriteToSpark(format="jdbc", mode="append"))
    with pytest.raises(UnsupportedFeatureError) as caught:
        prepare(p.to_runner_api(), p.options)
    text = str(caught.value)
    assert "3 unsupported" in text, text
    for expected in ("mode='overwrite' in a streaming pipeline", "transform 'Overwrite'",
                     "a bounded ReadFromSpark of json data at", "transform 'Snapshot",
                     "WriteToSpark to jdbc data in a streaming pipeline", "transform 'Jdbc'"):
        assert expected in text, text


def test_a_stream_makes_the_job_a_stream_unless_batch_is_forced(tmp_path) -> None:
    """Without --streaming the stream's unbounded output makes the job a stream (as a Kafka
    read does); kept in batch by Beam's experiment, the read is refused."""
    p = beam.Pipeline(runner=SparkRunner(), options=PipelineOptions([]))
    _ = p | "Stream" >> ReadFromSpark(format="rate", streaming=True) | beam.Map(print)
    plan = prepare(p.to_runner_api(), p.options)
    assert "Stream/Read: Spark streams a stream of rate data into the query" in plan.decisions
    p = beam.Pipeline(runner=SparkRunner(), options=PipelineOptions([
        f"--experiments={BATCH_EXPERIMENT}"]))
    _ = p | "Stream" >> ReadFromSpark(format="rate", streaming=True) | beam.Map(print)
    with pytest.raises(UnsupportedFeatureError,
                       match="ReadFromSpark of a stream of rate data in a batch pipeline "
                             r"\(run it with --streaming\) in transform 'Stream"):
        prepare(p.to_runner_api(), p.options)


def test_other_runners_refuse_a_stream_when_the_pipeline_is_built(tmp_path) -> None:
    p = beam.Pipeline(runner=FnApiRunner(), options=PipelineOptions(["--streaming"]))
    with pytest.raises(ValueError, match="ReadFromSpark of a stream of rate data runs on "
                                         "sparkbeam's streaming engine only"):
        _ = p | ReadFromSpark(format="rate")
    with pytest.raises(ValueError, match="timestamp_column='n' is not a timestamp column"):
        _ = beam.Pipeline(runner=SparkRunner(),
                          options=PipelineOptions(["--streaming"])) | ReadFromSpark(
            format="json", path=str(tmp_path), schema=SCHEMA, timestamp_column="n")


def test_the_bounded_path_is_unchanged_on_fnapi_runner(spark, tmp_path) -> None:
    """streaming=False reads a snapshot of the same directory on any runner."""
    landing = tmp_path / "landing"
    landing.mkdir()
    events = _events(12)
    _land(str(landing), "part-0.json", events)
    with beam.Pipeline(runner=FnApiRunner()) as p:
        got = (p | ReadFromSpark(format="json", path=str(landing), schema=SCHEMA,
                                 streaming=False) | beam.Map(lambda r: r.n))
        assert_that(got, equal_to(list(range(12))))


@pytest.mark.parametrize("relative", [False, True], ids=["absolute", "relative"])
def test_a_batch_written_again_after_a_killed_move_is_in_the_target_once(spark, tmp_path,
                                                                        relative) -> None:
    """The flush's record of a batch decides: written (a replayed flush skips it), or killed
    while its files moved (the moved files go, the batch is written again). A relative path=
    is where Spark's file system puts it (the JVM's working directory, this process's)."""
    from apache_beam.coders import RowCoder, WindowedValueCoder
    from apache_beam.coders.coders import GlobalWindowCoder
    from apache_beam.internal import pickler
    from apache_beam.runners.pipeline_context import PipelineContext
    from apache_beam.transforms.window import GlobalWindow
    from apache_beam.typehints import schemas
    from apache_beam.utils.windowed_value import WindowedValue

    from sparkbeam.plan.native_spark import RunnerWrite
    from sparkbeam.streaming.checkpoint import CheckpointLayout, write_side_file
    from sparkbeam.streaming.spark_writes import flush_spark_writes, spark_stream_writes

    schema = schemas.schema_from_element_type(WindowCount)
    coder = WindowedValueCoder(RowCoder(schema), GlobalWindowCoder())
    context = PipelineContext()
    coder_id = context.coders.get_id(coder)
    target = dataclasses.replace(
        WriteToSpark(format="parquet", mode="append", path=os.path.relpath(tmp_path / "out")
                     if relative else str(tmp_path / "out")).target,
        schema=schema.SerializeToString())  # as WriteToSpark.expand sets it
    layout = CheckpointLayout(str(tmp_path / "ckpt"))
    (writes,) = spark_stream_writes(
        layout, (RunnerWrite("Out", b"buffer", coder_id, pickler.dumps(target)),),
        context.to_runner_api().SerializeToString())
    rows = [WindowCount(f"u{i}", i, i * i) for i in range(50)]

    def stage() -> None:
        for part in (0, 1):
            write_side_file(writes.staged, 3, part, [
                coder.encode(WindowedValue(r, 0, (GlobalWindow(),))) for r in rows[part::2]])

    def written() -> list[WindowCount]:
        return sorted(WindowCount(*r) for r in spark.read.parquet(str(tmp_path / "out")).collect())

    stage()
    assert flush_spark_writes(spark, (writes,), "q" * 36, before_batch=3) == 0  # not committed
    assert flush_spark_writes(spark, (writes,), "q" * 36, before_batch=4) == 1
    assert written() == sorted(rows) and not os.listdir(writes.staged)
    stage()  # a replayed flush of a written batch: skipped
    assert flush_spark_writes(spark, (writes,), "q" * 36, before_batch=4) == 0
    assert written() == sorted(rows)
    record = os.path.join(writes.written, "3")
    os.rename(record, record + ".moving")  # as if killed after moving the files
    stage()
    assert flush_spark_writes(spark, (writes,), "q" * 36, before_batch=4) == 1
    assert written() == sorted(rows)
    assert sorted(os.listdir(writes.written)) == ["3"]


def _files_per_batch(ckpt: str) -> list[int]:
    """Files Spark's file source read in each micro-batch that read any (its own log)."""
    counts = []
    for root, _, names in os.walk(os.path.join(ckpt, "sources")):
        for name in sorted((n for n in names if n.isdigit()), key=int):
            with open(os.path.join(root, name)) as f:
                counts.append(sum(1 for line in f if '"path"' in line))
    return counts


def test_the_byte_budget_is_the_file_sources_own_limit(spark, tmp_path) -> None:
    """--max_bytes_per_batch becomes the file source's maxBytesPerTrigger: a backlog of four
    landed files is read a file a micro-batch (each is larger than the budget), every row
    written once."""
    events = _events(40)
    landing, out, ckpt = tmp_path / "landing", str(tmp_path / "out"), str(tmp_path / "ckpt")
    landing.mkdir()
    for n in range(4):
        _land(str(landing), f"part-{n}.json", events[10 * n:10 * (n + 1)])
    p = beam.Pipeline(runner=SparkRunner(), options=PipelineOptions([
        "--streaming", f"--checkpoint_dir={ckpt}", "--trigger_interval=0.2 seconds",
        "--max_bytes_per_batch=64"]))
    _ = (p | ReadFromSpark(format="json", path=str(landing), schema=SCHEMA)
         | beam.Map(lambda r: Value(r.n)).with_output_types(Value)
         | WriteToSpark(format="parquet", path=out, mode="append"))
    _run_until_drained(p, lambda: _rows_written(spark, out) >= 40, "all 40 rows written")
    assert _files_per_batch(ckpt) == [1, 1, 1, 1]
    assert sorted(r.value for r in spark.read.parquet(out).collect()) == list(range(40))
