"""A stateful DoFn stage for one key in one micro-batch, over a state blob (no pyspark).

The stage runs in the SDK's bundle processor as in batch (`execute/stage_task.py`'s driver):
its user state (bag, value, combining, set, ordered list — Beam's StateServicer layout) and its
pending timers (every family, dynamic tags included) are loaded from the key's blob before the
batch's bundle and saved after it. Elements are processed first; then the timers the batch's
watermark (event time) and processing time allow fire, earliest first, timers set while firing
joining in, as Beam's runners do for one key.
"""
from __future__ import annotations

import collections
import pickle
from collections.abc import Iterator
from typing import Any

from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.runners.portability.fn_api_runner.worker_handlers import StateServicer
from apache_beam.utils.timestamp import Timestamp

from sparkbeam.control.embedded import WORKERS
from sparkbeam.execute.stage_task import OutRow, TaskSpec, _StageDriver
from sparkbeam.metrics import merge_infos
from sparkbeam.streaming.gbk import to_timestamp
from sparkbeam.streaming.script import MAX_MICROS, Pending, RunnerTime

_MAX_ROUNDS = 100_000
_EVENT_TIME = beam_runner_api_pb2.TimeDomain.EVENT_TIME


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
    """Runs one key's micro-batch through a stateful stage; built once per process."""

    def __init__(self, spec: TaskSpec) -> None:
        self.spec = spec
        self.infos: list[Any] = []  # monitoring infos of the bundles run since the last take

    def step(self, blob: bytes | None, inputs: dict[int, list[bytes]], time: RunnerTime
             ) -> tuple[list[OutRow], bytes | None, Pending | None]:
        """(output rows, the key's new blob or None, what its pending timers wait for: their
        earliest fire time per domain and hold (the earliest output timestamp they will emit
        at); None when none are pending)."""
        saved = pickle.loads(blob) if blob else None
        out: list[OutRow] = []
        with WORKERS.lease(self.spec.stage.descriptor) as worker:
            driver = _StageDriver(self.spec, worker)
            previous = worker.state.swap_user_state(load_user_state(saved))
            try:
                driver._timers = collections.defaultdict(dict, saved["timers"] if saved else {})
                self._fire(driver, time.watermark_before, time.processing_before, out)
                if any(inputs.values()):
                    out.extend(driver._run_chunks(inputs))
                self._fire(driver, time.watermark, time.processing, out)
                state = dump_user_state(worker.state.swap_user_state(previous))
            except BaseException:
                worker.state.swap_user_state(previous)
                raise
            finally:
                self.infos.extend(driver.infos)
        timers = {f: dict(p) for f, p in driver._timers.items() if p}
        pending = _pending(timers, driver._timer_domain)
        if not timers and not state["state"] and not state["ordered"]:
            return out, None, None
        return out, pickle.dumps({**state, "timers": timers}, protocol=5), pending

    def take_infos(self) -> list[Any]:
        """The monitoring infos of every key run since the last call, merged."""
        infos, self.infos = merge_infos(self.infos), []
        return infos

    def _fire(self, driver: _StageDriver, watermark: int, processing: int,
              out: list[OutRow]) -> None:
        limits: dict[int, Timestamp] = {_EVENT_TIME: to_timestamp(watermark)}
        # At the final watermark the job ends: processing-time timers fire too (as a drained
        # or finished job's would).
        other = to_timestamp(MAX_MICROS if watermark >= MAX_MICROS else processing)
        for _ in range(_MAX_ROUNDS):
            due: list[tuple[Any, tuple[str, str], Any]] = []
            for family, pending in driver._timers.items():
                limit = limits.get(driver._timer_domain[family], other)
                for ident, timer in pending.items():
                    if timer.fire_timestamp is not None and timer.fire_timestamp <= limit:
                        due.append((timer.fire_timestamp, family, ident))
            if not due:
                return
            earliest = min(d[0] for d in due)
            firing: dict[tuple[str, str], list[Any]] = {}
            for when, family, ident in due:
                if when == earliest:
                    firing.setdefault(family, []).append(driver._timers[family].pop(ident))
            for batch in driver._timer_bundles(firing):
                out.extend(driver._run(batch))
        raise RuntimeError(f"timers of {self.spec.stage.label} kept re-arming")


def timer_hold(timers: dict[Any, dict[Any, Any]]) -> int | None:
    """The earliest output timestamp (hold) of pending timers, in micros; None if none. A timer
    set without an output timestamp holds at its fire time (event time) as Beam sets it."""
    holds = [
        (t.hold_timestamp if t.hold_timestamp is not None else t.fire_timestamp).micros
        for pending in timers.values() for t in pending.values()
        if t.hold_timestamp is not None or t.fire_timestamp is not None
    ]
    return min(holds, default=MAX_MICROS) if timers else None


def _pending(timers: dict[Any, dict[Any, Any]], domains: dict[Any, int]) -> Pending | None:
    """The earliest fire time of the pending timers per time domain and their hold."""
    hold = timer_hold(timers)
    if hold is None:
        return None
    event = processing = MAX_MICROS
    for family, pending in timers.items():
        for timer in pending.values():
            if timer.fire_timestamp is None:
                continue
            if domains[family] == _EVENT_TIME:
                event = min(event, timer.fire_timestamp.micros)
            else:
                processing = min(processing, timer.fire_timestamp.micros)
    return Pending(event=event, processing=processing, hold=hold)


def rows_by_input(rows: Iterator[tuple[int, bytes]]) -> dict[int, list[bytes]]:
    chunks: dict[int, list[bytes]] = {}
    for n, value in rows:
        chunks.setdefault(n, []).append(value)
    return chunks
