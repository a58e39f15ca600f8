"""Watermarks and holds, as pure functions of the plan, the runner's time and a hold store.

A stage *holds back* when it keeps work across micro-batches that will still emit: main-input
elements waiting for side inputs, residual restrictions of a splittable read, pending timers of
a stateful DoFn (their output timestamps), the panes of a GroupByKey that outputs at the
earliest or latest element's time. Each holding task records, at the end of batch B, the
earliest timestamp it still holds (`HoldStore`). A buffer downstream of holding stages has, in
batch B, the watermark

    min(the runner's watermark at the start of B, their holds at the end of B - 1)

(`watermark_at_start`): an element released in B was held at the end of B - 1, and one that
started waiting in B was not late at the start of B. So no later stage sees its input as late
because of the runner, and no watermark goes back: the runner's watermark never does, and a
hold only ever stands for work not yet emitted. Batch is the case without holds: every key's
watermark is the end of time once its input is done.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP

from sparkbeam.plan.model import Stage, StageKind

MIN_MICROS = MIN_TIMESTAMP.micros
MAX_MICROS = MAX_TIMESTAMP.micros


class HoldStore(Protocol):
    """Where holding stages' tasks leave their holds (the streaming checkpoint's `holds/`)."""

    def hold(self, labels: Iterable[str], batch: int) -> int:
        """The earliest hold of these stages at the end of `batch` (MAX_MICROS: none)."""
        ...


def holds_back(stage: Stage) -> bool:
    """Whether the stage keeps work across micro-batches and so holds what is downstream:
    main-input elements waiting for side inputs, residual restrictions, or the output
    timestamps of pending timers."""
    return (bool(stage.side_inputs) or stage.kind is StageKind.SPLITTABLE
            or (stage.kind.stateful and bool(stage.timers)))


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


def watermark_at_start(runner_watermark: int, holds: tuple[str, ...], store: HoldStore,
                       batch: int) -> int:
    """A buffer's watermark at the start of `batch`: the runner's watermark then, held back
    by the holding stages upstream of it as they stood at the end of the batch before."""
    if not holds or batch == 0:
        return runner_watermark
    return min(runner_watermark, store.hold(holds, batch - 1))


def held_watermarks(batch: int, holds: tuple[str, ...], store: HoldStore,
                    runner_watermark_at_start: Callable[[int], int]) -> tuple[int, int]:
    """(watermark before, watermark after) batch `batch` for a stage downstream of `holds`:
    its event time runs one batch behind the runner's, held back by what waits upstream.
    `runner_watermark_at_start(b)` is the runner's watermark at the start of batch b."""
    after = watermark_at_start(runner_watermark_at_start(batch), holds, store, batch)
    if batch <= 0:
        return min(MIN_MICROS, after), after
    before = watermark_at_start(runner_watermark_at_start(batch - 1), holds, store, batch - 1)
    return min(before, after), after
