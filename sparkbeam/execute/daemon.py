"""A PySpark daemon that imports Beam before it forks Python workers.

Spark starts Python workers by forking `spark.python.daemon.module`. With PySpark's own daemon
every worker then imports apache_beam on its first task (seconds each, and its own copy of the
memory); forked from this one they start with Beam loaded and share those pages.
Used by the sessions sparkbeam creates (see `session_config`).
"""
from __future__ import annotations

from sparkbeam.logs import quiet_beam_imports

quiet_beam_imports()  # forked workers inherit the filter

import apache_beam  # noqa: E402, F401
import apache_beam.runners.worker.bundle_processor  # noqa: E402, F401
import apache_beam.runners.worker.sdk_worker  # noqa: E402, F401
import apache_beam.transforms.core  # noqa: E402, F401
from pyspark.daemon import manager  # noqa: E402

import sparkbeam.engine.task  # noqa: E402, F401

if __name__ == "__main__":
    manager()
