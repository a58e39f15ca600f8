"""Side inputs of a streaming job: written per micro-batch, read from the batch after (no pyspark
at import).

Every micro-batch, the elements of each side-input buffer are written by the tasks that compute
them into `<checkpoint>/sides/<tag>/batch-<B>-part-<P>` (one file per task, renamed into place
once complete; a replayed batch rewrites the same files with the same contents). A stage reading
side inputs sees, in micro-batch B, everything written by batches before B.

A main-input element waits (it is pushed back, as on Beam's DirectRunner) until every side input
is ready for the window its window maps to: the side input's watermark has reached that window's
end. Waiting elements hold the watermark of everything downstream of their stage, as Beam's
watermark holds do: each task of a side-input stage writes the earliest timestamp still waiting
at the end of a micro-batch to `<checkpoint>/holds/<stage>/batch-<B>-part-<P>`. In batch B, a
buffer downstream of side-input stages has the watermark min(runner's watermark at the start of
B, their holds at the end of B - 1): an element released in B was waiting at the end of B - 1,
one that started waiting in B was not late at the start of B.
"""
from __future__ import annotations

import os
import struct
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from apache_beam.internal import pickler
from apache_beam.portability import python_urns
from apache_beam.portability.api import beam_fn_api_pb2, beam_runner_api_pb2

from sparkbeam.errors import Unsupported
from sparkbeam.plan.model import SideInputUse, Stage
from sparkbeam.streaming.script import MAX_MICROS

_LENGTH = struct.Struct(">I")


@dataclass(frozen=True)
class StreamingSide:
    """A side input of a streaming stage: which buffer (tag) feeds it, and the side-input
    stages upstream of that buffer, whose holds bound its watermark."""

    use: SideInputUse
    tag: int
    holds: tuple[str, ...] = ()
    triggered: bool = False  # its windowing has a trigger of its own: ready at its first pane


def holds_back(stage: Stage) -> bool:
    """Whether the stage keeps work across micro-batches and so holds the watermark of what is
    downstream: main-input elements waiting for side inputs, residual restrictions, or the
    output timestamps of pending timers (a stateful DoFn's timers hold its output watermark)."""
    return bool(stage.side_inputs) or stage.splittable or bool(stage.stateful and stage.timers)


def upstream_holds(stages: Iterable[Stage], groupings: Mapping[bytes, str] | None = None
                   ) -> dict[bytes, tuple[str, ...]]:
    """buffer id -> labels of the holding stages upstream of it (stages in topological
    order; a holding stage's outputs are downstream of itself). `groupings` names the holding
    GroupByKeys by the buffer they group: what reads their output is downstream of them."""
    found: dict[bytes, set[str]] = {}
    holding_groupings = groupings or {}
    for stage in stages:
        reads = [i.buffer_id for i in stage.inputs] + [s.buffer_id for s in stage.side_inputs]
        labels = set().union(*(found.get(b, set()) for b in reads))
        labels.update(holding_groupings[i.buffer_id] for i in stage.inputs
                      if i.buffer_id in holding_groupings)
        if holds_back(stage):
            labels.add(stage.label)
        for output in stage.outputs:
            found.setdefault(output.buffer_id, set()).update(labels)
    return {b: tuple(sorted(labels)) for b, labels in found.items()}


def side_problems(stage: Stage) -> list[Unsupported]:
    where = f"{stage.label} [{stage.description}]"
    found: list[Unsupported] = []
    if not stage.side_inputs:
        return found
    if stage.stateful:
        found.append(Unsupported("side inputs of a stateful DoFn in streaming", where,
                                 "not built yet in the streaming engine"))
    if stage.splittable:
        found.append(Unsupported(
            "side inputs read by a splittable DoFn in streaming", where,
            "its elements cannot wait for the side input inside the read; read the side "
            "input in a transform after the read (its consumers start a stage of their own)"))
    for use in stage.side_inputs:
        spec = side_input_proto(stage, use).window_mapping_fn
        if spec.urn != python_urns.PICKLED_WINDOW_MAPPING_FN:
            found.append(Unsupported(f"side input window mapping {spec.urn or '(none)'}",
                                     f"{where}, side input '{use.tag}'",
                                     "only Python window mapping functions are supported"))
    return found


def side_input_proto(stage: Stage, use: SideInputUse) -> beam_runner_api_pb2.SideInput:
    """The SideInput of `use` as the stage's descriptor declares it."""
    descriptor = beam_fn_api_pb2.ProcessBundleDescriptor.FromString(stage.descriptor)
    payload = beam_runner_api_pb2.ParDoPayload.FromString(
        descriptor.transforms[use.transform_id].spec.payload)
    if use.tag not in payload.side_inputs:
        raise KeyError(f"{stage.label}: transform {use.transform_id} has no side input {use.tag}")
    return payload.side_inputs[use.tag]


def side_path(checkpoint: str, tag: int) -> str:
    return os.path.join(checkpoint, "sides", str(tag))


def write_side_file(directory: str, batch: int, partition: int, values: list[bytes]) -> None:
    """One task's elements of a side-input buffer in one micro-batch (replaces an earlier
    attempt's file; nothing is written for an empty task)."""
    final = os.path.join(directory, f"batch-{batch:010d}-part-{partition:05d}")
    if not values:
        if os.path.exists(final):
            os.remove(final)
        return
    os.makedirs(directory, exist_ok=True)
    temporary = os.path.join(directory, f".tmp-{uuid.uuid4().hex}")
    with open(temporary, "wb") as f:
        for value in values:
            f.write(_LENGTH.pack(len(value)))
            f.write(value)
    os.replace(temporary, final)


def _read_side_file(path: str) -> list[bytes]:
    with open(path, "rb") as f:
        data = f.read()
    values, at = [], 0
    while at < len(data):
        (size,) = _LENGTH.unpack_from(data, at)
        at += _LENGTH.size
        values.append(data[at:at + size])
        at += size
    return values


class SideStore:
    """The elements of side-input buffers written before a micro-batch; files of finished
    batches never change, so each is read once per process."""

    def __init__(self, checkpoint: str) -> None:
        self.checkpoint = checkpoint
        self._files: dict[int, dict[str, list[bytes]]] = {}
        self._lock = threading.Lock()

    def elements(self, tag: int, before_batch: int) -> list[bytes]:
        directory = side_path(self.checkpoint, tag)
        with self._lock:
            files = self._files.setdefault(tag, {})
            try:
                names = sorted(n for n in os.listdir(directory) if n.startswith("batch-"))
            except FileNotFoundError:
                names = []
            out: list[bytes] = []
            for name in names:
                if int(name.split("-")[1]) >= before_batch:
                    break
                if name not in files:
                    files[name] = _read_side_file(os.path.join(directory, name))
                out.extend(files[name])
            return out


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


def hold_path(checkpoint: str, label: str) -> str:
    return os.path.join(checkpoint, "holds", label)


def write_hold(directory: str, batch: int, partition: int, hold: int) -> None:
    """A task's earliest waiting timestamp at the end of a micro-batch (none: no file)."""
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


class HoldStore:
    """The holds that holding stages (`holds_back`) left at the end of finished micro-batches."""

    def __init__(self, checkpoint: str) -> None:
        self.checkpoint = checkpoint
        self._cache: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()

    def hold(self, labels: Iterable[str], batch: int) -> int:
        """The earliest hold of these stages at the end of `batch` (MAX_MICROS: none)."""
        out = MAX_MICROS
        for label in labels:
            with self._lock:
                if (label, batch) not in self._cache:
                    self._cache[(label, batch)] = self._read(label, batch)
                out = min(out, self._cache[(label, batch)])
        return out

    def _read(self, label: str, batch: int) -> int:
        directory = hold_path(self.checkpoint, label)
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


def watermark_at_start(wm_before: int, holds: tuple[str, ...], store: HoldStore, batch: int
                       ) -> int:
    """A buffer's watermark at the start of `batch`: the runner's, held back by the holding
    stages upstream of it as they stood at the end of the batch before."""
    if not holds or batch == 0:
        return wm_before
    return min(wm_before, store.hold(holds, batch - 1))


def values_of(batches: Iterator[Any]) -> list[bytes]:
    """The value column of Arrow batches (rows of one side-input buffer)."""
    return [v for batch in batches for v in batch.column(2).to_pylist()]
