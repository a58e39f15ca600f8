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
