"""The runner's clock as a micro-batch sees it, read from the query's offset log (no pyspark).

Spark writes `<checkpoint>/offsets/<batch>` before it runs a batch: a version line, the batch
metadata (with `batchTimestampMs`, which is also what `transformWithState` reports as the current
processing time) and one offset per source. Our source's end offset carries the Beam watermark and
processing time before and after the batch (`script.offset_for`), so a keyed operator finds the
runner's time of the batch it runs in from the timestamp Spark hands it. A replayed batch reads the
same log entry: it sees the same times as the first attempt.
"""
from __future__ import annotations

import json
import os
import threading

from sparkbeam.streaming.script import RunnerTime, runner_time


class OffsetLogClock:
    """batch timestamp (ms) -> RunnerTime, from `<checkpoint>/offsets`; cached per process."""

    def __init__(self, checkpoint: str) -> None:
        self.directory = os.path.join(checkpoint, "offsets")
        self._by_timestamp: dict[int, RunnerTime] = {}
        self._batch_of: dict[int, int] = {}  # batch timestamp -> batch id
        self._by_batch: dict[int, RunnerTime] = {}
        self._read: set[str] = set()
        self._lock = threading.Lock()

    def at(self, batch_timestamp_ms: int) -> RunnerTime:
        with self._lock:
            found = self._by_timestamp.get(batch_timestamp_ms)
            if found is None:
                self._scan()
                found = self._by_timestamp.get(batch_timestamp_ms)
            if found is None:
                raise LookupError(
                    f"no micro-batch with timestamp {batch_timestamp_ms} in {self.directory}"
                )
            return found

    def batch_at(self, batch_timestamp_ms: int) -> int:
        """The id of the micro-batch with this timestamp."""
        self.at(batch_timestamp_ms)
        return self._batch_of[batch_timestamp_ms]

    def of_batch(self, batch: int) -> RunnerTime:
        """The runner's time of micro-batch `batch` (a recent one: the last 64 are scanned)."""
        with self._lock:
            if batch not in self._by_batch:
                self._scan()
            if batch not in self._by_batch:
                raise LookupError(f"no micro-batch {batch} in {self.directory}")
            return self._by_batch[batch]

    def _scan(self) -> None:
        names = sorted((n for n in os.listdir(self.directory) if n.isdigit()), key=int)
        for name in names[-64:]:
            if name in self._read:
                continue
            entry = read_offset_entry(os.path.join(self.directory, name))
            if entry is None:
                continue  # being written
            timestamp, offset = entry
            self._by_timestamp[timestamp] = self._by_batch[int(name)] = runner_time(offset)
            self._batch_of[timestamp] = int(name)
            self._read.add(name)


def read_offset_entry(path: str) -> tuple[int, dict] | None:
    """(batchTimestampMs, our source's offset) of one offset-log file, None if incomplete."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return None
    if len(lines) < 3:
        return None
    try:
        metadata = json.loads(lines[1])
        for line in lines[2:]:
            offset = json.loads(line)
            if isinstance(offset, dict) and "wm" in offset and "pos" in offset:
                return int(metadata["batchTimestampMs"]), offset
    except (ValueError, KeyError):
        return None
    return None
