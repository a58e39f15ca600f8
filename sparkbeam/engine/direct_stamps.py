"""A direct stage's `TimestampedValue` results encoded from their timestamps (no pyspark).

A Map returning `TimestampedValue`s (the sessions and stateful workloads' `to_timestamped`) has
each result windowed by `direct_steps._stamped`: a WindowedValue of its own, appended to the
batch's list, which the stage's encoding then reads back (its timestamp, its one window, its
pane). In the stateful workload's map stage that was ~1 µs of a ~4.4 µs line in-process
(bench/ANALYSIS.md). When such a step is the stage's last function step, and the stage encodes
keyed pairs or ends in a WindowInto(Sessions) (`engine/direct_sessions.py`), the encoding reads
only each result's value and timestamp: `stamped_micros` takes those from the results, and
`encode_stamped` writes each element as Beam's coder does. Anything else (a result of another
type, a timestamp that is not a `Timestamp`, another WindowFn, an element of the batch in
several windows) returns None, and the results are windowed as before (`direct_steps.settled`),
the user's function not called again.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from apache_beam.transforms.window import GlobalWindows, TimestampedValue
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import PANE_INFO_UNKNOWN, WindowedValue, create

from sparkbeam.engine.direct_steps import IN_GLOBAL_WINDOW, Step, timestamp_bytes
from sparkbeam.engine.program import OutRow

# A windowed value holds its timestamp's micros as a C int64: past these, Beam's
# `WindowedValue` raises OverflowError, which the general way then raises too.
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


class Stamped(NamedTuple):
    """A step's `TimestampedValue` results as their values and timestamps (micros)."""

    values: list[Any]
    micros: list[int]

    @property
    def first(self) -> WindowedValue:
        """The first result as `_stamped` windows it."""
        return in_global_window(self.values[0], self.micros[0])


def stamped_micros(step: Step, out: list[Any], wvs: list[WindowedValue]) -> Stamped | None:
    """The values and timestamps (micros) of `out`, a function step's results, when each is
    a `TimestampedValue` at a `Timestamp`, the step's WindowFn is Beam's own GlobalWindows and
    every element of the batch (`wvs`) is in one window: `_stamped` would then put each
    value in the global window at its timestamp and the default pane, once. None otherwise,
    and for a timestamp a windowed value cannot hold (Beam's own error, on the general way)."""
    if type(step.window_fn) is not GlobalWindows or not out:
        return None
    for wv in wvs:
        if len(wv.windows) != 1:
            return None
    values: list[Any] = []
    micros: list[int] = []
    add_value, add_micros = values.append, micros.append
    for result in out:
        if type(result) is not TimestampedValue:
            return None
        timestamp = result.timestamp
        if type(timestamp) is not Timestamp:
            return None
        add_value(result.value)
        add_micros(timestamp.micros)
    if min(micros) < _INT64_MIN or max(micros) > _INT64_MAX:
        return None
    return Stamped(values, micros)


def in_global_window(value: Any, micros: int) -> WindowedValue:
    """What `_stamped` makes of a result `stamped_micros` took."""
    return create(value, micros, IN_GLOBAL_WINDOW, PANE_INFO_UNKNOWN)


def encode_stamped(header_of: Callable[[WindowedValue, Any], bytes | None],
                   kv_impls: tuple[Any, Any], values: list[Any], micros: list[int],
                   first: WindowedValue) -> list[OutRow] | None:
    """Each (key, value) of `values` at its timestamp (`micros`), all in `first`'s one window
    and pane, encoded as the stage's keyed output: its timestamp's 8 bytes
    (`timestamp_bytes`), the rest of `first`'s header (`header_of`, Beam's own encoding of
    the first value), the key's bytes (encoded once, for the key column too) and the value's.
    None when the first element's layout is not that or a value is not a pair."""
    v0 = values[0]
    if type(v0) is not tuple or len(v0) != 2:
        return None
    header = header_of(first, v0)
    if header is None or header[:8] != timestamp_bytes(micros[0]):
        return None
    rest = header[8:]
    key_of, value_of = (impl.encode_nested for impl in kv_impls)
    rows: list[OutRow] = []
    append = rows.append
    for v, at in zip(values, micros, strict=True):
        if type(v) is not tuple or len(v) != 2:
            return None
        k = key_of(v[0])
        append((0, k, timestamp_bytes(at) + rest + k + value_of(v[1])))
    return rows


def encode_sharing(header_of: Callable[[WindowedValue, Any], bytes | None],
                   kv_impls: tuple[Any, Any], values: list[Any], src: list[int],
                   wvs: list[WindowedValue]) -> list[OutRow] | None:
    """`encode_stamped` of (key, value) pairs whose windowed values (`wvs[src[i]]`) share
    the first's one window (the same object) and pane but not their timestamps. None when an
    element differs."""
    first = wvs[src[0]]
    windows, pane = first.windows, first.pane_info
    if len(windows) != 1:
        return None
    window = windows[0]
    micros: list[int] = []
    for i in src:
        wv = wvs[i]
        ws = wv.windows
        if wv.pane_info is not pane or len(ws) != 1 or ws[0] is not window:
            return None
        micros.append(wv.timestamp_micros)
    return encode_stamped(header_of, kv_impls, values, micros, first)


def windowed(stamped: Stamped, wvs: list[WindowedValue]) -> tuple[list[Any], list[int]]:
    """`stamped_micros`' results windowed after all, as `direct_steps.settled` windows them:
    each a windowed value of its own, appended to `wvs`."""
    values, micros = stamped
    start = len(wvs)
    wvs.extend(map(in_global_window, values, micros))
    return values, list(range(start, len(wvs)))
