"""Session rows (`engine/session_rows.py`): a sessions GroupByKey's input packed as window bounds
and values, then grouped, gives byte for byte what grouping its elements gives (and Beam's
trigger driver), on generated keys; elements it cannot cut stay whole and group the same."""
from __future__ import annotations

import dataclasses

import pytest
from apache_beam.coders import coders
from apache_beam.runners.pipeline_context import PipelineContext
from apache_beam.transforms import trigger, window
from apache_beam.transforms.core import Windowing
from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP, Timestamp
from apache_beam.utils.windowed_value import PaneInfo, PaneInfoTiming, WindowedValue
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkbeam.engine.grouping import ByWindowGrouper, TriggerDriverGrouper
from sparkbeam.engine.packed_rows import packed
from sparkbeam.engine.session_rows import layout_of
from sparkbeam.engine.window_coders import interval_window, interval_windows
from sparkbeam.plan.grouping_paths import session_coders, window_layout
from sparkbeam.plan.model import Grouping

_KEY = coders.StrUtf8Coder()
# A pane of more than one byte: its element is not cut, and stays whole in a row of its own.
_LATE = PaneInfo(is_first=False, is_last=False, timing=PaneInfoTiming.LATE, index=3,
                 nonspeculative_index=2)


_WINDOW_CODERS = {
    # As Beam's own SDK plans a GroupByKey's input (FnApiRunner's `group_by_key_input_visitor`).
    "plain": coders.IntervalWindowCoder(),
    "prefixed": coders.TimestampPrefixingWindowCoder(coders.IntervalWindowCoder()),
    # As a portable pipeline's GroupByKey has it after Beam's length-prefixing.
    "prefixed-length": coders.TimestampPrefixingWindowCoder(
        coders.LengthPrefixCoder(coders.IntervalWindowCoder())),
}


def _grouping(windowing: Windowing, window_coder: str = "prefixed-length"
              ) -> tuple[Grouping, Grouping, PipelineContext]:
    ctx = PipelineContext()
    window_coder = _WINDOW_CODERS[window_coder]
    pre = coders.WindowedValueCoder(coders.TupleCoder([_KEY, coders.VarIntCoder()]),
                                    window_coder)
    post = coders.WindowedValueCoder(
        coders.TupleCoder([_KEY, coders.IterableCoder(coders.VarIntCoder())]), window_coder)
    grouping = Grouping(b"buffer", "GroupByKey", ctx.coders.get_id(pre), ctx.coders.get_id(post),
                        ctx.windowing_strategies.get_id(windowing), by_window=True)
    return grouping, dataclasses.replace(grouping, session_rows=True), ctx


def _element(windowing: Windowing, impl, key: str, micros: int, value: int,  # type: ignore[no-untyped-def]
             late: bool) -> bytes:
    ts = Timestamp(micros=micros)
    windows = windowing.windowfn.assign(window.WindowFn.AssignContext(ts, element=value))
    pane = _LATE if late else PaneInfo(True, True, PaneInfoTiming.UNKNOWN, 0, 0)
    return impl.encode_nested(WindowedValue((key, value), ts, windows, pane))


_MICROS = st.one_of(st.integers(-50_000_000, 200_000_000),
                    st.integers(-50, 200).map(lambda s: s * 1_000_000),
                    st.integers(MAX_TIMESTAMP.micros - 10_000_000, MAX_TIMESTAMP.micros),
                    st.integers(MIN_TIMESTAMP.micros, MIN_TIMESTAMP.micros + 10_000_000))
_EVENTS = st.lists(st.tuples(st.sampled_from(["a", "é", "", "key"]), _MICROS,
                             st.integers(-(2 ** 63), 2 ** 63 - 1), st.booleans()),
                   min_size=1, max_size=60)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(gap=st.sampled_from([0.001, 0.0015, 1, 5, 30, 600]), events=_EVENTS,
       late=st.booleans(), window_coder=st.sampled_from(sorted(_WINDOW_CODERS)),
       row_bytes=st.sampled_from([1, 40, 200, 1024]), stretch=st.sampled_from([3, 7, 100_000]))
def test_session_rows_group_as_the_elements_do(gap, events, late, window_coder,  # type: ignore[no-untyped-def]
                                               row_bytes, stretch) -> None:
    windowing = Windowing(window.Sessions(gap))
    elements, rows_of, ctx = _grouping(windowing, window_coder)
    assert session_coders(elements, ctx) is not None
    impl = ctx.coders[elements.input_coder_id].get_impl()
    rows = [(0, _KEY.get_impl().encode_nested(key),
             _element(windowing, impl, key, micros, value, late and whole))
            for key, micros, value, whole in events]
    out = list(packed(iter(rows), set(), max_rows=stretch, max_row_bytes=row_bytes,
                      sessions={0: layout_of(ctx.coders[elements.input_coder_id])}))
    assert {tag for tag, _, _ in out} == {0}
    # Whole: the late ones, and some of those whose bounds in micros are past 2**61.
    whole = [value for _, _, value in out if value[:4] == b"\0\0\0\0"]
    late_ones = sum(1 for *_, w in events if w) if late else 0
    far = sum(1 for _, micros, _, w in events if abs(micros) > 2 ** 61 and not (late and w))
    assert late_ones <= len(whole) <= late_ones + far
    by_rows, by_elements = ByWindowGrouper(rows_of, ctx), ByWindowGrouper(elements, ctx)
    beams = TriggerDriverGrouper(dataclasses.replace(elements, by_window=False), ctx)
    for key in dict.fromkeys(k for _, k, _ in rows):
        packed_rows = [value for _, k, value in out if k == key]
        originals = [value for _, k, value in rows if k == key]
        assert by_rows.group(packed_rows, key) == by_elements.group(originals)
        assert by_rows.group(packed_rows, key) == beams.group(originals)
        coded = [(g.value, g.timestamp_micros, g.windows, g.pane_info)
                 for g in by_rows.grouped(packed_rows, True, key)]
        assert coded == [(g.value, g.timestamp_micros, g.windows, g.pane_info)
                         for g in by_elements.grouped(originals, True)]


@pytest.mark.parametrize("windowing", [
    Windowing(window.Sessions(0.0005)),  # a window Beam's coder gives back may be empty
    Windowing(window.Sessions(5), timestamp_combiner=window.TimestampCombiner.OUTPUT_AT_EARLIEST),
    Windowing(window.FixedWindows(5)),
    Windowing(window.Sessions(5), triggerfn=trigger.AfterCount(2),
              accumulation_mode=trigger.AccumulationMode.DISCARDING),
])
def test_other_windowings_keep_their_elements(windowing: Windowing) -> None:
    grouping, _, ctx = _grouping(windowing)
    by_window = grouping if windowing.triggerfn == trigger.DefaultTrigger() else (
        dataclasses.replace(grouping, by_window=False))
    assert session_coders(by_window, ctx) is None


@pytest.mark.parametrize("coder", [
    coders.PickleCoder(), coders.GlobalWindowCoder(),
    coders.TimestampPrefixingWindowCoder(coders.PickleCoder()),
    # A length prefix over another window coder (found by review: it was taken).
    coders.TimestampPrefixingWindowCoder(coders.LengthPrefixCoder(coders.PickleCoder())),
    coders.TimestampPrefixingWindowCoder(coders.LengthPrefixCoder(coders.GlobalWindowCoder())),
])
def test_only_interval_windows_have_a_layout(coder: coders.Coder) -> None:
    assert window_layout(coder) is None


def test_a_window_coder_of_another_kind_keeps_its_elements() -> None:
    ctx = PipelineContext()
    kv = coders.TupleCoder([_KEY, coders.VarIntCoder()])
    pre = coders.WindowedValueCoder(kv, coders.PickleCoder())
    post = coders.WindowedValueCoder(
        coders.TupleCoder([_KEY, coders.IterableCoder(coders.VarIntCoder())]),
        coders.PickleCoder())
    grouping = Grouping(b"b", "GroupByKey", ctx.coders.get_id(pre), ctx.coders.get_id(post),
                        ctx.windowing_strategies.get_id(Windowing(window.Sessions(5))),
                        by_window=True)
    assert session_coders(grouping, ctx) is None


def test_session_rows_grouped_without_their_key_is_an_error() -> None:
    _, rows_of, ctx = _grouping(Windowing(window.Sessions(5)))
    with pytest.raises(AssertionError, match="without their key"):
        ByWindowGrouper(rows_of, ctx).group([b"\0\0\0\1" + bytes(17)])


def test_sessions_that_touch_stay_apart_and_chained_ones_merge() -> None:
    windowing = Windowing(window.Sessions(5))
    elements, rows_of, ctx = _grouping(windowing)
    impl = ctx.coders[elements.input_coder_id].get_impl()
    key = _KEY.get_impl().encode_nested("k")
    # [0, 5) and [5, 10) touch: two sessions. 12 s and 20 s, bridged by 16 s: one.
    events = [(20, 1), (0, 2), (5, 3), (12, 4), (16, 5), (0, 6)]
    rows = [(0, key, _element(windowing, impl, "k", s * 1_000_000, v, False)) for s, v in events]
    out = [value for _, _, value in packed(
        iter(rows), set(), sessions={0: layout_of(ctx.coders[elements.input_coder_id])})]
    grouped = ByWindowGrouper(rows_of, ctx).grouped(out, True, key)
    assert [(g.value[1], g.windows[0].start.micros, g.windows[0].end.micros)
            for g in grouped] == [
        ([1, 4, 5], 12_000_000, 25_000_000), ([2, 6], 0, 5_000_000), ([3], 5_000_000, 10_000_000)]


_MILLIS = st.integers(-(2 ** 50), 2 ** 50)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(bounds=st.lists(st.tuples(_MILLIS, st.integers(1, 2 ** 40)), max_size=20))
def test_windows_decoded_at_once_are_each_ones(bounds: list[tuple[int, int]]) -> None:
    starts = [start * 1000 for start, _ in bounds]
    ends = [(start + span) * 1000 for start, span in bounds]
    got = interval_windows(starts, ends)
    want = [interval_window(start, end) for start, end in zip(starts, ends, strict=True)]
    assert [(w._start_micros, w._end_micros) for w in got] == [  # noqa: SLF001
        (w._start_micros, w._end_micros) for w in want] == list(zip(starts, ends, strict=True))  # noqa: SLF001


def test_a_window_end_at_the_least_int64_stays_whole() -> None:
    # End bytes all zero: -2**63 ms, whose absolute value in NumPy is itself (negative), so a
    # check by np.abs took it and its start wrapped around (found by review).
    windowing = Windowing(window.Sessions(5))
    elements, rows_of, ctx = _grouping(windowing, "plain")
    impl = ctx.coders[elements.input_coder_id].get_impl()
    key = _KEY.get_impl().encode_nested("k")
    normal = _element(windowing, impl, "k", 0, 7, False)
    odd = (normal[:12] + bytes(8) + bytes([0x88, 0x27]) + b"\x0f" + key
           + coders.VarIntCoder().get_impl().encode_nested(9))
    out = [value for _, _, value in packed(
        iter([(0, key, odd), (0, key, normal)]), set(),
        sessions={0: layout_of(ctx.coders[elements.input_coder_id])})]
    assert out[0][:4] == b"\0\0\0\0" and out[0][4:] == odd
    assert ByWindowGrouper(rows_of, ctx).group(out, key) == ByWindowGrouper(
        elements, ctx).group([odd, normal])
