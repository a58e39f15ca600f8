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
    held: dict[tuple[int, bytes], tuple[list[bytes], list[int]]] = {}
    count = size = 0
    for row in rows:
        tag, key, value = row
        if key is None or tag not in tags:
            if tag < 0 and held:
                yield from _flush(held)
                count = size = 0
            yield row
            continue
        found = held.get((tag, key))
        if found is None:
            held[(tag, key)] = ([value], [len(value)])
        else:
            values, row_bytes = found
            if row_bytes[0] + len(value) > max_row_bytes:
                yield (tag, key, b"".join(values))
                values.clear()
                row_bytes[0] = 0
            values.append(value)
            row_bytes[0] += len(value)
        count += 1
        size += len(value)
        if count >= max_rows or size >= max_bytes:
            yield from _flush(held)
            count = size = 0
    yield from _flush(held)


def _flush(held: dict[tuple[int, bytes], tuple[list[bytes], list[int]]]) -> Iterator[OutRow]:
    for (tag, key), (values, _) in held.items():
        if values:
            yield (tag, key, b"".join(values))
    held.clear()
