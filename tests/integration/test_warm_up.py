"""A local session's first job starts its Python workers in a job of their own, once
(sparkbeam/execute/warm_up.py), which a pipeline's Spark job count leaves out.

The session is a fresh one in a child process (`warm_up_child.py`): the shared session's
warm-up was its first job, and Spark's status store forgets the oldest jobs after 1,000."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from sparkbeam.execute.warm_up import warm_python_workers

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_a_fresh_sessions_first_pipeline_warms_it_once_and_counts_only_its_own_jobs() -> None:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    proc = subprocess.run(
        [sys.executable, "-m", "tests.integration.warm_up_child"], cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=280, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["session_before"] is False  # the runner made the session: its own path
    assert report["first"] == {"spark_jobs": 1, "warm_up_jobs": ["SUCCEEDED"]}
    assert report["second"] == {"spark_jobs": 1, "warm_up_jobs": ["SUCCEEDED"]}


def _local(app: str) -> SimpleNamespace:
    # Pure logic: the warm-up thread's job fails on this object, which is only logged.
    return SimpleNamespace(sparkContext=SimpleNamespace(master="local[2]", applicationId=app))


def test_first_jobs_arriving_together_start_one_warm_up() -> None:
    session = _local(f"race-{uuid.uuid4().hex}")
    barrier = threading.Barrier(8)
    started: list[object] = []

    def first_job() -> None:
        barrier.wait()
        started.append(warm_python_workers(session))

    threads = [threading.Thread(target=first_job) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(started) == 8
    assert sum(s is not None for s in started) == 1


def test_no_warm_up_off_a_local_master() -> None:
    cluster = SimpleNamespace(sparkContext=SimpleNamespace(master="spark://127.0.0.1:7077",
                                                           applicationId="app-1"))
    assert warm_python_workers(cluster) is None
    assert warm_python_workers(_local(f"local-{uuid.uuid4().hex}")) is not None


def test_a_stopped_session_is_not_warmed() -> None:
    class Stopped:
        @property
        def sparkContext(self):  # type: ignore[no-untyped-def]
            raise RuntimeError("SparkContext was shut down")

    assert warm_python_workers(Stopped()) is None
