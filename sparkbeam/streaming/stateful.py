"""A stateful DoFn stage for one key in one micro-batch, over a state blob (no pyspark).

The stage runs in the SDK's bundle processor as in batch (`engine.StageRun`): its user state
(bag, value, combining, set, ordered list — Beam's StateServicer layout) and its pending timers
(every family, dynamic tags included, in an `engine.TimerBook`) are loaded from the key's blob
before the batch's bundle and saved after it. Timers due at the time before the batch fire
first; then the elements are processed; then the timers the batch's watermark (event time) and
processing time allow fire, earliest first whatever the domain, timers set while firing joining
in, as Beam's DirectRunner does for one key.
"""
from __future__ import annotations

import pickle
from collections.abc import Iterator, Mapping
from typing import Any

from apache_beam.runners.portability.fn_api_runner.worker_handlers import StateServicer

from sparkbeam.engine.program import OutRow, program_for
from sparkbeam.engine.run import BatchSideWorker
from sparkbeam.engine.task import TaskSpec
from sparkbeam.engine.timers import Limits, Ordering, TimerBook
from sparkbeam.metrics import merge_infos
from sparkbeam.streaming.gbk import to_timestamp
from sparkbeam.streaming.script import MAX_MICROS, Pending, RunnerTime


def load_user_state(blob: dict[str, Any] | None) -> StateServicer:
    # Beam's in-memory StateServicer, filled with one key's entries (its layout is Beam's).
    servicer: Any = StateServicer()
    if blob:
        for key, chunks in blob["state"].items():
            servicer._state[key] = list(chunks)
        for key, positions in blob["ordered"].items():
            servicer._ordered_list_keys[key].update(positions)
    return servicer


def dump_user_state(servicer: Any) -> dict[str, Any]:
    return {
        "state": {k: list(v) for k, v in servicer._state.items() if v},
        "ordered": {k: list(v) for k, v in servicer._ordered_list_keys.items() if v},
    }


class KeyStage:
    """Runs one key's micro-batch through a stateful stage (its program is built once per
    process; `engine.StageRun` runs the bundles and keeps the timers)."""

    def __init__(self, spec: TaskSpec) -> None:
        self.spec = spec
        self.program = program_for(spec.stage, spec.components, spec.groupings)
        self.infos: list[Any] = []  # monitoring infos of the bundles run since the last take
        self.sided = BatchSideWorker()  # for elements that read side inputs

    def step(self, blob: bytes | None, inputs: dict[int, list[bytes]], time: RunnerTime,
             sides: tuple[int, Mapping[bytes, list[bytes]]] | None = None
             ) -> tuple[list[OutRow], bytes | None, Pending | None]:
        """(output rows, the key's new blob or None, what its pending timers wait for: their
        earliest fire time per domain and hold (the earliest output timestamp they will emit
        at); None when none are pending). `sides`: (the micro-batch, the data of the side
        inputs its elements read)."""
        saved = pickle.loads(blob) if blob else None
        out: list[OutRow] = []
        book = TimerBook(self.program.timer_impls, self.program.timer_domains,
                         saved["timers"] if saved else None)
        with self.sided.run_or_leased(self.program, self.spec.bundle_size, book, sides) as run:
            worker = run.worker
            previous = worker.state.swap_user_state(load_user_state(saved))
            try:
                out.extend(run.fire_timers(_limits(time.watermark_before,
                                                   time.processing_before), Ordering.BY_TIME))
                if any(inputs.values()):
                    out.extend(run.run_chunks(inputs))
                out.extend(run.fire_timers(_limits(time.watermark, time.processing),
                                           Ordering.BY_TIME))
                state = dump_user_state(worker.state.swap_user_state(previous))
            except BaseException:
                worker.state.swap_user_state(previous)
                raise
            finally:
                self.infos.extend(run.infos)
        timers = book.snapshot()
        wait = book.waiting()
        if not timers and not state["state"] and not state["ordered"]:
            return out, None, None
        pending = None if wait is None else Pending(wait.event, wait.processing, wait.hold)
        return out, pickle.dumps({**state, "timers": timers}, protocol=5), pending

    def take_infos(self) -> list[Any]:
        """The monitoring infos of every key run since the last call, merged."""
        infos, self.infos = merge_infos(self.infos), []
        return infos


def _limits(watermark: int, processing: int) -> Limits:
    """What may fire at this runner time; at the final watermark the job ends, so
    processing-time timers fire too (as a drained or finished job's would)."""
    other = MAX_MICROS if watermark >= MAX_MICROS else processing
    return Limits(to_timestamp(watermark), to_timestamp(other))


def rows_by_input(rows: Iterator[tuple[int, bytes]]) -> dict[int, list[bytes]]:
    chunks: dict[int, list[bytes]] = {}
    for n, value in rows:
        chunks.setdefault(n, []).append(value)
    return chunks
