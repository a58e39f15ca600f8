"""Exactly-once file output for streaming jobs: files named by micro-batch and partition.

`WriteToFilesPerBatch(directory)` writes each element (as a text line) into
`<directory>/batch-<B>-part-<P>-<n>.txt`, where B is the Structured Streaming micro-batch and P
the Spark partition of the task that wrote it. A task attempt first deletes what an earlier
attempt of the same (batch, partition) left, then writes each bundle to a temporary file renamed
into place once complete. A micro-batch replayed after a crash recomputes the same partitions
from the same offsets and state, so it replaces its own files instead of adding to them: no
duplicates, nothing lost. Outside streaming (batch jobs, other runners) B is `batch`.
"""
from __future__ import annotations

import glob
import os
import uuid
from collections.abc import Iterator
from typing import Any

import apache_beam as beam


def _task_identity() -> tuple[str, int, int] | None:
    """(micro-batch, partition, task attempt id) of the Spark task running this code; None
    outside a Spark task (another runner: no replays to guard against)."""
    try:
        from pyspark import TaskContext
    except ImportError:  # pragma: no cover - not on Spark
        return None
    tc = TaskContext.get()
    if tc is None:
        return None
    batch = tc.getLocalProperty("streaming.sql.batchId")
    return (f"{int(batch):06d}" if batch is not None else "batch", tc.partitionId(),
            tc.taskAttemptId())


# (directory, task attempt id) -> the next file number of that attempt, per process: a Spark
# task runs in one Python worker, but not always in one DoFn instance (a stage run per key may
# start a new bundle processor per key), and every instance must add to the attempt's files.
_ATTEMPTS: dict[tuple[str, int], int] = {}
_KEPT_ATTEMPTS = 256


class _WritePerBatch(beam.DoFn):
    def __init__(self, directory: str, suffix: str) -> None:
        self.directory = directory
        self.suffix = suffix

    def setup(self) -> None:
        os.makedirs(self.directory, exist_ok=True)

    def start_bundle(self) -> None:
        self._lines: list[str] = []
        identity = _task_identity()
        if identity is None:
            self._prefix = ("batch", os.getpid())
            self._unique = uuid.uuid4().hex[:12]
            return
        self._unique = ""
        batch, partition, attempt = identity
        self._attempt = (self.directory, attempt)
        if self._attempt not in _ATTEMPTS:
            # First bundle of this task attempt: what an earlier attempt of the same batch and
            # partition wrote is replaced, not added to.
            for stale in glob.glob(self._path(batch, partition, "*")):
                os.remove(stale)
            _ATTEMPTS[self._attempt] = 0
            while len(_ATTEMPTS) > _KEPT_ATTEMPTS:
                del _ATTEMPTS[next(iter(_ATTEMPTS))]
        self._prefix = (batch, partition)

    def process(self, element: Any) -> Iterator[Any]:
        self._lines.append(element if isinstance(element, str) else repr(element))
        return iter(())

    def finish_bundle(self) -> None:
        if not self._lines:
            return
        batch, partition = self._prefix
        if not self._unique:
            count = _ATTEMPTS.get(self._attempt, 0)
            _ATTEMPTS[self._attempt] = count + 1
        final = self._path(batch, partition, self._unique or f"{count:05d}")
        temporary = os.path.join(self.directory, f".tmp-{uuid.uuid4().hex}")
        with open(temporary, "w", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in self._lines))
        os.replace(temporary, final)
        self._lines = []

    def _path(self, batch: str, partition: int, n: str) -> str:
        return os.path.join(self.directory, f"batch-{batch}-part-{partition:05d}-{n}{self.suffix}")


class WriteToFilesPerBatch(beam.PTransform):
    """Writes elements as text lines, exactly once per micro-batch (see the module doc)."""

    def __init__(self, directory: str, suffix: str = ".txt") -> None:
        super().__init__()
        self.directory = directory
        self.suffix = suffix

    def expand(self, pcoll: Any) -> Any:
        return pcoll | "WritePerBatch" >> beam.ParDo(_WritePerBatch(self.directory, self.suffix))


def read_lines(directory: str, suffix: str = ".txt") -> list[str]:
    """Every line written so far, in file order."""
    lines: list[str] = []
    for path in sorted(glob.glob(os.path.join(directory, f"batch-*{suffix}"))):
        with open(path, encoding="utf-8") as f:
            lines.extend(line.rstrip("\n") for line in f)
    return lines
