"""A batch stateful DoFn called without Beam's bundle processor (no pyspark).

`plan/direct_stateful.py` chooses the stages and says why. A task's rows arrive with each key's
together; key after key, each element is decoded and its process method called with the
arguments Beam's invoker would give it (`_Process`: a key's state and timer objects placed once
for the key, the element's own arguments for each element) and Beam's own output handler
wrapping the results, as in the bundle processor; a DoFn taking other parameters goes through
Beam's own `DoFnRunner`. A `UserStateContext` keeps the key's state and timers in memory.
Then the key's timers fire at the end of time, round by round, the earliest per key first and
event time before processing time (`TimerBook`, as the general path fires them), and the key's
state is dropped.

What the bundle processor would do to state and timers is done here too:
- a state value is encoded with its coder when written and decoded when read (a value that
  cannot be encoded fails here as it would there, and a read gives a copy, as after Beam's
  commit);
- a timer is what Beam's `OutputTimer` writes, seen through Beam's timer coder: fire and hold
  times at millisecond precision, the key a decoded copy, the last write per (key, tag, window)
  winning, a clear removing it.

A key's outputs and metrics count once the whole key has gone through. Any exception hands that
key and the rest of the task to the bundle processor (`fallback`), which raises Beam's own error;
if it does not (code that failed once but not twice), the task fails rather than count the key's
metrics twice.
"""
from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple, Protocol

from apache_beam.coders import coders
from apache_beam.coders.coder_impl import create_InputStream
from apache_beam.internal import util
from apache_beam.metrics import monitoring_infos
from apache_beam.metrics.execution import MetricsContainer
from apache_beam.options.value_provider import RuntimeValueProvider
from apache_beam.portability.api import beam_fn_api_pb2, beam_runner_api_pb2, metrics_pb2
from apache_beam.runners import common
from apache_beam.runners.common import NameContext
from apache_beam.runners.worker import statesampler
from apache_beam.transforms import userstate
from apache_beam.transforms.core import CallableWrapperDoFn, DoFn
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.utils.counters import CounterFactory
from apache_beam.utils.timestamp import Timestamp

from sparkbeam.engine import context
from sparkbeam.engine.program import OutRow
from sparkbeam.engine.timers import ALL, Ordering, TimerBook, timer_rounds
from sparkbeam.plan.direct_paths import loaded_dofn
from sparkbeam.plan.model import Stage

Row = tuple[int, bytes | None, bytes]


def _millis(ts: Timestamp) -> Timestamp:
    """`ts` as Beam's timer coder gives it back (`TimestampCoderImpl`: whole milliseconds,
    rounded down); itself when it is whole milliseconds already (Timestamps are values)."""
    micros = ts.micros
    extra = micros % 1000
    return ts if not extra else Timestamp(micros=micros - extra)


class _Receiver(common.Receiver):
    def __init__(self) -> None:
        self.out: list[Any] = []

    def receive(self, windowed_value: Any) -> None:
        self.out.append(windowed_value)


class _Nowhere(common.Receiver):
    def receive(self, windowed_value: Any) -> None:
        pass


class _Receivers(dict):  # type: ignore[type-arg]
    """Beam's `_TaggedReceivers`: an output to an undeclared tag goes nowhere."""

    def __missing__(self, tag: Any) -> _Nowhere:
        receiver = self[tag] = _Nowhere()
        return receiver


class _Bag(userstate.BagRuntimeState):
    def __init__(self, impl: Any) -> None:
        self._impl = impl
        self._values: list[bytes] = []

    def read(self) -> Iterable[Any]:
        decode = self._impl.decode
        return [decode(v) for v in self._values]

    def add(self, value: Any) -> None:
        self._values.append(self._impl.encode(value))

    def clear(self) -> None:
        self._values = []


class _Value(userstate.ReadModifyWriteRuntimeState):
    def __init__(self, impl: Any) -> None:
        self._impl = impl
        self._value: bytes | None = None

    def read(self) -> Any:
        return None if self._value is None else self._impl.decode(self._value)

    def write(self, value: Any) -> None:
        self._value = self._impl.encode(value)

    def clear(self) -> None:
        self._value = None


class _Combining(userstate.CombiningValueRuntimeState):
    """Beam's `CombiningValueRuntimeState` over one accumulator: a read merges it (alone), as
    Beam's merges its bag of accumulators, and keeps the result."""

    def __init__(self, fn: Any, impl: Any) -> None:
        self._fn = fn
        self._impl = impl
        self._accumulator: bytes | None = None

    def _current(self) -> Any:
        if self._accumulator is None:
            return self._fn.create_accumulator()
        return self._impl.decode(self._accumulator)

    def read(self) -> Any:
        merged = self._fn.merge_accumulators([self._current()])
        self._accumulator = self._impl.encode(merged)
        return self._fn.extract_output(merged)

    def add(self, value: Any) -> None:
        self._accumulator = self._impl.encode(self._fn.add_input(self._current(), value))

    def clear(self) -> None:
        self._accumulator = None


_TIMER = userstate.Timer
_NEW_TUPLE = tuple.__new__
assert _TIMER._fields == ("user_key", "dynamic_timer_tag", "windows", "clear_bit",
                          "fire_timestamp", "hold_timestamp", "paneinfo"), _TIMER._fields


class _Element(Protocol):
    """What a timer is set from: an element's timestamp and pane (a WindowedValue has both)."""

    @property
    def timestamp(self) -> Any: ...

    @property
    def pane_info(self) -> Any: ...


class _At(NamedTuple):
    """The element a timer is set from, as Beam's `get_timer` gets it: its timestamp and pane."""
    timestamp: Any
    pane_info: Any


class _Timer(userstate.BaseTimer):
    """Beam's `OutputTimer`, writing straight into the key's pending timers. `element` is
    what the timer is set from: its timestamp is read only at a set in processing time (the
    timer's hold), so the direct `_Process` keeps one timer a key and points it at each
    element in turn, without making a Timestamp or a timer an element."""

    def __init__(self, keyed: _KeyState, family: Any, window: Any, element: _Element | None,
                 event_time: bool) -> None:
        self._keyed = keyed
        self._pending = keyed.book.pending.setdefault(family, {})
        self._window = window
        self.element = element
        self._event_time = event_time

    def set(self, ts: Any, dynamic_timer_tag: str = "") -> None:
        # Set once an element in many DoFns (the bench's stateful one): Timestamp.of's checks
        # skipped for a Timestamp, the Timer made from positions (its fields' order). A timer
        # object a DoFn keeps from an earlier element reads the latest element's timestamp
        # and pane, where Beam's keeps its own: only the hold and the timer's pane differ,
        # and neither reaches a batch stage's output (no hold is waited for, and `on_timer`
        # is not given the pane).
        fire = _millis(ts if type(ts) is Timestamp else Timestamp.of(ts))
        element = self.element
        assert element is not None, "a timer set outside process"
        hold = fire if self._event_time else _millis(Timestamp.of(element.timestamp))
        keyed = self._keyed
        window = self._window
        # The Timer tuple made in C (`tuple.__new__` of the namedtuple, as its own `__new__`
        # does after a Python call of its own).
        self._pending[(keyed.encoded, dynamic_timer_tag, window)] = _NEW_TUPLE(_TIMER, (
            keyed.user_key, dynamic_timer_tag, (window,), False, fire, hold,
            element.pane_info))

    def clear(self, dynamic_timer_tag: str = "") -> None:
        self._pending.pop((self._keyed.encoded, dynamic_timer_tag, self._window), None)


class _KeyState:
    """One key's state objects and pending timers."""

    def __init__(self, encoded: bytes, user_key: Any, domains: dict[Any, int]) -> None:
        self.encoded = encoded
        self.user_key = user_key
        self.states: dict[tuple[Any, Any], Any] = {}
        self.book = TimerBook({}, domains)


class _Context(userstate.UserStateContext):
    """The running key's state and timers (`begin` switches keys)."""

    def __init__(self, program: StatefulProgram) -> None:
        self._program = program
        self.keyed: _KeyState | None = None

    def begin(self, key: Any) -> _KeyState:
        impl = self._program.key_impl
        encoded = impl.encode_nested(key)
        self.keyed = _KeyState(encoded, impl.decode_nested(encoded), self._program.domains)
        return self.keyed

    def get_timer(self, timer_spec: Any, key: Any, window: Any, timestamp: Any,
                  pane: Any) -> _Timer:
        return self.timer(timer_spec, window, _At(timestamp, pane))

    def timer(self, timer_spec: Any, window: Any, element: _Element | None) -> _Timer:
        """The running key's timer of `timer_spec`, set from `element` (anything with a
        `timestamp` and a `pane_info`)."""
        assert self.keyed is not None
        family, event_time = self._program.timer_families[timer_spec.name]
        return _Timer(self.keyed, family, window, element, event_time)

    def get_state(self, state_spec: Any, key: Any, window: Any) -> Any:
        assert self.keyed is not None
        found = self.keyed.states.get((state_spec.name, window))
        if found is None:
            found = self.keyed.states[(state_spec.name, window)] = self._program.new_state(
                state_spec)
        return found

    def commit(self) -> None:
        pass  # nothing to write anywhere: the state is the key's, in memory

    def reset(self) -> None:
        pass


_ELEMENT, _KEY, _WINDOW, _WINDOWED, _TIMESTAMP, _PANE = range(6)


class _Process:
    """Beam's `PerWindowInvoker._invoke_process_per_window` for one key's elements, each in
    one window, with no side inputs. What Beam works out per element, comparing each of the
    process method's placeholders with each kind of parameter, is worked out here once, and a
    state argument (one object for the whole key) is placed once per key; the arguments, the
    context's calls and the output handler (built as `DoFnRunner` builds its own: Cython keeps
    the runner's invoker out of reach) are Beam's. `usable` is False for a parameter of another
    kind (a bundle finalizer, a bundle or setup context): `DoFnRunner.process` then runs each
    element."""

    def __init__(self, dofn: Any, args: Any, kwargs: Any, windowing: Any, receivers: Any,
                 context: _Context) -> None:
        signature = common.DoFnSignature(dofn)
        self._context = context
        self._method = signature.process_method.method_value
        # Beam's per-element output counter (an experiment) is its runner's alone.
        self.usable = not (signature.is_splittable_dofn()
                           or "outputs_per_element_counter" in RuntimeValueProvider.experiments)
        self._per_element: list[tuple[int, int]] = []
        self._states: list[tuple[int, Any]] = []
        self._timers: list[tuple[int, Any]] = []
        placeholders, self._template, kwargs = common._get_arg_placeholders(
            signature.process_method, list(args or []), kwargs or {})
        self._kwargs: dict[str, Any] = kwargs or {}
        for i, p in placeholders:
            for kind, param in ((_ELEMENT, DoFn.ElementParam), (_KEY, DoFn.KeyParam),
                                (_WINDOW, DoFn.WindowParam),
                                (_WINDOWED, DoFn.WindowedValueParam),
                                (_TIMESTAMP, DoFn.TimestampParam),
                                (_PANE, DoFn.PaneInfoParam)):
                if param == p:
                    self._per_element.append((i, kind))
                    break
            else:
                if isinstance(p, DoFn.StateParam):
                    self._states.append((i, p.state_spec))
                elif isinstance(p, DoFn.TimerParam):
                    self._timers.append((i, p.timer_spec))
                else:
                    self.usable = False
        method = self._method
        self._handler = common._OutputHandler(
            windowing.windowfn, receivers[None], receivers, None,
            getattr(dofn, "output_batch_converter", None),
            getattr(method, "_beam_yields_batches", False),
            getattr(signature.process_batch_method.method_value, "_beam_yields_elements",
                    False),
            check_user_dofn_output=(not isinstance(dofn, CallableWrapperDoFn)
                                    and not inspect.isgeneratorfunction(method)))
        self._args: list[Any] = []
        self._key_timers: list[_Timer] = []
        # The process method's one per-element argument when that is the element itself.
        self._element_at = (self._per_element[0][0] if [k for _, k in self._per_element]
                            == [_ELEMENT] else None)

    def begin(self, key: Any, window: Any) -> None:
        """A new key (and its window): its state and timer arguments placed. A timer object
        serves all of the key's elements (`_Timer.element` moved to each), where Beam's
        invoker asks for one an element: the same timer, and the same window."""
        args, _ = util.insert_values_in_args(self._template, self._kwargs, [])
        self._args = list(args)
        for i, spec in self._states:
            self._args[i] = self._context.get_state(spec, key, window)
        self._key_timers = []
        for i, spec in self._timers:
            timer = self._args[i] = self._context.timer(spec, window, None)
            self._key_timers.append(timer)

    def __call__(self, wv: Any) -> None:
        args = self._args
        if self._element_at is not None:  # the element alone (the usual process method)
            args[self._element_at] = wv.value
        else:
            window, = wv.windows
            for i, kind in self._per_element:
                if kind == _ELEMENT:
                    args[i] = wv.value
                elif kind == _KEY:
                    args[i] = wv.value[0]
                elif kind == _WINDOW:
                    args[i] = window
                elif kind == _WINDOWED:
                    args[i] = wv
                elif kind == _TIMESTAMP:
                    args[i] = wv.timestamp
                else:
                    args[i] = wv.pane_info
        for timer in self._key_timers:
            timer.element = wv
        self._handler.handle_process_outputs(wv, self._method(*args, **self._kwargs), None)


class StatefulProgram:
    """What a task needs to run `stage.direct_stateful`, built once per process (its DoFn set
    up once, as the bundle processor's is)."""

    def __init__(self, stage: Stage, components: bytes) -> None:
        tid = stage.direct_stateful
        assert tid is not None
        ctx = context.pipeline_context(components)
        descriptor = beam_fn_api_pb2.ProcessBundleDescriptor.FromString(stage.descriptor)
        transform = descriptor.transforms[tid]
        self.transform_id = tid
        self.name = transform.unique_name
        in_coder = ctx.coders[stage.inputs[0].coder_id]
        self.in_impl = in_coder.get_impl()
        kv = in_coder.wrapped_value_coder if isinstance(
            in_coder, coders.WindowedValueCoder) else in_coder
        self.key_impl = kv.key_coder().get_impl()
        out = stage.outputs[0] if stage.outputs else None
        self.out_impl = ctx.coders[out.coder_id].get_impl() if out else None
        self.out_key_impl = (ctx.coders[out.key_coder_id].get_impl()
                             if out and out.key_coder_id else None)
        (self.in_pcoll,) = list(transform.inputs.values())
        (self.out_tag, self.out_pcoll), = list(transform.outputs.items())
        dofn, args, kwargs, _, windowing = loaded_dofn(transform)[:5]
        if windowing is None:  # as Beam's bundle processor: the input's windowing
            windowing = ctx.windowing_strategies.get_by_id(
                descriptor.pcollections[self.in_pcoll].windowing_strategy_id)
        state_specs, timer_specs = userstate.get_dofn_specs(dofn)
        self.timer_specs = {(tid, t.name): t for t in timer_specs}
        # Per timer name: its family and whether it is in event time (asked at every set).
        self.timer_families = {t.name: ((tid, t.name), TimeDomain.is_event_time(t.time_domain))
                               for t in timer_specs}
        payload = beam_runner_api_pb2.ParDoPayload.FromString(transform.spec.payload)
        self.domains = {(tid, name): spec.time_domain
                        for name, spec in payload.timer_family_specs.items()}
        self._impls = {s.name: s.coder.get_impl() for s in state_specs}
        for spec in state_specs:
            if isinstance(spec, userstate.CombiningValueStateSpec):
                spec.combine_fn.setup()
        self.context = _Context(self)
        self.receivers = _Receivers()
        main = _Receiver()
        self.receivers[None] = self.receivers[self.out_tag] = main
        self.main = main
        self.runner = common.DoFnRunner(
            dofn, args, kwargs, [], windowing, tagged_receivers=self.receivers,
            step_name=self.name, state=common.DoFnState(CounterFactory()),
            user_state_context=self.context, transform_id=tid, operation_name=self.name)
        self.runner.setup()
        self.process = _Process(dofn, args, kwargs, windowing, self.receivers, self.context)

    def new_state(self, spec: Any) -> Any:
        impl = self._impls[spec.name]
        if isinstance(spec, userstate.BagStateSpec):
            return _Bag(impl)
        if isinstance(spec, userstate.ReadModifyWriteStateSpec):
            return _Value(impl)
        if isinstance(spec, userstate.CombiningValueStateSpec):
            return _Combining(spec.combine_fn, impl)
        raise AssertionError(f"{self.name}: state {spec.name} is a {type(spec).__name__}")


class StatefulRun:
    """One task of a direct stateful stage: rows in, rows and monitoring infos out."""

    def __init__(self, program: StatefulProgram) -> None:
        self.program = program
        self.infos: list[metrics_pb2.MonitoringInfo] = []
        self.counts = [0, 0]  # elements in, elements out

    def run(self, rows: Iterable[Row],
            fallback: Callable[[Iterable[Row]], Iterator[OutRow]]) -> Iterator[OutRow]:
        """Every key of `rows`; from the first one that raises, `fallback` runs the rest."""
        program = self.program
        container = MetricsContainer(program.transform_id)
        sampler = statesampler.StateSampler("direct", CounterFactory())
        scope = sampler.scoped_state(NameContext(program.name, program.transform_id),
                                     "process", metrics_container=container)
        source = iter(rows)
        ahead: list[Row] = []  # the row `_by_key` read past the key it yields
        try:
            for group in _by_key(source, ahead):
                previous = statesampler.get_current_tracker()
                statesampler.set_current_tracker(sampler)
                try:
                    with scope:
                        rows_out = self._key(group)
                except Exception:  # noqa: BLE001 - Beam's bundle processor raises it its way
                    statesampler.set_current_tracker(previous)
                    yield from fallback(_chain(group, ahead, source))
                    raise RuntimeError(
                        f"{program.name}: a key failed in the direct path but not in Beam's "
                        "bundle processor; the task fails rather than count its metrics "
                        "twice") from None
                statesampler.set_current_tracker(previous)
                yield from rows_out
        finally:
            self.infos.extend(container.to_runner_api_monitoring_infos(
                program.transform_id).values())
            self.infos.extend(
                monitoring_infos.int64_counter(monitoring_infos.ELEMENT_COUNT_URN, count,
                                               pcollection=pcoll)
                for pcoll, count in zip((program.in_pcoll, program.out_pcoll), self.counts,
                                        strict=True) if count)

    def _key(self, group: list[Row]) -> list[OutRow]:
        program = self.program
        runner = program.runner
        # A row may hold several of the key's elements back to back (`engine/packed_rows.py`).
        stream = create_InputStream(b"".join(value for _, _, value in group))
        decode = program.in_impl.decode_from_stream
        elements = []
        while stream.size() > 0:
            elements.append(decode(stream, True))
        keyed = program.context.begin(elements[0].value[0])
        out = program.main.out
        out.clear()
        process = program.process
        if process.usable and all(len(e.windows) == 1 for e in elements):
            process.begin(elements[0].value[0], elements[0].windows[0])
            for element in elements:
                process(element)
        else:
            for element in elements:
                runner.process(element)
        book = keyed.book
        for _ in timer_rounds(f"timers of {program.name}"):
            firing = book.take_due(ALL, Ordering.EVENT_TIME_FIRST)
            if not firing:
                break
            for family, timers in firing.items():
                spec = program.timer_specs[family]
                for timer in timers:
                    runner.process_user_timer(spec, timer.user_key, timer.windows[0],
                                              timer.fire_timestamp, timer.paneinfo,
                                              timer.dynamic_timer_tag)
        program.context.keyed = None
        rows = self._encode(out)
        out.clear()
        self.counts[0] += len(elements)
        self.counts[1] += len(rows)
        return rows

    def _encode(self, out: list[Any]) -> list[OutRow]:
        program = self.program
        if program.out_impl is None:
            return []
        encode = program.out_impl.encode_nested
        key = program.out_key_impl
        if key is None:
            return [(0, None, encode(wv)) for wv in out]
        return [(0, key.encode_nested(wv.value[0]), encode(wv)) for wv in out]


def _by_key(source: Iterator[Row], ahead: list[Row]) -> Iterator[list[Row]]:
    """Rows with each key's together, as one list per key. While a key is out, the first row
    of the next one (read to see that the key ended) waits in `ahead`."""
    group: list[Row] = []
    for row in source:
        if group and row[1] != group[0][1]:
            ahead.append(row)
            yield group
            group = [ahead.pop()]
            continue
        group.append(row)
    if group:
        yield group


def _chain(*parts: Iterable[Row]) -> Iterator[Row]:
    for part in parts:
        yield from part
