"""A producer's keyed rows packed: a key's encoded elements back to back in one row (pure).

Only for outputs whose every reader joins a key's values into one stream and decodes elements
until it ends (`plan/packed_rows.py` says which, and why it pays). Rows of other tags, and rows
with no key, pass as they come. Within a stretch of the task's output (`MAX_ROWS` rows or
`MAX_BYTES` bytes of packed values), each key's rows of one tag become one row, its values in
the order they came, in the order the keys first came; a key's row is cut at `MAX_ROW_BYTES`
(64 KB): the readers' own batches count rows, not bytes, in places (the hash collisions'
repair cuts 8,192 rows, `engine/key_runs.py`), and a row then holds ~100 of the bench's events.
A row with a negative tag (the task's metric rows) first flushes what is held, so metric rows
still follow the rows they count.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Set

from sparkbeam.engine.program import OutRow

MAX_ROWS = 100_000
MAX_BYTES = 16 << 20
MAX_ROW_BYTES = 64 << 10


def packed(rows: Iterable[OutRow], tags: Set[int], max_rows: int = MAX_ROWS,
           max_bytes: int = MAX_BYTES, max_row_bytes: int = MAX_ROW_BYTES) -> Iterator[OutRow]:
    """`rows` with those of `tags` packed per key (see the module doc)."""
    # One table a tag, keyed by the key's bytes: this runs once a row of the task's output.
    held: dict[int, dict[bytes, list[bytes]]] = {tag: {} for tag in tags}
    count = size = 0
    for row in rows:
        tag, key, value = row
        table = held.get(tag)
        if table is None or key is None:
            if tag < 0 and count:
                yield from _flush(held, max_row_bytes)
                count = size = 0
            yield row
            continue
        found = table.get(key)
        if found is None:
            table[key] = [value]
        else:
            found.append(value)
        count += 1
        size += len(value)
        if count >= max_rows or size >= max_bytes:
            yield from _flush(held, max_row_bytes)
            count = size = 0
    if count:
        yield from _flush(held, max_row_bytes)


def _flush(held: dict[int, dict[bytes, list[bytes]]], max_row_bytes: int) -> Iterator[OutRow]:
    """Each key's held values as rows of at most `max_row_bytes` (or one value larger)."""
    for tag, table in held.items():
        for key, values in table.items():
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
        table.clear()
