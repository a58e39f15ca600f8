"""A Map's `TimestampedValue` results encoded from their micros (`engine/direct_stamps.py`):
byte for byte the bundle processor's rows, taken only when every result qualifies, and the
general windowing for a batch that mixes in anything else, the user's function called once."""
from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Iterator
from unittest import mock

from apache_beam.transforms import window
from apache_beam.utils.timestamp import Timestamp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkbeam.engine import direct_stamps
from sparkbeam.plan.native_text import varint
from tests.unit.engine.test_direct import _batch, _both_paths, keyed_stamping_plan

CALLS: list[int] = []  # one entry a call of the user's function, in this process


def _stamp(line: str) -> object:
    """`key,micros,value,kind`: kind 0 a TimestampedValue of a pair, 1 a plain pair, 2 a
    TimestampedValue of a list (which Beam's tuple coder takes, and `encode_stamped` does
    not), 3 a TimestampedValue at whole seconds given as an int."""
    CALLS.append(1)
    key, at, value, kind = (int(part) for part in line.split(","))
    if kind == 1:
        return (key, value)
    if kind == 2:
        return window.TimestampedValue([key, value], Timestamp(micros=at))
    if kind == 3:
        return window.TimestampedValue((key, value), at // 10**6)
    return window.TimestampedValue((key, value), Timestamp(micros=at))


@functools.cache
def _plan():  # type: ignore[no-untyped-def]
    plan, stage, prefix = keyed_stamping_plan(_stamp)
    assert stage.outputs[0].key_coder_id
    return plan, stage, prefix


@contextlib.contextmanager
def _spied() -> Iterator[dict[str, list[bool]]]:
    """Per function, whether each of its calls from the direct stage gave an answer."""
    calls: dict[str, list[bool]] = {"stamped_micros": [], "encode_stamped": []}

    def spy(name: str):  # type: ignore[no-untyped-def]
        real = getattr(direct_stamps, name)

        def call(*args):  # type: ignore[no-untyped-def]
            found = real(*args)
            calls[name].append(found is not None)
            return found
        return call

    with mock.patch("sparkbeam.engine.direct.stamped_micros", spy("stamped_micros")), \
            mock.patch("sparkbeam.engine.direct.encode_stamped", spy("encode_stamped")):
        yield calls


_EVENTS = st.lists(st.tuples(st.integers(-3, 3),
                             st.integers(-(10**13), 10**13)
                             | st.sampled_from([-1, -999, -1000, -1001, 0, 999, 1001]),
                             st.integers(0, 2**40), st.sampled_from([0, 0, 0, 1, 2, 3])),
                   min_size=1, max_size=30)


@settings(max_examples=150, deadline=None)
@given(events=_EVENTS)
def test_stamped_results_are_the_bundle_processors(events) -> None:  # type: ignore[no-untyped-def]
    plan, stage, prefix = _plan()
    lines = [",".join(map(str, e)).encode() for e in events]
    batch = _batch([prefix + varint(len(s)) + s for s in lines])
    CALLS.clear()
    with _spied() as calls:
        direct, beams = _both_paths(plan, stage, [batch])
    assert direct == beams
    # Once a line on each path: a refused batch is windowed from the results it has.
    assert len(CALLS) == 2 * len(events)
    kinds = {kind for *_, kind in events}
    assert calls["stamped_micros"] == [1 not in kinds]
    assert calls["encode_stamped"] == ([kinds <= {0, 3}] if 1 not in kinds else [])


def test_a_stamped_batch_takes_the_micros_encoding() -> None:
    """The test above compares the micros encoding with Beam's: it is the one taken."""
    plan, stage, prefix = _plan()
    lines = [b"1,5000000,7,0", b"2,-1500,8,3"]
    with _spied() as calls:
        direct, beams = _both_paths(plan, stage, [_batch([prefix + varint(len(s)) + s
                                                          for s in lines])])
    assert calls == {"stamped_micros": [True], "encode_stamped": [True]} and direct == beams


def test_a_timestamp_no_windowed_value_can_hold_is_beams_error() -> None:
    """Micros below -2**63 (a `Timestamp` takes them; Beam's `WindowedValue` does not): the
    batch goes the general way, which fails as the bundle processor does, rather than being
    encoded at the least timestamp."""
    plan, stage, prefix = _plan()
    lines = [b"1,5000000,7,0", f"2,{-(2**63) - 1},8,0".encode()]
    batch = _batch([prefix + varint(len(s)) + s for s in lines])
    with _spied() as calls, pytest.raises(RuntimeError, match="too large to convert"):
        _both_paths(plan, stage, [batch])  # the direct stage first
    assert calls == {"stamped_micros": [False], "encode_stamped": []}
    with pytest.raises(RuntimeError, match="too large to convert"):
        _both_paths(plan, dataclasses.replace(stage, direct=None), [batch])
