"""A producer's keyed rows packed per key (`engine/packed_rows.py`) lose, add and reorder nothing
their readers see: the packing itself on generated rows, and a stage that groups per window or a
stateful stage fed packed rows giving the same rows as fed one element a row, directly and by
Beam's bundle processor (without Spark); counted rows (the global window's grouping from
columns), from the producer's task to the grouped stage's."""
from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

import apache_beam as beam
import pytest
from apache_beam.coders import coders
from apache_beam.coders.coder_impl import create_InputStream
from apache_beam.runners.common import ENCODED_IMPULSE_VALUE
from apache_beam.transforms.window import GlobalWindows
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkbeam.engine.context import pipeline_context
from sparkbeam.engine.packed_rows import counted_value, packed
from sparkbeam.engine.session_rows import layout_of
from sparkbeam.engine.task import TaskSpec, run_stage_task
from sparkbeam.plan.batch import plan_batch
from sparkbeam.plan.model import IMPULSE_BUFFER, StageKind
from sparkbeam.plan.packed_rows import packed_tags
from tests.unit.engine.test_direct_grouped import _FNS, _elements, _stage
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
    rows = _elements(plan, stage, events)
    grouping = plan.groupings[stage.inputs[0].buffer_id]
    # Beam's Sessions shuffle as session rows (`engine/session_rows.py`): against the same
    # stage planned to read one element a row.
    assert grouping.session_rows == (windowing == "sessions")
    plain = dataclasses.replace(spec, groupings={
        b: dataclasses.replace(g, session_rows=False) for b, g in spec.groupings.items()})
    sessions = ({0: layout_of(pipeline_context(plan.components).coders[grouping.input_coder_id])}
                if grouping.session_rows else {})
    # Packed as a producer packs them, then each key's rows together again, as the shuffle
    # hands them on (its sort keeps no order within a key: a key's rows in any order).
    packs = sorted(packed(iter(rows), set() if sessions else {0}, max_rows=max_rows,
                          sessions=sessions), key=lambda r: r[1])
    if max_rows > len(events) > len({k for k, _, _ in events}):
        assert len(packs) < len(rows)

    def data(task: TaskSpec, given: list[Any]) -> list[Any]:
        return sorted(r for r in run_stage_task(task, iter(given), {}) if r[0] >= 0)

    assert data(spec, packs) == data(plain, rows)


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


def _global_stages(counting: bool) -> tuple[Any, list[Any]]:
    """A global-window GroupByKey between two plain stages, planned with its input counted
    or not: the plan and its stages in order."""
    p = beam.Pipeline()
    grouped = (p | beam.Impulse() | beam.FlatMap(lambda _: range(3_000)).with_output_types(int)
               | beam.Map(lambda x: (x % 37, x)).with_output_types(tuple[int, int])
               | "Group" >> beam.GroupByKey()
               | beam.MapTuple(lambda k, vs: (k, len(vs), sum(vs), list(vs)[:3])))
    # Read as a side input: the grouped stage's rows come out as elements, packed or not.
    _ = (p | "Again" >> beam.Impulse()
         | beam.FlatMap(lambda _, side: side, beam.pvalue.AsList(grouped)))
    plan = plan_batch(p.to_runner_api(), packing=counting)
    return plan, list(plan.stages)


def _run_in_order(plan: Any, stages: list[Any], direct: bool = True) -> list[Any]:
    """Each stage's task over its inputs' rows (a keyed stage's by key, as the shuffle hands
    them), with the tags the executor gives it, up to the grouped stage; its rows."""
    buffers: dict[bytes, list[Any]] = {}
    out: list[Any] = []
    for stage in stages[:next(n for n, s in enumerate(stages)
                              if s.kind is StageKind.GROUPED) + 1]:
        if not direct:
            stage = dataclasses.replace(stage, direct=None)
        tags, counted = packed_tags(plan, stage)
        spec = TaskSpec(stage=stage, components=plan.components,
                        groupings={i.buffer_id: plan.groupings[i.buffer_id]
                                   for i in stage.inputs if i.buffer_id in plan.groupings},
                        pickle_library="default", bundle_size=100, bundle_bytes=64 << 20,
                        packed_tags=tags, counted_tags=counted)
        rows = [(n, None, ENCODED_IMPULSE_VALUE) if i.buffer_id == IMPULSE_BUFFER else (n, k, v)
                for n, i in enumerate(stage.inputs)
                for k, v in ([(None, None)] if i.buffer_id == IMPULSE_BUFFER
                             else buffers.get(i.buffer_id, []))]
        if stage.kind.keyed:
            rows.sort(key=lambda r: (r[1], r[0]))
        out = [(t, k, bytes(v)) for t, k, v in run_stage_task(spec, iter(rows), {}) if t >= 0]
        for t, k, v in out:
            buffers.setdefault(stage.outputs[t].buffer_id, []).append((k, v))
    return out


@pytest.mark.parametrize("direct", [True, False])
def test_a_counted_grouping_gives_the_uncounted_ones_output(direct: bool) -> None:
    # The producer's task counts its output (`counted_tags`), the grouped stage reads the
    # counted rows from columns: the same rows out as one element a row, through the direct
    # path or Beam's bundle processor.
    counted_plan, counted_stages = _global_stages(counting=True)
    plain_plan, plain_stages = _global_stages(counting=False)
    assert any(packed_tags(counted_plan, s)[1] for s in counted_stages)
    assert not any(g.counted for g in plain_plan.groupings.values())
    got = _run_in_order(counted_plan, counted_stages, direct)
    assert got and sorted(got) == sorted(_run_in_order(plain_plan, plain_stages, direct))


def test_a_counted_input_a_stage_cannot_group_from_columns_is_refused() -> None:
    plan, stages = _global_stages(counting=True)
    grouped = next(s for s in stages if s.kind is StageKind.GROUPED)
    # A plan that said counted where the worker groups row by row (here: a plain stage).
    wrong = dataclasses.replace(grouped, kind=StageKind.PLAIN)
    spec = TaskSpec(stage=wrong, components=plan.components, groupings=dict(plan.groupings),
                    pickle_library="default", bundle_size=100, bundle_bytes=64 << 20)
    with pytest.raises(ValueError, match="packed as counted values, but this stage does not"):
        list(run_stage_task(spec, iter([(0, b"\x01", b"\x00\x00\x00\x01\x05")]), {}))


def test_streamed_and_counted_tags_of_one_task_pack_apart_past_a_uint16_of_keys() -> None:
    # 70,000 keys in one stretch (past the radix sort's 65,536), a streamed tag beside the
    # counted one, metric rows between: each tag's values per key in order, counted rows a
    # count and the values.
    coder = coders.WindowedValueCoder(
        coders.TupleCoder([coders.VarIntCoder(), coders.VarIntCoder()]),
        coders.GlobalWindowCoder())
    impl, key_impl = coder.get_impl(), coders.VarIntCoder().get_impl()
    rows: list[Any] = []
    for x in range(140_000):
        k = x % 70_000
        rows.append((1, key_impl.encode_nested(k),
                     impl.encode_nested(GlobalWindows.windowed_value((k, x)))))
        if x % 3 == 0:
            rows.append((0, b"s" + bytes([x % 5]), bytes([x % 251])))
        if x == 100_000:
            rows.append((-1, b"attempt", b"m"))
    out = list(packed(rows, {0}, counted={1: counted_value(coder)}))
    metric = out.index((-1, b"attempt", b"m"))
    for part, came in ((out[:metric], rows[:rows.index((-1, b"attempt", b"m"))]),
                       (out[metric + 1:], rows[rows.index((-1, b"attempt", b"m")) + 1:])):
        want: dict[Any, list[Any]] = {}
        for t, k, v in came:
            want.setdefault((t, k), []).append(
                v if t == 0 else key_impl.encode_nested(impl.decode_nested(v).value[1]))
        got: dict[Any, list[Any]] = {}
        for t, k, v in part:
            if t == 0:
                got.setdefault((t, k), []).append(v)
                continue
            count = int.from_bytes(v[:4], "big")
            stream = create_InputStream(v[4:])
            values = [key_impl.encode_nested(key_impl.decode_from_stream(stream, True))
                      for _ in range(count)]
            assert stream.size() == 0
            got.setdefault((t, k), []).extend(values)
        assert {k: b"".join(v) for k, v in got.items() if k[0] == 0} == {
            k: b"".join(v) for k, v in want.items() if k[0] == 0}
        assert {k: v for k, v in got.items() if k[0] == 1} == {
            k: v for k, v in want.items() if k[0] == 1}
