"""The Spark side of streaming stages: what runs inside `mapInArrow` and `transformWithState`.

A stateless stage runs the batch stage task (`execute/stage_task.py`) over each micro-batch's
rows. A GroupByKey runs as `transformWithState` keyed by the encoded key, in ProcessingTime mode:
Beam's state and timers for the key are one blob (`gbk.py`), and a key that still has Beam timers
keeps one Spark timer a millisecond after the batch, so it is woken next batch and fires whatever
the new runner time allows (processing-time timers therefore fire within one trigger interval).
The runner's time comes from the offset log (`clock.py`).
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql import Row
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle

from sparkbeam.execute.dataset import to_arrow_batches
from sparkbeam.execute.stage_task import METRICS_TAG, TaskSpec, run_stage_task
from sparkbeam.execute.task_errors import error_payload
from sparkbeam.plan.model import Grouping
from sparkbeam.streaming.clock import OffsetLogClock
from sparkbeam.streaming.gbk import dump_state, grouper, has_timers, load_state
from sparkbeam.streaming.script import RunnerTime
from sparkbeam.streaming.stateful import KeyStage, rows_by_input

ROW_SCHEMA = "tag int, key binary, value binary"


@dataclass(frozen=True)
class StageTask:
    """A stateless stage over tagged rows: buffer tags in, buffer tags out."""

    spec: TaskSpec
    input_tags: dict[int, int]  # buffer tag -> stage input index
    output_tags: tuple[int, ...]  # stage output index -> buffer tag

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        tc = TaskContext.get()
        batch_id = int(tc.getLocalProperty("streaming.sql.batchId") or 0) if tc else 0
        attempt = (batch_id, tc.partitionId(), tc.attemptNumber()) if tc else (0, 0, 0)
        rows = (
            (self.input_tags[tag], key, value)
            for batch in batches
            for tag, key, value in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(),
                                       batch.column(2).to_pylist(), strict=True)
        )
        outputs = run_stage_task(self.spec, rows, {}, attempt)
        # Streaming metrics reach the driver through the metrics channel, not as rows.
        yield from to_arrow_batches(
            (self.output_tags[index], key, value)
            for index, key, value in outputs
            if index != METRICS_TAG
        )


class _KeyedProcessor(StatefulProcessor):  # type: ignore[misc]
    """One blob of Beam state per key, one Spark wake-up timer while Beam timers are pending,
    the runner's time from the offset log."""

    def __init__(self, pickle_library: str, checkpoint: str) -> None:
        self.pickle_library = pickle_library
        self.checkpoint = checkpoint

    def init(self, handle: StatefulProcessorHandle) -> None:
        from sparkbeam.execute import worker_context

        worker_context.prepare(self.pickle_library)
        self.handle = handle
        self.blob = handle.getValueState("beam", "blob binary, wake long")
        self.clock = OffsetLogClock(self.checkpoint)

    def handleInputRows(self, key: Any, rows: Iterator[Row], timerValues: Any) -> Iterator[Row]:  # noqa: N802
        return self._step(bytes(key[0]), list(rows), timerValues, woken=False)

    def handleExpiredTimer(  # noqa: N802
        self, key: Any, timerValues: Any, expiredTimerInfo: Any  # noqa: N803
    ) -> Iterator[Row]:
        return self._step(bytes(key[0]), [], timerValues, woken=True)

    def _process(self, key: bytes, rows: list[Row], blob: bytes | None, time: RunnerTime
                 ) -> tuple[list[Row], bytes | None, bool]:
        raise NotImplementedError

    def _step(self, key: bytes, rows: list[Row], timer_values: Any, woken: bool) -> Iterator[Row]:
        now_ms = timer_values.getCurrentProcessingTimeInMs()
        saved = self.blob.get() if self.blob.exists() else None
        blob = bytes(saved[0]) if saved and saved[0] is not None else None
        wake = None if woken or not saved else saved[1]
        out, blob, pending = self._process(key, rows, blob, self.clock.at(now_ms))
        if pending and wake is None:
            wake = now_ms + 1
            self.handle.registerTimer(wake)
        if blob is None:
            self.blob.clear()
        else:
            self.blob.update((blob, wake))
        return iter(out)

    def close(self) -> None:
        pass


class GroupByKeyProcessor(_KeyedProcessor):
    """One GroupByKey of a streaming job: rows (tag, key, value) of its input buffer in, panes
    (output tag, key, KV<key, iterable>) out."""

    def __init__(self, grouping: Grouping, components: bytes, pickle_library: str,
                 output_tag: int, checkpoint: str) -> None:
        super().__init__(pickle_library, checkpoint)
        self.grouping = grouping
        self.components = components
        self.output_tag = output_tag

    def init(self, handle: StatefulProcessorHandle) -> None:
        super().init(handle)
        self.grouper = grouper(self.grouping, self.components)

    def _process(self, key: bytes, rows: list[Row], blob: bytes | None, time: RunnerTime
                 ) -> tuple[list[Row], bytes | None, bool]:
        state = load_state(blob)
        panes = self.grouper.process(key, state, [bytes(r.value) for r in rows],
                                     time.watermark_before, time.watermark,
                                     time.processing_before, time.processing)
        out = [Row(tag=self.output_tag, key=key, value=p) for p in panes]
        return out, dump_state(state), has_timers(state)


class StatefulStageProcessor(_KeyedProcessor):
    """A stage with a stateful DoFn: the key's elements and due timers through the SDK's bundle
    processor, its user state and timers in the blob (`stateful.py`)."""

    def __init__(self, task: StageTask, checkpoint: str) -> None:
        super().__init__(task.spec.pickle_library, checkpoint)
        self.task = task

    def init(self, handle: StatefulProcessorHandle) -> None:
        super().init(handle)
        self.key_stage = KeyStage(self.task.spec)

    def _process(self, key: bytes, rows: list[Row], blob: bytes | None, time: RunnerTime
                 ) -> tuple[list[Row], bytes | None, bool]:
        inputs = rows_by_input((self.task.input_tags[r.tag], bytes(r.value)) for r in rows)
        try:
            out, blob, pending = self.key_stage.step(blob, inputs, time)
        except Exception as exc:  # noqa: BLE001 - reported with the stage and transform
            raise RuntimeError(error_payload(self.task.spec.stage, exc)) from None
        rows_out = [Row(tag=self.task.output_tags[index], key=k, value=v)
                    for index, k, v in out]
        return rows_out, blob, pending
