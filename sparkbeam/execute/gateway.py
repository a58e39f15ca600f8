"""The driver JVM a sparkbeam session launches, its one start-up warning left out.

Spark 4's launcher starts every JVM with `--add-modules=jdk.incubator.vector`
(`JavaModuleOptions`), and Java then writes `WARNING: Using incubator modules:
jdk.incubator.vector` to the JVM's stderr as it starts. No JVM option silences it, so it was
the one line on stderr of a quiet `make run`. When sparkbeam launches the driver JVM itself
(a session of its own, no Spark Connect, not under spark-submit, whose JVM is already up), it
gives PySpark's `launch_gateway` a pipe for the JVM's stderr. A thread copies every line of it
to this process's stderr (file descriptor 2, where the JVM's own writes went), except that
warning. The thread starts before the JVM does, so even a JVM that dies as it launches has its
last words copied.
"""
from __future__ import annotations

import os
import threading
from typing import Any

_INCUBATOR_WARNING = b"WARNING: Using incubator modules:"


def launch_filtered(settings: dict[str, str]) -> None:
    """Launches PySpark's gateway JVM with `settings` (what the session builder would have
    passed it: master, app name and the rest) and makes it the SparkContext's, so the builder's
    `getOrCreate` then uses it. Raises what `launch_gateway` raises."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    conf = SparkConf(loadDefaults=False)
    for key, value in settings.items():
        conf.set(key, value)
    read, write = os.pipe()
    threading.Thread(target=_copy, args=(read,), name="sparkbeam-jvm-stderr", daemon=True).start()
    try:
        gateway: Any = launch_gateway(conf, popen_kwargs={"stderr": write})
    finally:
        os.close(write)  # the JVM holds its own copy; the copier ends when the JVM exits
    SparkContext._ensure_initialized(gateway=gateway)  # noqa: SLF001 - PySpark's own entry


def _copy(read: int) -> None:
    with os.fdopen(read, "rb") as lines:
        for line in lines:
            if not line.startswith(_INCUBATOR_WARNING):
                _write_all(line)


def _write_all(data: bytes) -> None:
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(2, view):]
    except OSError:  # this process's stderr closed: nothing left to tell
        pass
