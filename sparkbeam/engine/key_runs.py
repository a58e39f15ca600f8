"""A keyed stage's input sorted by a hash of its key, made exact (pure: Arrow batches in and out).

The shuffle into a keyed stage used to sort each partition by (key, input). Spark compares such
rows one pair at a time; a single long column whose value decides the order is sorted by radix
instead: on 10 M skewed rows in Spark alone, ~4 s of the sort's ~6 s less, and the bench's
skewed GroupByKey at 10 M ~10 % faster (bench/ANALYSIS.md). So the shuffle sorts by one long,
`order`: a hash of the key in the high 48 bits and the stage input number in the low 16
(`ORDER_INPUT_BITS`). Rows of one key then lie together, in input order, unless another key of
the same partition has the same 48-bit hash: then the two keys' rows can interleave.

`contiguous_keys` repairs that. Within each run of rows with equal hash, the rows of the run's
first key pass on as they come; the rows of any other key are held back and follow the run,
sorted by (key, input). (Those rows wait in the task's memory, where Spark's sort could have
spilled them to disk; with a 48-bit hash, a few keys' at most, in very large partitions.) Every
consumer downstream (grouping from columns, bundles, stateful DoFns) sees what it always saw:
each key's rows together, ordered by input. A batch without such a collision (all but a
vanishing few) is checked with vectorised comparisons of neighbouring rows and passed on with
its `order` column dropped, without a Python step per row.

The shuffle hands the tasks (key, value, order) only: the input number is `order`'s low bits,
so it is not sent a second time (each column the JVM hands Python costs it ~0.3-0.5 us a row:
bench/ANALYSIS.md). `contiguous_keys` puts it back in front, with NumPy, per batch.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: Low bits of the sort column that hold the stage input number (so a stage may sort this way
#: only when its input numbers, and the metric rows' tag masked to them, fit).
ORDER_INPUT_BITS = 16
MAX_ORDERED_INPUTS = (1 << ORDER_INPUT_BITS) - 1  # the all-ones value is the metric rows'


class _Runs:
    """The hash run the previous batch ended in: its hash, its first key, the rows held."""

    def __init__(self) -> None:
        self.hash: int | None = None
        self.first: Any = None
        self.last: Any = None
        self.held: list[tuple[int, Any, Any]] = []


def contiguous_keys(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Batches of (key, value, order), sorted by `order`, as batches of (input, key, value)
    in which each key's rows are together and ordered by input (module docstring)."""
    runs = _Runs()
    schema: pa.Schema | None = None
    for shuffled in batches:
        if shuffled.num_rows == 0:
            continue
        batch = _with_inputs(shuffled)
        if schema is None:
            schema = pa.schema(list(batch.schema)[:3])
        hashes = batch.column(3).to_numpy(zero_copy_only=False) >> ORDER_INPUT_BITS
        keys = batch.column(1)
        if not runs.held and not _collides(runs, hashes, keys):
            runs.hash, runs.last = int(hashes[-1]), keys[-1].as_py()
            runs.first = runs.last  # no collision: the run's rows all have this key
            yield batch.select([0, 1, 2])
            continue
        yield from _batches(_repair(runs, batch, hashes), schema)
    if runs.held and schema is not None:
        yield from _batches(_release(runs), schema)


def _with_inputs(batch: pa.RecordBatch) -> pa.RecordBatch:
    """(key, value, order) as (input, key, value, order): the input number from `order`'s low
    bits, the all-ones value the metric rows' -1."""
    order = batch.column(2)
    low = order.to_numpy(zero_copy_only=False) & MAX_ORDERED_INPUTS
    inputs = np.where(low == MAX_ORDERED_INPUTS, -1, low).astype(np.int32)
    return pa.RecordBatch.from_arrays([pa.array(inputs, pa.int32()), batch.column(0),
                                       batch.column(1), order],
                                      names=["input", "key", "value", "order"])


#: Rows per batch the repair makes (the rows a run held back can be many: a hot key's).
_REPAIRED_ROWS = 8192


def _batches(rows: list[tuple], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    for start in range(0, len(rows), _REPAIRED_ROWS):
        columns = zip(*rows[start:start + _REPAIRED_ROWS], strict=True)
        yield pa.RecordBatch.from_arrays(
            [pa.array(list(column), type=field.type)
             for column, field in zip(columns, schema, strict=True)], schema=schema)


def _collides(runs: _Runs, hashes: np.ndarray, keys: pa.Array) -> bool:
    """Whether two different keys share a hash run in this batch (or its first row's key
    differs from the run the previous batch ended in, with the same hash)."""
    if runs.hash is not None and int(hashes[0]) == runs.hash and keys[0].as_py() != runs.last:
        return True
    if len(hashes) < 2:
        return False
    same_run = hashes[1:] == hashes[:-1]
    if not same_run.any():
        return False
    same_key = pc.fill_null(pc.equal(keys.slice(1), keys.slice(0, len(keys) - 1)), False)
    return bool((same_run & ~same_key.to_numpy(zero_copy_only=False)).any())


def _repair(runs: _Runs, batch: pa.RecordBatch, hashes: np.ndarray) -> list[tuple]:
    """The batch's rows with other keys of a hash run held back until the run ends."""
    out: list[tuple] = []
    inputs = batch.column(0).to_pylist()
    keys = batch.column(1).to_pylist()
    values = batch.column(2).to_pylist()
    for n, key in enumerate(keys):
        h = int(hashes[n])
        if h != runs.hash:
            out.extend(_release(runs))
            runs.hash, runs.first = h, key
        row = (inputs[n], key, values[n])
        if key == runs.first:
            out.append(row)
        else:
            runs.held.append(row)
        runs.last = key
    return out


def _release(runs: _Runs) -> list[tuple]:
    """The held rows, each key's together and ordered by input as the shuffle orders them
    (metric rows last), a stable sort: rows of one key and input keep their order."""
    held, runs.held = runs.held, []
    held.sort(key=lambda row: (row[1] is not None, row[1] or b"", row[0] & MAX_ORDERED_INPUTS))
    return held
