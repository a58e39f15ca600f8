"""Rows to and from Arrow record batches, the vehicle of every stage's input and output.

Stage rows are (tag or input index, encoded key or None, encoded element); on the wire they are
Arrow batches of three columns (int32, binary, binary), cut at 8192 rows or 16 MB. A text read's
encoded lines are cut out of a batch's buffer as strings at once (`text_lines`, for the direct
path).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

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


@dataclass
class ArrowRows:
    """A task's input as Arrow batches: iterated, its rows; `columns()`, each batch as
    columns, so a plain stage hands the SDK runs of encoded elements as they lie in Arrow's
    buffer, with no Python work per element (`engine/bundles.py`, `column_bundles`)."""

    batches: Iterator[pa.RecordBatch]

    def __iter__(self) -> Iterator[tuple[int, Any, bytes]]:
        return rows_of(self.batches)

    def columns(self) -> Iterator[Columns]:
        for batch in self.batches:
            if batch.num_rows:
                yield columns_of(batch)


@dataclass(frozen=True)
class Columns:
    """One batch: each row's stage input, and its values back to back (`data`), row i's
    value at data[offsets[i]:offsets[i + 1]]."""

    inputs: np.ndarray
    offsets: np.ndarray  # int64, len(inputs) + 1, starting at 0
    data: memoryview


def columns_of(batch: pa.RecordBatch) -> Columns:
    offsets, data = binary_buffers(batch.column(2))
    return Columns(batch.column(0).to_numpy(zero_copy_only=False), offsets, data)


def binary_buffers(values: pa.Array) -> tuple[np.ndarray, memoryview]:
    """A binary array's offsets (int64, len(values) + 1, starting at 0) and its values back to
    back, as they lie in Arrow's buffers (a sliced array's too)."""
    _, offset_buffer, data_buffer = values.buffers()[:3]
    wide = pa.types.is_large_binary(values.type)
    offsets = np.frombuffer(offset_buffer, dtype=np.int64 if wide else np.int32,
                            count=len(values) + 1, offset=values.offset * (8 if wide else 4))
    start, end = int(offsets[0]), int(offsets[-1])
    data = memoryview(data_buffer)[start:end] if data_buffer is not None else memoryview(b"")
    return offsets.astype(np.int64) - start, data


def cut_out(data: np.ndarray, begin: np.ndarray, end: np.ndarray) -> np.ndarray:
    """The bytes [begin, end) of `data` of each row, back to back, in one gather (its index
    as long as what it cuts, not as `data`)."""
    lengths = end - begin
    if not len(lengths):
        return data[:0]
    before = np.cumsum(lengths) - lengths
    return data[np.arange(int(before[-1] + lengths[-1])) + np.repeat(begin - before, lengths)]


@dataclass
class KeyedStretch:
    """A producer's held rows of one tag, each key's together (`keyed_stretch`)."""

    keys: pa.Array  # the distinct keys, in the order they first came
    group: np.ndarray  # each element's key, as an index into `keys`, in the new order
    data: np.ndarray  # the elements back to back, in the new order (uint8)
    begin: np.ndarray  # each element's bounds in `data`
    end: np.ndarray
    key_offsets: np.ndarray  # each element's key bytes in `key_data`
    key_data: np.ndarray


def keyed_stretch(kept: list[tuple[int, Any, bytes]]) -> KeyedStretch:
    """`kept`'s elements with each key's together, the keys in the order they first came and
    each key's elements in order (a stable sort; a radix sort for up to 65,536 keys, most
    stretches), as NumPy views of Arrow's buffers."""
    keyed = pc.dictionary_encode(pa.array([row[1] for row in kept], pa.binary()))
    first = keyed.indices.to_numpy(zero_copy_only=False)
    order = np.argsort(first.astype(np.uint16) if len(keyed.dictionary) <= 1 << 16 else first,
                       kind="stable")
    group = first[order]
    offsets, view = binary_buffers(pa.array([row[2] for row in kept], pa.binary())
                                   .take(pa.array(order)))
    key_offsets, key_view = binary_buffers(keyed.dictionary.take(pa.array(group)))
    return KeyedStretch(keyed.dictionary, group, np.frombuffer(view, dtype=np.uint8),
                        offsets[:-1], offsets[1:], key_offsets,
                        np.frombuffer(key_view, dtype=np.uint8))


def arrow_rows(rows: list[tuple[int, Any, bytes]]) -> ArrowRows:
    """Stage input rows held in a list as Arrow batches, cut as a task's output is (so no
    batch outgrows a binary column's 2 GB)."""
    return ArrowRows(to_arrow_batches(iter(rows)))


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


def text_lines(col: Columns, prefix: bytes) -> list[str] | None:
    """The strings of a batch of encoded lines (`prefix`, the UTF-8 length as a varint of up to
    three bytes, the bytes), or None if an element is not one or is not valid UTF-8."""
    n = len(col.inputs)
    data = np.frombuffer(col.data, dtype=np.uint8)
    starts = col.offsets[:-1]
    total = np.diff(col.offsets) - len(prefix)
    if n == 0 or total.min() < 1:
        return None
    if prefix:
        head = data[starts[:, None] + np.arange(len(prefix))]
        if not (head == np.frombuffer(prefix, dtype=np.uint8)).all():
            return None
    # The varint's width w solves w + length == total; its bytes must say that length.
    width = np.where(total - 1 < 1 << 7, 1, np.where(total - 2 < 1 << 14, 2, 3))
    length = total - width
    if (length < 0).any() or (length >= 1 << 21).any():
        return None
    base = starts + len(prefix)
    for k in range(3):
        has = width > k
        if not (data[base[has] + k] == _varint_byte(length[has], width[has], k)).all():
            return None
    keep = np.ones(len(data), dtype=bool)
    header = len(prefix) + width
    for k in range(int(header.max())):
        at = header > k
        keep[starts[at] + k] = False
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(length, out=offsets[1:])
    strings = pa.LargeStringArray.from_buffers(n, pa.py_buffer(offsets),
                                                pa.py_buffer(data[keep]))
    try:
        strings.validate(full=True)
    except pa.ArrowInvalid:
        return None
    return strings.to_pylist()


def encoded_lines(prefix: bytes) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """What turns a task's batches of Spark's text source (one string column of lines, each
    cut at '\\n') into stage input batches (input 0, no key, the line's encoded element):
    the one '\\r' that may end a line dropped, as Beam's reader drops it with the '\\n',
    then `prefix`, the byte length as Beam's varint, the bytes. With NumPy over the batch's
    buffers, no Python per line: the encoding in Spark's own expressions cost each job
    ~60-100 ms of analysis and code generation in the driver (bench/ANALYSIS.md)."""
    head = np.frombuffer(prefix, dtype=np.uint8)

    def encode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            n = batch.num_rows
            if not n:
                continue
            lines = batch.column(0)
            if pa.types.is_string(lines.type) or pa.types.is_large_string(lines.type):
                lines = lines.view(pa.large_binary() if pa.types.is_large_string(lines.type)
                                   else pa.binary())
            values = _encode_lines(lines, head)
            yield pa.RecordBatch.from_arrays(
                [pa.array(np.zeros(n, dtype=np.int32)), pa.nulls(n, pa.binary()), values],
                names=["input", "key", "value"])

    return encode


def _encode_lines(lines: pa.Array, head: np.ndarray) -> pa.Array:
    offsets, data = binary_buffers(lines)
    raw = np.frombuffer(data, dtype=np.uint8)
    length = np.diff(offsets)
    ends = offsets[1:]
    cr = np.zeros(len(length), dtype=bool)
    has = length > 0
    cr[has] = raw[ends[has] - 1] == 13  # b"\r"
    length = length - cr
    width = np.ones(len(length), dtype=np.int64)
    for k in range(1, 5):
        width += length >= 1 << 7 * k
    header = len(head) + width
    out_offsets = np.zeros(len(length) + 1, dtype=np.int64)
    np.cumsum(header + length, out=out_offsets[1:])
    out = np.empty(int(out_offsets[-1]), dtype=np.uint8)
    starts = out_offsets[:-1]
    body = np.ones(len(out), dtype=bool)
    for k, byte in enumerate(head):
        out[starts + k] = byte
        body[starts + k] = False
    for k in range(int(width.max())):
        at = width > k
        where = starts[at] + len(head) + k
        out[where] = _varint_byte(length[at], width[at], k)
        body[where] = False
    keep = np.ones(len(raw), dtype=bool)
    keep[ends[cr] - 1] = False
    out[body] = raw[keep]
    return pa.Array.from_buffers(pa.large_binary(), len(length),
                                 [None, pa.py_buffer(out_offsets), pa.py_buffer(out)])


def _varint_byte(length: np.ndarray, width: np.ndarray, k: int) -> np.ndarray:
    """Byte `k` of Beam's varint of each `length`, written in `width` bytes: seven bits, low
    first, the high bit set on all but the last."""
    return (length >> 7 * k) & 0x7F | np.where(width > k + 1, 0x80, 0)
