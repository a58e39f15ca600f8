"""The runner's per-window grouping under the default trigger equals Beam's trigger driver,
byte for byte (values, their order, windows, timestamps, panes), on generated keys' values."""
from __future__ import annotations

import pytest
from apache_beam.coders import coders
from apache_beam.coders.coder_impl import create_InputStream
from apache_beam.runners.pipeline_context import PipelineContext
from apache_beam.transforms import trigger, window
from apache_beam.transforms.core import Windowing
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import PaneInfoTiming, WindowedValue
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkbeam.engine.grouping import ByWindowGrouper, TriggerDriverGrouper, grouper_for
from sparkbeam.engine.window_coders import interval_window
from sparkbeam.plan.grouping_paths import groups_by_window
from sparkbeam.plan.model import Grouping

WINDOW_FNS = [window.FixedWindows(60), window.FixedWindows(7, 3), window.FixedWindows(1),
              window.SlidingWindows(10, 5), window.SlidingWindows(7, 3),
              window.SlidingWindows(3, 7), window.Sessions(1), window.Sessions(5),
              window.Sessions(30), window.Sessions(0.0005), window.GlobalWindows()]
COMBINERS = [window.TimestampCombiner.OUTPUT_AT_EOW, window.TimestampCombiner.OUTPUT_AT_EARLIEST,
             window.TimestampCombiner.OUTPUT_AT_LATEST]  # EARLIEST_TRANSFORMED has no proto
MODES = [trigger.AccumulationMode.DISCARDING, trigger.AccumulationMode.ACCUMULATING]


def _grouping(windowing: Windowing, by_window: bool, prefixed: bool = False
              ) -> tuple[Grouping, PipelineContext]:
    ctx = PipelineContext()
    window_coder = windowing.windowfn.get_window_coder()
    if prefixed and isinstance(window_coder, coders.IntervalWindowCoder):
        # As a pipeline's GroupByKey has it (sparkbeam's `engine/window_coders.py` codes it).
        window_coder = coders.TimestampPrefixingWindowCoder(
            coders.LengthPrefixCoder(window_coder))
    pre = coders.WindowedValueCoder(
        coders.TupleCoder([coders.StrUtf8Coder(), coders.VarIntCoder()]), window_coder)
    post = coders.WindowedValueCoder(
        coders.TupleCoder([coders.StrUtf8Coder(), coders.IterableCoder(coders.VarIntCoder())]),
        window_coder)
    grouping = Grouping(b"buffer", "GroupByKey", ctx.coders.get_id(pre),
                        ctx.coders.get_id(post), ctx.windowing_strategies.get_id(windowing),
                        by_window=by_window)
    return grouping, ctx


def _encoded(windowing: Windowing, grouping: Grouping, ctx: PipelineContext, key: str,
             events: list[tuple[int, int]]) -> list[bytes]:
    impl = ctx.coders[grouping.input_coder_id].get_impl()
    out = []
    for micros, value in events:
        ts = Timestamp(micros=micros)
        windows = windowing.windowfn.assign(window.WindowFn.AssignContext(ts, element=value))
        out.append(impl.encode_nested(WindowedValue((key, value), ts, windows)))
    return out


# Whole seconds too, so sessions touch exactly (end == next start: not merged) and windows
# share bounds.
_MICROS = st.one_of(st.integers(-50_000_000, 200_000_000),
                    st.integers(-50, 200).map(lambda s: s * 1_000_000))
_EVENTS = st.lists(st.tuples(_MICROS, st.integers(-(2 ** 63), 2 ** 63 - 1)),
                   min_size=1, max_size=40)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(wfn=st.sampled_from(WINDOW_FNS), combiner=st.sampled_from(COMBINERS),
       mode=st.sampled_from(MODES), lateness=st.sampled_from([0, 10]),
       key=st.sampled_from(["a", "é", ""]), events=_EVENTS, prefixed=st.booleans())
def test_by_window_equals_beams_trigger_driver(wfn, combiner, mode, lateness, key,  # type: ignore[no-untyped-def]
                                               events, prefixed) -> None:
    windowing = Windowing(wfn, triggerfn=trigger.DefaultTrigger(), accumulation_mode=mode,
                          timestamp_combiner=combiner, allowed_lateness=lateness)
    if windowing.is_default():  # GroupingBuffer's own list: not the runner's to group
        assert not groups_by_window(windowing.to_runner_api(PipelineContext()))
        return
    assert groups_by_window(windowing.to_runner_api(PipelineContext()))
    ours, ctx = _grouping(windowing, by_window=True, prefixed=prefixed)
    beams, _ = _grouping(windowing, by_window=False, prefixed=prefixed)
    values = _encoded(windowing, ours, ctx, key, events)
    by_window = grouper_for(ours, ctx)
    assert isinstance(by_window, ByWindowGrouper)
    assert by_window.group(values) == TriggerDriverGrouper(beams, ctx).group(values)


@pytest.mark.parametrize("trig", [trigger.AfterWatermark(), trigger.AfterCount(2),
                                  trigger.Repeatedly(trigger.AfterCount(1))])
def test_other_triggers_keep_beams_driver(trig) -> None:  # type: ignore[no-untyped-def]
    windowing = Windowing(window.Sessions(5), triggerfn=trig,
                          accumulation_mode=trigger.AccumulationMode.DISCARDING)
    assert not groups_by_window(windowing.to_runner_api(PipelineContext()))


def test_merged_sessions_keep_the_drivers_pane_and_value_order() -> None:
    windowing = Windowing(window.Sessions(10))
    grouping, ctx = _grouping(windowing, by_window=True)
    # 3 and 30 start their own sessions; 12 bridges 3's into one with 5.
    values = _encoded(windowing, grouping, ctx, "k",
                      [(3_000_000, 1), (30_000_000, 2), (12_000_000, 3), (5_000_000, 4)])
    post = ctx.coders[grouping.output_coder_id].get_impl()
    (chunk,) = grouper_for(grouping, ctx).group(values)
    stream = create_InputStream(chunk)
    grouped = []
    while stream.size() > 0:
        grouped.append(post.decode_from_stream(stream, True))
    assert [(g.value[0], list(g.value[1]), g.windows[0].start.micros, g.windows[0].end.micros,
             g.timestamp.micros) for g in grouped] == [
        ("k", [1, 3, 4], 3_000_000, 22_000_000, 21_999_000),  # the coder keeps millis
        ("k", [2], 30_000_000, 40_000_000, 39_999_000)]
    assert {(g.pane_info.is_first, g.pane_info.is_last, g.pane_info.timing) for g in grouped} == {
        (True, False, PaneInfoTiming.ON_TIME)}


@pytest.mark.parametrize("events", [
    [(0, 1), (5_000_000, 2)],  # touching: [0, 5) and [5, 10) stay apart
    [(0, 1), (4_999_999, 2), (9_999_998, 3)],  # a chain of overlaps: one session
    [(7_000_000, 1), (0, 2), (3_000_000, 3), (20_000_000, 4), (7_000_000, 5)],  # out of order
])
@pytest.mark.parametrize("prefixed", [False, True])
def test_sessions_edges_equal_beams_driver(events, prefixed) -> None:  # type: ignore[no-untyped-def]
    windowing = Windowing(window.Sessions(5))
    ours, ctx = _grouping(windowing, by_window=True, prefixed=prefixed)
    beams, _ = _grouping(windowing, by_window=False, prefixed=prefixed)
    values = _encoded(windowing, ours, ctx, "k", events)
    assert grouper_for(ours, ctx).group(values) == TriggerDriverGrouper(beams, ctx).group(values)


@pytest.mark.parametrize("events", [
    [(500, 0), (0, 1)],  # [0.5, 1) ms decodes as [0, 0) ms: empty, tied in start with [0, 1)
    [(0, 1), (500, 0), (1_500, 2), (1_000, 3)],
])
def test_sub_millisecond_sessions_equal_beams_driver(events) -> None:  # type: ignore[no-untyped-def]
    # Beam's window coder keeps whole milliseconds, so a gap under one makes empty windows,
    # which Beam merges in its set's order: Beam's own merge decides those.
    windowing = Windowing(window.Sessions(0.0005))
    ours, ctx = _grouping(windowing, by_window=True, prefixed=True)
    beams, _ = _grouping(windowing, by_window=False, prefixed=True)
    values = _encoded(windowing, ours, ctx, "k", events)
    assert grouper_for(ours, ctx).group(values) == TriggerDriverGrouper(beams, ctx).group(values)


def test_batch_leaves_a_combine_over_sessions_unlifted_and_streaming_keeps_beams_phases() -> None:
    import apache_beam as beam

    from sparkbeam.plan.fuse import plan_pipeline

    p = beam.Pipeline()
    _ = (p | beam.Create([("a", 1)]) | beam.WindowInto(window.Sessions(5))
         | "Sum" >> beam.CombinePerKey(sum))
    proto = p.to_runner_api()

    def names(plan) -> set[str]:  # type: ignore[no-untyped-def]
        return {t for s in plan.stages for t in s.transforms}

    assert "Sum/Combine" in names(plan_pipeline(proto))
    assert not any("Precombine" in t for t in names(plan_pipeline(proto)))
    assert "Sum/Precombine" in names(plan_pipeline(proto, beam_phases=True))
    assert "Sum/Precombine" in names(plan_pipeline(proto, streaming=True))


class _ChainedSessions(window.Sessions):
    """Sessions merged pairwise, left to right: each merge's result is merged again with the
    next overlapping window (a chain of merges in one merge call, which Beam's own Sessions
    never makes)."""

    def merge(self, merge_context):  # type: ignore[no-untyped-def]
        current = None
        for w in sorted(merge_context.windows, key=lambda w: (w.start, w.end)):
            if current is not None and current.end > w.start:
                merged = window.IntervalWindow(current.start, max(current.end, w.end))
                merge_context.merge([current, w], merged)
                current = merged
            else:
                current = w


@settings(max_examples=100, deadline=None, derandomize=True)
@given(events=_EVENTS)
def test_chained_merges_equal_beams_trigger_driver(events) -> None:  # type: ignore[no-untyped-def]
    windowing = Windowing(_ChainedSessions(5), triggerfn=trigger.DefaultTrigger(),
                          timestamp_combiner=window.TimestampCombiner.OUTPUT_AT_EARLIEST)
    ours, ctx = _grouping(windowing, by_window=True)
    beams, _ = _grouping(windowing, by_window=False)
    values = _encoded(windowing, ours, ctx, "k", events)
    assert ByWindowGrouper(ours, ctx).group(values) == TriggerDriverGrouper(beams, ctx).group(
        values)


class _SecondSessions(window.Sessions):
    """Merges as Sessions, but its merged windows end on a whole-second Timestamp (precision
    0), whose `max_timestamp()` is a second before the end, not a microsecond."""

    def merge(self, merge_context) -> None:  # type: ignore[no-untyped-def]
        windows = sorted(merge_context.windows, key=lambda w: w.start)
        if len(windows) > 1:
            end = max(w.end for w in windows)
            seconds = -(-end.micros // 1_000_000)
            merge_context.merge(windows, window.IntervalWindow(
                windows[0].start, Timestamp(seconds, 0, 0)))


@pytest.mark.parametrize("prefixed", [False, True])
def test_a_merging_window_fns_coarse_window_ends_equal_beams_driver(  # type: ignore[no-untyped-def]
        prefixed) -> None:
    windowing = Windowing(_SecondSessions(5),
                          timestamp_combiner=window.TimestampCombiner.OUTPUT_AT_EOW)
    ours, ctx = _grouping(windowing, by_window=True, prefixed=prefixed)
    beams, _ = _grouping(windowing, by_window=False, prefixed=prefixed)
    values = _encoded(windowing, ours, ctx, "k", [(0, 1), (2_500_000, 2), (30_000_000, 3)])
    by_window = grouper_for(ours, ctx)
    assert isinstance(by_window, ByWindowGrouper)
    assert by_window.group(values) == TriggerDriverGrouper(beams, ctx).group(values)


_BOUND = st.one_of(st.integers(-(10 ** 15), 10 ** 15),
                   st.integers(-(10 ** 12), 10 ** 12).map(lambda ms: ms * 1000))


@settings(max_examples=300, deadline=None, derandomize=True)
@given(start=_BOUND, length=_BOUND.map(abs).filter(bool))
def test_merged_windows_are_beams_interval_windows(start: int, length: int) -> None:
    # The sessions' merged windows skip Beam's Timestamps where the bounds are whole
    # milliseconds (every merge of windows Beam's coder decoded), not elsewhere.
    end = start + length
    ours = interval_window(start, end)
    beams = window.IntervalWindow(Timestamp(micros=start), Timestamp(micros=end))
    assert type(ours) is type(beams)
    assert (ours.start, ours.end, ours.max_timestamp()) == (
        beams.start, beams.end, beams.max_timestamp())
    impl = coders.IntervalWindowCoder().get_impl()
    assert impl.encode(ours) == impl.encode(beams)
