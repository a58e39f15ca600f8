"""A producer's keyed rows packed: several of a key's elements in one row (pure).

Only for outputs whose every reader takes a key's rows together (`plan/packed_rows.py` says
which, and why it pays). Rows of other tags, and rows with no key, pass as they come. The rows
of a packed tag are held over a stretch of the task's output (`MAX_ROWS` rows or `MAX_BYTES`
bytes) and then each key's become as few rows as its cut allows, its values in the order they
came, the keys in the order they first came. A row with a negative tag (the task's metric rows)
first flushes what is held, so metric rows still follow the rows they count. The cut,
`PACKED_ROW_BYTES` (1 KB, `plan/arrow_batches.py`): the readers' own batches count rows, not
bytes, in places (the hash collisions' repair cuts 8,192 rows, `engine/key_runs.py`), a job of
provably small elements stays one (batched by count), and a row then holds ~40 of the bench's
events or ~200 of its skewed GroupByKey's values.

Two layouts. A *streamed* tag's row is the key's encoded elements back to back, cut before an
element that would take it past the cut: its readers decode elements until the row ends, so a
row of one element is one too. A *counted* tag's row (the global window's grouping from
columns, `engine/keyed_columns.py`, which cuts values out of rows without decoding them) is a
big-endian int32 count, then that many values, each as its grouping's value coder nests it,
without the element's timestamp, window, pane and key; a new row starts each time a key's
values pass another multiple of the cut. Every row of a counted tag is counted, one of a single
value too: its reader takes every row of it for one. The values are cut out of the elements
with NumPy, by the reader's own check (`keyed_columns.cuttable`); an element it rejects
(another pane encoding, a key encoded otherwise) goes through `counted_value`, which decodes
it with Beam's coders.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Set
from typing import Any

import numpy as np
import pyarrow as pa

from sparkbeam.engine.arrow import cut_out, keyed_stretch
from sparkbeam.engine.keyed_columns import cuttable
from sparkbeam.engine.program import OutRow
from sparkbeam.engine.session_rows import SessionRows, session_rows
from sparkbeam.plan.arrow_batches import PACKED_ROW_BYTES, PACKED_STRETCH_ROWS

MAX_ROWS = PACKED_STRETCH_ROWS
# Bytes held at most: a stretch's NumPy temporaries are ~17 times them.
MAX_BYTES = 4 << 20

#: An element -> its value, nested-encoded (`counted_value`)
Revalue = Callable[[bytes], bytes]


def counted_value(coder: Any) -> Revalue:
    """What a counted row holds of an element of `coder` (a global-window `WindowedValue(KV)`'s
    coder, as `plan.grouping_paths.columnar_coders` takes it) that `keyed_columns.cuttable`
    does not cut: its value, decoded and encoded again, as `GlobalGrouping.value_of` does."""
    decode = coder.get_impl().decode_nested
    encode = coder.wrapped_value_coder.coders()[1].get_impl().encode_nested

    def revalue(element: bytes) -> bytes:
        return encode(decode(element).value[1])  # type: ignore[no-any-return]

    return revalue


def packed(rows: Iterable[OutRow], tags: Set[int], max_rows: int = MAX_ROWS,
           max_bytes: int = MAX_BYTES, max_row_bytes: int = PACKED_ROW_BYTES,
           counted: Mapping[int, Revalue] | None = None,
           sessions: Mapping[int, SessionRows] | None = None) -> Iterator[OutRow]:
    """`rows` with those of `tags` packed per key, those of `counted`'s tags counted, and
    those of `sessions`' as session rows (see the module doc, `engine/session_rows.py`)."""
    counted = counted or {}
    sessions = sessions or {}
    # Each packed tag's rows as they came, packed at the flush: a streamed tag's per key in
    # Python, a counted or sessions tag's with NumPy. Only the append runs once a row.
    held: dict[int, list[OutRow]] = {tag: [] for tag in (*tags, *counted, *sessions)}
    count = size = 0

    def flush() -> Iterator[OutRow]:
        for tag, kept in held.items():
            if kept:
                revalue = counted.get(tag)
                layout = sessions.get(tag)
                if layout is not None:
                    yield from session_rows(tag, kept, layout, max_row_bytes)
                elif revalue is None:
                    yield from _streamed_rows(kept, max_row_bytes)
                else:
                    yield from _counted_rows(tag, kept, revalue, max_row_bytes)
                kept.clear()

    for row in rows:
        kept = held.get(row[0])
        if kept is not None and row[1] is not None:
            kept.append(row)
            count += 1
            size += len(row[2])
            if count >= max_rows or size >= max_bytes:
                yield from flush()
                count = size = 0
            continue
        if row[0] < 0 and count:
            yield from flush()
            count = size = 0
        yield row
    if count:
        yield from flush()


def _streamed_rows(kept: list[OutRow], max_row_bytes: int) -> Iterator[OutRow]:
    """A streamed tag's held rows, per key in the order the keys first came, its values in
    order: a row of at most `max_row_bytes` (or one value larger)."""
    by_key: dict[bytes, list[bytes]] = {}
    for _, key, value in kept:
        found = by_key.get(key)  # type: ignore[arg-type]
        if found is None:
            by_key[key] = [value]  # type: ignore[index]
        else:
            found.append(value)
    tag = kept[0][0]
    for key, values in by_key.items():
        joined = values[0] if len(values) == 1 else b"".join(values)
        if len(joined) <= max_row_bytes or len(values) == 1:
            yield (tag, key, joined)
            continue
        first = taken = 0
        for n, value in enumerate(values):
            if taken and taken + len(value) > max_row_bytes:
                yield (tag, key, b"".join(values[first:n]))
                first, taken = n, 0
            taken += len(value)
        yield (tag, key, b"".join(values[first:]))


def _counted_rows(tag: int, kept: list[OutRow], revalue: Revalue, max_row_bytes: int
                  ) -> list[OutRow]:
    """A stretch's rows of a counted tag: per key, in the order the keys first came, its
    values in order, a row each time they pass another `max_row_bytes` (so a row holds less
    than that and one value more), each after its count. With NumPy: a Python call a row
    (cut the value out, then a table a key) added ~0.8 µs a line to the skewed GroupByKey's
    map stage in-process (1.5 µs a line unpacked); this adds none measurable."""
    stretch = keyed_stretch(kept)
    group, data, begin, end = stretch.group, stretch.data, stretch.begin, stretch.end
    n = len(begin)
    ok, start = cuttable(data, begin, end, stretch.key_offsets, stretch.key_data,
                         np.ones(n, dtype=bool))
    if ok.all():
        values = cut_out(data, start, end)
        lengths = end - start
    else:  # an element its header or key does not cut: the stretch in Python, it by `revalue`
        skips = (start - begin).tolist()
        elements = [data[a:b].tobytes() for a, b in zip(begin.tolist(), end.tolist(),
                                                        strict=True)]
        parts = [element[skip:] if good else revalue(element) for element, skip, good
                 in zip(elements, skips, ok.tolist(), strict=True)]
        values = np.frombuffer(b"".join(parts), dtype=np.uint8)
        lengths = np.array([len(part) for part in parts], dtype=np.int64)
    # Each value's bytes before it in its key's, and the rows: a new one where the key changes
    # or those bytes pass another `max_row_bytes`.
    before = np.cumsum(lengths) - lengths
    new_key = np.ones(n, dtype=bool)
    new_key[1:] = group[1:] != group[:-1]
    key_starts = np.flatnonzero(new_key)
    within = (before - np.repeat(before[key_starts], np.diff(np.append(key_starts, n)))
              ) // max(max_row_bytes, 1)
    new_row = new_key.copy()
    new_row[1:] |= within[1:] != within[:-1]
    starts = np.flatnonzero(new_row)
    counts = np.diff(np.append(starts, n))
    row_bytes = np.add.reduceat(lengths, starts)
    # Out: each row's count (4 bytes, big-endian), then its values.
    out = np.empty(len(values) + 4 * len(starts), dtype=np.uint8)
    at = np.cumsum(row_bytes + 4) - (row_bytes + 4)
    for k in range(4):
        out[at + k] = (counts >> (8 * (3 - k))) & 0xFF
    out[np.arange(len(values)) + 4 * (np.repeat(np.arange(len(starts)), row_bytes) + 1)] = values
    joined = out.tobytes()
    bounds = np.append(at, len(out)).tolist()
    row_keys = stretch.keys.take(pa.array(group[starts])).to_pylist()
    return [(tag, key, joined[bounds[r]:bounds[r + 1]]) for r, key in enumerate(row_keys)]
