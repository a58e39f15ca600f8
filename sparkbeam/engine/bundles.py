"""Cutting a task's rows into bundles (pure: rows in, chunks out).

Rows are (stage input index, encoded key or None, encoded element). A bundle holds at most
`size` elements or `max_bytes` bytes of them (the first element of a bundle is always taken, so
one element larger than `max_bytes` is a bundle of its own).

Keyed rows arrive with each key's rows together, ordered by input (`key_runs.py`). A bundle
then ends at a key boundary once full, and says so (`Bundle.closes_keys`): the keys it ends
with are complete, so batch fires their timers and drops their state before the next bundle.
A GroupByKey input's values are gathered key by key and grouped (`Grouper`) into one element
per window and pane before they join a bundle; a key with more ungrouped values than a bundle
holds is cut inside the key, and that bundle does not close it.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sparkbeam.engine.arrow import Columns
from sparkbeam.engine.grouping import Grouper
from sparkbeam.engine.program import Chunks

Row = tuple[int, bytes | None, bytes]  # (stage input index, encoded key, encoded element)


@dataclass
class Bundle:
    """The elements of one bundle per stage input, and whether its last key is complete."""

    chunks: Chunks = field(default_factory=dict)
    closes_keys: bool = False
    count: int = 0
    size: int = 0
    counts: dict[int, int] = field(default_factory=dict)  # elements per stage input

    @classmethod
    def of(cls, chunks: Chunks, closes_keys: bool = False) -> Bundle:
        bundle = cls(closes_keys=closes_keys)
        for n, elements in chunks.items():
            for element in elements:
                bundle.add(n, element)
        return bundle

    def add(self, n: int, element: bytes) -> None:
        self.add_run(n, element, 1)

    def add_run(self, n: int, elements: bytes, count: int) -> None:
        """`count` encoded elements of input `n`, back to back."""
        self.chunks.setdefault(n, []).append(elements)
        self.counts[n] = self.counts.get(n, 0) + count
        self.count += count
        self.size += len(elements)

    def full(self, size: int, max_bytes: int) -> bool:
        return self.count >= size or self.size >= max_bytes


def plain_bundles(rows: Iterable[Row], size: int, max_bytes: int, *, always: bool = False
                  ) -> Iterator[Bundle]:
    """Rows in arrival order as bundles; `always`: one (empty) bundle even without rows (a
    stage without inputs runs once)."""
    bundle = Bundle()
    for n, _key, value in rows:
        bundle.add(n, value)
        if bundle.full(size, max_bytes):
            yield bundle
            bundle = Bundle()
    if bundle.count or always:
        yield bundle


def column_bundles(columns: Iterable[Columns], size: int, max_bytes: int, *,
                   always: bool = False) -> Iterator[Bundle]:
    """What `plain_bundles` makes of the same rows (the same elements in the same bundles),
    from Arrow columns: each bundle takes runs of consecutive values of one input as they lie
    in the batch's buffer, found with a search over the offsets, not a step per element."""
    bundle = Bundle()
    for col in columns:
        rows, i = len(col.inputs), 0
        while i < rows:
            n = int(col.inputs[i])
            end = min(rows, i + size - bundle.count)
            other = np.flatnonzero(col.inputs[i:end] != n)
            if other.size:
                end = i + int(other[0])
            # An element joins while the bundle is under max_bytes before it (as in `add`).
            room = max_bytes - bundle.size
            end = min(end, int(np.searchsorted(col.offsets, col.offsets[i] + room, "left")))
            end = max(end, i + 1)  # the bundle is not full, so it takes at least this one
            bundle.add_run(n, bytes(col.data[col.offsets[i]:col.offsets[end]]), end - i)
            i = end
            if bundle.full(size, max_bytes):
                yield bundle
                bundle = Bundle()
    if bundle.count or always:
        yield bundle


def keyed_bundles(rows: Iterable[Row], size: int, max_bytes: int,
                  groupers: Mapping[int, Grouper]) -> Iterator[Bundle]:
    """Rows with each key's together, ordered by input, as bundles that end at key boundaries
    once full; the last one closes every key seen."""
    bundle = Bundle()
    current: tuple[bytes | None, int] | None = None
    run: list[bytes] = []  # the current key's values of a grouped input, not yet grouped

    def close_run() -> None:
        if current is None or not run:
            return
        n = current[1]
        for element in groupers[n].group(run, current[0]):
            bundle.add(n, element)
        run.clear()

    for n, key, value in rows:
        if current is not None and (key, n) != current:
            close_run()
            if key != current[0] and bundle.full(size, max_bytes):
                bundle.closes_keys = True
                yield bundle
                bundle = Bundle()
        elif n not in groupers and bundle.full(size, max_bytes):
            # One key bigger than a bundle: cut the bundle inside the key, close it later.
            yield bundle
            bundle = Bundle()
        current = (key, n)
        if n in groupers:
            run.append(value)
        else:
            bundle.add(n, value)
    close_run()
    bundle.closes_keys = True
    yield bundle


@dataclass
class GroupedBatch:
    """A direct grouped stage's bundle (`engine/direct.py`): its grouped elements as the
    grouper made them, not encoded."""

    elements: list[Any]  # WindowedValues of (key, values)

    def bundle(self, encode: Callable[[Any], bytes]) -> Bundle:
        """The same elements as the bundle processor takes them (`encode`: the grouper's)."""
        return Bundle.of({0: [encode(e) for e in self.elements]}, closes_keys=True)


def grouped_batches(rows: Iterable[Row], size: int, max_bytes: int,
                    group: Callable[[list[bytes], bytes], list[Any]]) -> Iterator[GroupedBatch]:
    """One GroupByKey input's rows, each key's together, grouped key by key (`group`) into
    batches that end at a key boundary once they hold `size` keys or `max_bytes` of input, as
    `keyed_bundles` cuts a grouped input's bundles (a key's grouped elements, one per window,
    count once there)."""
    batch: list[Any] = []
    taken = keys = 0
    current: bytes | None = None
    run: list[bytes] = []
    for _n, key, value in rows:
        if run and key != current:
            batch.extend(group(run, current))  # type: ignore[arg-type]
            run = []
            keys += 1
            if keys >= size or taken >= max_bytes:
                yield GroupedBatch(batch)
                batch, taken, keys = [], 0, 0
        current = key
        run.append(value)
        taken += len(value)
    if run:
        batch.extend(group(run, current))  # type: ignore[arg-type]
    if batch:
        yield GroupedBatch(batch)
