"""Killing the driver (kill -9, with its JVM and Python workers) mid-stream three times: each
restart resumes from the checkpoint and the final output equals an uninterrupted run's, with no
pane written twice (exactly-once files per micro-batch)."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from sparkbeam.streaming.sinks import WriteToFilesPerBatch, read_lines
from tests.integration.streaming_pipelines import STREAMING_PIPELINES

DRIVER = textwrap.dedent("""
    import sys
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from sparkbeam import SparkRunner
    from sparkbeam.streaming.sinks import WriteToFilesPerBatch
    from tests.integration.streaming_pipelines import STREAMING_PIPELINES

    out, ckpt, name = sys.argv[1], sys.argv[2], sys.argv[3]
    options = PipelineOptions(["--streaming", "--allow_unsafe_triggers", "--parallelism=2",
                               "--spark_master=local[2]", f"--checkpoint_dir={ckpt}"])
    with beam.Pipeline(runner=SparkRunner(), options=options) as p:
        STREAMING_PIPELINES[name](p) | WriteToFilesPerBatch(out)
    print("DRIVER DONE", flush=True)
""")


def _expected(name: str) -> list[str]:
    out = tempfile.mkdtemp(prefix="sparkbeam-restart-ref-")
    options = PipelineOptions(["--streaming", "--allow_unsafe_triggers"])
    with beam.Pipeline(runner="BundleBasedDirectRunner", options=options) as p:
        STREAMING_PIPELINES[name](p) | WriteToFilesPerBatch(out)
    return sorted(read_lines(out))


def _start(out: str, ckpt: str, log, name: str) -> subprocess.Popen:  # type: ignore[no-untyped-def]
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    return subprocess.Popen([sys.executable, "-c", DRIVER, out, ckpt, name], stdout=log,
                            stderr=subprocess.STDOUT, env=env, start_new_session=True)


def _wait_for_batch(ckpt: str, batch: int, proc: subprocess.Popen, timeout: float) -> bool:
    path = os.path.join(ckpt, "offsets", str(batch))
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if os.path.exists(path):
            return True
        time.sleep(0.05)
    return False


# Pipeline -> the batches it may be killed in: early_accumulating_late's 17 events (with the
# final watermark) make 14 batches (three element events share theirs with the watermark
# event after them); stateful_with_side_input (a stateful DoFn whose elements wait in its
# keys' state for a side input) runs 8 events and the batches its holds add.
KILLABLE = {"early_accumulating_late": range(2, 13), "stateful_with_side_input": range(2, 9)}


@pytest.mark.slow  # ~3 min each (four driver starts): `make test-slow`, not in `make test`
@pytest.mark.parametrize("name", sorted(KILLABLE))
def test_kill_9_three_times_then_same_output_without_duplicates(tmp_path, name: str) -> None:
    expected = _expected(name)
    assert len(expected) >= 6
    out, ckpt = str(tmp_path / "out"), str(tmp_path / "ckpt")
    rng = random.Random(7)
    kill_at = sorted(rng.sample(KILLABLE[name], 3))
    with open(tmp_path / "driver.log", "w") as log:
        for batch in kill_at:
            proc = _start(out, ckpt, log, name)
            try:
                assert _wait_for_batch(ckpt, batch, proc, 240), (
                    f"batch {batch} never started; see {tmp_path / 'driver.log'}")
                # Into the batch (~1.5 s each here): sometimes before its output is written,
                # sometimes after it is written but before Spark commits the batch.
                time.sleep(rng.uniform(0.2, 1.4))
            finally:
                os.killpg(proc.pid, signal.SIGKILL)  # driver, its JVM and Python workers
                proc.wait(30)
            log.write(f"\n===== killed in batch {batch} =====\n")
            log.flush()
        proc = _start(out, ckpt, log, name)
        assert proc.wait(300) == 0, (tmp_path / "driver.log").read_text()[-3000:]
    actual = read_lines(out)
    assert len(actual) == len(set(actual)), "a pane was written twice"
    assert sorted(actual) == expected, (sorted(actual), expected)
