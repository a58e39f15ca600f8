"""A grouped stage called directly gives the bundle processor's rows byte for byte, without Spark
(`engine/task.py::_run_direct_grouped`): grouped elements taken as the grouper makes them, their
timestamps as Beam's coder gives them back, a WindowInto after them, on generated events."""
from __future__ import annotations

import dataclasses
from typing import Any

import apache_beam as beam
from apache_beam.transforms import window
from apache_beam.utils.windowed_value import WindowedValue
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkbeam.engine.context import pipeline_context
from sparkbeam.engine.packed_rows import packed
from sparkbeam.engine.session_rows import layout_of
from sparkbeam.engine.task import TaskSpec, run_stage_task
from sparkbeam.plan.batch import plan_batch
from sparkbeam.plan.model import StageKind


class WithWindow(beam.DoFn):
    def process(self, kv, win=beam.DoFn.WindowParam):  # type: ignore[no-untyped-def]
        yield (kv[0], (sorted(kv[1]), win.start.micros, win.end.micros))


_FNS = {"sessions": window.Sessions(0.01), "fixed": window.FixedWindows(0.0123),
        "sliding": window.SlidingWindows(0.02, 0.01)}


def _stage(windowing: str) -> tuple[Any, Any]:
    p = beam.Pipeline()
    _ = (p | beam.Create([("a", 1)]) | "Window" >> beam.WindowInto(_FNS[windowing])
         | "Group" >> beam.GroupByKey() | "WithWindow" >> beam.ParDo(WithWindow())
         # Sub-millisecond windows: they tell a timestamp at micros from one at millis.
         | "Fine" >> beam.WindowInto(window.FixedWindows(0.0005)) | "Again" >> beam.GroupByKey())
    plan = plan_batch(p.to_runner_api())
    stage = next(s for s in plan.stages if s.kind is StageKind.GROUPED and "WithWindow" in
                 s.transforms)
    assert stage.direct is not None
    return plan, stage


def _rows(plan: Any, stage: Any, events: list[tuple[str, int, int]]) -> list[Any]:
    """The stage's input rows as its producer writes them: session rows where the plan says
    (`engine/session_rows.py`), else one element a row."""
    rows = _elements(plan, stage, events)
    grouping = plan.groupings[stage.inputs[0].buffer_id]
    if not grouping.session_rows:
        return rows
    coder = pipeline_context(plan.components).coders[grouping.input_coder_id]
    return sorted(packed(iter(rows), set(), sessions={0: layout_of(coder)}), key=lambda r: r[1])


def _elements(plan: Any, stage: Any, events: list[tuple[str, int, int]]) -> list[Any]:
    grouping = plan.groupings[stage.inputs[0].buffer_id]
    ctx = pipeline_context(plan.components)
    coder = ctx.coders[grouping.input_coder_id]
    impl, key_impl = coder.get_impl(), coder.wrapped_value_coder.key_coder().get_impl()
    fn = ctx.windowing_strategies[grouping.windowing_strategy_id].windowfn
    rows = []
    for key, micros, value in events:
        ts = beam.utils.timestamp.Timestamp(micros=micros)
        windows = fn.assign(window.WindowFn.AssignContext(ts))
        rows.append((0, key_impl.encode_nested(key),
                     impl.encode_nested(WindowedValue((key, value), ts, windows))))
    return sorted(rows, key=lambda r: r[1])


@settings(max_examples=60, deadline=None)
@given(events=st.lists(st.tuples(st.sampled_from(["a", "b", "ü"]),
                                 st.integers(-30_000, 60_000), st.integers(-5, 5)),
                       max_size=30),
       windowing=st.sampled_from(sorted(_FNS)), bundle_size=st.sampled_from([1, 2, 1000]))
def test_direct_grouped_rows_are_the_bundle_processors(
        events: list[tuple[str, int, int]], windowing: str, bundle_size: int) -> None:
    plan, stage = _stage(windowing)
    rows = _rows(plan, stage, events)
    spec = TaskSpec(stage=stage, components=plan.components, groupings=dict(plan.groupings),
                    pickle_library="default", bundle_size=bundle_size, bundle_bytes=64 << 20)
    beams = dataclasses.replace(spec, stage=dataclasses.replace(stage, direct=None))

    def data(s: TaskSpec) -> list[Any]:
        return sorted(r for r in run_stage_task(s, iter(rows), {}) if r[0] >= 0)

    assert data(spec) == data(beams)


def _stamp_group(kv: Any) -> Any:
    return window.TimestampedValue((kv[0], sorted(kv[1])), 5)


def _windowed_for_b(kv: Any) -> Any:
    # A WindowedValue result, which Beam's output handler takes as it is: the direct path
    # hands the batch over after the step before it has windowed its results.
    if kv[0] == "b":
        yield WindowedValue(kv, beam.utils.timestamp.Timestamp(7), (window.IntervalWindow(0, 100),))
    else:
        yield kv


def test_a_batch_handed_over_after_a_windowing_step_is_its_own_elements_once() -> None:
    # The steps append windowed values to the batch's list of them: the batch the bundle
    # processor then takes must be the grouper's elements alone (the same rows as Beam's,
    # not the appended ones as well).
    p = beam.Pipeline()
    _ = (p | beam.Create([("a", 1)]) | "Window" >> beam.WindowInto(window.FixedWindows(100))
         | "Group" >> beam.GroupByKey() | "Stamp" >> beam.Map(_stamp_group)
         | "Wv" >> beam.FlatMap(_windowed_for_b) | "Again" >> beam.GroupByKey())
    plan = plan_batch(p.to_runner_api())
    stage = next(s for s in plan.stages if s.kind is StageKind.GROUPED and "Stamp" in
                 s.transforms)
    assert stage.direct is not None
    rows = _rows(plan, stage, [("a", 1000, 1), ("b", 2000, 2)])
    spec = TaskSpec(stage=stage, components=plan.components, groupings=dict(plan.groupings),
                    pickle_library="default", bundle_size=1000, bundle_bytes=64 << 20)
    beams = dataclasses.replace(spec, stage=dataclasses.replace(stage, direct=None))

    def data(s: TaskSpec) -> list[Any]:
        return sorted(r for r in run_stage_task(s, iter(rows), {}) if r[0] >= 0)

    direct = data(spec)
    assert len(direct) == 2 and direct == data(beams)
