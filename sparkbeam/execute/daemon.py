"""A PySpark daemon that imports Beam before it forks Python workers.

Spark starts Python workers by forking `spark.python.daemon.module`. With PySpark's own daemon
every worker then imports apache_beam on its first task (seconds each, and its own copy of the
memory); forked from this one they start with Beam loaded and share those pages.
Used by the sessions sparkbeam creates (see `session_config`).
"""
from __future__ import annotations

import apache_beam  # noqa: F401
import apache_beam.runners.worker.bundle_processor  # noqa: F401
import apache_beam.runners.worker.sdk_worker  # noqa: F401
import apache_beam.transforms.core  # noqa: F401
from pyspark.daemon import manager

import sparkbeam.engine.task  # noqa: F401

if __name__ == "__main__":
    manager()
