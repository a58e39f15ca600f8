"""A sessions GroupByKey's shuffled rows as window bounds and values (pure: NumPy, Arrow, Beam's
coders).

Under Beam's own `Sessions` with the default trigger and the end-of-window output time, what a
grouped key comes to depends on each element's window and value alone (`engine/grouping.py`):
its timestamp and pane are dropped, the windows merge on their bounds, and the key is the
row's. Decoding each element (a `WindowedValue`, an `IntervalWindow`, a tuple) and listing it
by window cost a sessions reduce stage ~4 µs an event in Python, most of its grouping.

So the producer's tasks pack such a buffer's rows as *session rows* (`packed_rows.packed`): a
row is a big-endian int32 count N, then the N windows' starts and the N ends (micros, int64,
little-endian, as Beam's window coder decodes them: whole milliseconds), then the N values as
the grouping's value coder nests them. That is what Beam's list coder decodes after the count,
so a row's values are decoded in one call, and its bounds are read as NumPy arrays. The
elements are cut with NumPy from their encoding: `timestamp (8) | window count (4, 1) |
[max timestamp (8) | [window length]] | end (8, milliseconds shifted by 2**63, big-endian) |
span (varint, milliseconds) | pane (1 byte when its type nibble is 0) | key (its bytes in the
key column) | value`. An element that is not so (another pane encoding, several windows, a key
encoded otherwise, a window of no span, bounds past what micros in an int64 hold) is left as
it is: its own row, a count of 0 and the element. A key with such a row is grouped from its
elements as before, the packed ones encoded again (`SessionRows.elements`).

The reader (`ByWindowGrouper.grouped`) merges a key's windows with NumPy (`merged`) into
exactly what `_merged_sessions` gives: sessions in order of their windows' first appearance,
each one's values by window in order of first appearance, then in input order. Held equal to
the element path on Hypothesis keys (`tests/unit/engine/test_session_rows.py`).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from apache_beam.coders import coders
from apache_beam.utils import windowed_value

from sparkbeam.engine.arrow import cut_out, keyed_stretch
from sparkbeam.engine.window_coders import MAX_MICROS, MIN_MICROS, faster_impl, interval_window
from sparkbeam.plan.grouping_paths import window_layout

_LE64 = np.dtype("<i8")
_BE64 = np.dtype(">u8")
_SIGN = np.uint64(1 << 63)
# Bounds in milliseconds whose micros an int64 holds (with room to subtract a span).
_BOUND_MS = (2**63 - 1) // 1000 // 4
_SPAN_BYTES = 9  # a span's varint at most (2**63 ms and more are left as elements)


@dataclass(frozen=True)
class SessionRows:
    """One sessions grouping's row layout (`layout_of`)."""

    pre: Any  # the pre-grouping element's impl (its windows through `window_coders`)
    key: Any  # the key coder's impl
    values: Any  # Beam's list coder of the value coder: a row's values after its count
    window_at: int  # where the window's end lies in the element (`grouping_paths.window_layout`)
    window_length: bool  # the window's length comes just before it

    def read(self, rows: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray, list[Any]] | None:
        """A key's rows as its windows' starts and ends (micros) and its values, in order; None
        where a row holds an element (`elements` then)."""
        starts, ends, values = [], [], []
        for row in rows:
            unpacked = self._unpacked(row)
            if unpacked is None:
                return None
            starts.append(unpacked[0])
            ends.append(unpacked[1])
            values.extend(unpacked[2])
        if len(starts) == 1:
            return starts[0], ends[0], values
        return np.concatenate(starts), np.concatenate(ends), values

    def elements(self, key: bytes, rows: Iterable[bytes]) -> list[bytes]:
        """A key's rows as its encoded elements, for the element path: a packed row's again,
        at the end of their windows (the output time ignores it) and with no pane (the
        grouping ignores it)."""
        user_key = self.key.decode_nested(key)
        encode = self.pre.encode_nested
        out: list[bytes] = []
        for row in rows:
            unpacked = self._unpacked(row)
            if unpacked is None:
                out.append(row[4:])
                continue
            starts, ends, values = unpacked
            out.extend(encode(windowed_value.create((user_key, value), end - 1,
                                                    (interval_window(start, end),)))
                       for start, end, value in zip(starts.tolist(), ends.tolist(), values,
                                                    strict=True))
        return out

    def _unpacked(self, row: bytes) -> tuple[np.ndarray, np.ndarray, list[Any]] | None:
        """A row's windows' starts and ends and its values; None for a row holding an
        element (a count of 0)."""
        n = int.from_bytes(row[:4], "big")
        if not n:
            return None
        return (np.frombuffer(row, _LE64, n, 4), np.frombuffer(row, _LE64, n, 4 + 8 * n),
                self.values.decode(row[:4] + row[4 + 16 * n:]))


def layout_of(coder: coders.WindowedValueCoder) -> SessionRows:
    """The row layout of a sessions grouping's input coder (one `session_coders` takes)."""
    key, value = coder.wrapped_value_coder.coders()  # type: ignore[attr-defined]
    layout = window_layout(coder.window_coder)
    assert layout is not None, coder
    return SessionRows(faster_impl(coder), key.get_impl(), coders.ListCoder(value).get_impl(),
                       *layout)


def merged(starts: np.ndarray, ends: np.ndarray
           ) -> tuple[list[int], list[int], list[int], list[int], list[int]]:
    """A key's windows [starts, ends) (each of some span) merged as Beam's Sessions merges
    them: the sessions' starts, ends, output times as Beam's coder gives them back (the end of
    window, `direct_steps.coded_micros`) and sizes in order of first appearance, and the order
    to take the values in (see the module doc)."""
    n = len(starts)
    order = np.lexsort((ends, starts))  # by start, then end; stable
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    new = np.empty(n, dtype=bool)
    new[0] = True
    new[1:] = s[1:] >= reach[:-1]
    firsts = np.flatnonzero(new)
    session = np.cumsum(new) - 1
    # Each distinct window's first element (windows equal in bounds lie together, stably).
    new_window = new.copy()
    new_window[1:] |= (s[1:] != s[:-1]) | (e[1:] != e[:-1])
    window_firsts = np.flatnonzero(new_window)
    first_seen = np.repeat(np.minimum.reduceat(order, window_firsts),
                           np.diff(np.append(window_firsts, n)))
    # Sessions ranked by their first element, each one's values by window, then as they came.
    by_rank = np.argsort(np.minimum.reduceat(order, firsts), kind="stable")
    rank = np.empty(len(firsts), dtype=np.int64)
    rank[by_rank] = np.arange(len(firsts))
    take = order[np.lexsort((order, first_seen, rank[session]))]
    last = np.maximum.reduceat(e, firsts)[by_rank]
    return (s[firsts][by_rank].tolist(), last.tolist(), _coded_stamps(last - 1).tolist(),
            np.diff(np.append(firsts, n))[by_rank].tolist(), take.tolist())


def _coded_stamps(micros: np.ndarray) -> np.ndarray:
    """`direct_steps.coded_micros` of each: milliseconds rounded toward zero, Beam's bounds
    restored at its bounds."""
    clamped = np.maximum(micros, MIN_MICROS)
    millis = np.where(clamped < 0, -(-clamped // 1000), clamped // 1000)
    return np.where(millis <= -(abs(MIN_MICROS) // 1000), MIN_MICROS,
                    np.where(millis >= MAX_MICROS // 1000, MAX_MICROS, millis * 1000))


def session_rows(tag: int, kept: list[tuple[int, Any, bytes]], layout: SessionRows,
                 max_row_bytes: int) -> list[tuple[int, Any, bytes]]:
    """A stretch's rows of a session-rows tag: per key, in the order the keys first came, its
    elements in order, a row each time they pass another `max_row_bytes` or an element is not
    cut (see the module doc)."""
    stretch = keyed_stretch(kept)
    group, data, begin, end = stretch.group, stretch.data, stretch.begin, stretch.end
    ok, start_ms, end_ms, value_begin = _cut(data, begin, end, stretch.key_offsets,
                                             stretch.key_data, layout.window_at,
                                             layout.window_length)
    n = len(begin)
    # Each element's payload: its value where it is cut, else the whole element.
    pay_begin = np.where(ok, value_begin, begin)
    pay_len = end - pay_begin
    # A new row where the key changes, where an element is not cut (its own row, and the
    # one after it), or where the key's bytes so far pass another `max_row_bytes`.
    new_row = np.ones(n, dtype=bool)
    new_row[1:] = (group[1:] != group[:-1]) | ~ok[1:] | ~ok[:-1]
    sizes = np.where(ok, pay_len + 16, 0)
    before = np.cumsum(sizes) - sizes
    runs = np.flatnonzero(new_row)
    within = (before - np.repeat(before[runs], np.diff(np.append(runs, n)))
              ) // max(max_row_bytes, 1)
    new_row[1:] |= within[1:] != within[:-1]
    firsts = np.flatnonzero(new_row)
    row_of = np.cumsum(new_row) - 1
    # Out, one buffer: each row's count (big-endian int32, 0 for an element kept whole), its
    # starts and its ends (little-endian int64), then its payloads, in one scatter each.
    counts = np.where(ok[firsts], np.diff(np.append(firsts, n)), 0)
    row_bytes = 4 + 16 * counts + np.add.reduceat(pay_len, firsts)
    at = np.cumsum(row_bytes) - row_bytes
    out = np.empty(int(row_bytes.sum()), dtype=np.uint8)
    for k in range(4):
        out[at + k] = (counts >> (8 * (3 - k))) & 0xFF
    cut = np.flatnonzero(ok)
    if len(cut):
        row = row_of[cut]
        place = at[row] + 4 + 8 * (cut - firsts[row])
        eight = np.arange(8)
        out[place[:, None] + eight] = (start_ms[cut] * 1000).astype(_LE64).view(
            np.uint8).reshape(-1, 8)
        out[(place + 8 * counts[row])[:, None] + eight] = (end_ms[cut] * 1000).astype(
            _LE64).view(np.uint8).reshape(-1, 8)
    pay_before = np.cumsum(pay_len) - pay_len
    pay_at = at[row_of] + 4 + 16 * counts[row_of] + pay_before - pay_before[firsts][row_of]
    total = int(pay_len.sum())
    out[np.repeat(pay_at - pay_before, pay_len) + np.arange(total)] = cut_out(
        data, pay_begin, end)
    joined = out.tobytes()
    bounds = np.append(at, len(out)).tolist()
    keys = stretch.keys.take(pa.array(group[firsts])).to_pylist()
    return [(tag, key, joined[bounds[r]:bounds[r + 1]]) for r, key in enumerate(keys)]


def _cut(data: np.ndarray, begin: np.ndarray, end: np.ndarray, key_offsets: np.ndarray,
         key_data: np.ndarray, at_end: int, window_length: bool
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Which elements [begin, end) of `data` are cut (the module doc's layout, the window's end
    at `at_end`, each one's key its key column's bytes), their windows' bounds in
    milliseconds, and where their values start."""
    n = len(begin)
    key_len = np.diff(key_offsets)
    ok = (end - begin) >= at_end + 10 + key_len  # the end, a span byte, the pane, the key
    last = max(len(data) - 1, 0)
    at = np.where(ok, begin, 0)
    if not len(data):
        zero = np.zeros(n, dtype=np.int64)
        return np.zeros(n, dtype=bool), zero, zero, zero

    def bytes_at(first: np.ndarray, count: int) -> np.ndarray:
        return data[np.minimum(first[:, None] + np.arange(count), last)]

    head = bytes_at(at + 8, 4)
    ok &= (head[:, 0] == 0) & (head[:, 1] == 0) & (head[:, 2] == 0) & (head[:, 3] == 1)
    end_ms = (np.ascontiguousarray(bytes_at(at + at_end, 8)).view(_BE64).ravel()
              .astype(np.uint64) ^ _SIGN).view(np.int64)
    span = bytes_at(at + at_end + 8, _SPAN_BYTES)
    stops = span < 128
    ok &= stops.any(axis=1)
    span_len = np.argmax(stops, axis=1) + 1
    within = np.arange(_SPAN_BYTES) < span_len[:, None]
    span_ms = (((span & 0x7F).astype(np.int64) << (7 * np.arange(_SPAN_BYTES))) * within
               ).sum(axis=1)
    if window_length:
        ok &= data[np.minimum(at + at_end - 1, last)] == 8 + span_len
    pane = at + at_end + 8 + span_len
    ok &= data[np.minimum(pane, last)] < 16
    # Ranges, not np.abs: the least int64 is its own absolute value.
    ok &= (span_ms > 0) & (span_ms < _BOUND_MS) & (end_ms > -_BOUND_MS) & (end_ms < _BOUND_MS)
    key_at = pane + 1
    total = int(key_len.sum())
    if total:
        row = np.repeat(np.arange(n), key_len)
        in_key = np.arange(total) - np.repeat(key_offsets[:-1], key_len)
        where = np.minimum(np.where(ok[row], key_at[row] + in_key, 0), last)
        ok &= np.bincount(row[data[where] != key_data], minlength=n) == 0
    value_begin = key_at + key_len
    ok &= value_begin <= end
    end_ms = np.where(ok, end_ms, 1)
    return ok, np.where(ok, end_ms - span_ms, 0), end_ms, np.where(ok, value_begin, begin)
