"""A direct stage ending in WindowInto(Sessions), encoded from micros
(`engine/direct_sessions.py`): byte for byte the bundle processor's rows, and the general way
for what it does not cover."""
from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from unittest import mock

import apache_beam as beam
from apache_beam.transforms import window
from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP, Timestamp
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkbeam.engine import direct_sessions
from sparkbeam.engine.direct import DirectProgram, DirectRun
from sparkbeam.plan.native_text import varint
from tests.unit.engine.test_direct import _batch, _both_paths, text_plan

# Seconds: half a millisecond; 8.5 and 9 ms, whose one-byte spans are as long as the
# prefixed window coder's length byte (a plain-window reading of its bytes must not pass).
_GAPS = (1, 30, 0.0005, 0.0085, 0.009)


def _stamp(line: str) -> object:
    key, at, value = line.split(",")
    return window.TimestampedValue((int(key), int(value)), Timestamp(micros=int(at)))


@functools.cache
def _plan(gap: float):  # type: ignore[no-untyped-def]
    plan, stage, prefix = text_plan("1,2,3", lambda lines: (
        lines | "Stamp" >> beam.Map(_stamp) | "Into" >> beam.WindowInto(window.Sessions(gap))
        | beam.GroupByKey()), lambda s: "Into" in s.transforms)
    assert stage.direct is not None, plan.decisions
    return plan, stage, prefix


_MICROS = st.one_of(
    st.integers(-(10**13), 10**13),
    st.sampled_from([-1, -999, -1000, -1001, -1500, 0, 1, 499, 500, 999, 1000, 1001]))
# At most one timestamp at Beam's bounds a batch, so most batches take the micros encoding.
_EXTREME = st.sampled_from([MIN_TIMESTAMP.micros, MIN_TIMESTAMP.micros + 1,
                            MAX_TIMESTAMP.micros - 10**7, MAX_TIMESTAMP.micros])


@contextlib.contextmanager
def _spied() -> Iterator[list[bool]]:
    """Whether each call of the micros encoding gave rows (True) or refused its batch."""
    calls: list[bool] = []

    def spy(real):  # type: ignore[no-untyped-def]
        def call(*args):  # type: ignore[no-untyped-def]
            rows = real(*args)
            calls.append(rows is not None)
            return rows
        return call

    # From windowed values, or from a Map's TimestampedValues (`engine/direct_stamps.py`).
    with mock.patch("sparkbeam.engine.direct.encode_into_sessions",
                    spy(direct_sessions.encode_into_sessions)), \
            mock.patch("sparkbeam.engine.direct.encode_micros_into_sessions",
                       spy(direct_sessions.encode_micros_into_sessions)):
        yield calls


@settings(max_examples=200, deadline=None)
@given(events=st.lists(st.tuples(st.integers(-3, 3), _MICROS, st.integers(0, 2**40)),
                       min_size=1, max_size=30),
       extreme=st.none() | _EXTREME, gap=st.sampled_from(_GAPS))
def test_session_windows_encoded_from_micros_are_the_bundle_processors(  # type: ignore[no-untyped-def]
        events, extreme, gap) -> None:
    """Negative and sub-millisecond timestamps, gaps of less than a millisecond and of 8.5 and
    9 ms, a window end past the maximum timestamp: byte for byte. A batch with no timestamp
    at the bounds takes the micros encoding."""
    plan, stage, prefix = _plan(gap)
    if extreme is not None:
        events = [*events, (1, extreme, 5)]
    lines = [f"{k},{at},{v}".encode() for k, at, v in events]
    with _spied() as calls:
        direct, beams = _both_paths(plan, stage, [_batch([prefix + varint(len(s)) + s
                                                          for s in lines])])
    assert direct == beams
    in_bounds = all(MIN_TIMESTAMP.micros <= at and at + gap * 1e6 <= MAX_TIMESTAMP.micros - 10**6
                    for _, at, _ in events)
    if in_bounds:
        assert calls == [True]


def test_the_stage_takes_the_micros_encoding() -> None:
    """The pipeline above does go that way (so the test above compares it), and a batch it
    refuses goes the general way with the same rows."""
    plan, stage, prefix = _plan(30)
    assert DirectRun(DirectProgram(stage, plan.components)).sessions_last is not None
    lines = [b"1,5000000,7", b"2,-1500,8"]
    batch = _batch([prefix + varint(len(s)) + s for s in lines])
    # A window end past the maximum timestamp.
    late = f"2,{MAX_TIMESTAMP.micros},2".encode()
    refused = _batch([prefix + varint(len(s)) + s for s in [b"1,0,7", late]])
    with _spied() as calls:
        direct, beams = _both_paths(plan, stage, [batch])
        assert calls == [True] and direct == beams
        direct, beams = _both_paths(plan, stage, [refused])
    assert calls == [True, False] and direct == beams


@settings(max_examples=300, deadline=None)
@given(micros=st.lists(st.one_of(st.integers(0, 10**13), st.sampled_from([0, 1, 999, 1000, 1001]),
                                 st.integers(MAX_TIMESTAMP.micros - 10**8, MAX_TIMESTAMP.micros)),
                       min_size=1, max_size=40),
       gap=st.sampled_from([*_GAPS, 127.5e-3, 16.3835, 2097.1515]), prefixed=st.booleans())
def test_a_batchs_leads_are_each_elements(micros, gap, prefixed) -> None:  # type: ignore[no-untyped-def]
    """NumPy's bytes of a batch are `_leads`' of each element, spans whose varints change
    length (127 or 128 ms, 16,383 or 16,384 ms, 2**21 - 1 or 2**21 ms) included; a batch it
    does not cover (a window end past the maximum timestamp, spans of two varint lengths) is
    refused."""
    gap_micros = round(gap * 1e6)
    lead = direct_sessions._leads(gap_micros, prefixed)
    batch = direct_sessions.batch_leads(micros, gap_micros, prefixed)
    spans = {len(varint((at + gap_micros) // 1000 - at // 1000)) for at in micros}
    if max(micros) + gap_micros > MAX_TIMESTAMP.micros or len(spans) > 1:
        assert batch is None
    else:
        assert batch == [lead(at) for at in micros]


def test_spans_of_two_varint_lengths_are_refused() -> None:
    assert direct_sessions.batch_leads([0, 500], 127_500, False) is None  # spans 127 and 128
    assert direct_sessions.batch_leads([0, 600], 127_500, False) is None
    assert direct_sessions.batch_leads([0, 1000], 127_500, True) == [
        direct_sessions._leads(127_500, True)(at) for at in (0, 1000)]


def test_a_batch_before_the_epoch_is_left_to_each_element() -> None:
    """Rounding toward zero and the floor differ there, so the batch takes `_leads`."""
    assert direct_sessions.batch_leads([5, -1], 30_000_000, True) is None
    assert direct_sessions.batch_leads([5, 1], 30_000_000, True) is not None
