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

A grouped stage (it reads a GroupByKey's output) qualifies too: its grouped elements, decoded
bundle by bundle as the grouping cuts them, go through the same steps. There a step may also be
a combine phase (CombineValues, a lifted combiner's merge and extract), run per grouped element
by Beam's own `PhasedCombineFnExecutor`, as its `CombineOperation` runs it. In either kind of
stage a step may be a DoFn of the user's whose `process` takes the element and its window
(`DoFn.WindowParam`) and nothing else, with no bundle or set-up methods of its own (Beam calls
it once per window, so an element in several windows hands over), and the last step may be
Beam's `_WriteBundleDoFn` of a `FileBasedSink` that writes a record as `FileBasedSink` does:
every `WriteToText`'s `WriteBundles` (`engine/direct_writes.py`; Parquet's and Avro's sinks write
records their own way and keep the bundle processor).

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
#: The combine phases Beam's bundle processor runs after a GroupByKey, each a
#: `CombineOperation` of Beam's `PhasedCombineFnExecutor` in that phase, per grouped element.
COMBINE_PHASES = {
    common_urns.combine_components.COMBINE_GROUPED_VALUES.urn: "all",
    common_urns.combine_components.COMBINE_PER_KEY_MERGE_ACCUMULATORS.urn: "merge",
    common_urns.combine_components.COMBINE_PER_KEY_EXTRACT_OUTPUTS.urn: "extract",
}
# What a ParDo step is to the direct path (`par_do_kind`).
FUNCTION, WINDOW_DOFN, WRITE = "function", "window", "write"
ASSIGN_WINDOWS = urns.ASSIGN_WINDOWS  # re-exported for the engine's direct path
_NOTHING = "no function to call"


def direct_chain(stage: Stage) -> tuple[DirectChain | None, str]:
    """The chain `stage` runs directly, or None and why not."""
    chain, why, _ = _chain_and_kinds(stage)
    return chain, why


def _chain_and_kinds(stage: Stage) -> tuple[DirectChain | None, str, set[str]]:
    """`direct_chain`, and the kinds of step the chain has (a ParDo's `par_do_kind`, "into"
    for a WindowInto, "phase" for a combine phase), for its plan line."""
    kinds: set[str] = set()
    chain, why = _walk(stage, kinds)
    return chain, why, kinds


def _walk(stage: Stage, kinds: set[str]) -> tuple[DirectChain | None, str]:
    if stage.kind not in (StageKind.PLAIN, StageKind.GROUPED):
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
    writes: str | None = None
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
        if writes is not None:
            return None, f"'{transform.unique_name}' follows a file write's bundles"
        if transform.spec.urn in COMBINE_PHASES:
            if stage.kind is not StageKind.GROUPED:
                return None, f"'{transform.unique_name}' combines outside a grouped stage"
            problem = _combine_problem(transform)
            if problem:
                return None, f"'{transform.unique_name}' {problem}"
            kinds.add("phase")
        elif transform.spec.urn == _PRECOMBINE:
            if not _default_windowing(descriptor, pcoll):
                return None, f"'{transform.unique_name}' combines under non-default windowing"
            combine = tid
        elif transform.spec.urn == ASSIGN_WINDOWS:
            problem = _window_into_problem(transform)
            if problem:
                return None, f"'{transform.unique_name}' {problem}"
            kinds.add("into")
        else:
            kind, problem = par_do_kind(transform)
            if problem:
                return None, f"'{transform.unique_name}' {problem}"
            kinds.add(kind)
            if kind == WRITE:
                writes = tid
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
    """`plan` with each qualifying stage's `direct` chain set, and one line per plain or
    grouped stage saying which path it takes and why."""
    stages, lines = [], []
    for stage in plan.stages:
        if stage.kind not in (StageKind.PLAIN, StageKind.GROUPED):
            stages.append(stage)
            continue
        chain, why, kinds = _chain_and_kinds(stage)
        stages.append(dataclasses.replace(stage, direct=chain))
        if why == _NOTHING:
            continue  # the runner's own stage (a read's, a flatten's): nothing to say
        if chain is not None:
            lines.append(f"{stage.description}: functions called directly, without Beam's "
                         f"bundle processor ({', '.join(_chain_parts(stage, chain, kinds))})")
        else:
            lines.append(f"{stage.description}: Beam's bundle processor ({why})")
    return dataclasses.replace(plan, stages=tuple(stages)), tuple(lines)


def _chain_parts(stage: Stage, chain: DirectChain, kinds: set[str]) -> list[str]:
    """What a direct chain calls (`kinds`, from `_chain_and_kinds`), for its plan line."""
    parts = ["grouped values"] if stage.kind is StageKind.GROUPED else []
    if FUNCTION in kinds or not kinds & {WINDOW_DOFN, WRITE, "phase"}:
        parts.append("Map/FlatMap/Filter")
    if "phase" in kinds:
        parts.append("CombineFn phases")
    if WINDOW_DOFN in kinds:
        parts.append("DoFns taking their window")
    if "into" in kinds:
        parts.append("WindowInto")
    if stage.side_inputs:
        parts.append("global side inputs")
    if WRITE in kinds:
        parts.append("file writes")
    if chain.combine:
        parts.append("lifted combiner")
    return parts


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


def call_of(dofn: Any, args: Any = (), kwargs: Any = None, sides: int = 0, *,
            windows: bool = False
            ) -> tuple[int, list[Any], dict[str, Any], tuple[int, ...]] | None:
    """How Beam's invoker calls this DoFn's process on an element: (the element's position in
    the positional arguments, those arguments, keyword arguments; Beam's `ArgumentPlaceholder`s
    where the `sides` side inputs' views go), worked out by Beam's own `_get_arg_placeholders`
    as its `PerWindowInvoker` does, and where the element's window goes (`windows`: a
    `DoFn.WindowParam` may be filled in); None when it fills in anything else (a timestamp,
    key, pane...) or the side inputs do not fill the placeholders."""
    from apache_beam.internal.util import ArgumentPlaceholder
    from apache_beam.runners import common
    from apache_beam.transforms import core

    args, kwargs = list(args or ()), dict(kwargs or {})
    signature = common.DoFnSignature(dofn)
    if not signature.process_method.defaults and not args and not kwargs and not sides:
        return 0, [None], {}, ()  # Beam's SimpleInvoker: process(element)
    placeholders, full, named = common._get_arg_placeholders(  # noqa: SLF001 - Beam's rule
        signature.process_method, args, kwargs)
    filled = [a for a in [*full, *named.values()] if isinstance(a, ArgumentPlaceholder)]
    window_at = tuple(i for i, p in placeholders if windows and p == core.DoFn.WindowParam)
    placeholders = [(i, p) for i, p in placeholders if i not in window_at]
    if (len(placeholders) != 1 or placeholders[0][1] != core.DoFn.ElementParam
            or len(filled) != sides
            or any(isinstance(a, core._DoFnParam) for a in full)  # noqa: SLF001
            or any(isinstance(v, core._DoFnParam) for v in named.values())):  # noqa: SLF001
        return None
    at = placeholders[0][0]
    full[at] = None
    for i in window_at:
        full[i] = None
    return at, list(full), dict(named), window_at


def par_do_kind(transform: beam_runner_api_pb2.PTransform) -> tuple[str, str]:
    """What the direct path makes of a ParDo, and why it cannot ("" if it can): Beam's own
    Map/FlatMap/Filter wrapper of a function (`FUNCTION`), a DoFn of the user's whose `process`
    takes the element and its window alone and which has no bundle or set-up methods of its own
    (`WINDOW_DOFN`: Beam's invoker then calls it once per element, its one window filled in), or
    Beam's own `_WriteBundleDoFn` of a `FileBasedSink` (`WRITE`, `engine/direct_writes.py`)."""
    from apache_beam.transforms.core import CallableWrapperDoFn

    if transform.spec.urn != common_urns.primitives.PAR_DO.urn:
        return "", f"is not a ParDo ({transform.spec.urn})"
    payload = beam_runner_api_pb2.ParDoPayload.FromString(transform.spec.payload)
    if payload.do_fn.urn != _PICKLED_DOFN:
        return "", f"is a DoFn of {payload.do_fn.urn}"
    if (payload.state_specs or payload.timer_family_specs
            or payload.restriction_coder_id or payload.requests_finalization
            or payload.requires_stable_input or payload.requires_time_sorted_input):
        return "", "uses state, timers, splitting or finalization"
    try:
        dofn, args, kwargs = loaded_dofn(transform)[:3]
        sides = side_inputs_of(payload)
    except Exception as exc:  # noqa: BLE001 - any failure to load keeps the general path
        return "", f"has a DoFn that cannot be loaded here ({type(exc).__name__})"
    for tag, data in sides:
        if data.access_pattern not in (urns.SIDE_ITERABLE, urns.SIDE_MULTIMAP):
            return "", f"reads side input {tag} by {data.access_pattern}"
        if not globally_windowed(data):
            return "", f"reads side input {tag} per window"
    if getattr(dofn, "_runtime_output_constraints", None):
        return "", "has its outputs type-checked at run time (--performance_runtime_type_check)"
    if _yields_batches(dofn):
        return "", "yields batches (DoFn.yields_batches)"
    if is_bundle_write(dofn):
        if len(sides) != 1 or kwargs or call_of(dofn, args, kwargs, 1) is None:
            return "", "writes files with arguments other than its initialisation's"
        return WRITE, ""
    if type(dofn) is CallableWrapperDoFn:
        call = call_of(dofn, args, kwargs, len(sides), windows=True)
        if call is None:
            return "", "has a function taking Beam's DoFn parameters (window, timestamp...)"
        return (WINDOW_DOFN if call[3] else FUNCTION), ""
    own = _own_methods(dofn)
    if own is None:
        return "", f"runs {type(dofn).__name__}, not a Map/FlatMap/Filter function"
    if own:
        return "", f"runs {type(dofn).__name__}, whose {own} Beam would call around bundles"
    call = call_of(dofn, args, kwargs, len(sides), windows=True)
    if call is None or not call[3]:
        return "", (f"runs {type(dofn).__name__}, not a Map/FlatMap/Filter function nor a DoFn "
                    "taking only its element and window")
    return WINDOW_DOFN, ""


def _yields_batches(dofn: Any) -> bool:
    """Beam's own test of a DoFn whose `process` (or a FlatMap's function) yields batches."""
    try:
        return bool(dofn._process_yields_batches)  # noqa: SLF001 - Beam's property
    except Exception:  # noqa: BLE001 - a DoFn Beam cannot tell: not ours to call
        return True


def _own_methods(dofn: Any) -> str | None:
    """The life-cycle methods a user's DoFn defines ("" for none), or None for a DoFn of
    Beam's own (whose other methods may matter), a wrapper or a batched DoFn."""
    from apache_beam.transforms import core

    cls = type(dofn)
    if (not isinstance(dofn, core.DoFn) or cls.__module__.startswith("apache_beam.")
            or cls.process is core.DoFn.process):
        return None
    if cls.process_batch is not core.DoFn.process_batch:
        return None
    names = ("setup", "start_bundle", "finish_bundle", "teardown")
    return ", ".join(n for n in names if getattr(cls, n) is not getattr(core.DoFn, n))


def is_bundle_write(dofn: Any) -> bool:
    """Whether `dofn` is exactly Beam's `_WriteBundleDoFn` of a `FileBasedSink` whose records
    are written as `FileBasedSink.write_record` writes them (its coder, then
    `write_encoded_record`)."""
    from apache_beam.io import filebasedsink, iobase

    sink = getattr(dofn, "sink", None)
    return (type(dofn) is iobase._WriteBundleDoFn  # noqa: SLF001 - Beam's own, by identity
            and isinstance(sink, filebasedsink.FileBasedSink)
            and type(sink).write_record is filebasedsink.FileBasedSink.write_record
            and type(sink).open_writer is filebasedsink.FileBasedSink.open_writer)


def _combine_problem(transform: beam_runner_api_pb2.PTransform) -> str:
    from apache_beam.runners.pipeline_context import PipelineContext
    from apache_beam.transforms import core

    try:
        payload = beam_runner_api_pb2.CombinePayload.FromString(transform.spec.payload)
        core.CombineFn.from_runner_api(payload.combine_fn, PipelineContext())
    except Exception as exc:  # noqa: BLE001 - any failure to load keeps the general path
        return f"has a CombineFn that cannot be loaded here ({type(exc).__name__})"
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
