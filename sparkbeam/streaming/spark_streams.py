"""ReadFromSpark of a stream in a streaming job: Spark's `readStream` as a root of the query.

The stream's DataFrame is part of the job's query, beside the sparkbeam source: each micro-batch
Spark reads what its source admits (new files in a landing directory, Kafka offsets, rate
rows) and a `mapInArrow` task turns each Arrow batch into the consuming stage's elements
(`StreamRows`): the Beam row, timestamped by the read's timestamp column or else by the
micro-batch's processing time, in the global window.

Its watermark is part of the runner's (`script.offset_for`), worked out when the sparkbeam
source plans the next micro-batch (`stream_watermark`), so every stage sees it as it sees a
TestStream's:
- under processing time, the batch's own processing time less a microsecond: every element of
  it and of later batches is stamped at or after it, so none is ever late;
- under event time, the latest timestamp read by the batches before it, less the read's
  `watermark_delay` (Spark's `withWatermark` rule): a task records the latest timestamp of
  its rows per (batch, partition) in `reads/<tag>/`, and Spark plans a batch only after the
  one before it has run. A row older than that is late because of the data, not the runner.
A drained job's watermark goes to its end; whatever Spark reads after that is late.

The work budget (`--max_items_per_batch`, `--max_bytes_per_batch`) becomes the source's own
limit where Spark's source has one that counts the same thing (`spark_limits`): Kafka's
`maxOffsetsPerTrigger` counts records (items), the file source's and Delta's
`maxBytesPerTrigger` bytes of files (at least one file a batch). Each stream gets the whole
budget, as each of Spark's sources applies its own; a limit the user set is kept, and a
dimension the source cannot limit is said in the log, per read.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from sparkbeam.streaming.checkpoint import write_hold
from sparkbeam.streaming.script import MAX_MICROS, MIN_MICROS

_LOG = logging.getLogger(__name__)
_KEPT_BATCHES = 3  # recorded batches kept behind the newest (older ones are in the offsets)


@dataclass(frozen=True)
class StreamClock:
    """What the sparkbeam source needs of one stream read to work out its watermark."""

    name: str  # the read's buffer tag, as text (the offset's key)
    directory: str  # `CheckpointLayout.spark_read_dir`: the latest timestamps tasks read
    event_time: bool
    delay_micros: int

    def as_text(self) -> str:
        return f"{self.name}|{int(self.event_time)}|{self.delay_micros}|{self.directory}"

    @classmethod
    def from_text(cls, text: str) -> StreamClock:
        name, event, delay, directory = text.split("|", 3)
        return cls(name, directory, event == "1", int(delay))


def stream_watermark(clocks: tuple[StreamClock, ...], previous: dict, processing: int
                     ) -> tuple[int, dict[str, int]]:
    """(the streams' watermark for the batch being planned, the latest timestamp read so far
    per event-time stream: the offset keeps it, so a replay sees the same watermark)."""
    seen = {k: int(v) for k, v in previous.get("seen", {}).items()}
    watermark = MAX_MICROS
    for clock in clocks:
        if not clock.event_time:
            watermark = min(watermark, processing - 1)
            continue
        latest = max(seen.get(clock.name, MIN_MICROS), _recorded(clock.directory))
        seen[clock.name] = latest
        watermark = min(watermark, latest - clock.delay_micros if latest > MIN_MICROS
                        else MIN_MICROS)
    return max(watermark, MIN_MICROS), seen


def _recorded(directory: str) -> int:
    """The latest timestamp the stream's tasks recorded; files of batches well behind the
    newest go (their batches' offsets hold what they said)."""
    try:
        names = [n for n in os.listdir(directory) if n.startswith("batch-")]
    except FileNotFoundError:
        return MIN_MICROS
    latest = MIN_MICROS
    newest = max((int(n.split("-")[1]) for n in names), default=0)
    for name in names:
        path = os.path.join(directory, name)
        try:
            with open(path, encoding="ascii") as f:
                latest = max(latest, int(f.read()))
            if int(name.split("-")[1]) < newest - _KEPT_BATCHES:
                os.remove(path)
        except FileNotFoundError:
            continue
    return latest


@dataclass(frozen=True)
class StreamRows:
    """One stream read's `mapInArrow` task: Spark rows in, rows (tag, key, value) of the
    consuming stage's input buffer out (`module doc`)."""

    transform: str
    source: bytes  # the pickled SparkSource: `.query`, `.to_beam()`
    tag: int
    coder_id: str  # the windowed coder of the stage input
    components: bytes
    checkpoint: str
    clock: StreamClock

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from sparkbeam.engine.task_errors import encoded_error

        try:
            yield from self._rows(batches)
        except Exception as exc:  # noqa: BLE001 - named for the driver (`task_errors`)
            raise RuntimeError(encoded_error(self.transform, self.transform, exc, "worker")
                               ) from exc

    def _rows(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from apache_beam.internal import pickler
        from apache_beam.transforms.window import GlobalWindow
        from apache_beam.utils.timestamp import Timestamp
        from apache_beam.utils.windowed_value import WindowedValue
        from pyspark import TaskContext

        from sparkbeam.engine.context import pipeline_context
        from sparkbeam.streaming.checkpoint import CheckpointLayout, OffsetLogClock

        tc = TaskContext.get()
        batch_id = int(tc.getLocalProperty("streaming.sql.batchId") or 0) if tc else 0
        source = pickler.loads(self.source)
        query = source.query
        to_rows = source.to_beam()
        impl = pipeline_context(self.components).coders[self.coder_id].get_impl()
        window = (GlobalWindow(),)
        processing = None
        if not self.clock.event_time:
            layout = CheckpointLayout(self.checkpoint)
            processing = Timestamp(micros=OffsetLogClock(layout).of_batch(batch_id).processing)
        latest = MIN_MICROS
        for batch in batches:
            rows = list(to_rows(batch))
            if processing is not None:
                values = [impl.encode_nested(WindowedValue(r, processing, window)) for r in rows]
            else:
                micros = _micros(batch, query.timestamp_column, query)
                if micros:
                    latest = max(latest, max(micros))
                values = [impl.encode_nested(WindowedValue(r, Timestamp(micros=m), window))
                          for r, m in zip(rows, micros, strict=True)]
            yield pa.RecordBatch.from_arrays(
                [pa.array([self.tag] * len(values), pa.int32()),
                 pa.nulls(len(values), pa.binary()), pa.array(values, pa.binary())],
                names=["tag", "key", "value"])
        if latest > MIN_MICROS:
            write_hold(self.clock.directory, batch_id, tc.partitionId() if tc else 0, latest)


_PER_UNIT = {"s": 1_000_000, "ms": 1_000, "us": 1, "ns": None}


def _micros(batch: pa.RecordBatch, column: str, query: Any) -> list[int]:
    """The timestamp column of `batch` in microseconds; a null is refused, naming it."""
    index = batch.schema.get_field_index(column)
    if index < 0:  # e.g. a table whose schema changed since the pipeline was built
        raise ValueError(f"{query.describe()} has no column {column} (timestamp_column) in "
                         f"{batch.schema.names}")
    array = batch.column(index)
    if array.null_count:
        raise ValueError(f"a row of {query.describe()} has no {column} (null): its event time "
                         "is unknown")
    unit = array.type.unit if pa.types.is_timestamp(array.type) else "us"
    ints = array.cast(pa.int64()).to_pylist()
    per = _PER_UNIT[unit]
    return [v * per for v in ints] if per is not None else [v // 1000 for v in ints]


# Spark's sources whose own limits count what a budget dimension counts: format -> (the
# option limiting items, the option limiting bytes); Spark's file formats limit bytes too.
# Spark's file source refuses a byte limit beside `maxFilesPerTrigger`; Delta takes both.
_LIMITS: dict[str, tuple[str | None, str | None]] = {
    "kafka": ("maxOffsetsPerTrigger", None),
    "delta": (None, "maxBytesPerTrigger"),
}
_FILES = (None, "maxBytesPerTrigger")
_EXCLUSIVE = {"maxBytesPerTrigger": "maxFilesPerTrigger"}  # for the file source only


def spark_limits(query: Any, max_items: int | None, max_bytes: int | None
                 ) -> tuple[dict[str, str], list[str]]:
    """(the source options the work budget sets on `query`'s stream, what it cannot set and
    why): `module doc`. Options the user gave win, compared as Spark does, ignoring case."""
    # Imported here: Spark's planning processes import this module (for `StreamClock`) and
    # must not load apache_beam, which `urns` does.
    from sparkbeam.urns import SPARK_FILE_FORMATS

    given = {k.lower() for k, _ in query.options}
    fmt = (query.format or "").lower()
    item_option, byte_option = _LIMITS.get(
        fmt, _FILES if fmt in SPARK_FILE_FORMATS else (None, None))
    limits: dict[str, str] = {}
    unset: list[str] = []
    where = "a table's stream" if query.table else f"Spark's {fmt} source"
    for flag, value, option, unit in (("max_items_per_batch", max_items, item_option, "items"),
                                      ("max_bytes_per_batch", max_bytes, byte_option, "bytes")):
        if not value:
            continue
        if option is None:
            unset.append(f"--{flag}: {where} has no limit counting {unit}")
        elif option.lower() in given:
            unset.append(f"--{flag}: {option} is set in options=")
        elif fmt != "delta" and _EXCLUSIVE.get(option, "").lower() in given:
            unset.append(f"--{flag}: Spark's file source takes no {option} beside "
                         f"{_EXCLUSIVE[option]}, set in options=")
        else:
            limits[option] = str(value)
    return limits, unset


def stream_reads(spark: Any, splan: Any, layout: Any, max_items: int | None = None,
                 max_bytes: int | None = None) -> dict[int, tuple[StreamRows, Any]]:
    """buffer tag -> (its task, the stream's DataFrame) for each ReadFromSpark of the plan
    (`streaming.plan.StreamingPlan`), limited by the work budget where the source can be
    (`spark_limits`); a stream Spark cannot open fails the job, named."""
    from apache_beam.internal import pickler

    from sparkbeam.errors import ExecutionError

    plan = splan.plan
    coders = {i.buffer_id: i.coder_id for s in splan.stages for i in s.inputs}
    out: dict[int, tuple[StreamRows, Any]] = {}
    for buffer_id, read in sorted(plan.spark_reads.items()):
        if buffer_id not in coders:
            continue  # nothing reads it
        source = pickler.loads(read.source)
        query = source.query
        tag = splan.tag(buffer_id)
        limits, unset = spark_limits(query, max_items, max_bytes)
        if limits or unset:
            _LOG.info("%s: the work budget %s", read.transform, "; ".join(
                [f"sets {k}={v}" for k, v in limits.items()]
                + [f"does not apply ({u})" for u in unset]))
        try:
            frame = query.stream_dataframe(spark, limits)
        except Exception as exc:  # noqa: BLE001 - Spark's analysis errors, named
            raise ExecutionError(f"{read.transform}: Spark cannot read {read.described}: "
                                 f"{type(exc).__name__}: {exc}") from exc
        clock = StreamClock(str(tag), layout.spark_read_dir(tag),
                            query.timestamp_column is not None, query.watermark_delay_micros)
        out[tag] = (StreamRows(read.transform, read.source, tag, coders[buffer_id],
                               plan.components, layout.root, clock), frame)
    return out
