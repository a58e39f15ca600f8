"""Watermarks and holds as properties (no Spark): a watermark downstream of a holding stage
never goes back, and no element the holding stage releases is late downstream."""
from __future__ import annotations

from collections.abc import Iterable

from hypothesis import given, settings
from hypothesis import strategies as hs

from sparkbeam.engine.watermarks import MAX_MICROS, held_watermarks, watermark_at_start


class Holds:
    """holds/<label> of one holding stage, batch by batch (what `FileHoldStore` reads)."""

    def __init__(self) -> None:
        self.by_batch: dict[int, int] = {}

    def hold(self, labels: Iterable[str], batch: int) -> int:
        return self.by_batch.get(batch, MAX_MICROS) if "holder" in labels else MAX_MICROS


@hs.composite
def histories(draw: hs.DrawFn) -> tuple[list[int], list[list[tuple[int, int]]]]:
    """Runner watermarks at the start of each batch (never going back), and per batch the
    elements reaching the holding stage: (timestamp, batches it waits), each at or after the
    stage's input watermark then (no element is late at the source)."""
    batches = draw(hs.integers(1, 12))
    marks, mark = [], 0
    for _ in range(batches):
        mark += draw(hs.integers(0, 20))
        marks.append(mark)
    arrivals = [
        [(marks[b] + draw(hs.integers(0, 30)), draw(hs.integers(0, 3)))
         for _ in range(draw(hs.integers(0, 4)))]
        for b in range(batches)
    ]
    return marks, arrivals


@settings(max_examples=300, deadline=None)
@given(histories())
def test_a_watermark_never_goes_back_and_a_hold_keeps_released_work_on_time(history) -> None:  # type: ignore[no-untyped-def]
    marks, arrivals = history
    holds = Holds()
    waiting: list[tuple[int, int]] = []  # (timestamp, batch it is released in)
    previous_after = None
    for batch in range(len(marks)):
        before, after = held_watermarks(batch, ("holder",), holds, lambda b: marks[b])
        assert before <= after
        if previous_after is not None:
            assert after >= previous_after, "the downstream watermark went back"
        previous_after = after
        waiting += [(ts, batch + wait) for ts, wait in arrivals[batch]]
        released = [ts for ts, when in waiting if when <= batch]
        waiting = [(ts, when) for ts, when in waiting if when > batch]
        for ts in released:
            assert ts >= before, f"released at {ts} but the downstream watermark was {before}"
        # The task records what still waits at the end of the batch (its hold).
        holds.by_batch[batch] = min((ts for ts, _ in waiting), default=MAX_MICROS)


def test_without_holds_the_watermark_is_the_runners() -> None:
    holds = Holds()
    holds.by_batch[2] = 5
    assert watermark_at_start(40, (), holds, 3) == 40
    assert watermark_at_start(40, ("holder",), holds, 3) == 5
    assert watermark_at_start(40, ("holder",), holds, 0) == 40  # no batch before the first
