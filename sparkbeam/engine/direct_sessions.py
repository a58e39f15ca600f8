"""A direct stage whose last step is a WindowInto(Sessions), encoded without window objects
(no pyspark).

Beam's `Sessions.assign` makes an `IntervalWindow(timestamp, timestamp + gap)` of two
`Timestamp`s for every element, and encoding it reads them back as micros: ~4 µs an element
in-process, more than the rest of such a stage (the sessions workload's read, parse and
timestamp). When the assignment is the stage's last step and its output is a keyed KV, each
element's encoding is computed from its timestamp's micros instead: the timestamp's 8 bytes,
one window (its end in milliseconds, shifted by 2**63, then the span in milliseconds as a
varint, as `IntervalWindowCoderImpl` writes it, length-prefixed after the window's last
millisecond where the stage's coder is Beam's `TimestampPrefixingWindowCoder` of it), the
default pane, the key and the value.
Which of those two the stage's coder writes is read off the coder (`window_layout`). The
first element of every batch is also encoded Beam's way; any difference (the pane must be its
one byte), an element not in exactly one window, a value that is not a pair, or a window end
past the maximum timestamp, and the batch takes `_window_into` and the general encoding
instead.
"""
from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import numpy as np
from apache_beam.coders import coders
from apache_beam.transforms.window import Sessions
from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

from sparkbeam.engine.direct_steps import Step, assigned, timestamp_bytes
from sparkbeam.engine.program import OutRow
from sparkbeam.engine.window_coders import max_timestamp_bytes
from sparkbeam.plan.native_text import varint

_PACK_U64 = struct.Struct(">Q").pack
_SHIFT = 1 << 63
_ONE_WINDOW = b"\x00\x00\x00\x01"  # the windows' count, a big-endian int32
_MIN_MICROS = MIN_TIMESTAMP.micros
_MAX_MICROS = MAX_TIMESTAMP.micros


def sessions_gap(step: Step) -> int | None:
    """The gap in micros when `step` is a WindowInto of Beam's own Sessions (not a subclass,
    whose assignment may differ), else None."""
    fn = step.window_into
    return int(fn.gap_size.micros) if type(fn) is Sessions else None


def window_layout(out_coder: Any) -> bool | None:
    """How the stage's output coder writes a session window: False for Beam's
    `IntervalWindowCoder`, True for it length-prefixed inside `TimestampPrefixingWindowCoder`
    (what a GroupByKey's input has), None for anything else (no such encoding here)."""
    windows = getattr(out_coder, "window_coder", None)
    if type(windows) is coders.IntervalWindowCoder:
        return False
    if type(windows) is coders.TimestampPrefixingWindowCoder:
        inner = windows._get_component_coders()[0]  # noqa: SLF001 - its one component
        if (type(inner) is coders.LengthPrefixCoder
                and type(inner._get_component_coders()[0]) is coders.IntervalWindowCoder):  # noqa: SLF001
            return True
    return None


def _leads(gap: int, prefixed: bool) -> Callable[[int], bytes]:
    """The bytes of an element at `micros` (at least Beam's least timestamp) in its session
    window, before its pane's. The window is `IntervalWindowCoderImpl`'s (its end's
    milliseconds, then its span's); when `prefixed`, as `TimestampPrefixingWindowCoderImpl`
    writes a length-prefixed one (the window's last microsecond in milliseconds first). A
    span takes one or two values for a gap (one at whole milliseconds), so its varint and the
    window's length byte are worked out once each (~1 µs an element in Python's loop)."""
    spans: dict[int, tuple[bytes, bytes]] = {}

    def lead(micros: int) -> bytes:
        end = micros + gap
        end_ms = end // 1000  # floor, as the window coder divides
        span = end_ms - micros // 1000
        found = spans.get(span)
        if found is None:
            tail = varint(span)
            found = spans[span] = (tail, varint(8 + len(tail)))
        window = _PACK_U64(end_ms + _SHIFT) + found[0]
        if prefixed:
            window = max_timestamp_bytes(end) + found[1] + window
        return timestamp_bytes(micros) + _ONE_WINDOW + window

    return lead


_SIGN = np.uint64(1 << 63)
_BIG_U64 = np.dtype(">u8")


def _shifted(millis: np.ndarray) -> np.ndarray:
    """Non-negative int64 milliseconds as TimestampCoderImpl writes them: shifted by 2**63 (for
    such values, the sign bit set), big endian, 8 bytes a row."""
    return (millis.view(np.uint64) ^ _SIGN).astype(_BIG_U64).view(np.uint8).reshape(-1, 8)


def batch_leads(micros: list[int], gap: int, prefixed: bool) -> list[bytes] | None:
    """`_leads(gap, prefixed)` of every one of `micros`, with NumPy (~0.1 µs an element
    against ~0.5 µs for the Python function's): the same bytes, one array column a field.
    Only for timestamps at or past the epoch whose windows end inside Beam's timestamps (the
    floors of the element's and the window's milliseconds are then plain integer divisions)
    and when every element's span takes a varint of the same length; None otherwise, and the
    caller uses `_leads`."""
    low, high = min(micros), max(micros)
    if low < 0 or high + gap > _MAX_MICROS:
        return None
    at = np.array(micros, dtype=np.int64)
    end = at + gap
    end_ms = end // 1000
    span = end_ms - at // 1000
    tail_size = len(varint(int(span.min())))
    if len(varint(int(span.max()))) != tail_size:
        return None
    n = len(micros)
    columns = [_shifted(at // 1000), np.broadcast_to(np.frombuffer(_ONE_WINDOW, np.uint8), (n, 4))]
    if prefixed:  # the window's last microsecond, then the length of the window's bytes
        columns += [_shifted((end - 1) // 1000), np.full((n, 1), 8 + tail_size, np.uint8)]
    columns.append(_shifted(end_ms))
    spans = span.view(np.uint64)
    for k in range(tail_size):  # the span's varint, seven bits a byte, least first
        byte = (spans >> np.uint64(7 * k)) & np.uint64(0x7F)
        if k < tail_size - 1:
            byte |= np.uint64(0x80)
        columns.append(byte.astype(np.uint8).reshape(-1, 1))
    joined = np.hstack(columns).tobytes()
    width = len(joined) // n
    return [joined[i:i + width] for i in range(0, len(joined), width)]


def encode_into_sessions(step: Step, gap: int, values: list[Any], src: list[int] | None,
                         wvs: list[WindowedValue], out_impl: Any,
                         kv_impls: tuple[Any, Any], prefixed: bool) -> list[OutRow] | None:
    """Each (key, value) of the batch assigned its session window by `step` and encoded as
    the stage's keyed output (`prefixed`: its window coder is the timestamp-prefixing one, from
    `window_layout`); None when the batch must go the general way."""
    if not values:
        return []
    micros: list[int] = []
    add = micros.append
    for k in range(len(values)):
        wv = wvs[0 if src is None else src[k]]
        if len(wv.windows) != 1:
            return None
        add(wv.timestamp_micros)
    return encode_micros_into_sessions(step, gap, values, micros, wvs[0 if src is None else src[0]],
                                       out_impl, kv_impls, prefixed)


def encode_micros_into_sessions(step: Step, gap: int, values: list[Any], micros: list[int],
                                first: WindowedValue, out_impl: Any, kv_impls: tuple[Any, Any],
                                prefixed: bool) -> list[OutRow] | None:
    """`encode_into_sessions` of values at timestamps `micros` (each element in one window;
    `first` is the first one's windowed value); None when the batch must go the general way."""
    key_of, value_of = (impl.encode_nested for impl in kv_impls)
    v0 = values[0]
    if len(first.windows) != 1 or type(v0) is not tuple or len(v0) != 2:
        return None
    # Beam's own encoding of the first element fixes the pane's bytes and checks the rest.
    beams = out_impl.encode_nested(WindowedValue(
        v0, first.timestamp, assigned(step.window_into, first.timestamp, v0, first.windows[0])))
    tail = key_of(v0[0]) + value_of(v0[1])
    if not beams.endswith(tail):
        return None
    leads = _leads(gap, prefixed)
    lead = leads(micros[0])
    # The default pane is one byte; checking its length too keeps a window's bytes from
    # passing for the pane's.
    if not beams.startswith(lead) or len(beams) - len(tail) - len(lead) != 1:
        return None
    pane = beams[len(lead):len(beams) - len(tail)]
    if min(micros) < _MIN_MICROS or max(micros) + gap > _MAX_MICROS:
        return None
    # The batch's leading bytes with NumPy where it covers them, else each element's.
    heads = batch_leads(micros, gap, prefixed)
    rows: list[OutRow] = []
    append = rows.append
    for v, head in zip(values, map(leads, micros) if heads is None else heads, strict=True):
        if type(v) is not tuple or len(v) != 2:
            return None
        key = key_of(v[0])
        append((0, key, head + pane + key + value_of(v[1])))
    return rows
