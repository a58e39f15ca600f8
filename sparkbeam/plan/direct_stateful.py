"""Which batch stateful DoFns run without Beam's bundle processor (no pyspark).

A stateful stage spends most of its time in the bundle processor's machinery around the user's
code, not in it: measured in-process on a bag-and-timer DoFn (100 k events, 10 k keys), ~16 µs
an event, of which decoding the bundle, Beam's state API (each state read and write through
the state handler's cache) and encoding every timer the DoFn sets, to be decoded again by the
runner, are most. `engine/direct_stateful.py` calls the DoFn through Beam's own `DoFnRunner`
(its invoker, its output handler, so Beam's argument rules and output wrapping hold) with a
key's state and timers kept in memory, key after key, and fires timers with `TimerBook` as the
general path does.

The conditions (`stateful_problem`) keep it to what that reproduces exactly: a Python DoFn
with bag, read-modify-write or combining state and event- or processing-time timers, its main
input in the global window under the default trigger (so state and timers are a key's alone,
in one window), one output, no side inputs, no splitting, no bundle finalization or
time-sorted input, no batched `process_batch`, and no `start_bundle`/`finish_bundle` of its
own (the general path's bundles span many keys; here there are none to mirror). Such a
ParDo's consumers are not fused into its stage (`runs_directly`, asked by a fusion phase), so the
stage holds the ParDo alone; the rest of the pipeline fuses as before.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_fn_api_pb2, beam_runner_api_pb2

from sparkbeam import urns
from sparkbeam.plan.grouping_paths import is_trivial
from sparkbeam.plan.model import Plan, Stage, StageKind

_PICKLED_DOFN = "beam:dofn:pickled_python_info:v1"
_PAR_DO = common_urns.primitives.PAR_DO.urn
_STATES = frozenset(["read_modify_write_spec", "bag_spec", "combining_spec"])
_DOMAINS = frozenset([beam_runner_api_pb2.TimeDomain.EVENT_TIME,
                      beam_runner_api_pb2.TimeDomain.PROCESSING_TIME])


def stateful_problem(transform: beam_runner_api_pb2.PTransform,
                     windowing_of: Any) -> str:
    """Why this stateful ParDo keeps Beam's bundle processor ("" if it need not).
    `windowing_of(pcollection id)` is its WindowingStrategy proto."""
    from apache_beam.transforms import core

    payload = beam_runner_api_pb2.ParDoPayload.FromString(transform.spec.payload)
    if payload.do_fn.urn != _PICKLED_DOFN:
        return f"a DoFn of {payload.do_fn.urn}"
    if payload.side_inputs:
        return "it reads side inputs"
    if payload.restriction_coder_id:
        return "it is splittable"
    if payload.requests_finalization or payload.requires_time_sorted_input:
        return "it asks for bundle finalization or time-sorted input"
    for name, spec in sorted(payload.state_specs.items()):
        kind = spec.WhichOneof("spec")
        if kind not in _STATES:
            return f"its state {name} is a {kind}"
    for name, timer in sorted(payload.timer_family_specs.items()):
        if timer.time_domain not in _DOMAINS:
            return f"its timer {name} is in time domain {timer.time_domain}"
    if len(transform.outputs) != 1:
        return "it has several outputs"
    (main,) = list(transform.inputs.values())
    if not is_trivial(windowing_of(main)):
        return "its input is not in the global window under the default trigger"
    try:
        from apache_beam.internal import pickler

        dofn = pickler.loads(payload.do_fn.payload)[0]
    except Exception as exc:  # noqa: BLE001 - any failure to load keeps the general path
        return f"its DoFn cannot be loaded here ({type(exc).__name__})"
    for method in ("start_bundle", "finish_bundle"):
        if getattr(type(dofn), method) is not getattr(core.DoFn, method):
            return f"{type(dofn).__name__} has a {method} of its own"
    if getattr(dofn, "_process_batch_defined", False):
        return f"{type(dofn).__name__} processes batches"
    return ""


def runs_directly(transform: beam_runner_api_pb2.PTransform, windowing_of: Any) -> bool:
    """Whether `transform` is a stateful ParDo that runs directly (what the fusion phase that
    gives it a stage of its own asks, `plan/fuse.py`)."""
    if transform.spec.urn != _PAR_DO:
        return False
    payload = beam_runner_api_pb2.ParDoPayload.FromString(transform.spec.payload)
    return bool(payload.state_specs or payload.timer_family_specs) and not stateful_problem(
        transform, windowing_of)


def direct_stateful(stage: Stage) -> tuple[str | None, str]:
    """The ParDo `stage` runs directly (its transform id), or None and why not."""
    if stage.kind is not StageKind.STATEFUL:
        return None, f"a {stage.kind.value} stage"
    if len(stage.inputs) != 1 or len(stage.outputs) > 1:
        return None, "not one input and at most one output"
    descriptor = beam_fn_api_pb2.ProcessBundleDescriptor.FromString(stage.descriptor)
    work = [tid for tid, t in descriptor.transforms.items()
            if t.spec.urn not in (urns.DATA_INPUT, urns.DATA_OUTPUT)]
    if len(work) != 1 or descriptor.transforms[work[0]].spec.urn != _PAR_DO:
        return None, "its stateful DoFn shares the stage with other transforms"
    transform = descriptor.transforms[work[0]]

    def windowing_of(pcoll: str) -> Any:
        return descriptor.windowing_strategies[descriptor.pcollections[pcoll].windowing_strategy_id]

    why = stateful_problem(transform, windowing_of)
    return (None, why) if why else (work[0], "")


def with_direct_stateful(plan: Plan) -> tuple[Plan, tuple[str, ...]]:
    """`plan` with each qualifying stateful stage's `direct_stateful` set, and one line per
    stateful stage saying which path it takes and why."""
    stages, lines = [], []
    for stage in plan.stages:
        if stage.kind is not StageKind.STATEFUL:
            stages.append(stage)
            continue
        tid, why = direct_stateful(stage)
        stages.append(dataclasses.replace(stage, direct_stateful=tid))
        if tid is not None:
            lines.append(f"{stage.description}: stateful DoFn called directly, without Beam's "
                         "bundle processor (each key's state and timers in memory)")
        else:
            lines.append(f"{stage.description}: Beam's bundle processor ({why})")
    return dataclasses.replace(plan, stages=tuple(stages)), tuple(lines)
