"""A skewed splittable read whose split does not depend on the machine's load, for the dynamic
rebalancing tests.

Left to timing, a loaded machine can run the big restriction to its end before the other task
is idle (or before the big one's task has even started, when the idle task leaves to free its
slot): no split happens and a test of splitting proves nothing (a fresh-clone `make test` failed
that way). Here the two elements cue each other through files in a shared directory: the small
one does not finish until the big one has started, and the big one, after its first position,
waits until the runner has split it. Both waits are bounded, so a runner that never splits
fails the test's own assertion instead of hanging it.
"""
from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import apache_beam as beam

from bench.splits import BURN, WholeRestriction, burn

SKEW = 20
WAIT_S = 60.0
_POLL_S = 0.02


def sources(unit: int) -> list[tuple[str, int]]:
    return [("big", SKEW * unit), ("small", unit)]


def read(p: beam.Pipeline, cued: beam.DoFn, unit: int) -> beam.PCollection:
    """Each element in its own task: one-element Creates are not reshuffled (a Create of
    both would place them at random, sometimes in one task, where no split can help)."""
    big, small = sources(unit)
    return ((p | "Big" >> beam.Create([big]), p | "Small" >> beam.Create([small]))
            | beam.Flatten() | beam.ParDo(cued))


def expected(unit: int) -> list[tuple[str, int]]:
    return sorted((name, pos) for name, size in sources(unit) for pos in range(size))


def _wait(until: Any) -> None:
    deadline = time.monotonic() + WAIT_S
    while not until() and time.monotonic() < deadline:
        time.sleep(_POLL_S)


class ReadOnCue(beam.DoFn):
    """Emits (name, position) for every position, burning CPU each, with the cues above."""

    def __init__(self, cues: str, unit: int) -> None:
        self._started = os.path.join(cues, "big-started")
        self._size = SKEW * unit

    def process(  # type: ignore[no-untyped-def]
        self, element, tracker=beam.DoFn.RestrictionParam(WholeRestriction())
    ) -> Iterator[tuple[str, int]]:
        name = element[0]
        unsplit = tracker.current_restriction().stop == self._size
        pos = tracker.current_restriction().start
        while tracker.try_claim(pos):
            if name == "big" and pos == 0 and unsplit:
                open(self._started, "w").close()
                _wait(lambda: tracker.current_restriction().stop < self._size)
            burn(BURN)
            yield self.checked(name, pos, tracker.current_restriction())
            pos += 1
        if name != "big":
            _wait(lambda: os.path.exists(self._started))

    def checked(self, name: str, pos: int, restriction: Any) -> tuple[str, int]:
        """A subclass's hook to fail chosen attempts; this one passes every position."""
        return name, pos
