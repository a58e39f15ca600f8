"""A local session's first job starts its Python workers in a job of their own, once
(sparkbeam/execute/warm_up.py), which a pipeline's Spark job count leaves out."""
from __future__ import annotations

import time
from types import SimpleNamespace

import apache_beam as beam

from sparkbeam.execute.warm_up import WARM_UP_GROUP, warm_python_workers
from tests.integration.conftest import run_and_collect_with_result, spark_runner


def _warm_up_jobs(spark) -> list:  # type: ignore[no-untyped-def]
    sc = spark.sparkContext
    sc._jsc.sc().listenerBus().waitUntilEmpty(5000)
    tracker = sc.statusTracker()
    return [tracker.getJobInfo(j) for j in tracker.getJobIdsForGroup(WARM_UP_GROUP)]


def test_the_warm_up_runs_once_per_session_and_succeeds(spark) -> None:  # type: ignore[no-untyped-def]
    thread = warm_python_workers(spark)  # None if an earlier job of this session warmed it
    if thread is not None:
        thread.join(60)
    deadline = time.monotonic() + 60
    while True:
        jobs = _warm_up_jobs(spark)
        if jobs and all(j.status == "SUCCEEDED" for j in jobs) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert [j.status for j in jobs] == ["SUCCEEDED"]
    assert warm_python_workers(spark) is None
    # A pipeline run now counts its own Spark job only.
    actual, result = run_and_collect_with_result(
        lambda p: p | beam.Create([1, 2, 3]) | beam.Map(lambda x: x * 2),
        spark_runner(), ["--parallelism=2"])
    assert sorted(actual) == ["2", "4", "6"]
    assert result.spark_jobs == 1
    assert [j.status for j in _warm_up_jobs(spark)] == ["SUCCEEDED"]


def test_no_warm_up_off_a_local_master() -> None:
    cluster = SimpleNamespace(sparkContext=SimpleNamespace(master="spark://127.0.0.1:7077",
                                                           applicationId="app-1"))
    assert warm_python_workers(cluster) is None


def test_a_stopped_session_is_not_warmed() -> None:
    class Stopped:
        @property
        def sparkContext(self):  # type: ignore[no-untyped-def]
            raise RuntimeError("SparkContext was shut down")

    assert warm_python_workers(Stopped()) is None
