"""Killing the driver (kill -9, with its JVM and Python workers) of the landing-directory ->
windowed count -> Parquet example three times while files keep landing: each restart resumes
from the checkpoint, and the output holds each window's count exactly once, equal to the
count of the events that landed (the streaming WriteToSpark, `streaming/spark_writes.py`)."""
from __future__ import annotations

import collections
import datetime
import os
import random
import signal
import subprocess
import sys

import pytest

from tests.integration.test_spark_streams import _files_read, _land, _wait
from tests.integration.test_streaming_restart import _wait_for_batch

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples",
                       "landing_windowed_count.py")
FILES = 12
EPOCH = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def _file(n: int) -> list[dict]:
    """File n: 30 events in seconds [10n, 10n + 10), three users, out of order."""
    return [{"user": f"u{j % 3}", "ts": (EPOCH + datetime.timedelta(
        seconds=10 * n + (j * 7) % 10)).isoformat()} for j in range(30)]


def _start(landing: str, out: str, ckpt: str, log) -> subprocess.Popen:  # type: ignore[no-untyped-def]
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    return subprocess.Popen(
        [sys.executable, EXAMPLE, "--landing", landing, "--output", out,
         f"--checkpoint_dir={ckpt}", "--parallelism=2", "--spark_master=local[2]",
         "--trigger_interval=0.2 seconds", "--watermark_delay=5"],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def _written(out: str) -> int:
    return sum(1 for n in os.listdir(out) if n.startswith("part-sb-")) if os.path.isdir(
        out) else 0


@pytest.mark.slow  # ~3 min (four driver starts): `make test-slow`, not in `make test`
@pytest.mark.timeout(600)
def test_kill_9_three_times_then_each_window_count_exactly_once(spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    landing, out, ckpt = tmp_path / "landing", str(tmp_path / "out"), str(tmp_path / "ckpt")
    landing.mkdir()
    expected = collections.Counter()
    for n in range(FILES):
        for event in _file(n):
            start = int(datetime.datetime.fromisoformat(event["ts"]).timestamp()) // 10 * 10
            expected[(event["user"], start)] += 1
    rng = random.Random(5)
    landed = 0

    def land(count: int) -> None:
        nonlocal landed
        for _ in range(count):
            if landed < FILES:
                _land(str(landing), f"events-{landed:03d}.json", _file(landed))
                landed += 1

    land(2)
    batch = 0
    with open(tmp_path / "driver.log", "w") as log:
        for _ in range(3):
            proc = _start(str(landing), out, ckpt, log)
            try:
                batch += rng.randint(3, 8)
                assert _wait_for_batch(ckpt, batch, proc, 240), (
                    f"batch {batch} never started; see {tmp_path / 'driver.log'}")
                land(3)
                # The moment that matters: files are moving into the output, and Spark has
                # not committed the batch; a replay must not write them again.
                before = _written(out)
                _wait(lambda b=before, running=proc: _written(out) > b
                      or running.poll() is not None, 60, "output to grow")
                subprocess.run(["sleep", str(rng.uniform(0, 0.3))], check=True)
            finally:
                os.killpg(proc.pid, signal.SIGKILL)  # driver, its JVM and Python workers
                proc.wait(30)
            log.write(f"\n===== killed at about batch {batch} =====\n")
            log.flush()
        land(FILES)
        proc = _start(str(landing), out, ckpt, log)
        try:
            _wait(lambda: _files_read(ckpt) >= FILES, 240, "every file to be read")
        finally:
            with open(os.path.join(ckpt, "drain"), "w") as f:
                f.write("test")
            code = proc.wait(180)
    assert code == 0, (tmp_path / "driver.log").read_text()[-3000:]
    rows = [(r.user, r.start, r["count"]) for r in spark.read.parquet(out).collect()]
    assert len(rows) == len({(u, s) for u, s, _ in rows}), "a window's count was written twice"
    assert sorted(rows) == sorted((u, s, c) for (u, s), c in expected.items()), (
        (tmp_path / "driver.log").read_text()[-3000:])

