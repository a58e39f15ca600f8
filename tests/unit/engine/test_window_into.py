"""A WindowInto(GlobalWindows) run by sparkbeam's own operation gives the bundle processor's rows
byte for byte (`control/window_into.py`, `plan/global_window.py`), and the plan rewrites only the
WindowIntos it may."""
from __future__ import annotations

import dataclasses
from typing import Any

import apache_beam as beam
import pytest
from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_fn_api_pb2, beam_runner_api_pb2
from apache_beam.transforms import window
from apache_beam.utils.windowed_value import WindowedValue
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkbeam import urns
from sparkbeam.engine.context import pipeline_context
from sparkbeam.engine.task import TaskSpec, run_stage_task
from sparkbeam.plan.batch import plan_batch
from sparkbeam.plan.global_window import with_global_window_operation
from sparkbeam.plan.model import DirectChain, Plan, Stage

_EVENT = st.tuples(st.integers(0, 3), st.integers(-2**63, 2**63 - 1),
                   st.integers(-10**12, 10**12) | st.sampled_from([0, 1, 999, 1000, 5000]))


class _Values(beam.DoFn):
    """A DoFn of the user's (the direct path leaves its stage to the bundle processor)."""

    def process(self, kv: tuple[int, list[int]]) -> Any:
        for value in kv[1]:
            yield kv[0], value


def _plan(sliding: bool) -> tuple[Plan, Stage]:
    p = beam.Pipeline()
    grouped = (p | beam.Create([(0, 0)]) | "Fixed" >> beam.WindowInto(window.FixedWindows(10))
               | "First" >> beam.GroupByKey() | "Values" >> beam.ParDo(_Values()))
    if sliding:  # every element in two windows as it reaches the WindowInto(GlobalWindows)
        grouped = grouped | "Slide" >> beam.WindowInto(window.SlidingWindows(10, 5))
    _ = (grouped | "Global" >> beam.WindowInto(window.GlobalWindows())
         | "Second" >> beam.GroupByKey())
    plan = plan_batch(p.to_runner_api())
    return plan, next(s for s in plan.stages if any("Global" in t for t in s.transforms))


def _rows(plan: Plan, stage: Stage, events: list[tuple[int, int, int]]) -> list[tuple]:  # type: ignore[type-arg]
    grouping = plan.groupings[stage.inputs[0].buffer_id]
    coder = pipeline_context(plan.components).coders[grouping.input_coder_id]
    impl, key_impl = coder.get_impl(), coder.wrapped_value_coder.key_coder().get_impl()
    fixed = window.FixedWindows(10)
    rows = []
    for key, value, micros in events:
        stamp = window.Timestamp(micros=micros)
        windows = fixed.assign(window.WindowFn.AssignContext(stamp))
        rows.append((0, key_impl.encode_nested(key),
                     impl.encode_nested(WindowedValue((key, value), stamp, windows))))
    return sorted(rows, key=lambda r: r[1])


def _with_beams_window_into(stage: Stage) -> Stage:
    descriptor = beam_fn_api_pb2.ProcessBundleDescriptor.FromString(stage.descriptor)
    for transform in descriptor.transforms.values():
        if transform.spec.urn == urns.INTO_GLOBAL_WINDOW:
            transform.spec.urn = urns.ASSIGN_WINDOWS
    return dataclasses.replace(stage, descriptor=descriptor.SerializeToString())


@pytest.mark.parametrize("sliding", [False, True], ids=["one-window", "two-windows"])
@pytest.mark.parametrize("bundle_size", [1, 1000])
@settings(max_examples=25, deadline=None)
@given(events=st.lists(_EVENT, max_size=20))
def test_the_operation_writes_the_bundle_processors_bytes(
        sliding: bool, bundle_size: int, events: list[tuple[int, int, int]]) -> None:
    plan, stage = _plan(sliding)
    assert urns.INTO_GLOBAL_WINDOW in stage.descriptor.decode("latin-1")
    rows = _rows(plan, stage, events)
    spec = TaskSpec(stage=stage, components=plan.components, groupings=dict(plan.groupings),
                    pickle_library="default", bundle_size=bundle_size, bundle_bytes=64 << 20)
    beams = dataclasses.replace(spec, stage=_with_beams_window_into(stage))

    def data(s: TaskSpec) -> list:  # type: ignore[type-arg]
        return [r for r in run_stage_task(s, rows, {}) if r[0] >= 0]

    ours = data(spec)
    assert ours == data(beams)
    assert len(ours) == len(events) * (2 if sliding else 1)


def test_the_plan_says_which_window_intos_it_rewrote() -> None:
    plan, stage = _plan(sliding=True)
    assert ("Global: into the global window by sparkbeam's operation (Beam's WindowInto DoFn "
            "left out)") in plan.decisions
    descriptor = beam_fn_api_pb2.ProcessBundleDescriptor.FromString(stage.descriptor)
    by_name = {t.unique_name: t.spec.urn for t in descriptor.transforms.values()}
    assert by_name["Global"] == urns.INTO_GLOBAL_WINDOW
    assert by_name["Slide"] == urns.ASSIGN_WINDOWS  # not the global window: Beam's DoFn


def test_direct_stages_and_other_sdk_workers_keep_beams_window_into() -> None:
    p = beam.Pipeline()
    # A function taking its timestamp keeps the grouped stage on the bundle processor.
    _ = (p | beam.Create([(1, 2)]) | beam.GroupByKey()
         | "Flat" >> beam.FlatMap(lambda kv, t=beam.DoFn.TimestampParam: kv[1])
         | "Global" >> beam.WindowInto(window.GlobalWindows()) | beam.Map(lambda v: (v, v))
         | "Again" >> beam.GroupByKey())
    plan = plan_batch(p.to_runner_api())
    grouped = next(s for s in plan.stages if any("Global" in t for t in s.transforms))
    assert urns.INTO_GLOBAL_WINDOW in grouped.descriptor.decode("latin-1")
    # A direct stage calls WindowInto itself; a PROCESS environment's SDK worker is Beam's own.
    original = _with_beams_window_into(grouped)
    process_env = beam_runner_api_pb2.Environment(
        urn=common_urns.environments.PROCESS.urn).SerializeToString()
    direct = dataclasses.replace(original, direct=DirectChain("in", (), None, "out", ()))
    for other in (direct, dataclasses.replace(original, direct_stateful="a stateful ParDo"),
                  dataclasses.replace(original, environment=process_env)):
        rewritten, lines = with_global_window_operation(dataclasses.replace(plan, stages=(other,)))
        assert rewritten.stages == (other,) and lines == ()
    # --spark_native=off: Beam's expansion as it is.
    beams = plan_batch(p.to_runner_api(), native=False)
    assert not any(urns.INTO_GLOBAL_WINDOW in s.descriptor.decode("latin-1") for s in beams.stages)
