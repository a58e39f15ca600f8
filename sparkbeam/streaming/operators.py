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

from sparkbeam.execute.stage_task import METRICS_TAG, TaskSpec, run_stage_task
from sparkbeam.plan.model import Grouping
from sparkbeam.streaming.clock import OffsetLogClock
from sparkbeam.streaming.gbk import dump_state, grouper, has_timers, load_state

ROW_SCHEMA = "tag int, key binary, value binary"
_ARROW = pa.schema(
    [("tag", pa.int32(), False), ("key", pa.binary()), ("value", pa.binary(), False)]
)
_BATCH = 8192


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
        tags: list[int] = []
        keys: list[Any] = []
        values: list[bytes] = []
        for index, key, value in run_stage_task(self.spec, rows, {}, attempt):
            if index == METRICS_TAG:
                continue  # streaming metrics reach the driver through the metrics channel
            tags.append(self.output_tags[index])
            keys.append(key)
            values.append(value)
            if len(tags) >= _BATCH:
                yield _batch(tags, keys, values)
                tags, keys, values = [], [], []
        if tags:
            yield _batch(tags, keys, values)


def _batch(tags: list[int], keys: list[Any], values: list[bytes]) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [pa.array(tags, pa.int32()), pa.array(keys, pa.binary()), pa.array(values, pa.binary())],
        schema=_ARROW,
    )


class GroupByKeyProcessor(StatefulProcessor):  # type: ignore[misc]
    """One GroupByKey of a streaming job: rows (tag, key, value) of its input buffer in, panes
    (output tag, key, KV<key, iterable>) out."""

    def __init__(self, grouping: Grouping, components: bytes, pickle_library: str,
                 output_tag: int, checkpoint: str) -> None:
        self.grouping = grouping
        self.components = components
        self.pickle_library = pickle_library
        self.output_tag = output_tag
        self.checkpoint = checkpoint

    def init(self, handle: StatefulProcessorHandle) -> None:
        from sparkbeam.execute import worker_context

        worker_context.prepare(self.pickle_library)
        self.handle = handle
        self.blob = handle.getValueState("beam", "blob binary, wake long")
        self.clock = OffsetLogClock(self.checkpoint)
        self.grouper = grouper(self.grouping, self.components)

    def handleInputRows(self, key: Any, rows: Iterator[Row], timerValues: Any) -> Iterator[Row]:  # noqa: N802
        elements = [bytes(r.value) for r in rows]
        return self._step(key[0], elements, timerValues, woken=False)

    def handleExpiredTimer(  # noqa: N802
        self, key: Any, timerValues: Any, expiredTimerInfo: Any  # noqa: N803
    ) -> Iterator[Row]:
        return self._step(key[0], [], timerValues, woken=True)

    def _step(
        self, key: bytes, elements: list[bytes], timer_values: Any, woken: bool
    ) -> Iterator[Row]:
        key = bytes(key)
        now_ms = timer_values.getCurrentProcessingTimeInMs()
        time = self.clock.at(now_ms)
        saved = self.blob.get() if self.blob.exists() else None
        state = load_state(bytes(saved[0]) if saved and saved[0] is not None else None)
        wake = None if woken or not saved else saved[1]
        panes = self.grouper.process(key, state, elements, time.watermark_before, time.watermark,
                                     time.processing_before, time.processing)
        blob = dump_state(state)
        if has_timers(state) and wake is None:
            wake = now_ms + 1
            self.handle.registerTimer(wake)
        if blob is None:
            self.blob.clear()
        else:
            self.blob.update((blob, wake))
        return iter([Row(tag=self.output_tag, key=key, value=p) for p in panes])

    def close(self) -> None:
        pass
