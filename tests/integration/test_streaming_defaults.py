"""Streaming as a Beam user expects it: a TestStream needs neither --streaming nor (on a local
master) --checkpoint_dir, and a checkpoint directory resumes only the pipeline that wrote it."""
from __future__ import annotations

import json
import logging
import os
import re

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.runner import PipelineState
from apache_beam.transforms import window

from sparkbeam import SparkRunner
from sparkbeam.errors import UnsupportedFeatureError
from tests.integration.streaming_pipelines import (
    STREAMING_PIPELINES,
    WriteLines,
    events,
    read_lines,
)
from tests.integration.test_streaming import expected_from_direct_runner


def _run(build, args: list[str], out: str) -> beam.runners.runner.PipelineResult:
    os.makedirs(out, exist_ok=True)
    p = beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(["--parallelism=2", *args]))
    _ = build(p) | "Write" >> beam.ParDo(WriteLines(out))
    result = p.run()
    result.wait_until_finish()
    return result


def _counts(p):
    return (p | events(("add", [("a", 1, 1), ("b", 2, 2)]), ("wm", 10), ("add", [("a", 3, 12)]))
            | beam.WindowInto(window.FixedWindows(10)) | beam.combiners.Count.PerKey())


def _sums(p):  # the same source, another pipeline after it
    return (p | events(("add", [("a", 1, 1), ("b", 2, 2)]), ("wm", 10), ("add", [("a", 3, 12)]))
            | beam.WindowInto(window.FixedWindows(10)) | beam.CombinePerKey(sum))


def test_a_test_stream_runs_as_a_stream_without_flags_into_a_fresh_checkpoint(
        tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="sparkbeam.runner")
    expected = expected_from_direct_runner("fixed_default")
    result = _run(STREAMING_PIPELINES["fixed_default"], [], str(tmp_path / "out"))
    assert result.state == PipelineState.DONE
    assert read_lines(str(tmp_path / "out")) == expected
    messages = [r.getMessage() for r in caplog.records]
    assert any(re.search(r"runs as a stream: it reads the TestStream '.*' \(no --streaming "
                         r"needed\)", m) for m in messages), messages
    made = [m for m in messages if "checkpointing to" in m]
    assert len(made) == 1 and "(no --checkpoint_dir given)" in made[0], messages
    directory = re.search(r"checkpointing to (\S+) ", made[0]).group(1)
    assert f"--checkpoint_dir={directory} to resume" in made[0]
    assert os.path.exists(os.path.join(directory, "sparkbeam-pipeline.json"))
    assert os.listdir(os.path.join(directory, "offsets"))


def test_a_checkpoint_resumes_its_own_pipeline_and_refuses_another(tmp_path) -> None:
    checkpoint = str(tmp_path / "ckpt")
    first = _run(_counts, [f"--checkpoint_dir={checkpoint}"], str(tmp_path / "one"))
    assert first.state == PipelineState.DONE
    assert sorted(read_lines(str(tmp_path / "one"))) == ["('a', 1)", "('a', 1)", "('b', 1)"]
    # The same pipeline resumes: its input is consumed and it ends without writing again.
    again = _run(_counts, [f"--checkpoint_dir={checkpoint}"], str(tmp_path / "two"))
    assert again.state == PipelineState.DONE
    assert read_lines(str(tmp_path / "two")) == []
    # Another pipeline is refused at Prepare (before any Spark work), naming what differs.
    p = beam.Pipeline(runner=SparkRunner(),
                      options=PipelineOptions([f"--checkpoint_dir={checkpoint}"]))
    _ = _sums(p) | "Write" >> beam.ParDo(WriteLines(str(tmp_path / "three")))
    with pytest.raises(UnsupportedFeatureError, match=(
            rf"checkpoint directory {re.escape(checkpoint)} belongs to another pipeline \("
            r"transform 'CombinePerKey\(sum\)/.*' is new.*"
            r"transform 'PerKey/CombinePerKey\(CountCombineFn\)/.*' is gone")):
        p.run()
    assert not os.path.exists(tmp_path / "three")


def test_a_checkpoint_of_an_unknown_pipeline_is_refused(tmp_path) -> None:
    """Offsets without sparkbeam's record (another program, an older sparkbeam): resuming them
    could skip input, so the job is refused rather than run on them."""
    offsets = tmp_path / "ckpt" / "offsets"
    offsets.mkdir(parents=True)
    (offsets / "0").write_text("v1\n{}\n-\n")
    p = beam.Pipeline(runner=SparkRunner(),
                      options=PipelineOptions([f"--checkpoint_dir={tmp_path / 'ckpt'}"]))
    _ = _counts(p)
    with pytest.raises(UnsupportedFeatureError,
                       match=r"holds a streaming query's offsets but no record of its pipeline"):
        p.run()


def _daemons_started_by(pid: int) -> list[int]:
    """sparkbeam's Python daemons among the children of process `pid` (Linux's /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:  # gone meanwhile
            continue
        if parent == pid and b"sparkbeam.execute.daemon" in argv:
            found.append(int(entry))
    return found


def test_a_streaming_jobs_stateless_and_stateful_stages_share_one_python_daemon(
        tmp_path, spark) -> None:
    # Spark keeps a daemon per worker environment; `transformWithState`'s runner left out a
    # variable Spark's other SQL runners add, so a streaming job started a second daemon
    # that imported Beam again (`session_config`). Counted before too: an earlier test on
    # the shared session may have started the batch runners' daemon already.
    if not spark.sparkContext.master.startswith("local["):
        pytest.skip("under local-cluster the daemons are the executors' children")
    jvm = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    before = _daemons_started_by(jvm)
    result = _run(_counts, [], str(tmp_path / "out"))
    assert result.state == PipelineState.DONE
    assert len(_daemons_started_by(jvm)) == max(1, len(before)), before


@pytest.mark.parametrize("flags, expected", [([], "default"), (["--parallelism=3"], "3")])
def test_stateful_operators_take_the_jobs_parallelism_not_the_sessions_shuffle_partitions(
        tmp_path, spark, flags, expected) -> None:
    # Each stateful partition costs every micro-batch a task (its state store's commit and a
    # Python round trip), input or not: the session's spark.sql.shuffle.partitions (4 in the
    # tests' session, 200 in Spark's default) made idle micro-batches cost as many.
    want = str(spark.sparkContext.defaultParallelism) if expected == "default" else expected
    # What the session would give (its own 4, or the 8 a job's session defaults set on it):
    # else this test could not tell the two apart.
    assert want not in ("4", "8")
    expected_lines = expected_from_direct_runner("fixed_default")
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "ckpt")
    os.makedirs(out)
    p = beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(
        [f"--checkpoint_dir={checkpoint}", *flags]))
    _ = STREAMING_PIPELINES["fixed_default"](p) | "Write" >> beam.ParDo(WriteLines(out))
    result = p.run()
    result.wait_until_finish()
    assert result.state == PipelineState.DONE
    assert read_lines(out) == expected_lines
    with open(os.path.join(checkpoint, "offsets", "0")) as f:
        metadata = json.loads(f.read().splitlines()[1])
    assert metadata["conf"]["spark.sql.shuffle.partitions"] == want
