"""Sessions' prefixed window coder without Timestamp objects (`engine/window_coders.py`): the
same bytes as Beam's, the same windows and windowed values back."""
from __future__ import annotations

from apache_beam.coders import coders
from apache_beam.transforms.window import GlobalWindow, IntervalWindow
from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP, Timestamp
from apache_beam.utils.windowed_value import PaneInfo, PaneInfoTiming, WindowedValue
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkbeam.engine.window_coders import _PrefixedIntervalImpl, faster_impl

_MICROS = (st.integers(-(10**15), 10**15)
           | st.sampled_from([-1001, -1000, -999, -1, 0, 1, 999, 1000, 1001,
                              MIN_TIMESTAMP.micros, MAX_TIMESTAMP.micros]))
# What a GroupByKey under Sessions encodes its elements with.
_CODER = coders.WindowedValueCoder(
    coders.TupleCoder([coders.VarIntCoder(), coders.StrUtf8Coder()]),
    coders.TimestampPrefixingWindowCoder(coders.LengthPrefixCoder(coders.IntervalWindowCoder())))


@settings(max_examples=300, deadline=None)
@given(start=_MICROS, length=st.integers(1, 10**12), at=_MICROS, pane=st.booleans())
def test_bytes_and_values_are_beams(start: int, length: int, at: int, pane: bool) -> None:
    window = IntervalWindow(Timestamp(micros=start), Timestamp(micros=start + length))
    info = PaneInfo(True, False, PaneInfoTiming.ON_TIME, 0, 0) if pane else PaneInfo(
        False, True, PaneInfoTiming.LATE, 3, 2)
    wv = WindowedValue((7, "é"), Timestamp(micros=at), (window, window), info)
    beams, ours = _CODER.get_impl(), faster_impl(_CODER)
    encoded = beams.encode_nested(wv)
    assert ours.encode_nested(wv) == encoded
    back = ours.decode_nested(encoded)
    assert back == beams.decode_nested(encoded)
    assert [(w._start_micros, w._end_micros) for w in back.windows] == [
        (w._start_micros, w._end_micros) for w in beams.decode_nested(encoded).windows]


def test_it_is_used_only_for_beams_prefixing_coder_and_other_windows_go_beams_way(
        monkeypatch) -> None:  # type: ignore[no-untyped-def]
    calls: list[str] = []
    for name in ("encode_to_stream", "decode_from_stream"):
        real = getattr(_PrefixedIntervalImpl, name)

        def spy(self, *args, _real=real, _name=name):  # type: ignore[no-untyped-def]
            calls.append(_name)
            return _real(self, *args)

        monkeypatch.setattr(_PrefixedIntervalImpl, name, spy)
    wv = WindowedValue(
        (1, "a"), 5, (IntervalWindow(Timestamp(micros=0), Timestamp(micros=10)),))
    ours = faster_impl(_CODER)
    ours.decode_nested(ours.encode_nested(wv))
    assert calls == ["encode_to_stream", "decode_from_stream"]  # so the test above compares it
    plain = coders.WindowedValueCoder(coders.VarIntCoder(), coders.IntervalWindowCoder())
    faster_impl(plain).decode_nested(faster_impl(plain).encode_nested(wv.with_value(1)))
    assert len(calls) == 2
    # A window that is not an IntervalWindow: Beam's own impl writes it.
    windows = coders.TimestampPrefixingWindowCoder(coders.GlobalWindowCoder())
    mine = faster_impl(coders.WindowedValueCoder(coders.VarIntCoder(), windows))
    glob = WindowedValue(3, 5, (GlobalWindow(),))
    beams = coders.WindowedValueCoder(coders.VarIntCoder(), windows).get_impl()
    assert mine.encode_nested(glob) == beams.encode_nested(glob)
    assert mine.decode_nested(beams.encode_nested(glob)) == glob
