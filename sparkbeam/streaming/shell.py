"""What Spark pickles for a keyed streaming operator: the processor itself as bytes, loaded when
a task first needs it (no apache_beam here).

At a streaming query's first batch Spark starts a fresh Python process per `transformWithState`
operator only to call the processor's `init` and learn its state variables. Unpickled whole,
a sparkbeam processor imports Beam there, ~1 s of a query's start per operator; the shell
registers the one state variable every keyed processor keeps and leaves the processor packed.
In a task the processor is unpacked at the first key and bound to the handle and the state the
shell registered; a task (or the planning process) that never saw a key has nothing to close: a
keyed processor's `close` writes holds and metrics only for a batch it ran keys in.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any, Protocol

from pyspark import cloudpickle
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle

# PySpark's process that calls a processor's `init` at a query's first batch.
PLANNING_MODULE = "pyspark.sql.streaming.transform_with_state_driver_worker"


def quiet_planning_process() -> None:
    """In PySpark's planning process only (`PLANNING_MODULE` run as `__main__`), its standard
    output goes nowhere from now on. That process prints to its stdout, which Spark copies to
    the driver's stderr, the UDF's repr, the state server's port and "Starting/Completed
    execution" per operator: a user saw them at the start of every streaming job. Its protocol
    with the JVM is a socket, not stdout, so the file descriptor itself is replaced. Its first
    line ("Starting ... Python worker.") is printed, unbuffered, before Spark unpickles the
    shell (which loads this module), and stays."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name == PLANNING_MODULE:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


quiet_planning_process()

# The one Spark state variable of a keyed processor: its grouping key's entries, each key's Beam
# state as a blob beside what it waits for (`buckets.py`).
BLOB_STATE = ("beam", "entries binary")


class Bindable(Protocol):
    # Whether it keys its state by buckets of the rows' Beam keys, else by spread keys: the
    # query groups its rows accordingly.
    bucketed: bool

    def bind(self, handle: StatefulProcessorHandle, blob: Any) -> None: ...
    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any  # noqa: N802, N803
                        ) -> Iterator[Any]: ...
    def handleExpiredTimer(self, key: Any, timerValues: Any,  # noqa: N802, N803
                           expiredTimerInfo: Any) -> Iterator[Any]: ...  # noqa: N803
    def close(self) -> None: ...


class ProcessorShell(StatefulProcessor):  # type: ignore[misc]
    def __init__(self, processor: Bindable) -> None:
        self.name = type(processor).__name__
        self.packed = cloudpickle.dumps(processor)

    def __repr__(self) -> str:
        return f"ProcessorShell({self.name})"

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.blob = handle.getValueState(*BLOB_STATE)
        self.processor: Bindable | None = None

    def _unpacked(self) -> Bindable:
        if self.processor is None:
            processor: Bindable = cloudpickle.loads(self.packed)
            processor.bind(self.handle, self.blob)
            self.processor = processor
        return self.processor

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any  # noqa: N802, N803
                        ) -> Iterator[Any]:
        return self._unpacked().handleInputRows(key, rows, timerValues)

    def handleExpiredTimer(self, key: Any, timerValues: Any,  # noqa: N802, N803
                           expiredTimerInfo: Any) -> Iterator[Any]:  # noqa: N803
        return self._unpacked().handleExpiredTimer(key, timerValues, expiredTimerInfo)

    def close(self) -> None:
        if self.processor is not None:
            self.processor.close()
