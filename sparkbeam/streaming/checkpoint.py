"""The checkpoint directory of a streaming job: its layout, and the reading of Spark's offset log.

The one module that knows where things are under `--checkpoint_dir` (no pyspark):

    offsets/<batch>                 Spark's offset log (Spark writes it; read here only)
    sparkbeam-pipeline.json         the pipeline the directory belongs to (`pipeline_record.py`)
    commits/<batch>                 Spark's commit log (read: which batches have committed)
    state/, sources/                Spark's own (never read here)
    sides/<tag>/batch-B-part-P      one task's elements of a side-input buffer in batch B
    sides/<tag>/batch-K-compact     what readers still see of batches up to K (`sides.py`)
    staged/<n>/batch-B-part-P       exactly-once write n's input of batch B, until written
    holds/<label>/batch-B-part-P    one holding task's earliest hold at the end of batch B
    reads/<tag>/batch-B-part-P      the latest event time a Spark stream's task read in batch B
    spark-staged/<n>/batch-B-part-P WriteToSpark n's input of batch B, until written
    spark-written/<n>/batch-B       present once WriteToSpark n has written batch B
    drain                           present once the job is asked to drain

Spark writes `offsets/<B>` before it runs batch B: a version line (`v1`), the batch metadata
(JSON with `batchTimestampMs`, which is also what `transformWithState` reports as the current
processing time) and one offset per source. The sparkbeam source's offset carries the Beam
watermark and processing time before and after the batch (`script.offset_for`), so a keyed
operator finds the runner's time of the batch it runs in from the timestamp Spark hands it; a
replayed batch reads the same entry and sees the same times. An entry in any other format fails
the job at once (`CheckpointFormatError`, naming the file, what was expected and the Spark
version), never later as a missing batch.

Side and hold files are written under a temporary name and renamed into place; a replayed batch
rewrites the same files with the same contents.
"""
from __future__ import annotations

import json
import os
import struct
import threading
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import metadata

from sparkbeam.errors import ExecutionError
from sparkbeam.streaming.script import MAX_MICROS, RunnerTime, runner_time

_LENGTH = struct.Struct(">I")
_OFFSET_LOG_VERSION = "v1"
_SCANNED = 64  # offset-log entries a clock looks back over


class CheckpointFormatError(ExecutionError):
    """A file under the checkpoint directory is not in the format sparkbeam reads."""


@dataclass(frozen=True)
class CheckpointLayout:
    """Where each part of a streaming job's checkpoint lives."""

    root: str

    @property
    def offsets(self) -> str:
        return os.path.join(self.root, "offsets")

    def offset_file(self, batch: int) -> str:
        return os.path.join(self.offsets, str(batch))

    def side_dir(self, tag: int) -> str:
        return os.path.join(self.root, "sides", str(tag))

    def commit_file(self, batch: int) -> str:
        """Spark's record that `batch` committed."""
        return os.path.join(self.root, "commits", str(batch))

    def last_commit(self) -> int:
        """The last committed batch, -1 if none."""
        try:
            return max((int(n) for n in os.listdir(os.path.join(self.root, "commits"))
                        if n.isdigit()), default=-1)
        except FileNotFoundError:
            return -1

    def staged_dir(self, index: int) -> str:
        """Where an exactly-once write's input waits for its micro-batch to commit."""
        return os.path.join(self.root, "staged", str(index))

    def spark_read_dir(self, tag: int) -> str:
        return os.path.join(self.root, "reads", str(tag))

    def spark_staged_dir(self, index: int) -> str:
        """Where a WriteToSpark's input waits for its micro-batch to commit."""
        return os.path.join(self.root, "spark-staged", str(index))

    def spark_written_dir(self, index: int) -> str:
        """A WriteToSpark's record of the batches it has written out."""
        return os.path.join(self.root, "spark-written", str(index))

    def hold_dir(self, label: str) -> str:
        return os.path.join(self.root, "holds", label)

    @property
    def waiting_dir(self) -> str:
        """Where tasks of batches past the end of input record keys that still wait."""
        return os.path.join(self.root, "waiting")

    @property
    def pipeline_record(self) -> str:
        return os.path.join(self.root, "sparkbeam-pipeline.json")

    @property
    def drain_marker(self) -> str:
        """The file whose existence drains the job (the source reads it when planning)."""
        return os.path.join(self.root, "drain")


# -- Spark's offset log ---------------------------------------------------------------------

@dataclass(frozen=True)
class OffsetEntry:
    """One offset-log entry: the batch's timestamp and the sparkbeam source's offset."""

    timestamp_ms: int
    offset: dict


def read_offset_entry(path: str) -> OffsetEntry | None:
    """The entry in `path`; None while Spark has not written it. Raises
    `CheckpointFormatError` for an entry in a format this version does not read."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return None
    problem = _entry_problem(lines)
    if problem is not None:
        raise CheckpointFormatError(
            f"{path}: not an offset-log entry sparkbeam can read ({problem}; expected the "
            f"line '{_OFFSET_LOG_VERSION}', the batch metadata with batchTimestampMs, then "
            f"the sparkbeam source's offset with 'wm' and 'pos'; Spark {_spark_version()} "
            "wrote it). Was the directory written by another Spark version, or by a "
            "pipeline without sparkbeam's source?"
        )
    metadata_line = json.loads(lines[1])
    for line in lines[2:]:
        offset = _json_or_none(line)
        if isinstance(offset, dict) and "wm" in offset and "pos" in offset:
            return OffsetEntry(int(metadata_line["batchTimestampMs"]), offset)
    raise AssertionError("unreachable: _entry_problem found the source offset")


def _entry_problem(lines: list[str]) -> str | None:
    if not lines or lines[0].strip() != _OFFSET_LOG_VERSION:
        return f"its first line is {lines[0][:40]!r}" if lines else "it is empty"
    if len(lines) < 3:
        return f"it has {len(lines)} line(s)"
    meta = _json_or_none(lines[1])
    if not isinstance(meta, dict) or not isinstance(meta.get("batchTimestampMs"), int):
        return f"its metadata line is {lines[1][:80]!r}"
    offsets = [_json_or_none(line) for line in lines[2:]]
    if not any(isinstance(o, dict) and "wm" in o and "pos" in o for o in offsets):
        return f"none of its {len(offsets)} source offset(s) is sparkbeam's"
    return None


def _json_or_none(line: str) -> object:
    try:
        return json.loads(line)
    except ValueError:
        return None  # a source without an offset writes "-"


def _spark_version() -> str:
    try:
        return metadata.version("pyspark")
    except metadata.PackageNotFoundError:
        return "(unknown)"


class OffsetLogClock:
    """The runner's time of recent micro-batches, by batch id or batch timestamp, read from
    the offset log; each entry is read once per process."""

    def __init__(self, layout: CheckpointLayout) -> None:
        self.layout = layout
        self._by_timestamp: dict[int, tuple[int, RunnerTime]] = {}  # ms -> (batch, time)
        self._by_batch: dict[int, RunnerTime] = {}
        self._lock = threading.Lock()

    def at(self, batch_timestamp_ms: int) -> tuple[int, RunnerTime]:
        """(batch id, runner time) of the micro-batch with this timestamp."""
        with self._lock:
            if batch_timestamp_ms not in self._by_timestamp:
                self._scan()
            found = self._by_timestamp.get(batch_timestamp_ms)
        if found is None:
            raise ExecutionError(
                f"no micro-batch with timestamp {batch_timestamp_ms} among the last "
                f"{_SCANNED} entries of {self.layout.offsets}: the operator runs a batch the "
                "offset log does not name (expected Spark to log every batch before running it)"
            )
        return found

    def of_batch(self, batch: int) -> RunnerTime:
        """The runner's time of micro-batch `batch` (one of the last 64)."""
        with self._lock:
            if batch not in self._by_batch:
                self._scan()
            found = self._by_batch.get(batch)
        if found is None:
            raise ExecutionError(f"no micro-batch {batch} among the last {_SCANNED} entries "
                                 f"of {self.layout.offsets}")
        return found

    def _scan(self) -> None:
        try:
            names = sorted((n for n in os.listdir(self.layout.offsets) if n.isdigit()), key=int)
        except FileNotFoundError:
            return
        for name in names[-_SCANNED:]:
            batch = int(name)
            if batch in self._by_batch:
                continue
            entry = read_offset_entry(self.layout.offset_file(batch))
            if entry is None:
                continue
            time = runner_time(entry.offset)
            self._by_timestamp[entry.timestamp_ms] = (batch, time)
            self._by_batch[batch] = time


# -- side-input files -------------------------------------------------------------------------

def write_side_file(directory: str, batch: int, partition: int, values: list[bytes]) -> None:
    """One task's elements of a side-input buffer in one micro-batch (replaces an earlier
    attempt's file; nothing is written for an empty task)."""
    final = os.path.join(directory, f"batch-{batch:010d}-part-{partition:05d}")
    if not values:
        if os.path.exists(final):
            os.remove(final)
        return
    _write_values(directory, final, values)


def _write_values(directory: str, final: str, values: list[bytes]) -> None:
    """`values`, length-prefixed, written aside and renamed to `final` (a reader sees the
    whole file or none)."""
    os.makedirs(directory, exist_ok=True)
    temporary = os.path.join(directory, f".tmp-{uuid.uuid4().hex}")
    with open(temporary, "wb") as f:
        for value in values:
            f.write(_LENGTH.pack(len(value)))
            f.write(value)
    os.replace(temporary, final)


def read_side_file(path: str) -> list[bytes]:
    with open(path, "rb") as f:
        data = f.read()
    values, at = [], 0
    while at < len(data):
        (size,) = _LENGTH.unpack_from(data, at)
        at += _LENGTH.size
        values.append(data[at:at + size])
        at += size
    return values


def _side_batch(name: str) -> int:
    return int(name.split("-")[1])


def side_files(names: Iterable[str], before_batch: int) -> list[str]:
    """Of a side buffer's file names, those a reader of batch `before_batch` reads, in batch
    order: the newest compacted file before it (`batch-K-compact` holds all that readers
    still see of the batches up to K, and supersedes their files, which are left over only if
    compaction was interrupted), then the task files after K and before `before_batch`."""
    files = sorted(n for n in names if n.startswith("batch-"))
    compacted = [n for n in files if n.endswith(_COMPACT) and _side_batch(n) < before_batch]
    newest = max(compacted, key=_side_batch, default=None)
    since = _side_batch(newest) if newest is not None else -1
    return ([newest] if newest else []) + [
        n for n in files if not n.endswith(_COMPACT) and since < _side_batch(n) < before_batch]


_COMPACT = "-compact"


def write_compacted_side(directory: str, through_batch: int, values: list[bytes]) -> None:
    """Replaces the files of the batches up to `through_batch` by one holding `values` (what
    readers still see of them): written whole first, then the superseded files go."""
    name = f"batch-{through_batch:010d}{_COMPACT}"
    _write_values(directory, os.path.join(directory, name), values)
    for other in os.listdir(directory):
        if other.startswith("batch-") and other != name and _side_batch(other) <= through_batch:
            os.remove(os.path.join(directory, other))


class SideStore:
    """The elements of side-input buffers written before a micro-batch; files of finished
    batches never change, so each is read once per process (and forgotten once compacted)."""

    def __init__(self, layout: CheckpointLayout) -> None:
        self.layout = layout
        self._files: dict[int, dict[str, list[bytes]]] = {}
        self._lock = threading.Lock()

    def batches(self, tag: int, before_batch: int) -> list[tuple[int, list[bytes]]]:
        """(batch, its elements) of the files written before `before_batch`, in batch order
        (a compacted file counts as its last batch)."""
        directory = self.layout.side_dir(tag)
        with self._lock:
            try:
                present = os.listdir(directory)
            except FileNotFoundError:
                present = []
            cached = self._files.setdefault(tag, {})
            for gone in set(cached) - set(present):
                del cached[gone]  # compacted away
            out = []
            for name in side_files(present, before_batch):
                if name not in cached:
                    cached[name] = read_side_file(os.path.join(directory, name))
                out.append((_side_batch(name), cached[name]))
            return out

    def elements(self, tag: int, before_batch: int) -> list[bytes]:
        return [v for _, values in self.batches(tag, before_batch) for v in values]


# -- hold files ------------------------------------------------------------------------------

def write_hold(directory: str, batch: int, partition: int, hold: int) -> None:
    """A task's earliest hold at the end of a micro-batch (none: no file)."""
    final = os.path.join(directory, f"batch-{batch:010d}-part-{partition:05d}")
    if hold >= MAX_MICROS:
        if os.path.exists(final):
            os.remove(final)
        return
    os.makedirs(directory, exist_ok=True)
    temporary = os.path.join(directory, f".tmp-{uuid.uuid4().hex}")
    with open(temporary, "w", encoding="ascii") as f:
        f.write(str(hold))
    os.replace(temporary, final)


def write_waiting(layout: CheckpointLayout, batch: int, partition: int) -> None:
    """A keyed task of a batch past the end of input left a key waiting (a timer set while
    firing, elements waiting for side inputs, residual restrictions): the job is not over."""
    os.makedirs(layout.waiting_dir, exist_ok=True)
    name = f"batch-{batch:010d}-part-{partition:05d}-{uuid.uuid4().hex}"
    with open(os.path.join(layout.waiting_dir, name), "w", encoding="ascii") as f:
        f.write("waiting")


def anything_waiting(layout: CheckpointLayout, batch: int) -> bool:
    """Whether any keyed task of `batch` recorded a key still waiting (`write_waiting`)."""
    prefix = f"batch-{batch:010d}-"
    try:
        return any(n.startswith(prefix) for n in os.listdir(layout.waiting_dir))
    except FileNotFoundError:
        return False


class FileHoldStore:
    """The holds holding stages left at the end of finished micro-batches (`engine.HoldStore`
    over `holds/`); a finished batch's holds never change, so each is read once."""

    def __init__(self, layout: CheckpointLayout) -> None:
        self.layout = layout
        self._cache: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()

    def hold(self, labels: Iterable[str], batch: int) -> int:
        out = MAX_MICROS
        for label in labels:
            with self._lock:
                if (label, batch) not in self._cache:
                    self._cache[(label, batch)] = self._read(label, batch)
                out = min(out, self._cache[(label, batch)])
        return out

    def _read(self, label: str, batch: int) -> int:
        directory = self.layout.hold_dir(label)
        prefix = f"batch-{batch:010d}-"
        hold = MAX_MICROS
        try:
            names = [n for n in os.listdir(directory) if n.startswith(prefix)]
        except FileNotFoundError:
            return hold
        for name in names:
            with open(os.path.join(directory, name), encoding="ascii") as f:
                hold = min(hold, int(f.read()))
        return hold
