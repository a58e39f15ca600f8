"""Side inputs of a streaming job: when a main-input element may read them (no pyspark).

Every micro-batch, the elements of each side-input buffer are written by the tasks that compute
them into the checkpoint (`checkpoint.write_side_file`); a stage reading side inputs sees, in
micro-batch B, everything written by batches before B.

A main-input element waits (it is pushed back, as on Beam's DirectRunner) until every side input
is ready for the window its window maps to (`SideReadiness`): the side input's watermark has
reached that window's end, or, for a side input with a trigger of its own, it has data for the
window. Waiting elements hold the watermark of everything downstream of their stage
(`engine.watermarks`).

What a reader sees of a side input (`visible_elements`), and so what is kept, is bounded:
- a side window no main-input window can map to any more is gone: with Beam's default
  mappings (a side window holds the end of the main windows mapped to it) once its end is
  before both the consumer's main-input watermark less the main input's allowed lateness and
  the earliest element waiting in the consumer (`reader_bound`), as Beam's runners
  garbage-collect a window's state (the global window never goes);
- a side input with a trigger of its own in discarding mode shows, per window, only its
  latest pane: the elements the latest micro-batch that wrote the window wrote (what the
  slowly-updating side input pattern reads with `AsSingleton`); accumulating, every pane.
Every reader applies both at its batch's watermark, so a replayed batch sees what the first
attempt saw; the driver compacts what no reader can see out of the checkpoint between batches
(`SideCompactor`), and readers forget compacted files.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from apache_beam.internal import pickler
from apache_beam.portability.api import beam_fn_api_pb2, beam_runner_api_pb2
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.windowed_value import WindowedValue

from sparkbeam.engine.context import pipeline_context
from sparkbeam.engine.watermarks import HoldStore, watermark_at_start
from sparkbeam.plan.model import SideInputUse, Stage, side_input_proto
from sparkbeam.streaming.checkpoint import write_compacted_side
from sparkbeam.streaming.script import MAX_MICROS


@dataclass(frozen=True)
class StreamingSide:
    """A side input of a streaming stage: which buffer (tag) feeds it, and the side-input
    stages upstream of that buffer, whose holds bound its watermark."""

    use: SideInputUse
    tag: int
    holds: tuple[str, ...] = ()
    triggered: bool = False  # its windowing has a trigger of its own: ready at its first pane
    discarding: bool = False  # triggered, discarding panes: each window's latest pane is seen
    # How long after a side window's end the consumer's main input may still map to it
    # (its allowed lateness, micros); None: no bound known (a custom window mapping).
    lateness: int | None = None
    main_holds: tuple[str, ...] = ()  # holding stages upstream of the consumer's main input
    reader: str = ""  # the consumer stage's label: its hold is its earliest waiting element


def reader_bound(side: StreamingSide, batch: int, runner_watermark_at_start: Callable[[int], int],
                 holds: HoldStore) -> int | None:
    """Side windows whose max timestamp is before this are read by no main-input element of
    `batch` or later (None: no bound): an element still to come is in a window ending at or
    after the main input's watermark less its allowed lateness (else it is dropped as late
    before it reads), one waiting since an earlier batch is at or after the reader's hold;
    with Beam's mappings either maps to a side window ending at or after its own."""
    if side.lateness is None:
        return None
    main = watermark_at_start(runner_watermark_at_start(batch), side.main_holds, holds, batch)
    waiting = holds.hold((side.reader,), batch - 1) if batch > 0 else MAX_MICROS
    return min(main - side.lateness, waiting)


def is_triggered(components: beam_runner_api_pb2.Components, pcoll_id: str) -> bool:
    """Whether the PCollection's windowing has a trigger other than the default."""
    pcoll = components.pcollections[pcoll_id]
    strategy = components.windowing_strategies[pcoll.windowing_strategy_id]
    return strategy.trigger.WhichOneof("trigger") not in (None, "default")


def is_discarding(components: beam_runner_api_pb2.Components, pcoll_id: str) -> bool:
    """Whether the PCollection's panes discard what earlier panes held."""
    pcoll = components.pcollections[pcoll_id]
    strategy = components.windowing_strategies[pcoll.windowing_strategy_id]
    return strategy.accumulation_mode == beam_runner_api_pb2.AccumulationMode.DISCARDING


def side_lateness(stage: Stage, use: SideInputUse) -> int | None:
    """`StreamingSide.lateness` of `use`: its reader's main-input allowed lateness (micros)
    when the side input's window mapping is one of Beam's defaults, else None."""
    mapping = pickler.loads(side_input_proto(stage, use).window_mapping_fn.payload)
    if getattr(mapping, "__name__", "") not in _BEAMS_MAPPINGS:
        return None
    descriptor = beam_fn_api_pb2.ProcessBundleDescriptor.FromString(stage.descriptor)
    reader = descriptor.transforms[use.transform_id]
    payload = beam_runner_api_pb2.ParDoPayload.FromString(reader.spec.payload)
    main = [p for tag, p in reader.inputs.items() if tag not in payload.side_inputs]
    strategy = descriptor.windowing_strategies[
        descriptor.pcollections[main[0]].windowing_strategy_id]
    return max(0, strategy.allowed_lateness) * 1000


# Beam's window mappings (`apache_beam.transforms.sideinputs`): a main window maps to the side
# window holding its end (or to the global window), so a side window outlives them all.
_BEAMS_MAPPINGS = frozenset(("map_via_end", "_global_window_mapping_fn"))


def visible_elements(batches: list[tuple[int, list[bytes]]], impl: Any, discarding: bool,
                     dead_before: int | None) -> list[bytes]:
    """What a reader sees of a side input's (batch, encoded windowed values), in order (module
    doc): in discarding mode each window's elements of the latest batch that has the window;
    none of a window ending before `dead_before` (the global window never ends). An element
    in several windows keeps those it is seen in."""
    if not discarding and dead_before is None:
        return [v for _, values in batches for v in values]
    decoded = [(batch, v, impl.decode_nested(v)) for batch, values in batches for v in values]
    latest: dict[Any, int] = {}
    if discarding:
        for batch, _, wv in decoded:
            for w in wv.windows:
                latest[w] = max(latest.get(w, batch), batch)

    def seen(batch: int, w: Any) -> bool:
        if (dead_before is not None and not isinstance(w, GlobalWindow)
                and w.max_timestamp().micros < dead_before):
            return False
        return not discarding or latest[w] == batch

    out = []
    for batch, value, wv in decoded:
        windows = [w for w in wv.windows if seen(batch, w)]
        if len(windows) == len(wv.windows):
            out.append(value)
        elif windows:
            out.append(impl.encode_nested(
                WindowedValue(wv.value, wv.timestamp, tuple(windows), wv.pane_info)))
    return out



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


class SideCompactor:
    """On the driver between micro-batches: every `every` batches that wrote a side buffer,
    its files before the batch running now are replaced by one holding what its readers
    still see of them (`visible_elements` at that batch's `reader_bound`, the earliest of its
    readers'; `checkpoint.write_compacted_side`). A replay of that batch reads the same."""

    def __init__(self, sides: dict[str, tuple[StreamingSide, ...]], components: bytes,
                 store: Any, runner_watermark_at_start: Callable[[int], int],
                 holds: HoldStore, every: int = 8) -> None:
        self.readers: dict[int, list[StreamingSide]] = {}
        for uses in sides.values():
            for side in uses:
                self.readers.setdefault(side.tag, []).append(side)
        ctx = pipeline_context(components)
        self.impls = {tag: ctx.coders[readers[0].use.coder_id].get_impl()
                      for tag, readers in self.readers.items()}
        self.store = store  # `checkpoint.SideStore`
        self.runner_watermark_at_start = runner_watermark_at_start
        self.holds = holds
        self.every = every

    def compact(self, batch: int) -> int:
        """Compacts what is due before `batch` (its tasks have run); the buffers compacted."""
        done = 0
        for tag, readers in sorted(self.readers.items()):
            batches = self.store.batches(tag, batch)
            if len(batches) <= self.every:  # files: task files and at most one compacted
                continue
            bounds = [reader_bound(r, batch, self.runner_watermark_at_start, self.holds)
                      for r in readers]
            dead_before = None if None in bounds else min(b for b in bounds if b is not None)
            values = visible_elements(batches, self.impls[tag], readers[0].discarding,
                                      dead_before)
            write_compacted_side(self.store.layout.side_dir(tag), batch - 1, values)
            done += 1
        return done
