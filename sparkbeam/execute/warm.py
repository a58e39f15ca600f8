"""Python workers started while the first job is being declared, not when its first task runs.

Spark starts its Python worker daemon (which imports Beam, ~1 s) and forks the workers only
when the first task that needs them runs, so a session's first job waits for them after it has
spent a second or two declaring its stages in the driver. A tiny job in a thread of its own,
run when sparkbeam first meets a session, does that start meanwhile; the workers it leaves
idle are reused by the job's tasks (`spark.python.worker.reuse`, on by default).
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql import SparkSession

_LOG = logging.getLogger(__name__)
_LOCK = threading.Lock()
_WARMED: set[str] = set()  # application ids
GROUP = "sparkbeam-warm-up"


def warm_python_workers(spark: SparkSession, tasks: int) -> threading.Thread | None:
    """Starts the warm-up job in the background, once per SparkContext (a classic session:
    over Connect the workers live on the server, which its own jobs keep warm). Returns the
    thread, or None when there is nothing to do."""
    try:
        app = spark.sparkContext.applicationId
    except Exception:  # noqa: BLE001 - Connect, or a stopped session: nothing to warm
        return None
    with _LOCK:
        if app in _WARMED:
            return None
        _WARMED.add(app)
    thread = threading.Thread(target=_run, args=(spark, max(1, tasks)),
                              name="sparkbeam-warm-up", daemon=True)
    thread.start()
    return thread


def _run(spark: SparkSession, tasks: int) -> None:
    try:
        sc = spark.sparkContext
        # Its own job group: not one of a job's Spark jobs, and never cancelled with one.
        sc.setJobGroup(GROUP, "sparkbeam: starting Python workers", interruptOnCancel=False)
        spark.range(0, tasks, 1, tasks).mapInArrow(_consume, "id long").collect()
    except Exception as exc:  # noqa: BLE001 - only a head start: the job starts them anyway
        _LOG.debug("warming Spark's Python workers failed: %s", exc)


def _consume(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for _ in batches:
        pass
    yield from ()
