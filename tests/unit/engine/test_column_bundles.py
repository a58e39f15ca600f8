"""A plain stage's bundles cut from Arrow columns are the bundles cut row by row."""
from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkbeam.engine.arrow import OUT_ARROW, ArrowRows
from sparkbeam.engine.bundles import column_bundles, plain_bundles

_ROW = st.tuples(st.integers(0, 2), st.binary(max_size=40))


def _batches(rows: list[tuple[int, bytes]], cut: int, sliced: bool) -> list[pa.RecordBatch]:
    batches = []
    for start in range(0, len(rows), cut):
        part = rows[start:start + cut]
        if sliced:  # a batch that is a slice of a bigger one: offsets do not start at 0
            part = [(0, b"before")] + part
        batch = pa.RecordBatch.from_arrays(
            [pa.array([n for n, _ in part], pa.int32()), pa.array([None] * len(part), pa.binary()),
             pa.array([v for _, v in part], pa.binary())], schema=OUT_ARROW)
        batches.append(batch.slice(1) if sliced else batch)
    return batches


def _shape(bundles):  # type: ignore[no-untyped-def]
    """Each bundle as (input -> its elements), elements joined per input, and its counts."""
    return [({n: b"".join(parts) for n, parts in b.chunks.items()}, b.counts, b.count, b.size)
            for b in bundles]


@settings(max_examples=300)
@given(rows=st.lists(_ROW, max_size=60), size=st.integers(1, 12), max_bytes=st.integers(1, 200),
       cut=st.integers(1, 25), sliced=st.booleans())
def test_column_bundles_are_plain_bundles(rows, size, max_bytes, cut, sliced) -> None:  # type: ignore[no-untyped-def]
    expected = plain_bundles([(n, None, v) for n, v in rows], size, max_bytes)
    got = column_bundles(ArrowRows(iter(_batches(rows, cut, sliced))).columns(), size, max_bytes)
    assert _shape(got) == _shape(expected)


def test_no_rows_is_one_empty_bundle_only_when_asked() -> None:
    assert list(column_bundles(iter([]), 5, 100)) == []
    (bundle,) = column_bundles(iter([]), 5, 100, always=True)
    assert bundle.count == 0 and bundle.chunks == {}
