"""Which batch stages run their DoFns directly, without Beam's bundle processor (no pyspark).

A stage that only reads one buffer, passes each element through `Map`, `FlatMap` and `Filter`
functions and writes the result (or a lifted combiner's accumulators) to one buffer has nothing
for the bundle processor to do but call those functions: no state, timers, side inputs, window
or timestamp parameters, tagged outputs or DoFn life cycle. Measured in-process on a parse and
lifted sum of 1 M lines, Beam's per-element path (a windowed value built, received and combined
through its Cython operations) costs ~2.0 µs an element; calling the functions directly ~0.7.

`direct_chain` says whether a stage qualifies and why not. The conditions are what makes Beam's
`DoFnRunner` call the function with the element alone (its `SimpleInvoker`, or its
`PerWindowInvoker` with arguments fixed once for every window) and its `_OutputHandler` wrap each
result in the input's window: a `CallableWrapperDoFn` (what `Map`, `FlatMap`, `Filter` and their
`Tuple` forms build, never a user's DoFn subclass nor runtime type checking's wrapper), none of
Beam's parameters such as `DoFn.TimestampParam` in the function's signature, one output, and side
inputs (if any) in the global window: Beam's invoker then reads each side input once, for the
global window, and passes the same view to every element (`is_globally_windowed`). A lifted
combiner (`CombinePerKey`'s pre-combine) may end the chain under the default windowing, where
Beam's `PGBKCVOperation` keeps one accumulator per key.

A WindowInto (`beam:transform:window_into:v1`) is a step too: Beam's bundle processor runs it
as a DoFn assigning each element's windows at its timestamp. A `TimestampedValue` result gets
the windows its ParDo's WindowFn assigns, as Beam's output handler gives it.

What cannot be known before the functions run is checked as they run (`engine/direct.py`): a
result that is a `WindowedValue` or `TaggedOutput`, an element in no window or several reaching
a WindowInto, and any exception, hand that Arrow batch and the rest of the task to the bundle
processor, which gives Beam's own output or Beam's own error.
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_fn_api_pb2, beam_runner_api_pb2

from sparkbeam import urns
from sparkbeam.plan.grouping_paths import is_trivial
from sparkbeam.plan.model import DirectChain, Plan, Stage, StageKind, runs_embedded

_PICKLED_DOFN = "beam:dofn:pickled_python_info:v1"
_PRECOMBINE = common_urns.combine_components.COMBINE_PER_KEY_PRECOMBINE.urn
ASSIGN_WINDOWS = urns.ASSIGN_WINDOWS  # re-exported for the engine's direct path
_NOTHING = "no function to call"


def direct_chain(stage: Stage) -> tuple[DirectChain | None, str]:
    """The chain `stage` runs directly, or None and why not."""
    if stage.kind is not StageKind.PLAIN:
        return None, f"a {stage.kind.value} stage"
    if len(stage.inputs) != 1 or len(stage.outputs) != 1:
        return None, "not one input and one output"
    if not runs_embedded(stage.environment):
        return None, "its SDK runs in a worker of its own"
    descriptor = beam_fn_api_pb2.ProcessBundleDescriptor.FromString(stage.descriptor)
    consumers: dict[str, list[str]] = {}
    for tid, transform in descriptor.transforms.items():
        for pcoll in transform.inputs.values():
            consumers.setdefault(pcoll, []).append(tid)
    first = descriptor.transforms[stage.inputs[0].transform_id]
    if len(first.outputs) != 1:
        return None, "its input feeds several PCollections"
    pcoll = next(iter(first.outputs.values()))
    pcolls = [pcoll]
    steps: list[tuple[str, str]] = []
    combine: str | None = None
    while True:
        after = consumers.get(pcoll, [])
        if len(after) != 1:
            return None, f"PCollection {pcoll} has {len(after)} consumers"
        tid = after[0]
        transform = descriptor.transforms[tid]
        if transform.spec.urn == urns.DATA_OUTPUT:
            if tid != stage.outputs[0].transform_id:
                return None, "it writes a buffer it does not declare"
            break
        if combine is not None:
            return None, f"'{transform.unique_name}' follows the lifted combiner"
        if transform.spec.urn == _PRECOMBINE:
            if not _default_windowing(descriptor, pcoll):
                return None, f"'{transform.unique_name}' combines under non-default windowing"
            combine = tid
        elif transform.spec.urn == ASSIGN_WINDOWS:
            problem = _window_into_problem(transform)
            if problem:
                return None, f"'{transform.unique_name}' {problem}"
        else:
            problem = _par_do_problem(transform)
            if problem:
                return None, f"'{transform.unique_name}' {problem}"
        if len(transform.outputs) != 1:
            return None, f"'{transform.unique_name}' has several outputs"
        if combine != tid:
            steps.append((tid, next(iter(transform.outputs.values()))))
        pcoll = next(iter(transform.outputs.values()))
        pcolls.append(pcoll)
    if not steps and combine is None:
        return None, _NOTHING
    return DirectChain(stage.inputs[0].transform_id, tuple(steps), combine,
                       stage.outputs[0].transform_id, tuple(pcolls)), ""


def with_direct_chains(plan: Plan) -> tuple[Plan, tuple[str, ...]]:
    """`plan` with each qualifying stage's `direct` chain set, and one line per plain stage
    saying which path it takes and why."""
    stages, lines = [], []
    for stage in plan.stages:
        if stage.kind is not StageKind.PLAIN:
            stages.append(stage)
            continue
        chain, why = direct_chain(stage)
        stages.append(dataclasses.replace(stage, direct=chain))
        if why == _NOTHING:
            continue  # the runner's own stage (a read's, a flatten's): nothing to say
        if chain is not None:
            lines.append(f"{stage.description}: functions called directly, without Beam's "
                         "bundle processor (Map/FlatMap/Filter"
                         + (", WindowInto" if _assigns_windows(stage, chain) else "")
                         + (", global side inputs" if stage.side_inputs else "")
                         + (", lifted combiner)" if chain.combine else ")"))
        else:
            lines.append(f"{stage.description}: Beam's bundle processor ({why})")
    return dataclasses.replace(plan, stages=tuple(stages)), tuple(lines)


def _assigns_windows(stage: Stage, chain: DirectChain) -> bool:
    descriptor = beam_fn_api_pb2.ProcessBundleDescriptor.FromString(stage.descriptor)
    return any(descriptor.transforms[tid].spec.urn == ASSIGN_WINDOWS for tid, _ in chain.steps)


def window_into_fn(transform: beam_runner_api_pb2.PTransform, context: Any) -> Any:
    """The WindowFn a WindowInto assigns with (its payload read as Beam's bundle processor
    reads it: a WindowingStrategy, whose first field is the WindowFn's spec)."""
    from apache_beam.transforms.core import Windowing

    strategy = beam_runner_api_pb2.WindowingStrategy.FromString(transform.spec.payload)
    return Windowing.from_runner_api(strategy, context).windowfn


def _window_into_problem(transform: beam_runner_api_pb2.PTransform) -> str:
    from apache_beam.runners.pipeline_context import PipelineContext

    try:
        window_into_fn(transform, PipelineContext())
    except Exception as exc:  # noqa: BLE001 - any failure to load keeps the general path
        return f"has a WindowFn that cannot be loaded here ({type(exc).__name__})"
    return ""


def loaded_dofn(transform: beam_runner_api_pb2.PTransform) -> Any:
    """The unpickled (DoFn, args, kwargs, side-input tags, windowing) of a Python ParDo."""
    from apache_beam.internal import pickler

    payload = beam_runner_api_pb2.ParDoPayload.FromString(transform.spec.payload)
    return pickler.loads(payload.do_fn.payload)


def call_of(dofn: Any, args: Any = (), kwargs: Any = None, sides: int = 0
            ) -> tuple[int, list[Any], dict[str, Any]] | None:
    """How Beam's invoker calls this DoFn's process on an element: (the element's position in
    the positional arguments, those arguments, keyword arguments; Beam's `ArgumentPlaceholder`s
    where the `sides` side inputs' views go), worked out by Beam's own `_get_arg_placeholders`
    as its `PerWindowInvoker` does; None when it fills in anything but the element (a window,
    timestamp, key, pane...) or the side inputs do not fill the placeholders."""
    from apache_beam.internal.util import ArgumentPlaceholder
    from apache_beam.runners import common
    from apache_beam.transforms import core

    args, kwargs = list(args or ()), dict(kwargs or {})
    signature = common.DoFnSignature(dofn)
    if not signature.process_method.defaults and not args and not kwargs and not sides:
        return 0, [None], {}  # Beam's SimpleInvoker: process(element)
    placeholders, full, named = common._get_arg_placeholders(  # noqa: SLF001 - Beam's rule
        signature.process_method, args, kwargs)
    filled = [a for a in [*full, *named.values()] if isinstance(a, ArgumentPlaceholder)]
    if (len(placeholders) != 1 or placeholders[0][1] != core.DoFn.ElementParam
            or len(filled) != sides
            or any(isinstance(a, core._DoFnParam) for a in full)  # noqa: SLF001
            or any(isinstance(v, core._DoFnParam) for v in named.values())):  # noqa: SLF001
        return None
    at = placeholders[0][0]
    full[at] = None
    return at, list(full), dict(named)


def _par_do_problem(transform: beam_runner_api_pb2.PTransform) -> str:
    """Why Beam would not call this transform's function with the element alone ("" if it
    would)."""
    from apache_beam.transforms.core import CallableWrapperDoFn

    if transform.spec.urn != common_urns.primitives.PAR_DO.urn:
        return f"is not a ParDo ({transform.spec.urn})"
    payload = beam_runner_api_pb2.ParDoPayload.FromString(transform.spec.payload)
    if payload.do_fn.urn != _PICKLED_DOFN:
        return f"is a DoFn of {payload.do_fn.urn}"
    if (payload.state_specs or payload.timer_family_specs
            or payload.restriction_coder_id or payload.requests_finalization
            or payload.requires_stable_input or payload.requires_time_sorted_input):
        return "uses state, timers, splitting or finalization"
    try:
        dofn, args, kwargs = loaded_dofn(transform)[:3]
        sides = side_inputs_of(payload)
    except Exception as exc:  # noqa: BLE001 - any failure to load keeps the general path
        return f"has a DoFn that cannot be loaded here ({type(exc).__name__})"
    if type(dofn) is not CallableWrapperDoFn:
        return f"runs {type(dofn).__name__}, not a Map/FlatMap/Filter function"
    for tag, data in sides:
        if data.access_pattern not in (urns.SIDE_ITERABLE, urns.SIDE_MULTIMAP):
            return f"reads side input {tag} by {data.access_pattern}"
        if not globally_windowed(data):
            return f"reads side input {tag} per window"
    if call_of(dofn, args, kwargs, len(sides)) is None:
        return "has a function taking Beam's DoFn parameters (window, timestamp...)"
    return ""


def side_inputs_of(payload: beam_runner_api_pb2.ParDoPayload) -> list[tuple[str, Any]]:
    """The ParDo's (tag, Beam's `SideInputData`) in the order Beam passes their views."""
    from apache_beam import pvalue
    from apache_beam.transforms import sideinputs

    unused_context: Any = None  # Beam's SideInputData ignores its context
    found = [(tag, pvalue.SideInputData.from_runner_api(si, unused_context))
             for tag, si in payload.side_inputs.items()]
    return sorted(found, key=lambda t: sideinputs.get_sideinput_index(t[0]))


@functools.cache
def _wrapper_codes() -> dict[str, Any]:
    """The code of Beam's Map and Filter wrappers (`lambda x: [fn(x)]`, `lambda x, *args,
    **kwargs: [x] if fn(x, *args, **kwargs) else []`), from this Beam."""
    from apache_beam.transforms import core

    return {kind: make(len).fn.process.__code__
            for kind, make in (("map", core.Map), ("filter", core.Filter))}


def same_code(code: Any, ref: Any) -> bool:
    """Whether `code` is the code object `ref` of Beam's source as a pickled function carries
    it (a new code object: the same bytecode, file, line, name and free variables)."""
    return (code is not None and ref is not None and code.co_code == ref.co_code
            and code.co_filename == ref.co_filename and code.co_firstlineno == ref.co_firstlineno
            and code.co_name == ref.co_name and code.co_freevars == ref.co_freevars)


def wrapped_fn(process: Any) -> tuple[str, Callable[[Any], Any]] | None:
    """("map" or "filter", the user's function) when `process` is Beam's own Map or Filter
    wrapper of a one-argument call (same code, same place in Beam's source; a pickled copy is
    a new code object), else None. Calling the function itself skips a Python call and a
    one-element list per element: ~0.5 µs of a word count's ~4 µs a line, in-process
    (`engine/direct_steps.py`); `plan/write_results.py` tells Beam's own Map steps by it."""
    code = getattr(process, "__code__", None)
    cells = getattr(process, "__closure__", None)
    if code is None or not cells or len(cells) != 1:
        return None
    for kind, ref in _wrapper_codes().items():
        if same_code(code, ref):
            fn = cells[0].cell_contents
            return (kind, fn) if callable(fn) else None
    return None


def globally_windowed(data: Any) -> bool:
    """Beam's `StateBackedSideInputMap.is_globally_windowed`."""
    from apache_beam.transforms import sideinputs

    return bool(data.window_mapping_fn == sideinputs._global_window_mapping_fn)  # noqa: SLF001


def _default_windowing(descriptor: beam_fn_api_pb2.ProcessBundleDescriptor, pcoll: str) -> bool:
    """Beam's `Windowing.is_default()` for the PCollection: `PGBKCVOperation` then keys its
    table by key alone and outputs in the global window."""
    return is_trivial(descriptor.windowing_strategies[
        descriptor.pcollections[pcoll].windowing_strategy_id])
