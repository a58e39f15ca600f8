"""One step of a direct stage (`engine/direct.py`) over a batch's values (no pyspark).

A step is a Map/FlatMap/Filter function, called as Beam's invoker calls it (Beam's own Map and
Filter wrappers skipped: `plan/direct_paths.wrapped_fn`), or a WindowInto. Each result keeps
the index of its windowed value in the batch's list of them (`src`): its input element's, as
Beam's `_OutputHandler` wraps a plain result; a `TimestampedValue` result and a WindowInto's
output get windowed values of their own, appended to that list. A result Beam treats otherwise (a
`WindowedValue`, a `TaggedOutput`) or an element a WindowInto cannot assign here raises
`Fallback`: the batch goes to the bundle processor.
"""
from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable, Iterable
from typing import Any

from apache_beam.coders.coder_impl import create_InputStream
from apache_beam.portability.api import beam_fn_api_pb2
from apache_beam.pvalue import TaggedOutput
from apache_beam.transforms.window import (
    GlobalWindow,
    GlobalWindows,
    TimestampedValue,
    WindowFn,
)
from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP, Timestamp
from apache_beam.utils.windowed_value import PANE_INFO_UNKNOWN, WindowedValue, create

_GLOBAL_WINDOW = GlobalWindow()
IN_GLOBAL_WINDOW = (_GLOBAL_WINDOW,)  # shared: a tuple, never changed in place

# Results Beam's output handler treats otherwise than wrapping them in the input's window.
_SPECIAL = (TimestampedValue, WindowedValue, TaggedOutput)


class Fallback(Exception):
    """This batch and the rest of the task go to the bundle processor."""


@dataclasses.dataclass(frozen=True)
class Step:
    transform_id: str
    name: str
    process: Callable[..., Iterable[Any] | None]
    element_at: int  # where the element goes in `args`
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    # The user's function inside Beam's own Map or Filter wrapper (`wrapped_fn`), called
    # without the wrapper's one-element list per element.
    wrapped: tuple[str, Callable[[Any], Any]] | None = None
    # The side inputs whose views fill `args`' and `kwargs`' placeholders, in Beam's order:
    # (tag, Beam's SideInputData, the windowed coder of their elements).
    sides: tuple[tuple[str, Any, Any], ...] = ()
    # The WindowFn of the ParDo's windowing: a `TimestampedValue` result's windows (Beam's
    # `_OutputHandler._maybe_propagate_windowing_info`).
    window_fn: Any = None
    # Set for a WindowInto step (no function): the WindowFn it assigns with.
    window_into: Any = None
    # Where the element's one window goes in `args` (a DoFn taking `DoFn.WindowParam`).
    window_at: tuple[int, ...] = ()
    # A user's DoFn whose `process` returns (not yields) its results: Beam's output handler
    # refuses a str, bytes or dict result of it (`check_user_dofn_output`).
    check_output: bool = False
    # Set for a combine phase after a GroupByKey: Beam's `PhasedCombineFnExecutor`, applied
    # to each (key, values) as its `CombineOperation` applies it.
    phase: Any = None


def no_process(element: Any) -> None:
    raise AssertionError("a WindowInto step has no function")


def apply_step(step: Step, values: list[Any], src: list[int] | None, wvs: list[WindowedValue]
           ) -> tuple[list[Any], list[int] | None]:
    """One step over a batch's values, each result kept with the index of its windowed value
    in `wvs` (`src`; None when every element has the first's window, timestamp and pane).
    Results that are `TimestampedValue`s, and a WindowInto's, get windowed values of their
    own, appended to `wvs`."""
    if step.window_into is not None:
        return _window_into(step.window_into, values, src, wvs)
    if step.phase is not None:
        apply = step.phase.apply
        return [(key, apply(grouped)) for key, grouped in values], src
    out, out_src = call_step(step, values, src, wvs)
    return settled(step, out, out_src, wvs)


def call_step(step: Step, values: list[Any], src: list[int] | None, wvs: list[WindowedValue]
              ) -> tuple[list[Any], list[int] | None]:
    """A function step's results as its function gave them (`settled` windows them)."""
    return _call_windowed(step, values, src, wvs) if step.window_at else _call(step, values, src)


def settled(step: Step, out: list[Any], out_src: list[int] | None, wvs: list[WindowedValue]
            ) -> tuple[list[Any], list[int] | None]:
    """`call_step`'s results as `apply_step` gives them: `TimestampedValue`s in windowed values
    of their own."""
    types = set(map(type, out))
    if any(issubclass(t, _SPECIAL) for t in types):
        if any(issubclass(t, _SPECIAL) and not issubclass(t, TimestampedValue) for t in types):
            raise Fallback()
        return _stamped(step.window_fn, out, out_src, wvs)
    return out, out_src


def _stamped(window_fn: Any, out: list[Any], src: list[int] | None, wvs: list[WindowedValue]
             ) -> tuple[list[Any], list[int]]:
    """Beam's `_maybe_propagate_windowing_info` for each `TimestampedValue` result: its
    value at its timestamp in the windows the ParDo's WindowFn assigns it (as many times over
    as its element had windows), at the default pane; other results keep their element's."""
    values: list[Any] = []
    value_src: list[int] = []
    global_windows = type(window_fn) is GlobalWindows
    for k, result in enumerate(out):
        at = 0 if src is None else src[k]
        if isinstance(result, TimestampedValue):
            timestamp = result.timestamp
            windows = len(wvs[at].windows)
            if global_windows and type(timestamp) is Timestamp:
                # The global window, the shared tuple, and the micros as they are: Beam's
                # WindowedValue(...) would read them back from the Timestamp, and a list per
                # element costs a collection pass over it (~0.3 µs an element in all).
                windowed = create(result.value, timestamp.micros, IN_GLOBAL_WINDOW
                                  if windows == 1 else IN_GLOBAL_WINDOW * windows,
                                  PANE_INFO_UNKNOWN)
            else:
                windowed = WindowedValue(result.value, timestamp,
                                         assigned(window_fn, timestamp, result.value))
                if windows != 1:
                    windowed.windows *= windows
            wvs.append(windowed)
            at = len(wvs) - 1
            result = result.value
        values.append(result)
        value_src.append(at)
    return values, value_src


def _window_into(window_fn: Any, values: list[Any], src: list[int] | None,
                 wvs: list[WindowedValue]) -> tuple[list[Any], list[int]]:
    """Beam's WindowInto (`bundle_processor.create_assign_windows`): each element, in its
    one window, assigned new windows at its timestamp, at the default pane. An element in
    no window or several goes to the bundle processor (Beam calls the assignment per window)."""
    value_src: list[int] = []
    if type(window_fn) is GlobalWindows:
        # Every element into the one global window at its own timestamp, the default pane:
        # no Timestamp object (reading `wv.timestamp` makes one) and no assignment per element.
        start = len(wvs)
        for k, value in enumerate(values):
            wv = wvs[0 if src is None else src[k]]
            if len(wv.windows) != 1:
                raise Fallback()
            wvs.append(create(value, wv.timestamp_micros, IN_GLOBAL_WINDOW, PANE_INFO_UNKNOWN))
        return values, list(range(start, len(wvs)))
    for k, value in enumerate(values):
        wv = wvs[0 if src is None else src[k]]
        if len(wv.windows) != 1:
            raise Fallback()
        timestamp = wv.timestamp
        wvs.append(WindowedValue(value, timestamp,
                                 assigned(window_fn, timestamp, value, wv.windows[0])))
        value_src.append(len(wvs) - 1)
    return values, value_src


def assigned(window_fn: Any, timestamp: Any, element: Any, window: Any = None) -> Any:
    """`window_fn.assign` of an `AssignContext(timestamp, element, window)`. Beam's own
    GlobalWindows assigns `[GlobalWindow()]`, its singleton, whose __init__ reads a constant
    from a proto enum each time (~1.5 µs, as much as the rest of a step): the same object,
    taken once, and no context made for it."""
    if type(window_fn) is GlobalWindows:
        return [_GLOBAL_WINDOW]
    return window_fn.assign(WindowFn.AssignContext(timestamp, element=element, window=window))


def _call(step: Step, values: list[Any], src: list[int] | None
          ) -> tuple[list[Any], list[int] | None]:
    """The step's function over the values, each result with its element's `src`."""
    out: list[Any] = []
    process = step.process
    args = list(step.args)
    simple = step.args == (None,) and not step.kwargs
    if simple and step.wrapped is not None:
        return _apply_wrapped(step.wrapped, values, src)
    if src is None:  # results appended in bulk, their types checked once per batch
        extend = out.extend
        for value in values:
            if simple:
                results = process(value)
            else:
                args[step.element_at] = value
                results = process(*args, **step.kwargs)
            if results is not None:
                extend(results)
        return out, None
    out_src: list[int] = []
    for i, value in zip(src, values, strict=True):
        if simple:
            results = process(value)
        else:
            args[step.element_at] = value
            results = process(*args, **step.kwargs)
        if results is None:
            continue
        for result in results:
            out.append(result)
            out_src.append(i)
    return out, out_src


def _call_windowed(step: Step, values: list[Any], src: list[int] | None,
                   wvs: list[WindowedValue]) -> tuple[list[Any], list[int]]:
    """`_call` of a DoFn taking its window: each element's one window in its arguments, as
    Beam's `PerWindowInvoker` fills `DoFn.WindowParam` (an element in several windows, which
    Beam calls once per window, goes to the bundle processor)."""
    out: list[Any] = []
    out_src: list[int] = []
    process, at, kwargs = step.process, step.element_at, step.kwargs
    args = list(step.args)
    for k, value in enumerate(values):
        i = 0 if src is None else src[k]
        windows = wvs[i].windows
        if len(windows) != 1:
            raise Fallback()
        for w in step.window_at:
            args[w] = windows[0]
        args[at] = value
        results = process(*args, **kwargs)
        if results is None:
            continue
        if step.check_output and isinstance(results, (str, bytes, dict)):
            raise Fallback()  # the bundle processor raises Beam's TypeError
        for result in results:
            out.append(result)
            out_src.append(i)
    return out, out_src


def _apply_wrapped(wrapped: tuple[str, Callable[[Any], Any]], values: list[Any],
                   src: list[int] | None) -> tuple[list[Any], list[int] | None]:
    """A Map's or Filter's function over a batch's values, as `_apply` with the wrapper."""
    kind, fn = wrapped
    out_src = src
    if kind == "map":
        out = list(map(fn, values))
    elif src is None:
        out = [v for v in values if fn(v)]
    else:
        kept = [(i, v) for i, v in zip(src, values, strict=True) if fn(v)]
        out, out_src = [v for _, v in kept], [i for i, _ in kept]
    return out, out_src


class _SideState:
    """What Beam's `StateBackedSideInputMap` asks of a state handler, over the stage's
    side-input state entries (`engine/side_inputs.py`): their elements, decoded."""

    def __init__(self, entries: dict[bytes, list[bytes]]) -> None:
        self.entries = entries

    def blocking_get(self, state_key: beam_fn_api_pb2.StateKey, coder: Any) -> list[Any]:
        stream = create_InputStream(b"".join(self.entries.get(state_key.SerializeToString(), ())))
        out = []
        while stream.size() > 0:
            out.append(coder.decode_from_stream(stream, True))
        return out


def with_views(step: Step, side_inputs: dict[bytes, list[bytes]]) -> Step:
    """`step` with its side inputs' views in its arguments, as Beam's `PerWindowInvoker` puts
    them there once for every element when each side input is globally windowed: the view
    Beam's own `StateBackedSideInputMap` makes for the global window."""
    from apache_beam.internal.util import insert_values_in_args
    from apache_beam.runners.worker.bundle_processor import StateBackedSideInputMap

    state = _SideState(side_inputs)
    views = [StateBackedSideInputMap(state, step.transform_id, tag, data, coder)  # type: ignore[arg-type]
             [GlobalWindow()]
             for tag, data, coder in step.sides]
    args, kwargs = insert_values_in_args(list(step.args), step.kwargs, views)
    return dataclasses.replace(step, args=tuple(args), kwargs=kwargs)


_PACK_U64 = struct.Struct(">Q").pack
_MIN_MICROS = MIN_TIMESTAMP.micros
_MAX_MICROS = MAX_TIMESTAMP.micros
_SHIFT = 1 << 63


def _coded_millis(micros: int) -> int:
    """What Beam's `WindowedValueCoderImpl` writes of an element's timestamp: its milliseconds
    rounded toward zero, at least the minimum timestamp's."""
    clamped = _MIN_MICROS if micros < _MIN_MICROS else micros
    return -(-clamped // 1000) if clamped < 0 else clamped // 1000


def timestamp_bytes(micros: int) -> bytes:
    """The first 8 bytes of Beam's `WindowedValueCoderImpl` encoding of an element at `micros`:
    `_coded_millis` shifted by 2**63, big endian (what its `encode_to_stream` writes)."""
    if micros >= 0:  # rounding toward zero is the floor there, and above the minimum
        return _PACK_U64(micros // 1000 + _SHIFT)
    return _PACK_U64(_coded_millis(micros) + _SHIFT)


def coded_micros(micros: int) -> int:
    """An element's timestamp as Beam's `WindowedValueCoderImpl` gives it back once encoded
    and decoded: whole milliseconds (`_coded_millis`), Beam's bounds restored."""
    millis = _coded_millis(micros)
    if millis <= -(abs(_MIN_MICROS) // 1000):
        return _MIN_MICROS
    if millis >= _MAX_MICROS // 1000:
        return _MAX_MICROS
    return millis * 1000
