"""Windowed GroupByKeys under the default trigger, grouped per window by the runner instead of
Beam's trigger driver (`engine/grouping.py`): differential tests against FnApiRunner on the same
pipeline, with generated events, in both bundle shapes, through a GroupByKey and a lifted
combiner; other triggers keep Beam's driver and say so."""
from __future__ import annotations

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.transforms import trigger, window
from apache_beam.utils.timestamp import Timestamp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkbeam import SparkRunner
from sparkbeam.runner import prepare
from tests.integration.conftest import run_and_collect

SHAPES = {"default": [], "one-per-bundle": ["--bundle_size=1", "--parallelism=1"]}
WINDOW_FNS = [window.FixedWindows(60), window.FixedWindows(7, 3), window.SlidingWindows(10, 5),
              window.SlidingWindows(3, 7), window.Sessions(5), window.Sessions(30),
              window.GlobalWindows()]
COMBINERS = [window.TimestampCombiner.OUTPUT_AT_EOW, window.TimestampCombiner.OUTPUT_AT_EARLIEST,
             window.TimestampCombiner.OUTPUT_AT_LATEST]


class _Describe(beam.DoFn):
    """A grouped element with everything the runner decides: window, timestamp, pane."""

    def process(self, kv, w=beam.DoFn.WindowParam, ts=beam.DoFn.TimestampParam,  # type: ignore[no-untyped-def]
                pane=beam.DoFn.PaneInfoParam):
        key, grouped = kv
        values = grouped if isinstance(grouped, int) else sorted(grouped)  # a sum or values
        yield (key, values, repr(w), ts.micros,
               (pane.is_first, pane.is_last, pane.timing, pane.index, pane.nonspeculative_index))


def _pipeline(events, wfn, combiner, combine: bool, trig=None):  # type: ignore[no-untyped-def]
    def build(p):  # type: ignore[no-untyped-def]
        windowed = (p | beam.Create(events)
                    | beam.Map(lambda e: window.TimestampedValue((e[0], e[2]),
                                                                 Timestamp(micros=e[1])))
                    | beam.WindowInto(wfn, timestamp_combiner=combiner,
                                      **({"trigger": trig, "accumulation_mode":
                                          trigger.AccumulationMode.DISCARDING} if trig else {})))
        grouped = (windowed | "Sum" >> beam.CombinePerKey(sum) if combine
                   else windowed | "Group" >> beam.GroupByKey())
        return grouped | beam.ParDo(_Describe())
    return build


def _decisions(build) -> tuple[str, ...]:  # type: ignore[no-untyped-def]
    p = beam.Pipeline(options=PipelineOptions([]))
    build(p)
    return prepare(p.to_runner_api(), p.options).decisions


_EVENTS = st.lists(st.tuples(st.sampled_from(["a", "b", "é"]),
                             st.integers(-20_000_000, 100_000_000),
                             st.integers(-(2 ** 40), 2 ** 40)), min_size=1, max_size=30)


@pytest.mark.parametrize("shape", SHAPES)
@settings(max_examples=5, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(events=_EVENTS, wfn=st.sampled_from(WINDOW_FNS), combiner=st.sampled_from(COMBINERS),
       combine=st.booleans())
def test_default_trigger_grouped_per_window_equals_fnapi(shape, events, wfn, combiner,  # type: ignore[no-untyped-def]
                                                         combine) -> None:
    build = _pipeline(events, wfn, combiner, combine)
    trivial = isinstance(wfn, window.GlobalWindows) and (
        combiner == window.TimestampCombiner.OUTPUT_AT_EOW)
    decisions = _decisions(build)
    by_window = [d for d in decisions if "grouped per window by the runner" in d]
    assert len(by_window) == (0 if trivial else 1), decisions
    unlifted = [d for d in decisions if d.startswith("Sum: combined after its GroupByKey")]
    assert len(unlifted) == (1 if combine and isinstance(wfn, window.Sessions) else 0), decisions
    assert run_and_collect(build, SparkRunner(), SHAPES[shape]) == run_and_collect(
        build, FnApiRunner())


def test_sessions_merge_the_same_as_fnapi_and_say_so() -> None:
    events = [("a", 1_000_000, 1), ("a", 4_000_000, 2), ("a", 100_000_000, 3),
              ("a", 8_000_000, 4), ("b", 2_000_000, 5), ("a", 50_000_000, 6)]
    build = _pipeline(events, window.Sessions(5), window.TimestampCombiner.OUTPUT_AT_EOW, False)
    assert [d for d in _decisions(build) if d.startswith("Group:")] == [
        "Group: grouped per window by the runner (default trigger: one on-time pane per window); "
        "its input shuffled as session rows (window bounds and values, several of a key's a "
        "row)"]
    expected = run_and_collect(build, FnApiRunner())
    # a's first three events bridge into one session [1 s, 13 s); two more sessions of a, one of b.
    assert len(expected) == 4 and any("[1, 2, 4]" in line and "13.0" in line
                                      for line in expected), expected
    assert run_and_collect(build, SparkRunner()) == expected
    assert run_and_collect(build, SparkRunner(), ["--spark_native=off"]) == expected


def test_other_triggers_keep_beams_driver_with_the_same_output() -> None:
    events = [("a", t * 1_000_000, t) for t in (1, 2, 3, 4, 30)]
    build = _pipeline(events, window.Sessions(5), window.TimestampCombiner.OUTPUT_AT_EOW, False,
                      trig=trigger.AfterWatermark(early=trigger.AfterCount(2)))
    assert [d for d in _decisions(build) if d.startswith("Group:")] == [
        "Group: Beam's trigger driver (trigger after_end_of_window)"]
    assert run_and_collect(build, SparkRunner()) == run_and_collect(build, FnApiRunner())


class _StampAfterState(beam.DoFn):
    """A stateful DoFn whose output carries a timestamp of its own, at micros precision."""

    COUNT = beam.transforms.userstate.BagStateSpec("count", beam.coders.VarIntCoder())

    def process(self, kv, count=beam.DoFn.StateParam(COUNT)):  # type: ignore[no-untyped-def]
        count.add(1)
        key, (micros, value) = kv
        yield window.TimestampedValue((key, value), Timestamp(micros=micros))


@pytest.mark.xfail(strict=True, reason=(
    "a stateful stage hands its output to the next stage encoded, and Beam's coder rounds a "
    "negative sub-millisecond timestamp toward zero before the later WindowInto assigns its "
    "window; FnApiRunner fuses the two and assigns it from the exact micros (found by review, "
    "2026-12-02; --spark_native=off matches)"))
def test_a_stateful_dofns_sub_millisecond_negative_timestamp_windows_as_fnapi() -> None:
    def build(p):  # type: ignore[no-untyped-def]
        return (p | beam.Create([("c", (-17_875_500, 1)), ("c", (2_000_250, 2))])
                | beam.ParDo(_StampAfterState()) | beam.WindowInto(window.Sessions(4))
                | beam.GroupByKey() | beam.ParDo(_Describe()))

    assert run_and_collect(build, SparkRunner()) == run_and_collect(build, FnApiRunner())
