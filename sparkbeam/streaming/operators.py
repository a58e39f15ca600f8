"""The Spark side of streaming stages: what runs inside `mapInArrow` and `transformWithState`.

A stateless stage runs the stage task (`engine/task.py`) over each micro-batch's
rows. A GroupByKey runs as `transformWithState` keyed by the encoded key, in ProcessingTime mode:
Beam's state and timers for the key are one blob (`gbk.py`), and a key that still has Beam timers
keeps one Spark timer a millisecond after the batch, so it is woken next batch and fires whatever
the new runner time allows (processing-time timers therefore fire within one trigger interval).
The runner's time comes from the offset log (`checkpoint.py`).
"""
from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import Row
from pyspark.sql import types as T
from pyspark.sql.streaming import StatefulProcessorHandle

from sparkbeam.engine.arrow import rows_of, to_arrow_batches
from sparkbeam.engine.context import pipeline_context, prepare
from sparkbeam.engine.side_inputs import side_input_state
from sparkbeam.engine.task import METRICS_TAG, TaskSpec, report_infos, run_stage_task
from sparkbeam.engine.task_errors import error_payload
from sparkbeam.engine.watermarks import held_watermarks, holds_back, watermark_at_start
from sparkbeam.plan.model import Grouping
from sparkbeam.streaming.buckets import dump_entries, load_entries
from sparkbeam.streaming.checkpoint import (
    CheckpointLayout,
    FileHoldStore,
    OffsetLogClock,
    SideStore,
    write_hold,
    write_side_file,
    write_waiting,
)
from sparkbeam.streaming.gbk import dump_state, earliest_hold, grouper, load_state, pending_of
from sparkbeam.streaming.script import EVERY_BATCH, MAX_MICROS, Pending, RunnerTime
from sparkbeam.streaming.sides import (
    SideReadiness,
    StreamingSide,
    reader_bound,
    values_of,
    visible_elements,
)
from sparkbeam.streaming.splittable import SplittableKey, spread_endpoint
from sparkbeam.streaming.stateful import KeyStage, rows_by_input

# A type object, not DDL text: text goes through Spark's SQL parser (sparkbeam/execute/dataset.py).
ROW_SCHEMA = T.StructType([T.StructField("tag", T.IntegerType()),
                           T.StructField("key", T.BinaryType()),
                           T.StructField("value", T.BinaryType())])


@dataclass(frozen=True)
class StageTask:
    """A stateless stage over tagged rows: buffer tags in, buffer tags out."""

    spec: TaskSpec
    input_tags: dict[int, int]  # buffer tag -> stage input index
    output_tags: tuple[int, ...]  # stage output index -> buffer tag

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        tc = TaskContext.get()
        batch_id = int(tc.getLocalProperty("streaming.sql.batchId") or 0) if tc else 0
        attempt = (batch_id, tc.partitionId(), tc.attemptNumber()) if tc else (0, 0, 0)
        rows = ((self.input_tags[tag], key, value) for tag, key, value in rows_of(batches))
        outputs = run_stage_task(self.spec, rows, {}, attempt)
        # Streaming metrics reach the driver through the metrics channel, not as rows.
        yield from to_arrow_batches(
            (self.output_tags[index], key, value)
            for index, key, value in outputs
            if index != METRICS_TAG
        )


class _KeyedProcessor:
    """Beam state and pending timers of many keys in one Spark state value per grouping key,
    one Spark wake-up timer per grouping key while any of its keys waits, the runner's time
    from the offset log; Spark runs it inside a `shell.ProcessorShell`, which registers the
    state value and calls `bind`.

    A grouping key is a bucket of Beam keys (`buckets.py`) for operators keyed by the Beam
    key, or one spread key (whose only key is itself). Its state value holds, per key, the
    key's blob and what it waits for (`script.Pending`), so a bucket costs Spark's per-key
    calls (set the key, read, write, timer) once per micro-batch however many of its keys
    the batch touches. While a key waits, the bucket's Spark timer, a millisecond after the
    batch, wakes it next batch; woken, it runs the keys whose timers are due and only counts
    the others' holds (their blobs are not decoded). A key runs at most once per batch: for its
    input, timers due then included, or when woken."""

    def __init__(self, pickle_library: str, checkpoint: str, holds: tuple[str, ...] = ()
                 ) -> None:
        self.pickle_library = pickle_library
        self.checkpoint = checkpoint
        # Holding stages upstream (`watermarks.holds_back`): they bound the watermark.
        self.holds = holds

    def bind(self, handle: StatefulProcessorHandle, blob: Any) -> None:
        """Ready for keys, with the grouping key's state value `blob` (the shell registers
        it)."""
        prepare(self.pickle_library)
        self.handle = handle
        self.blob = blob
        self.layout = CheckpointLayout(self.checkpoint)
        self.clock = OffsetLogClock(self.layout)
        self.hold_store = FileHoldStore(self.layout)
        self.batch = -1
        # The earliest hold (pending output time, waiting element, residual restriction) of
        # what this task ran in its batch; holding stages write it at close.
        self.hold = MAX_MICROS
        self._ran: set[bytes] = set()  # keys run in this task's batch
        # A batch past the end of input (`RunnerTime.done`) that left a key waiting: the
        # driver must not end the job after it (`write_waiting`).
        self._waits_at_end = False

    def handleInputRows(self, key: Any, rows: Iterator[Row], timerValues: Any) -> Iterator[Row]:  # noqa: N802
        return self._step(key[0], list(rows), timerValues, woken=False)

    def handleExpiredTimer(  # noqa: N802
        self, key: Any, timerValues: Any, expiredTimerInfo: Any  # noqa: N803
    ) -> Iterator[Row]:
        return self._step(key[0], [], timerValues, woken=True)

    #: Grouped by buckets of Beam keys (the rows' `key`), not by a spread key.
    bucketed = False

    def _keys_of(self, group: Any, rows: list[Row]) -> dict[bytes, list[Row]]:
        """The rows of grouping key `group` by the key they belong to: their Beam key in a
        bucket, else the grouping key itself (a spread key)."""
        if not self.bucketed:
            return {bytes(group): rows} if rows else {}
        by_key: dict[bytes, list[Row]] = {}
        for row in rows:
            by_key.setdefault(bytes(row.key), []).append(row)
        return by_key

    def _process(self, key: bytes, rows: list[Row], blob: bytes | None, time: RunnerTime
                 ) -> tuple[list[Row], bytes | None, Pending | None]:
        """(output rows, the key's new blob or None, what it waits for or None)."""
        raise NotImplementedError

    def _step(self, group: Any, rows: list[Row], timer_values: Any, woken: bool
              ) -> Iterator[Row]:
        now_ms = timer_values.getCurrentProcessingTimeInMs()
        batch, time = self.clock.at(now_ms)
        if batch != self.batch:
            self.batch, self._ran, self._waits_at_end = batch, set(), False
        time = self._held(time)
        saved = self.blob.get()  # None when no key of the group has state
        entries = load_entries(saved[0] if saved is not None else None)
        armed = any(pending is not None for _, pending in entries.values())
        out: list[Row] = []
        changed = False
        work = self._keys_of(group, rows)
        for key, (_, pending) in entries.items():
            if (pending is not None and key not in work and key not in self._ran
                    and pending.due(time)):
                work[key] = []
        for key, key_rows in work.items():
            self._ran.add(key)
            blob, _ = entries.get(key, (None, None))
            key_out, blob, pending = self._process(key, key_rows, blob, time)
            out.extend(key_out)
            changed = True
            if blob is None and pending is None:
                entries.pop(key, None)
            else:
                entries[key] = (blob, pending)
        waiting = [pending for _, pending in entries.values() if pending is not None]
        for pending in waiting:
            self.hold = min(self.hold, pending.hold)
        if waiting and time.done:
            self._waits_at_end = True
        if waiting and (woken or not armed):
            # Invariant: a group with a waiting key has one Spark timer set, expiring next
            # batch (an armed group's timer expires in this batch and is set again then).
            self.handle.registerTimer(now_ms + 1)
        if changed:
            if entries:
                self.blob.update((dump_entries(entries),))
            else:
                self.blob.clear()
        return iter(out)

    def _held(self, time: RunnerTime) -> RunnerTime:
        """Downstream of holding stages, event time runs one batch behind, held back by the
        work still waiting there (`engine.watermarks`)."""
        if not self.holds:
            return time
        before, after = held_watermarks(self.batch, self.holds, self.hold_store,
                                        self._runner_watermark_at_start)
        return dataclasses.replace(time, watermark_before=before, watermark=after)

    def _runner_watermark_at_start(self, batch: int) -> int:
        return self.clock.of_batch(batch).watermark_before

    def _watermark_at_start(self, batch: int, holds: tuple[str, ...]) -> int:
        return watermark_at_start(self._runner_watermark_at_start(batch), holds,
                                  self.hold_store, batch)

    def close(self) -> None:
        """Every subclass's close ends here (a group not visited this batch has no key waiting:
        one that had would have been woken by its timer)."""
        if self._waits_at_end and self.batch >= 0:
            tc = TaskContext.get()
            write_waiting(self.layout, self.batch, tc.partitionId() if tc else 0)

    def _write_hold(self, label: str, hold: int) -> None:
        """A holding stage's task records its earliest hold for this batch (`sides.py`); the
        stages downstream read it at the start of the next batch."""
        if self.batch < 0:
            return
        tc = TaskContext.get()
        write_hold(self.layout.hold_dir(label), self.batch, tc.partitionId() if tc else 0, hold)


class GroupByKeyProcessor(_KeyedProcessor):
    """One GroupByKey of a streaming job: rows (tag, key, value) of its input buffer in, panes
    (output tag, key, KV<key, iterable>) out."""

    bucketed = True

    def __init__(self, grouping: Grouping, components: bytes, pickle_library: str,
                 output_tag: int, checkpoint: str, holds: tuple[str, ...] = (),
                 hold_label: str | None = None) -> None:
        super().__init__(pickle_library, checkpoint, holds)
        self.grouping = grouping
        self.components = components
        self.output_tag = output_tag
        self.hold_label = hold_label  # set when its panes may be timestamped before window end

    def bind(self, handle: StatefulProcessorHandle, blob: Any) -> None:
        super().bind(handle, blob)
        self.grouper = grouper(self.grouping, self.components)

    def close(self) -> None:
        super().close()
        if self.hold_label is not None:
            # Keys with buffered windows have trigger timers, so they are woken every batch.
            self._write_hold(self.hold_label, self.hold)

    def _process(self, key: bytes, rows: list[Row], blob: bytes | None, time: RunnerTime
                 ) -> tuple[list[Row], bytes | None, Pending | None]:
        state = load_state(blob)
        panes = self.grouper.process(key, state, [bytes(r.value) for r in rows],
                                     time.watermark_before, time.watermark,
                                     time.processing_before, time.processing)
        out = [Row(tag=self.output_tag, key=key, value=p) for p in panes]
        hold = earliest_hold(state) if self.hold_label is not None else MAX_MICROS
        pending = pending_of(state, hold)
        return out, dump_state(state), pending


class _PerKeyStageProcessor(_KeyedProcessor):
    """A stage run key by key: one metrics report per task (micro-batch, partition) with the
    infos of all its keys."""

    def __init__(self, task: StageTask, checkpoint: str, holds: tuple[str, ...] = ()) -> None:
        super().__init__(task.spec.pickle_library, checkpoint, holds)
        self.task = task

    def bind(self, handle: StatefulProcessorHandle, blob: Any) -> None:
        super().bind(handle, blob)
        self.failed = False

    def _take_infos(self) -> list[Any]:
        raise NotImplementedError

    def close(self) -> None:
        super().close()
        infos = self._take_infos()
        spec = self.task.spec
        if self.batch < 0 or not infos or not spec.metrics_address:
            return
        tc = TaskContext.get()
        partition, attempt = (tc.partitionId(), tc.attemptNumber()) if tc else (0, 0)
        report_infos(spec, (self.batch, partition, attempt), infos, ok=not self.failed)


class StatefulStageProcessor(_PerKeyStageProcessor):
    """A stage with a stateful DoFn: the key's elements and due timers through the SDK's bundle
    processor, its user state and timers in the blob (`stateful.py`)."""

    bucketed = True

    def bind(self, handle: StatefulProcessorHandle, blob: Any) -> None:
        super().bind(handle, blob)
        self.key_stage = KeyStage(self.task.spec)

    def _take_infos(self) -> list[Any]:
        return self.key_stage.take_infos()

    def close(self) -> None:
        super().close()
        if holds_back(self.task.spec.stage):
            # Keys with pending timers are woken every batch, so every such key was seen.
            self._write_hold(self.task.spec.stage.label, self.hold)

    def _process(self, key: bytes, rows: list[Row], blob: bytes | None, time: RunnerTime
                 ) -> tuple[list[Row], bytes | None, Pending | None]:
        inputs = rows_by_input((self.task.input_tags[r.tag], bytes(r.value)) for r in rows)
        try:
            out, blob, pending = self.key_stage.step(blob, inputs, time)
        except Exception as exc:  # noqa: BLE001 - reported with the stage and transform
            self.failed = True
            raise RuntimeError(error_payload(self.task.spec.stage, exc)) from None
        rows_out = [Row(tag=self.task.output_tags[index], key=k, value=v)
                    for index, k, v in out]
        return rows_out, blob, pending


@dataclass(frozen=True)
class SideWriter:
    """Writes one side-input buffer's rows of this task to the checkpoint (`sides.py`); emits
    nothing."""

    directory: str

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        tc = TaskContext.get()
        assert tc is not None, "side-input buffers are written by Spark tasks"
        batch = tc.getLocalProperty("streaming.sql.batchId")
        if batch is None:  # every batch would be batch 0: later ones would be lost
            raise RuntimeError(f"writing {self.directory}: not in a micro-batch's task")
        write_side_file(self.directory, int(batch), tc.partitionId(), values_of(batches))
        yield from ()


class _SideView:
    """What a stage reading side inputs sees of them in one task's micro-batch: which
    main-input elements are ready (`sides.SideReadiness`), and the side-input data written by
    earlier batches (read once per batch)."""

    def __init__(self, processor: _KeyedProcessor, spec: TaskSpec,
                 sides: tuple[StreamingSide, ...]) -> None:
        self.processor = processor  # bound: its layout, batch and watermarks
        self.sides = sides
        ctx = pipeline_context(spec.components)
        stage = spec.stage
        self.readiness = SideReadiness(
            stage, sides,
            {n: ctx.coders[i.coder_id].get_impl() for n, i in enumerate(stage.inputs)})
        self.store = SideStore(processor.layout)
        self.ctx = ctx
        # What this batch's keys see, read once per batch: side tag -> visible elements, side
        # tag -> their windows, the state entries (the caches are of `_batch`).
        self._batch = -1
        self._seen: dict[int, list[bytes]] = {}
        self._filled: dict[int, set[Any]] = {}
        self._state: dict[bytes, list[bytes]] | None = None

    def split(self, held: list[tuple[int, bytes]]
              ) -> tuple[list[tuple[int, bytes]], list[tuple[int, bytes]], int]:
        """`SideReadiness.split` in this batch: (ready, still waiting, earliest waiting
        timestamp or MAX_MICROS)."""
        batch = self.processor.batch
        return self.readiness.split(
            held, lambda side: self.processor._watermark_at_start(batch, side.holds),
            self._windows_with_data)

    def _this_batch(self) -> int:
        batch = self.processor.batch
        if batch != self._batch:
            self._batch, self._seen, self._filled, self._state = batch, {}, {}, None
        return batch

    def _visible(self, side: StreamingSide) -> list[bytes]:
        """What this batch sees of `side` (`sides.visible_elements`)."""
        batch = self._this_batch()
        if side.tag not in self._seen:
            bound = reader_bound(side, batch, self.processor._runner_watermark_at_start,
                                 self.processor.hold_store)
            self._seen[side.tag] = visible_elements(
                self.store.batches(side.tag, batch),
                self.ctx.coders[side.use.coder_id].get_impl(), side.discarding, bound)
        return self._seen[side.tag]

    def _windows_with_data(self, side: StreamingSide) -> set[Any]:
        """The windows a (triggered) side input has elements in, as of this batch."""
        self._this_batch()
        if side.tag not in self._filled:
            impl = self.ctx.coders[side.use.coder_id].get_impl()
            self._filled[side.tag] = {w for data in self._visible(side)
                                      for w in impl.decode_nested(data).windows}
        return self._filled[side.tag]

    def state(self) -> dict[bytes, list[bytes]]:
        """The side inputs' data as the SDK's state API serves it, in this batch."""
        self._this_batch()
        if self._state is None:
            elements = {s.use.buffer_id: self._visible(s) for s in self.sides}
            self._state = side_input_state([s.use for s in self.sides], elements, self.ctx)
        return self._state


class SideInputStageProcessor(_KeyedProcessor):
    """A stage reading side inputs: its main-input elements wait in the state of a spread key
    (hash of the element modulo --parallelism) until the side inputs are ready for their
    windows, then run as a plain stage with the side inputs written by earlier batches."""

    def __init__(self, task: StageTask, sides: tuple[StreamingSide, ...], checkpoint: str
                 ) -> None:
        super().__init__(task.spec.pickle_library, checkpoint)
        self.task = task
        self.sides = sides

    def bind(self, handle: StatefulProcessorHandle, blob: Any) -> None:
        super().bind(handle, blob)
        self.view = _SideView(self, self.task.spec, self.sides)

    def close(self) -> None:
        super().close()
        self._write_hold(self.task.spec.stage.label, self.hold)

    def _process(self, key: bytes, rows: list[Row], blob: bytes | None, time: RunnerTime
                 ) -> tuple[list[Row], bytes | None, Pending | None]:
        held: list[tuple[int, bytes]] = pickle.loads(blob) if blob else []
        held.extend((self.task.input_tags[r.tag], bytes(r.value)) for r in rows)
        ready, waiting, hold = self.view.split(held)
        self.hold = min(self.hold, hold)
        out = []
        if ready:
            tc = TaskContext.get()
            attempt = (self.batch, int(key), tc.attemptNumber() if tc else 0)
            # A new bundle processor each time: Beam's DoFn runner keeps the values of
            # global-window side inputs for its lifetime, and these change batch by batch.
            outputs = run_stage_task(self.task.spec, ((n, None, v) for n, v in ready),
                                     self.view.state(), attempt, fresh_worker=True)
            out = [Row(tag=self.task.output_tags[index], key=k, value=v)
                   for index, k, v in outputs if index != METRICS_TAG]
        if not waiting:
            return out, None, None
        return out, pickle.dumps(waiting, protocol=5), EVERY_BATCH


class _ReadingSides(_PerKeyStageProcessor):
    """A stage run key by key whose DoFn reads side inputs: its view of them per batch
    (`_SideView`), and its key stage's worker for the batch closed with the task."""

    key_stage: Any  # a KeyStage or a SplittableKey: each has the batch worker `sided`

    def __init__(self, task: StageTask, sides: tuple[StreamingSide, ...], checkpoint: str,
                 holds: tuple[str, ...] = ()) -> None:
        super().__init__(task, checkpoint, holds)
        self.sides = sides

    def bind(self, handle: StatefulProcessorHandle, blob: Any) -> None:
        super().bind(handle, blob)
        self.view = _SideView(self, self.task.spec, self.sides)

    def close(self) -> None:
        super().close()
        self.key_stage.sided.close()


class StatefulSideInputProcessor(_ReadingSides, StatefulStageProcessor):
    """A stateful DoFn reading side inputs: per key, as `StatefulStageProcessor`, but each
    main-input element waits in the key's blob until the side inputs are ready for its window
    (as `SideInputStageProcessor`); due timers fire whatever waits. The blob is (the stateful
    stage's blob, the waiting elements)."""

    def _process(self, key: bytes, rows: list[Row], blob: bytes | None, time: RunnerTime
                 ) -> tuple[list[Row], bytes | None, Pending | None]:
        stage_blob, held = pickle.loads(blob) if blob else (None, [])
        held.extend((self.task.input_tags[r.tag], bytes(r.value)) for r in rows)
        ready, waiting, hold = self.view.split(held)
        inputs = rows_by_input(iter(ready))
        try:
            out, stage_blob, pending = self.key_stage.step(
                stage_blob, inputs, time, (self.batch, self.view.state()) if ready else None)
        except Exception as exc:  # noqa: BLE001 - reported with the stage and transform
            self.failed = True
            raise RuntimeError(error_payload(self.task.spec.stage, exc)) from None
        rows_out = [Row(tag=self.task.output_tags[index], key=k, value=v)
                    for index, k, v in out]
        if waiting:
            # Run every batch while elements wait; their earliest timestamp holds downstream.
            timers = pending or Pending()
            pending = Pending(EVERY_BATCH.event, timers.processing, min(timers.hold, hold))
        if stage_blob is None and not waiting:
            return rows_out, None, pending
        return rows_out, pickle.dumps((stage_blob, waiting), protocol=5), pending


class SplittableStageProcessor(_PerKeyStageProcessor):
    """A splittable DoFn stage (e.g. PeriodicImpulse's): each spread key's restrictions run as
    far as they can every micro-batch, their residuals wait in the blob (`splittable.py`), and
    the earliest watermark they report is this stage's hold for the stages downstream."""

    def bind(self, handle: StatefulProcessorHandle, blob: Any) -> None:
        super().bind(handle, blob)
        self.key_stage = SplittableKey(self.task.spec)

    def _take_infos(self) -> list[Any]:
        return self.key_stage.take_infos()

    def close(self) -> None:
        super().close()
        self._write_hold(self.task.spec.stage.label, self.hold)

    def _process(self, key: bytes, rows: list[Row], blob: bytes | None, time: RunnerTime
                 ) -> tuple[list[Row], bytes | None, Pending | None]:
        inputs = rows_by_input((self.task.input_tags[r.tag], bytes(r.value)) for r in rows)
        try:
            budget = time.budget_of(spread_endpoint(self.task.spec.stage.label, key))
            out, blob, hold = self.key_stage.step(blob, inputs, time, time.drained, budget,
                                                  self._sides())
        except Exception as exc:  # noqa: BLE001 - reported with the stage and transform
            self.failed = True
            raise RuntimeError(error_payload(self.task.spec.stage, exc)) from None
        self.hold = min(self.hold, hold)
        rows_out = [Row(tag=self.task.output_tags[index], key=k, value=v)
                    for index, k, v in out]
        return rows_out, blob, EVERY_BATCH if blob is not None else None

    def _sides(self) -> tuple[int, Mapping[bytes, list[bytes]]] | None:
        """(the micro-batch, the side-input data its restrictions read); None: it reads none."""
        return None


class SplittableSideInputProcessor(_ReadingSides, SplittableStageProcessor):
    """A splittable DoFn reading side inputs: per spread key, as `SplittableStageProcessor`,
    its restrictions and their residuals run with the side inputs as each micro-batch sees
    them. Its new elements need not wait here: Beam's SDF expansion gives the step before it,
    SplitAndSizeRestriction, the same side inputs, so they waited there (readiness only grows)
    and arrive ready."""

    def _sides(self) -> tuple[int, Mapping[bytes, list[bytes]]] | None:
        return self.batch, self.view.state()
