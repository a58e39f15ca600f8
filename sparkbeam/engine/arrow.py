"""Rows to and from Arrow record batches, the vehicle of every stage's input and output.

Stage rows are (tag or input index, encoded key or None, encoded element); on the wire they are
Arrow batches of three columns (int32, binary, binary), cut at 8192 rows or 16 MB.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa

OUT_ARROW = pa.schema(
    [("tag", pa.int32(), False), ("key", pa.binary()), ("value", pa.binary(), False)]
)
_BATCH_ROWS = 8192
_BATCH_BYTES = 16 << 20


def rows_of(batches: Iterator[pa.RecordBatch]) -> Iterator[tuple[int, Any, bytes]]:
    """The rows of Arrow batches of three columns."""
    for batch in batches:
        yield from zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(),
                       batch.column(2).to_pylist(), strict=True)


def to_arrow_batches(rows: Iterator[tuple]) -> Iterator[pa.RecordBatch]:
    tags: list[int] = []
    keys: list[Any] = []
    values: list[bytes] = []
    size = 0
    for tag, key, value in rows:
        tags.append(tag)
        keys.append(key)
        values.append(value)
        size += len(value)
        if len(tags) >= _BATCH_ROWS or size >= _BATCH_BYTES:
            yield _batch(tags, keys, values)
            tags, keys, values, size = [], [], [], 0
    if tags:
        yield _batch(tags, keys, values)


def _batch(tags: list[int], keys: list[Any], values: list[bytes]) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [pa.array(tags, pa.int32()), pa.array(keys, pa.binary()), pa.array(values, pa.binary())],
        schema=OUT_ARROW,
    )
