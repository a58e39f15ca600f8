"""Which batch stages run their DoFns directly, without Beam's bundle processor (no pyspark).

A stage that only reads one buffer, passes each element through `Map`, `FlatMap` and `Filter`
functions and writes the result (or a lifted combiner's accumulators) to one buffer has nothing
for the bundle processor to do but call those functions: no state, timers, side inputs, window
or timestamp parameters, tagged outputs or DoFn life cycle. Measured in-process on a parse and
lifted sum of 1 M lines, Beam's per-element path (a windowed value built, received and combined
through its Cython operations) costs ~2.0 µs an element; calling the functions directly ~0.7.

`direct_chain` says whether a stage qualifies and why not. The conditions are what makes Beam's
`DoFnRunner` choose its `SimpleInvoker` and its `_OutputHandler` wrap each result in the input's
window: a `CallableWrapperDoFn` (what `Map`, `FlatMap`, `Filter` and their `Tuple` forms build,
never a user's DoFn subclass nor runtime type checking's wrapper), no extra arguments, no defaults
in the function's signature (Beam's parameters such as `DoFn.TimestampParam` arrive that way),
no side inputs, one output. A lifted combiner (`CombinePerKey`'s pre-combine) may end the chain
under the default windowing, where Beam's `PGBKCVOperation` keeps one accumulator per key.

What cannot be known before the functions run is checked as they run (`engine/direct.py`): a
result that is a `TimestampedValue`, `WindowedValue` or `TaggedOutput`, and any exception, hand
that Arrow batch and the rest of the task to the bundle processor, which gives Beam's own
output or Beam's own error.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_fn_api_pb2, beam_runner_api_pb2

from sparkbeam import urns
from sparkbeam.plan.grouping_paths import is_trivial
from sparkbeam.plan.model import DirectChain, Plan, Stage, StageKind

_PICKLED_DOFN = "beam:dofn:pickled_python_info:v1"
_PRECOMBINE = common_urns.combine_components.COMBINE_PER_KEY_PRECOMBINE.urn
_NOTHING = "no function to call"
_GRPC_ENVIRONMENTS = frozenset(
    [common_urns.environments.PROCESS.urn, common_urns.environments.EXTERNAL.urn])


def direct_chain(stage: Stage) -> tuple[DirectChain | None, str]:
    """The chain `stage` runs directly, or None and why not."""
    if stage.kind is not StageKind.PLAIN:
        return None, f"a {stage.kind.value} stage"
    if len(stage.inputs) != 1 or len(stage.outputs) != 1:
        return None, "not one input and one output"
    if stage.side_inputs:
        return None, "it reads side inputs"
    if stage.environment and beam_runner_api_pb2.Environment.FromString(
            stage.environment).urn in _GRPC_ENVIRONMENTS:
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
                         + (", lifted combiner)" if chain.combine else ")"))
        else:
            lines.append(f"{stage.description}: Beam's bundle processor ({why})")
    return dataclasses.replace(plan, stages=tuple(stages)), tuple(lines)


def loaded_dofn(transform: beam_runner_api_pb2.PTransform) -> Any:
    """The unpickled (DoFn, args, kwargs, side-input tags, windowing) of a Python ParDo."""
    from apache_beam.internal import pickler

    payload = beam_runner_api_pb2.ParDoPayload.FromString(transform.spec.payload)
    return pickler.loads(payload.do_fn.payload)


def call_of(dofn: Any) -> tuple[int, list[Any], dict[str, Any]] | None:
    """How Beam's invoker calls this DoFn's process on an element: (the element's position in
    the positional arguments, those arguments, keyword arguments), worked out by Beam's own
    `_get_arg_placeholders` as its `PerWindowInvoker` does for a function with defaults; None
    when it fills in anything but the element (a window, timestamp, key, pane...)."""
    from apache_beam.runners import common
    from apache_beam.transforms import core

    signature = common.DoFnSignature(dofn)
    if not signature.process_method.defaults:  # Beam's SimpleInvoker: process(element)
        return 0, [None], {}
    placeholders, args, kwargs = common._get_arg_placeholders(  # noqa: SLF001 - Beam's rule
        signature.process_method, [], {})
    if (len(placeholders) != 1 or placeholders[0][1] != core.DoFn.ElementParam
            or any(isinstance(a, core._DoFnParam) for a in args)  # noqa: SLF001
            or any(isinstance(v, core._DoFnParam) for v in kwargs.values())):  # noqa: SLF001
        return None
    return placeholders[0][0], list(args), dict(kwargs)


def _par_do_problem(transform: beam_runner_api_pb2.PTransform) -> str:
    """Why this transform is not a ParDo Beam would run with its SimpleInvoker ("" if it is)."""
    from apache_beam.transforms.core import CallableWrapperDoFn

    if transform.spec.urn != common_urns.primitives.PAR_DO.urn:
        return f"is not a ParDo ({transform.spec.urn})"
    payload = beam_runner_api_pb2.ParDoPayload.FromString(transform.spec.payload)
    if payload.do_fn.urn != _PICKLED_DOFN:
        return f"is a DoFn of {payload.do_fn.urn}"
    if (payload.side_inputs or payload.state_specs or payload.timer_family_specs
            or payload.restriction_coder_id or payload.requests_finalization
            or payload.requires_stable_input or payload.requires_time_sorted_input):
        return "uses side inputs, state, timers, splitting or finalization"
    try:
        dofn, args, kwargs = loaded_dofn(transform)[:3]
    except Exception as exc:  # noqa: BLE001 - any failure to load keeps the general path
        return f"has a DoFn that cannot be loaded here ({type(exc).__name__})"
    if type(dofn) is not CallableWrapperDoFn:
        return f"runs {type(dofn).__name__}, not a Map/FlatMap/Filter function"
    if args or kwargs:
        return "passes extra arguments to its function"
    if call_of(dofn) is None:
        return "has a function taking Beam's DoFn parameters (window, timestamp...)"
    return ""


def _default_windowing(descriptor: beam_fn_api_pb2.ProcessBundleDescriptor, pcoll: str) -> bool:
    """Beam's `Windowing.is_default()` for the PCollection: `PGBKCVOperation` then keys its
    table by key alone and outputs in the global window."""
    return is_trivial(descriptor.windowing_strategies[
        descriptor.pcollections[pcoll].windowing_strategy_id])
