"""A PySpark daemon that imports Beam before it forks Python workers.

Spark starts Python workers by forking `spark.python.daemon.module`. With PySpark's own daemon
every worker then imports apache_beam on its first task (seconds each, and its own copy of the
memory); forked from this one they start with Beam loaded and share those pages.

Those modules' objects (~130 k) are then frozen out of the garbage collector (`gc.freeze`):
otherwise each full collection in a worker walks them all, and a stage that allocates many
surviving objects (a batch's values and windowed values) triggers many. Measured in-process on
the sessions workload's map stage (parse, timestamp, assign sessions, encode; 200 k lines):
20.3 µs a line, 12.4 with Beam's objects frozen. Frozen pages also stay shared with the forked
workers (a collection no longer writes to them). The workers' youngest generation is collected
every 10,000 allocations instead of Python's 700 (`GEN0_THRESHOLD`): a batch's values, windowed
values and lists live until the batch is through, so each young collection walked them again.
In-process, the sessions workload's reduce stage on the direct path (200 k events, Beam's objects
frozen, four alternating runs each, best): 9.38 µs an event at 700, 8.06 at 10,000, 8.34 at
50,000 (7.5 with the collector off). Cyclic garbage waits at most that many allocations longer.
Used by the sessions sparkbeam creates (see `session_config`). PySpark is imported from the
installed package, not from Spark's zip of it (`sparkbeam_site.py`: ~0.9 s less per daemon);
`sparkbeam_site.pth` already did that in an installed sparkbeam's environment, but a Python
started without site processing did not run it.
"""
from __future__ import annotations

import sparkbeam_site

sparkbeam_site.reorder_sys_path()  # before anything imports pyspark

from sparkbeam.logs import quiet_beam_imports  # noqa: E402

quiet_beam_imports()  # forked workers inherit the filter

import apache_beam  # noqa: E402, F401
import apache_beam.runners.worker.bundle_processor  # noqa: E402, F401
import apache_beam.runners.worker.sdk_worker  # noqa: E402, F401
import apache_beam.transforms.core  # noqa: E402, F401
from pyspark.daemon import manager  # noqa: E402

import sparkbeam.engine.task  # noqa: E402, F401

#: Allocations between two collections of the workers' youngest generation (Python's is 700).
GEN0_THRESHOLD = 10_000

if __name__ == "__main__":
    import gc

    gc.freeze()
    gc.set_threshold(GEN0_THRESHOLD, *gc.get_threshold()[1:])
    manager()
