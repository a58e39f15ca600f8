"""Side inputs of a streaming job: when a main-input element may read them (no pyspark).

Every micro-batch, the elements of each side-input buffer are written by the tasks that compute
them into the checkpoint (`checkpoint.write_side_file`); a stage reading side inputs sees, in
micro-batch B, everything written by batches before B.

A main-input element waits (it is pushed back, as on Beam's DirectRunner) until every side input
is ready for the window its window maps to (`SideReadiness`): the side input's watermark has
reached that window's end, or, for a side input with a trigger of its own, it has data for the
window. Waiting elements hold the watermark of everything downstream of their stage
(`engine.watermarks`).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from apache_beam.internal import pickler
from apache_beam.portability.api import beam_runner_api_pb2

from sparkbeam.plan.model import SideInputUse, Stage, side_input_proto
from sparkbeam.streaming.script import MAX_MICROS


@dataclass(frozen=True)
class StreamingSide:
    """A side input of a streaming stage: which buffer (tag) feeds it, and the side-input
    stages upstream of that buffer, whose holds bound its watermark."""

    use: SideInputUse
    tag: int
    holds: tuple[str, ...] = ()
    triggered: bool = False  # its windowing has a trigger of its own: ready at its first pane


def is_triggered(components: beam_runner_api_pb2.Components, pcoll_id: str) -> bool:
    """Whether the PCollection's windowing has a trigger other than the default."""
    pcoll = components.pcollections[pcoll_id]
    strategy = components.windowing_strategies[pcoll.windowing_strategy_id]
    return strategy.trigger.WhichOneof("trigger") not in (None, "default")


class SideReadiness:
    """Whether a main-input element may run in a micro-batch: each side input is ready for the
    side window its windows map to. A side input is ready once its watermark has reached that
    window's end (Beam's DirectRunner's rule); a triggered side input (e.g. a global window
    with a repeated trigger: a side input that updates) is ready as soon as it has data for the
    window, and from then on each batch sees what earlier batches wrote."""

    def __init__(self, stage: Stage, sides: tuple[StreamingSide, ...],
                 main_coders: dict[int, Any]) -> None:
        self.sides = sides
        self.mappings = [
            pickler.loads(side_input_proto(stage, s.use).window_mapping_fn.payload)
            for s in sides
        ]
        self.main_coders = main_coders  # stage input index -> windowed coder impl

    def split(self, elements: list[tuple[int, bytes]], watermark: Callable[[StreamingSide], int],
              windows_with_data: Callable[[StreamingSide], set[Any]] = lambda side: set(),
              ) -> tuple[list[tuple[int, bytes]], list[tuple[int, bytes]], int]:
        """(ready, still waiting, earliest waiting timestamp or MAX_MICROS), in arrival order;
        `watermark(side)` is the side input's watermark in this batch (micros) and
        `windows_with_data(side)` the windows it has elements in (asked of triggered sides)."""
        marks = [watermark(s) for s in self.sides]
        filled = [windows_with_data(s) if s.triggered else set() for s in self.sides]

        def ready_for(w: Any) -> bool:
            for mapping, mark, data in zip(self.mappings, marks, filled, strict=True):
                side_window = mapping(w)
                if side_window.end.micros > mark and side_window not in data:
                    return False
            return True

        ready, waiting, hold = [], [], MAX_MICROS
        for n, value in elements:
            wv = self.main_coders[n].decode_nested(value)
            if all(ready_for(w) for w in wv.windows):
                ready.append((n, value))
            else:
                waiting.append((n, value))
                hold = min(hold, wv.timestamp.micros)
        return ready, waiting, hold


def values_of(batches: Iterator[Any]) -> list[bytes]:
    """The value column of Arrow batches (rows of one side-input buffer)."""
    return [v for batch in batches for v in batch.column(2).to_pylist()]
