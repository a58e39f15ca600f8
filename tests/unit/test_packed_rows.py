"""Which buffers a batch plan packs several of a key's elements a row into (plan/packed_rows): only
those every reader groups per window or hands a stateful DoFn (streamed), or groups from columns
in the global window (counted), never under --spark_native=off or batches by count."""
from __future__ import annotations

import dataclasses
from typing import Any

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import trigger, userstate, window

from sparkbeam.plan.arrow_batches import PACKED_ROW_BYTES, largest_row
from sparkbeam.plan.batch import plan_batch
from sparkbeam.plan.model import Plan, StageKind
from sparkbeam.plan.grouping_paths import grouping_decisions
from sparkbeam.plan.packed_rows import packed_tags, session_tags
from sparkbeam.runner import prepare


def _grouped(windowing: beam.WindowInto | None, native: bool = True) -> Plan:
    return plan_batch(_proto(windowing), native=native)


def _proto(windowing: beam.WindowInto | None) -> Any:
    p = beam.Pipeline()
    pairs = (p | beam.Impulse() | beam.FlatMap(lambda _: range(20)).with_output_types(int)
             | beam.Map(lambda x: window.TimestampedValue((x % 3, x), x))
             .with_output_types(tuple[int, int]))
    if windowing is not None:
        pairs = pairs | windowing
    _ = pairs | beam.GroupByKey() | beam.MapTuple(lambda k, vs: (k, sorted(vs)))
    return p.to_runner_api()


def _group_input(plan: Plan) -> bytes:
    stage = next(s for s in plan.stages if s.kind is StageKind.GROUPED)
    return stage.inputs[0].buffer_id


def test_a_grouping_per_window_is_packed_and_its_producer_packs_it() -> None:
    plan = _grouped(beam.WindowInto(window.FixedWindows(5)))
    buffer_id = _group_input(plan)
    assert plan.groupings[buffer_id].by_window and not plan.groupings[buffer_id].session_rows
    assert plan.packed == {buffer_id}
    producer = next(s for s in plan.stages if any(o.buffer_id == buffer_id for o in s.outputs))
    tags, counted = packed_tags(plan, producer)
    assert [producer.outputs[n].buffer_id for n in tags] == [buffer_id] and not counted
    assert not session_tags(plan, producer)


@pytest.mark.parametrize("windowing, rows", [
    (window.Sessions(5), True),
    (window.Sessions(0.0005), False),  # a window Beam's coder gives back may be empty
])
def test_beams_sessions_shuffle_as_session_rows_where_no_window_is_empty(
        windowing: Any, rows: bool) -> None:
    plan = _grouped(beam.WindowInto(windowing))
    buffer_id = _group_input(plan)
    assert plan.groupings[buffer_id].by_window
    assert plan.groupings[buffer_id].session_rows == rows
    assert plan.packed == {buffer_id}
    producer = next(s for s in plan.stages if any(o.buffer_id == buffer_id for o in s.outputs))
    tags, counted = packed_tags(plan, producer)
    assert not counted
    assert [producer.outputs[n].buffer_id for n in (session_tags(plan, producer) if rows
                                                    else tags)] == [buffer_id]
    assert not (tags and session_tags(plan, producer))
    assert ("shuffled as session rows" in " ".join(grouping_decisions(plan))) == rows


def test_the_global_windows_grouping_from_columns_is_counted() -> None:
    # Its reader cuts values out of rows and counts rows as values: every row counted.
    plan = _grouped(None)
    buffer_id = _group_input(plan)
    assert plan.packed == {buffer_id} and plan.groupings[buffer_id].counted
    assert not plan.groupings[buffer_id].by_window
    producer = next(s for s in plan.stages if any(o.buffer_id == buffer_id for o in s.outputs))
    tags, counted = packed_tags(plan, producer)
    assert not tags and [producer.outputs[n].buffer_id for n in counted] == [buffer_id]
    # Batched by count on the user's say (`--arrow_batch_bytes=rows`): nothing packed.
    unpacked = plan_batch(_proto(None), packing=False)
    assert unpacked.packed == frozenset()
    assert not any(g.counted for g in unpacked.groupings.values())


def test_beams_own_grouping_and_no_native_paths_are_not_packed() -> None:
    # --spark_native=off: Beam's GroupingBuffer and trigger driver everywhere.
    for windowing in (None, beam.WindowInto(window.Sessions(5))):
        plan = _grouped(windowing, native=False)
        assert plan.packed == frozenset()
        assert not any(g.counted for g in plan.groupings.values())
    # A trigger of its own: Beam's trigger driver groups it.
    repeated = beam.WindowInto(window.FixedWindows(5), trigger=trigger.Repeatedly(
        trigger.AfterCount(2)), accumulation_mode=trigger.AccumulationMode.DISCARDING)
    assert _grouped(repeated).packed == frozenset()
    # The global window with a trigger of its own: not grouped from columns.
    global_repeated = beam.WindowInto(window.GlobalWindows(), trigger=trigger.Repeatedly(
        trigger.AfterCount(2)), accumulation_mode=trigger.AccumulationMode.DISCARDING)
    assert _grouped(global_repeated).packed == frozenset()


def test_a_packed_input_is_bounded_by_its_cut() -> None:
    # The global window, grouped per window by the runner (its lateness is not the default's):
    # its elements' coder bounds them, and its packed rows hold less than PACKED_ROW_BYTES
    # of them and one more (a count besides).
    plan = _grouped(beam.WindowInto(window.GlobalWindows(), allowed_lateness=10))
    assert plan.packed == {_group_input(plan)}
    unpacked = largest_row(dataclasses.replace(plan, packed=frozenset()))
    assert unpacked is not None
    element = (unpacked - 20) // 2  # a row: 20 bytes of overhead, the element, its key
    assert largest_row(plan) == 20 + 2 * element + PACKED_ROW_BYTES + 4


class _Count(beam.DoFn):
    COUNT = userstate.CombiningValueStateSpec("count", sum)

    def process(self, kv, count=beam.DoFn.StateParam(COUNT)):  # type: ignore[no-untyped-def]
        count.add(1)
        yield kv


def test_a_stateful_stages_input_is_packed() -> None:
    p = beam.Pipeline()
    _ = (p | beam.Impulse() | beam.FlatMap(lambda _: [(1, 2), (1, 3)])
         .with_output_types(tuple[int, int])
         | beam.ParDo(_Count()))
    plan = plan_batch(p.to_runner_api())
    stateful = next(s for s in plan.stages if s.kind is StageKind.STATEFUL)
    assert stateful.direct_stateful is not None
    assert plan.packed == {stateful.inputs[0].buffer_id}


class _CountPerBundle(_Count):
    def start_bundle(self) -> None:  # Beam's bundle processor runs it: bundles count elements
        self.seen = 0


def test_a_stateful_stage_through_beams_bundle_processor_is_not_packed() -> None:
    p = beam.Pipeline()
    _ = (p | beam.Impulse() | beam.FlatMap(lambda _: [(1, 2), (1, 3)])
         .with_output_types(tuple[int, int]) | beam.ParDo(_CountPerBundle()))
    plan = plan_batch(p.to_runner_api())
    stateful = next(s for s in plan.stages if s.kind is StageKind.STATEFUL)
    assert stateful.direct_stateful is None
    assert plan.packed == frozenset()


def test_batches_by_count_alone_pack_nothing_and_the_log_says_which_grouping_packs() -> None:
    p = beam.Pipeline()
    _ = (p | beam.Impulse() | beam.FlatMap(lambda _: range(20)).with_output_types(int)
         | beam.Map(lambda x: window.TimestampedValue((x % 3, x), x))
         .with_output_types(tuple[int, int])
         | beam.WindowInto(window.Sessions(5)) | "Sum" >> beam.CombinePerKey(sum))
    proto = p.to_runner_api()
    plan = prepare(proto, PipelineOptions([]))
    assert plan.packed
    # An unlifted combine's GroupByKey, listed once though it has two buffers.
    assert [d for d in plan.decisions if "grouped per window" in d] == [
        "Sum/GroupByKey: grouped per window by the runner (default trigger: one on-time pane per "
        "window); its input shuffled as session rows (window bounds and values, several of a "
        "key's a row)"]
    rows = prepare(proto, PipelineOptions(["--arrow_batch_bytes=rows"]))
    assert rows.packed == frozenset()
    assert not any(g.session_rows for g in rows.groupings.values())
    assert not any("shuffled" in d for d in rows.decisions)


def test_the_log_says_which_global_grouping_is_counted() -> None:
    p = beam.Pipeline()
    _ = (p | beam.Impulse() | beam.FlatMap(lambda _: range(20)).with_output_types(int)
         | beam.Map(lambda x: (x % 3, x)).with_output_types(tuple[int, int])
         | "Group" >> beam.GroupByKey())
    proto = p.to_runner_api()
    assert [d for d in prepare(proto, PipelineOptions([])).decisions if "columns" in d] == [
        "Group: grouped from columns by the runner (the global window); its input shuffled as "
        "counted values, several of a key's a row"]
    for flag in ("--arrow_batch_bytes=rows", "--spark_native=off"):
        assert not any("columns" in d for d in prepare(proto, PipelineOptions([flag])).decisions)


def test_a_lifted_combines_grouping_is_not_counted() -> None:
    # Its pre-combine holds one accumulator a key a task already: nothing to pack.
    p = beam.Pipeline()
    _ = (p | beam.Impulse() | beam.FlatMap(lambda _: range(20)).with_output_types(int)
         | beam.Map(lambda x: (x % 3, x)).with_output_types(tuple[int, int])
         | "Sum" >> beam.CombinePerKey(sum))
    plan = plan_batch(p.to_runner_api())
    (grouping,) = [g for g in plan.groupings.values() if g.transform_id.startswith("Sum/")]
    assert not grouping.counted and grouping.buffer_id not in plan.packed
