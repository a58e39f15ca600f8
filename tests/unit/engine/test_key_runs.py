"""`contiguous_keys`: rows sorted by a (hash, input) long come out with each key's rows together
and in input order, with their input numbers read back from the long, however keys collide in
the hash and however the rows are cut into batches."""
from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkbeam.engine.key_runs import ORDER_INPUT_BITS, contiguous_keys

# What the shuffle hands a keyed stage's tasks: the input number only in `order`'s low bits.
SCHEMA = pa.schema([("key", pa.binary()), ("value", pa.binary()), ("order", pa.int64())])


def _sorted_batches(rows: list[tuple[int, bytes | None, bytes]], hash_of, cuts: list[int]
                    ) -> list[pa.RecordBatch]:
    """`rows` as the shuffle hands them over: sorted (stably) by the order long."""
    def order(row):  # type: ignore[no-untyped-def]
        return (hash_of(row[1]) << ORDER_INPUT_BITS) | (row[0] & 0xFFFF)

    ordered = sorted(rows, key=order)
    table = pa.table({"key": [r[1] for r in ordered], "value": [r[2] for r in ordered],
                      "order": [order(r) for r in ordered]}, schema=SCHEMA)
    batches, start = [], 0
    for cut in sorted(set(cuts)) + [len(ordered)]:
        if start <= cut <= len(ordered):
            batches.append(table.slice(start, cut - start).to_batches(max_chunksize=10**9)
                           or [pa.RecordBatch.from_pylist([], schema=SCHEMA)])
            start = cut
    return [b for part in batches for b in part]


def _check(rows, out_batches) -> None:  # type: ignore[no-untyped-def]
    out = [row for b in out_batches for row in zip(*(c.to_pylist() for c in b.columns),
                                                   strict=True)]
    assert all(b.schema.names == ["input", "key", "value"] for b in out_batches)
    assert sorted(out, key=repr) == sorted(rows, key=repr)  # nothing lost, nothing added
    seen, previous = set(), object()
    last_input: dict[object, int] = {}
    for inp, key, _ in out:
        if key != previous:
            assert key not in seen, f"key {key!r} comes back after other keys"
            seen.add(key)
            previous = key
        # Metric rows (input -1) sort after a key's data rows: they are filtered out later.
        rank = inp & 0xFFFF
        assert rank >= last_input.get(key, rank), f"key {key!r}: input {inp} after a later one"
        last_input[key] = rank


rows_strategy = st.lists(st.tuples(st.integers(-1, 3), st.one_of(st.none(), st.binary(max_size=3)),
                                   st.binary(max_size=4)), max_size=60)


@settings(max_examples=300, deadline=None)
@given(rows=rows_strategy, bits=st.integers(0, 3),
       cuts=st.lists(st.integers(0, 60), max_size=5))
def test_colliding_hashes_still_give_each_key_its_rows_together(rows, bits, cuts) -> None:
    # A hash of 0-3 bits, negative ones too: most keys collide (0 bits: all of them).
    def hash_of(key):  # type: ignore[no-untyped-def]
        return (hash(key) & ((1 << bits) - 1)) - (1 << bits) // 2

    _check(rows, list(contiguous_keys(iter(_sorted_batches(rows, hash_of, cuts)))))


@settings(max_examples=100, deadline=None)
@given(rows=rows_strategy, cuts=st.lists(st.integers(0, 60), max_size=5))
def test_distinct_hashes_pass_batches_through_unchanged(rows, cuts) -> None:
    keys = sorted({r[1] for r in rows}, key=repr)
    index = {k: n for n, k in enumerate(keys)}
    batches = _sorted_batches(rows, index.__getitem__, cuts)
    out = list(contiguous_keys(iter(batches)))
    _check(rows, out)
    assert [b.num_rows for b in out] == [b.num_rows for b in batches if b.num_rows]


def test_a_collision_holds_the_second_key_until_its_run_ends() -> None:
    rows = [(0, b"a", b"1"), (0, b"b", b"2"), (1, b"a", b"3"), (1, b"b", b"4"), (0, b"c", b"5")]
    same = {b"a": 7, b"b": 7, b"c": 9}
    out = list(contiguous_keys(iter(_sorted_batches(rows, same.__getitem__, [1, 3]))))
    assert [tuple(r.values()) for b in out for r in b.to_pylist()] == [
        (0, b"a", b"1"), (1, b"a", b"3"), (0, b"b", b"2"), (1, b"b", b"4"), (0, b"c", b"5")]
