"""Batch grouping of one key's values of a GroupByKey input, by window and pane.

Beam's FnApiRunner groups with `GroupingBuffer`: in the global window with the default trigger
it lists a key's values itself; any other windowing goes through Beam's `GeneralTriggerDriver`
(per-key state objects, a timer per window, a merge context per element batch): measured
in-process, a sessions reduce stage took 93 µs an event, 95 % of it in the driver.

Under the default trigger a batch run fires each window exactly once, and the trigger driver's
output is fully determined by the window function and the timestamp combiner (read off
`GeneralTriggerDriver.process_entire_key` for `DefaultTrigger` on Beam 2.77):

- every value is added to each of its windows; windows are merged by the window function's own
  `merge` (a merged-away window's values follow its result's, chained merges followed to the
  end), with the set of windows the driver would pass;
- a window's values keep the driver's order: windows in order of first appearance, each
  window's values in input order;
- each window fires once, on time, at the watermark's end-of-window timer: pane
  `PaneInfo(is_first=True, is_last=False, ON_TIME, 0, 0)` (`DefaultTrigger.on_fire` returns
  False, so the driver never marks the pane last);
- the output timestamp is the combiner's `merge` over `assign_output_time` of the window's
  values, the window being the merged one (the driver's watermark hold).

`ByWindowGrouper` does exactly that in one pass (10.9 µs an event for that stage, most of it
the SDK's): `tests/unit/engine/test_grouping.py` holds it byte-equal to Beam's driver on
Hypothesis keys, `tests/integration/test_grouping.py` equal to FnApiRunner end to end. Other
triggers keep Beam's driver (`TriggerDriverGrouper`); `Grouping.by_window` (chosen at planning,
`plan/grouping_paths.py`) says which.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from apache_beam.coders.coder_impl import create_InputStream, create_OutputStream
from apache_beam.runners.portability.fn_api_runner.execution import GroupingBuffer
from apache_beam.transforms.timeutil import (
    OutputAtEarliestInputTimestampImpl,
    OutputAtEndOfWindowImpl,
    OutputAtLatestInputTimestampImpl,
)
from apache_beam.transforms.window import IntervalWindow, Sessions, TimestampCombiner, WindowFn
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils import windowed_value
from apache_beam.utils.windowed_value import PaneInfo, PaneInfoTiming, WindowedValue

from sparkbeam.engine.direct_steps import coded_micros
from sparkbeam.engine.session_rows import layout_of
from sparkbeam.engine.session_rows import merged as merged_bounds
from sparkbeam.engine.window_coders import faster_impl, interval_window, interval_windows
from sparkbeam.plan.model import Grouping

# The one pane the default trigger gives a window in batch (see the module doc).
ON_TIME_PANE = PaneInfo(is_first=True, is_last=False, timing=PaneInfoTiming.ON_TIME, index=0,
                        nonspeculative_index=0)


class Grouper(Protocol):
    """Groups one key's encoded values (nested context) into its grouped element(s)."""

    def group(self, values: list[bytes], key: bytes | None = None) -> list[bytes]:
        """Encoded chunk(s) holding one grouped element per window (and pane); `key`, the
        key's bytes as the rows carry it."""
        ...


def grouper_for(grouping: Grouping, ctx: Any) -> Grouper:
    """The grouper Prepare chose for `grouping` (`Grouping.by_window`)."""
    if grouping.by_window:
        return ByWindowGrouper(grouping, ctx)
    return TriggerDriverGrouper(grouping, ctx)


class TriggerDriverGrouper:
    """Beam's own `GroupingBuffer`: its list in the global window, its trigger driver else."""

    def __init__(self, grouping: Grouping, ctx: Any) -> None:
        self._pre = ctx.coders[grouping.input_coder_id]
        self._post = ctx.coders[grouping.output_coder_id]
        self._windowing = ctx.windowing_strategies[grouping.windowing_strategy_id]

    def group(self, values: list[bytes], key: bytes | None = None) -> list[bytes]:
        buffer = GroupingBuffer(self._pre, self._post, self._windowing)
        buffer.append(b"".join(values))
        return [chunk for chunk in buffer.partition(1)[0] if chunk]


class _Merges(WindowFn.MergeContext):
    """Records which window each merged-away window went into."""

    def __init__(self, windows: Iterable[Any]) -> None:
        super().__init__(windows)
        self.into: dict[Any, Any] = {}

    def merge(self, to_be_merged: Iterable[Any], merge_result: Any) -> None:
        for window in to_be_merged:
            if window != merge_result:
                self.into[window] = merge_result


class ByWindowGrouper:
    """The default trigger's batch output without the trigger driver (see the module doc)."""

    def __init__(self, grouping: Grouping, ctx: Any) -> None:
        windowing = ctx.windowing_strategies[grouping.windowing_strategy_id]
        self._window_fn = windowing.windowfn
        self._merging = windowing.windowfn.is_merging()
        # Beam's own Sessions merges on integer micros here (`_merged_sessions`); any other
        # merging window function through its `merge`.
        self._sessions = type(windowing.windowfn) is Sessions
        # The output's windows are decoded ones or `_merged_sessions`' (ends at micros
        # precision), unless another merging WindowFn made them: its windows' ends may be
        # Timestamps of a coarser precision, whose `max_timestamp()` is a whole unit of it
        # before the end, not a microsecond.
        micros_ends = self._sessions or not self._merging
        # Its grouped elements' windows are what decoding them gives (decoded ones, or
        # `_merged_sessions`' at whole milliseconds): a direct stage may take them unencoded.
        self.exact_windows = micros_ends
        # Windows coded without Timestamp objects (`engine/window_coders.py`): decoding only
        # skips the max-timestamp prefix, so it is exact for any window.
        self._pre = faster_impl(ctx.coders[grouping.input_coder_id])
        post = ctx.coders[grouping.output_coder_id]
        self._post = faster_impl(post) if micros_ends else post.get_impl()
        self._stamp = TimestampCombiner.get_impl(windowing.timestamp_combiner, windowing.windowfn)
        # Beam's own combiners' results, computed on micros (`_output_micros`); the end of a
        # window only where its end is at micros precision.
        kind = _STAMP_KINDS.get(type(self._stamp), "")
        self._stamp_kind = "" if kind == "end" and not micros_ends else kind
        # The input shuffled as window bounds and values (`engine/session_rows.py`).
        self._rows = (layout_of(ctx.coders[grouping.input_coder_id])
                      if grouping.session_rows else None)
        if self._rows is not None:
            assert self._sessions and self._stamp_kind == "end", grouping.transform_id

    def group(self, values: list[bytes], key: bytes | None = None) -> list[bytes]:
        grouped = self.grouped(values, key_bytes=key)
        if not grouped:
            return []
        out = create_OutputStream()
        for element in grouped:
            self._post.encode_to_stream(element, out, True)
        return [out.get()]

    def encode(self, element: WindowedValue) -> bytes:
        """One grouped element as `group` encodes it."""
        return self._post.encode_nested(element)

    def grouped(self, values: list[bytes], coded: bool = False, key_bytes: bytes | None = None
                ) -> list[WindowedValue]:
        """One key's grouped elements, one per window, as `group` encodes them; when `coded`,
        at their timestamps as Beam's coder gives them back (`coded_micros`), as a direct
        grouped stage takes them (`engine/direct.py`: the bundle processor would see them
        decoded). `key_bytes`: the key's bytes in the rows (session rows carry no other)."""
        if self._rows is not None:
            assert key_bytes is not None, "session rows grouped without their key"
            bounds = self._rows.read(values)
            if bounds is not None:
                return self._from_bounds(key_bytes, *bounds, coded)
            values = self._rows.elements(key_bytes, values)
        stream = create_InputStream(b"".join(values))
        decode = self._pre.decode_from_stream
        # Entries by window, keyed by `_window_key` (an IntervalWindow's hash and equality go
        # through Timestamp objects, ~2 a lookup); timestamps kept as micros until needed.
        windows: dict[Any, list[tuple[Any, int]]] = {}
        objects: dict[Any, Any] = {}
        key: Any = None
        intervals = True  # every window one of Beam's IntervalWindows, looked up by bounds
        while stream.size() > 0:
            element = decode(stream, True)
            key, value = element.value
            micros = element.timestamp_micros
            for window in element.windows:
                if type(window) is IntervalWindow:  # `_window_key`, inline: once an event
                    at = (window._start_micros, window._end_micros)
                else:
                    at = window
                    intervals = False
                found = windows.get(at)
                if found is None:
                    windows[at] = [(value, micros)]
                    objects[at] = window
                else:
                    found.append((value, micros))
        if self._merging and windows:
            merged = _merged_sessions(windows, objects) if self._sessions and intervals else None
            if merged is not None:
                windows, objects = merged
            else:
                into = self._merge(list(objects.values()))
                if into:
                    windows, objects = _regroup(windows, objects, into)
        stamp = self._stamp
        out: list[WindowedValue] = []
        for at, entries in windows.items():
            window = objects[at]
            values = [value for value, _ in entries]
            micros = _output_micros(self._stamp_kind, window, entries)
            if micros is None:
                timestamp = stamp.merge(window, (
                    stamp.assign_output_time(window, Timestamp(micros=ts)) for _, ts in entries))
                if not coded:
                    out.append(WindowedValue((key, values), timestamp, (window,), ON_TIME_PANE))
                    continue
                micros = timestamp.micros
            out.append(windowed_value.create((key, values), coded_micros(micros) if coded
                                             else micros, (window,), ON_TIME_PANE))
        return out

    def _from_bounds(self, key: bytes, starts: Any, ends: Any, values: list[Any], coded: bool
                     ) -> list[WindowedValue]:
        """`grouped` of a key's session rows: its windows merged with NumPy (`merged`), each
        session at its end of window."""
        assert self._rows is not None
        user_key = self._rows.key.decode_nested(key)
        out: list[WindowedValue] = []
        at = 0
        firsts, lasts, stamps, sizes, take = merged_bounds(starts, ends)
        ordered = [values[i] for i in take]
        create = windowed_value.create
        for window, end, stamp, size in zip(interval_windows(firsts, lasts), lasts, stamps, sizes,
                                            strict=True):
            out.append(create((user_key, ordered[at:at + size]), stamp if coded else end - 1,
                              (window,), ON_TIME_PANE))
            at += size
        return out

    def _merge(self, windows: Iterable[Any]) -> dict[Any, Any]:
        """The window function's own `merge`: merged-away window -> its result."""
        # The driver passes a set of the windows (its known windows, none for a fresh key).
        merges = _Merges(set(windows))
        self._window_fn.merge(merges)
        return merges.into


_STAMP_KINDS = {
    OutputAtEndOfWindowImpl: "end",
    OutputAtEarliestInputTimestampImpl: "earliest",
    OutputAtLatestInputTimestampImpl: "latest",
}


def _merged_sessions(windows: dict[Any, list[tuple[Any, int]]], objects: dict[Any, Any]
                     ) -> tuple[dict[Any, list[tuple[Any, int]]], dict[Any, Any]] | None:
    """`Sessions.merge` and `_regroup` together, on the windows' bounds in micros (`windows`
    keyed by them, in order of first appearance): the windows sorted by start, a run of windows
    each starting before the run's end so far merges into [first start, run end); a window
    equal to its run's result is not merged away. Beam's IntervalWindow hashes and compares
    through its bounds clamped to Beam's timestamps, so each window of a run in a dict cost
    ~1 µs; a merged session has ~2 events in the bench's sessions. Ties in start may come in
    any order: a run's start is its first window's either way, its end their greatest. None
    when a window is empty (a gap under a millisecond, which Beam's window coder rounds to
    a span of 0): which run it joins then depends on the order of Beam's set of windows, so
    Beam's own merge decides (`ByWindowGrouper._merge`)."""
    result_of: dict[tuple[int, int], tuple[int, int]] = {}
    run: list[tuple[int, int]] = []
    run_start = run_end = 0
    for bounds in sorted(windows):
        start, end = bounds
        if start >= end:
            return None
        if run and run_end > start:
            run.append(bounds)
            if end > run_end:
                run_end = end
            continue
        if len(run) > 1:
            _merge_run(run, (run_start, run_end), result_of)
        run = [bounds]
        run_start, run_end = bounds
    if len(run) > 1:
        _merge_run(run, (run_start, run_end), result_of)
    if not result_of:
        return windows, objects
    # As the driver lists them (`_regroup`): windows in order of first appearance, each
    # merged-away window's values after its result's so far.
    merged: dict[Any, list[tuple[Any, int]]] = {}
    merged_objects: dict[Any, Any] = {}
    for at, entries in windows.items():
        into = result_of.get(at, at)
        found = merged.get(into)
        if found is None:
            merged[into] = entries
            merged_objects[into] = objects[at] if into is at else interval_window(*into)
        else:
            found.extend(entries)
    return merged, merged_objects


def _merge_run(run: list[tuple[int, int]], result: tuple[int, int],
               result_of: dict[tuple[int, int], tuple[int, int]]) -> None:
    for bounds in run:
        if bounds != result:
            result_of[bounds] = result


def _output_micros(kind: str, window: Any, entries: list[tuple[Any, int]]) -> int | None:
    """What Beam's own timestamp combiner (`kind`) gives a window's values, in micros, without
    a Timestamp object per value and per window (with one window for nearly every event, as in
    sparse sessions, those were ~a quarter of a sessions reduce stage's time): the end of
    window is its `max_timestamp()`, the end's predecessor; the earliest and latest are the
    least and greatest input. None for any other combiner or window type: Beam's own calls."""
    if kind == "end":
        return window._end_micros - 1 if type(window) is IntervalWindow else None
    if kind == "earliest":
        return min(ts for _, ts in entries)
    if kind == "latest":
        return max(ts for _, ts in entries)
    return None


def _window_key(window: Any) -> Any:
    """What a window is looked up by: Beam's own IntervalWindow by its bounds in micros (what
    its equality compares), any other window by itself."""
    if type(window) is IntervalWindow:
        return (window._start_micros, window._end_micros)
    return window


def _regroup(windows: dict[Any, list[tuple[Any, Any]]], objects: dict[Any, Any],
             into: dict[Any, Any]) -> tuple[dict[Any, list[tuple[Any, Any]]], dict[Any, Any]]:
    """The values under their merged windows, as the driver lists them: windows in order of
    first appearance, each merged-away window's values after its result's so far (chained
    merges followed to the end)."""
    into_keys = {_window_key(w): r for w, r in into.items()}
    merged: dict[Any, list[tuple[Any, Any]]] = {}
    merged_objects: dict[Any, Any] = {}
    for at, entries in windows.items():
        window = objects[at]
        while at in into_keys:
            window = into_keys[at]
            at = _window_key(window)
        merged.setdefault(at, []).extend(entries)
        merged_objects.setdefault(at, window)
    return merged, merged_objects

