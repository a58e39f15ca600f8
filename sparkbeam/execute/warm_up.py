"""Starting a session's Python workers while its first job is still being planned.

Spark starts an executor's Python daemon, and forks its first worker, when the first task that
runs Python arrives: sparkbeam's daemon imports Beam first (`daemon.py`, ~1.3 s of CPU here),
so the first task of a session's first job waited ~1.8 s before its Python code began
(2026-11-28: the map task of a fresh session's first word count launched at +0.06 s, its
Python began at +1.88 s). The driver, meanwhile, spends ~2 s of that job declaring the stages
and planning the query on the JVM, with the other core idle.

So the first job of a local session also starts a one-row Python job of its own, in a
thread, as it begins: the daemon imports Beam while the driver plans, and the job's first
task finds a worker waiting. Once per SparkContext; local masters only, those whose workers
fork sparkbeam's daemon (`session_config`): `local[...]`, and `local-cluster[...]`, where it
warms one executor. On a cluster the executors' daemon is PySpark's own, and one task would
warm one executor of many. Never over Spark Connect. It runs in a job group of its own, so
a pipeline's Spark job count leaves it out, and a failure is only logged: it is an
optimisation, never part of a job.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

_LOG = logging.getLogger(__name__)

WARM_UP_GROUP = "sparkbeam-warm-up"
_WARMED: set[str] = set()  # applicationIds of the SparkContexts already warmed
_LOCK = threading.Lock()


def warm_python_workers(spark: Any) -> threading.Thread | None:
    """Starts the warm-up job of `spark`'s SparkContext if it is local and was not warmed
    yet; returns its thread (None when nothing was started)."""
    from sparkbeam.execute.session import is_connect

    if is_connect(spark):
        return None
    try:
        sc = spark.sparkContext
        if not str(sc.master).startswith("local"):
            return None
        key = str(sc.applicationId)
    except Exception:  # noqa: BLE001 - a stopped or failing session: nothing to warm
        return None
    with _LOCK:
        if key in _WARMED:
            return None
        _WARMED.add(key)
    thread = threading.Thread(target=_run, args=(spark,), name="sparkbeam-warm-up", daemon=True)
    thread.start()
    return thread


def _pass_through(batches: Iterator[Any]) -> Iterator[Any]:
    yield from batches


def _run(spark: Any) -> None:
    from sparkbeam.execute.dataset import Datasets

    try:
        # A job group is a local property of this thread's jobs only (PySpark pins Python
        # threads to JVM threads): the pipeline's own jobs keep theirs. `job_group` clears it
        # after, in case the JVM thread serves another Python thread later.
        with Datasets(spark, parallelism=1).job_group(
                WARM_UP_GROUP, "sparkbeam: starting the Python workers"):
            one = spark.range(0, 1, 1, 1)
            one.mapInArrow(_pass_through, one.schema).collect()
    except Exception as exc:  # noqa: BLE001 - the pipeline's own job reports real problems
        _LOG.debug("warming the Python workers failed: %s", exc)
