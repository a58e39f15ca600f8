"""A WindowInto(GlobalWindows) that the bundle processor's stage holds runs as sparkbeam's own
operation (`control/window_into.py`) and gives what FnApiRunner gives: a differential test on
generated events, each in two sliding windows as it reaches it, in both bundle shapes."""
from __future__ import annotations

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.transforms import window
from apache_beam.utils.timestamp import Timestamp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkbeam import SparkRunner
from sparkbeam.runner import prepare
from tests.integration.conftest import run_and_collect

SHAPES = {"default": [], "one-per-bundle": ["--bundle_size=1", "--parallelism=1"]}


class _Keep(beam.DoFn):
    """A DoFn of the user's, so the stage is the bundle processor's, not the direct path's."""

    def process(self, kv):  # type: ignore[no-untyped-def]
        yield kv


class _Describe(beam.DoFn):
    def process(self, kv, w=beam.DoFn.WindowParam, ts=beam.DoFn.TimestampParam,  # type: ignore[no-untyped-def]
                pane=beam.DoFn.PaneInfoParam):
        yield (kv[0], sorted(kv[1]), repr(w), ts.micros, (pane.is_first, pane.is_last,
                                                         pane.timing, pane.index))


def _build(events):  # type: ignore[no-untyped-def]
    def build(p):  # type: ignore[no-untyped-def]
        return (p | beam.Create(events)
                | beam.Map(lambda e: window.TimestampedValue((e[0], e[2]), Timestamp(micros=e[1])))
                | "Slide" >> beam.WindowInto(window.SlidingWindows(10, 5))
                | "Keep" >> beam.ParDo(_Keep())
                | "Global" >> beam.WindowInto(window.GlobalWindows())
                | "Group" >> beam.GroupByKey() | beam.ParDo(_Describe()))
    return build


_EVENTS = st.lists(st.tuples(st.sampled_from(["a", "b", "é"]),
                             st.integers(-20_000_000, 100_000_000),
                             st.integers(-(2 ** 40), 2 ** 40)), max_size=20)


@pytest.mark.parametrize("shape", SHAPES)
@settings(max_examples=3, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(events=_EVENTS)
def test_into_the_global_window_equals_fnapi(shape, events) -> None:  # type: ignore[no-untyped-def]
    build = _build(events)
    p = beam.Pipeline(options=PipelineOptions([]))
    build(p)
    assert ("Global: into the global window by sparkbeam's operation (Beam's WindowInto DoFn "
            "left out)" in prepare(p.to_runner_api(), p.options).decisions)
    ours = run_and_collect(build, SparkRunner(), SHAPES[shape])
    assert ours == run_and_collect(build, FnApiRunner())
    # Each event reached the global window twice (its two sliding windows).
    assert sum(len(eval(line)[1]) for line in ours) == 2 * len(events)  # noqa: S307
