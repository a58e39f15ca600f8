"""What the sources of a streaming job emit, batch by batch, with the runner's clock (pure).

A streaming job's roots are *endpoints* (see `budget.py`): a TestStream transform replays its
events, an Impulse emits its one element. Each endpoint holds a deterministic list of items at
fixed offsets; reading items [a, b) always gives the same rows, and the runner's Beam watermark
and processing time after an offset are a function of that offset alone, so a replayed micro-batch
sees exactly what the first attempt saw.

A TestStream item is one of its events; a micro-batch takes at most one event per TestStream,
plus the watermark event right after an element event, so every batch boundary is a TestStream
event boundary (elements are processed at the watermark before the batch, timers then fire at
the watermark after it, as Beam's DirectRunner does for the two events in turn). Processing
time starts at 0 for TestStream pipelines (Beam's TestClock) and advances by its
ProcessingTimeEvents; otherwise it is the wall clock when the batch was planned.
"""
from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

# Beam's MIN_TIMESTAMP and MAX_TIMESTAMP in micros (a unit test holds them equal). Written out,
# not imported: this module runs in the Python process Spark starts per streaming query to plan
# the source's batches, where importing apache_beam would cost a second on every query's start.
MIN_MICROS = -9223372036854775000
MAX_MICROS = 9223372036854775000

Row = tuple[int, bytes | None, bytes]  # (buffer number, encoded key or None, encoded element)


@dataclass(frozen=True)
class Item:
    """One endpoint item: rows to emit, then the endpoint's watermark and processing time."""

    rows: tuple[Row, ...] = ()
    watermark: int | None = None  # micros; None: unchanged
    advance: int = 0  # micros of processing time this item advances


@dataclass(frozen=True)
class Endpoint:
    """One root of the streaming job: deterministic items, at most `per_batch` per batch.

    Positions count *units*: an item with n rows is n units (one per row), an item without rows
    one unit. A work budget may stop a batch inside an item (`budget.py`); the item's watermark
    and processing-time advance count only once all its units are read.
    """

    name: str
    items: tuple[Item, ...]
    per_batch: int = 1
    final_watermark: int = MAX_MICROS  # once every item is read
    ends: tuple[int, ...] = field(default=(), compare=False)  # each item's end unit

    def __post_init__(self) -> None:
        ends, end = [], 0
        for item in self.items:
            end += max(1, len(item.rows))
            ends.append(end)
        object.__setattr__(self, "ends", tuple(ends))

    @property
    def units(self) -> int:
        return self.ends[-1] if self.ends else 0

    def _read(self, position: int) -> int:
        """How many items are read completely at `position`."""
        return bisect.bisect_right(self.ends, position)

    def watermark_after(self, position: int) -> int:
        """The endpoint's watermark once units [0, position) are read."""
        if position >= self.units:
            return self.final_watermark
        wm = MIN_MICROS
        for item in self.items[: self._read(position)]:
            if item.watermark is not None:
                wm = max(wm, item.watermark)
        return wm

    def advance_until(self, position: int) -> int:
        return sum(item.advance for item in self.items[: self._read(position)])

    def next_position(self, start: int) -> int:
        """Where the next batch ends without a budget: `per_batch` more items read (the item
        being read at `start` counts as one), and the watermark item right after the last of
        them if they hold rows: elements are processed at the watermark before the batch and
        timers fire at the one after it, as a runner would process the two events in turn."""
        done = self._read(start)
        if done >= len(self.items):
            return self.units
        last = min(len(self.items), done + self.per_batch) - 1
        if self.items[last].rows and last + 1 < len(self.items) and _only_watermark(
                self.items[last + 1]):
            last += 1
        return self.ends[last]

    def _slices(self, start: int, end: int) -> Iterator[tuple[Item, int, int]]:
        """The items units [start, end) touch, each with the slice [lo, hi) of its units
        (counted from the item's first unit) that falls in the range."""
        for index in range(self._read(start), len(self.items)):
            item = self.items[index]
            first = self.ends[index] - max(1, len(item.rows))
            if first >= end:
                return
            yield item, max(start, first) - first, min(end, self.ends[index]) - first

    def costs(self, start: int, end: int) -> list[int | None]:
        """The encoded size of every unit in [start, end): a row's key and value bytes, None
        for an item without rows (it costs no budget)."""
        out: list[int | None] = []
        for item, lo, hi in self._slices(start, end):
            if not item.rows:
                out.extend([None] * (hi - lo))
                continue
            out.extend(len(key or b"") + len(value) for _tag, key, value in item.rows[lo:hi])
        return out

    def rows(self, start: int, end: int) -> list[Row]:
        out: list[Row] = []
        for item, lo, hi in self._slices(start, end):
            out.extend(item.rows[lo:hi])
        return out


def _only_watermark(item: Item) -> bool:
    return item.watermark is not None and not item.rows and not item.advance


@dataclass(frozen=True)
class Script:
    """All endpoints of a job and how its clock moves."""

    endpoints: tuple[Endpoint, ...]
    test_clock: bool = True  # processing time from TestStream events (else the wall clock)
    names: dict[str, Endpoint] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        self.names.update({e.name: e for e in self.endpoints})

    def endpoint(self, name: str) -> Endpoint:
        return self.names[name]

    def next_positions(self, start: dict[str, int]) -> dict[str, int]:
        """Positions after the next micro-batch: each endpoint's next items, up to its limit."""
        return {e.name: e.next_position(int(start.get(e.name, 0))) for e in self.endpoints}

    def watermark(self, positions: dict[str, int]) -> int:
        """The job's input watermark at `positions`: the least of its endpoints'."""
        if not self.endpoints:
            return MAX_MICROS
        return min(e.watermark_after(int(positions.get(e.name, 0))) for e in self.endpoints)

    def processing_advance(self, positions: dict[str, int]) -> int:
        return sum(e.advance_until(int(positions.get(e.name, 0))) for e in self.endpoints)

    def exhausted(self, positions: dict[str, int]) -> bool:
        return all(int(positions.get(e.name, 0)) >= e.units for e in self.endpoints)

    def rows(self, name: str, start: int, end: int) -> list[Row]:
        return self.endpoint(name).rows(start, end)


@dataclass(frozen=True)
class RunnerTime:
    """What a micro-batch knows of the runner's clock: before its input and after it."""

    watermark_before: int
    watermark: int
    processing_before: int
    processing: int
    done: bool = False  # every endpoint is exhausted and the watermark is final
    drained: bool = False  # the job was drained: restrictions are truncated
    # Under a work budget: the (items, bytes) each splittable endpoint may output this batch.
    budgets: tuple[tuple[str, int, int], ...] = ()

    def budget_of(self, endpoint: str) -> tuple[int, int] | None:
        """The share of a splittable endpoint this batch; None when the job has no budget."""
        if not self.budgets:
            return None
        for name, items, size in self.budgets:
            if name == endpoint:
                return items, size
        return 0, 0


@dataclass(frozen=True)
class Pending:
    """What a key waits for between micro-batches, kept beside its blob: its earliest
    event-time and processing-time timers and the earliest output time it holds, in micros
    (MAX_MICROS: none). A key woken by its Spark timer when nothing is due is passed over
    without decoding its blob; its hold still counts."""

    event: int = MAX_MICROS
    processing: int = MAX_MICROS
    hold: int = MAX_MICROS

    def due(self, time: RunnerTime) -> bool:
        """Whether a timer of the key fires in the batch at `time` (Beam fires a timer once the
        time passes or reaches it); at the final watermark everything left fires."""
        return (time.watermark >= MAX_MICROS or self.event <= time.watermark
                or self.processing <= time.processing)


#: A key to run every micro-batch (its work is not timers, e.g. elements waiting for side
#: inputs, residual restrictions).
EVERY_BATCH = Pending(event=MIN_MICROS)


def offset_for(
    script: Script, positions: dict[str, int], previous: dict, wall_clock_micros: int, tick: int,
    drained: bool = False, streams: Callable[[dict, int], tuple[int, dict]] | None = None,
) -> dict:
    """The end offset of a micro-batch (JSON-able; Spark logs it, replays use the log).

    A drained job reads nothing more: its positions stay where the last batch left them and
    its watermark is final, so every window and event-time timer fires and the job ends.
    `streams` (`spark_streams.stream_watermark`), given the previous offset and the batch's
    processing time, bounds the watermark by Spark streams read beside the script, which
    never run out: (their watermark, what the offset keeps of them as "seen")."""
    drained = drained or bool(previous.get("drained"))
    if drained:
        positions = {k: int(v) for k, v in previous.get("pos", {}).items()}
    if script.test_clock:
        processing = script.processing_advance(positions)
    else:
        processing = max(wall_clock_micros, int(previous.get("pt", MIN_MICROS)))
    wm = MAX_MICROS if drained else script.watermark(positions)
    seen = None
    if streams is not None and not drained:
        bound, seen = streams(previous, processing)
        wm = min(wm, max(bound, int(previous.get("wm", MIN_MICROS))))
    offset = {
        "pos": dict(sorted(positions.items())),
        "wm0": int(previous.get("wm", MIN_MICROS)),
        "wm": wm,
        "pt0": int(previous.get("pt", processing)),
        "pt": processing,
        "tick": tick,
        "done": drained or (script.exhausted(positions) and wm >= MAX_MICROS),
    }
    if seen:
        offset["seen"] = seen
    if drained:
        offset["drained"] = True
    return offset


def runner_time(offset: dict) -> RunnerTime:
    return RunnerTime(
        watermark_before=int(offset["wm0"]),
        watermark=int(offset["wm"]),
        processing_before=int(offset["pt0"]),
        processing=int(offset["pt"]),
        done=bool(offset.get("done", False)),
        drained=bool(offset.get("drained", False)),
        budgets=tuple((name, int(items), int(size))
                      for name, (items, size) in sorted(offset.get("sdf", {}).items())),
    )
