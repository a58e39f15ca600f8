"""A producer's keyed rows packed per key (`engine/packed_rows.py`) lose, add and reorder nothing
their readers see: the packing itself on generated rows, and a stage that groups per window or a
stateful stage fed packed rows giving the same rows as fed one element a row, directly and by
Beam's bundle processor (without Spark)."""
from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sparkbeam.engine.packed_rows import packed
from sparkbeam.engine.task import TaskSpec, run_stage_task
from tests.unit.engine.test_direct_grouped import _FNS, _rows, _stage
from tests.unit.engine.test_direct_stateful import _EVENTS as _STATEFUL_EVENTS
from tests.unit.engine.test_direct_stateful import PLANS as STATEFUL_PLANS
from tests.unit.engine.test_direct_stateful import _rows as _stateful_rows

_KEYS = st.sampled_from([b"a", b"b", b"\xff", None])
_ROWS = st.lists(st.tuples(st.sampled_from([0, 1, -1]), _KEYS, st.binary(max_size=6)),
                 max_size=60)


def _segments(rows: list[Any]) -> list[list[Any]]:
    """The rows between metric rows (tag < 0), each metric row ending its segment."""
    out: list[list[Any]] = [[]]
    for row in rows:
        out[-1].append(row)
        if row[0] < 0:
            out.append([])
    return out


def _joined(rows: list[Any]) -> dict[tuple[int, bytes], bytes]:
    joined: dict[tuple[int, bytes], bytes] = {}
    for tag, key, value in rows:
        if tag == 0 and key is not None:
            joined[(tag, key)] = joined.get((tag, key), b"") + value
    return joined


@settings(max_examples=300, deadline=None)
@given(rows=_ROWS, max_rows=st.sampled_from([1, 2, 5, 100_000]),
       max_row_bytes=st.sampled_from([1, 4, 1 << 20]))
def test_packing_keeps_each_keys_bytes_in_order_and_the_rest_as_it_came(
        rows: list[Any], max_rows: int, max_row_bytes: int) -> None:
    out = list(packed(rows, {0}, max_rows=max_rows, max_row_bytes=max_row_bytes))
    ins, outs = _segments(rows), _segments(out)
    # Metric rows still close the same stretches: nothing packed crosses one.
    assert len(ins) == len(outs)
    for before, after in zip(ins, outs, strict=True):
        assert _joined(after) == _joined(before)
        untouched = [r for r in before if r[0] != 0 or r[1] is None]
        assert [r for r in after if r[0] != 0 or r[1] is None] == untouched
    for tag, key, value in out:
        if tag == 0 and key is not None:
            # Cut at the row limit, unless one element alone is larger.
            assert len(value) <= max_row_bytes or any(
                v == value for t, k, v in rows if (t, k) == (tag, key))


def test_a_keys_rows_become_one_row_and_metric_rows_come_after_them() -> None:
    rows = [(0, b"a", b"1"), (0, b"b", b"2"), (1, b"a", b"x"), (0, b"a", b"3"),
            (-1, b"attempt", b"m"), (0, b"a", b"4")]
    assert list(packed(rows, {0})) == [
        (1, b"a", b"x"), (0, b"a", b"13"), (0, b"b", b"2"), (-1, b"attempt", b"m"),
        (0, b"a", b"4")]


def _spec(plan: Any, stage: Any, bundle_size: int) -> TaskSpec:
    """The stage's task, its input one of the buffers the plan packs."""
    assert stage.inputs[0].buffer_id in plan.packed
    return TaskSpec(stage=stage, components=plan.components, groupings=dict(plan.groupings),
                    pickle_library="default", bundle_size=bundle_size, bundle_bytes=64 << 20)


@settings(max_examples=40, deadline=None)
@given(events=st.lists(st.tuples(st.sampled_from(["a", "b", "ü"]),
                                 st.integers(-30_000, 60_000), st.integers(-5, 5)),
                       max_size=40),
       windowing=st.sampled_from(sorted(_FNS)), bundle_size=st.sampled_from([1, 2, 1000]),
       max_rows=st.sampled_from([3, 100_000]), direct=st.booleans())
def test_a_grouped_stage_reads_packed_rows_as_it_reads_one_element_a_row(
        events: list[tuple[str, int, int]], windowing: str, bundle_size: int, max_rows: int,
        direct: bool) -> None:
    plan, stage = _stage(windowing)
    spec = _spec(plan, stage if direct else dataclasses.replace(stage, direct=None), bundle_size)
    rows = _rows(plan, stage, events)
    # Packed as a producer packs them, then each key's rows together again, as the shuffle
    # hands them on (its sort keeps no order within a key: a key's rows in any order).
    packs = sorted(packed(iter(rows), {0}, max_rows=max_rows), key=lambda r: r[1])
    if max_rows > len(events) > len({k for k, _, _ in events}):
        assert len(packs) < len(rows)

    def data(given: list[Any]) -> list[Any]:
        return sorted(r for r in run_stage_task(spec, iter(given), {}) if r[0] >= 0)

    assert data(packs) == data(rows)


@settings(max_examples=40, deadline=None)
@given(events=_STATEFUL_EVENTS, dofn=st.sampled_from(sorted(STATEFUL_PLANS)),
       bundle_size=st.sampled_from([1, 1000]), direct=st.booleans())
def test_a_stateful_stage_reads_packed_rows_as_it_reads_one_element_a_row(
        events: list[tuple[str, int, int]], dofn: str, bundle_size: int, direct: bool) -> None:
    plan, stage = STATEFUL_PLANS[dofn]
    spec = _spec(plan, stage if direct else dataclasses.replace(stage, direct_stateful=None),
                 bundle_size)
    rows = _stateful_rows(plan, stage, events)
    packs = sorted(packed(iter(rows), {0}), key=lambda r: r[1])
    if len(events) > len({k for k, _, _ in events}):
        assert len(packs) < len(rows)

    def data(given: list[Any]) -> Counter[Any]:
        return Counter((t, k, bytes(v)) for t, k, v in run_stage_task(spec, iter(given), {})
                       if t >= 0)

    assert data(packs) == data(rows)
