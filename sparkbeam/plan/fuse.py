"""Pipeline proto -> Plan, with Beam's own fusion phases.

We run FnApiRunner's phase list plus `annotate_stateful_dofns_as_roots`: FnApiRunner fuses
stateful DoFns into their producers because it runs them on one worker with one global state
store; once keys are spread over Spark tasks, a stateful DoFn must start a stage so its input can
be partitioned by key. In streaming, what a splittable DoFn outputs also starts a stage
(`_consumers_of_sdfs_as_roots`): a read's output then leaves its stage as elements the runner
counts, so the work budget can stop the read at its share (`streaming/splittable.py`).
"""
from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from apache_beam.portability.api import (
    beam_fn_api_pb2,
    beam_runner_api_pb2,
    endpoints_pb2,
)
from apache_beam.runners.portability.fn_api_runner import translations
from apache_beam.runners.portability.fn_api_runner.execution import FnApiRunnerExecutionContext
from apache_beam.utils import proto_utils

from sparkbeam import urns
from sparkbeam.errors import PlanningError
from sparkbeam.plan.direct_stateful import runs_directly
from sparkbeam.plan.grouping_paths import groups_by_window, lift_combiners_unless_merging
from sparkbeam.plan.model import (
    IMPULSE_BUFFER,
    Grouping,
    Plan,
    SideInputUse,
    Stage,
    StageInput,
    StageKind,
    StageOutput,
    TimerFamily,
)

_LOG = logging.getLogger(__name__)

# The data-plane "address" written into descriptors; the embedded worker ignores it.
EMBEDDED_URL = "sparkbeam:embedded"

# Beam's phases, as FnApiRunner runs them (streaming; batch with --spark_native=off).
BEAM_PHASES = [
    translations.annotate_downstream_side_inputs,
    translations.annotate_stateful_dofns_as_roots,
    translations.fix_side_input_pcoll_coders,
    translations.pack_combiners,
    translations.lift_combiners,
    translations.expand_sdf,
    translations.expand_gbk,
    translations.sink_flattens,
    translations.greedily_fuse,
    translations.read_to_impulse,
    translations.impulse_to_input,
    translations.sort_stages,
    translations.add_impulse_to_dangling_transforms,
    translations.setup_timer_mapping,
    translations.populate_data_channel_coders,
]


def _consumers_as_roots(stages: list[translations.Stage],
                        producer: Callable[[beam_runner_api_pb2.PTransform], bool]
                        ) -> Iterable[translations.Stage]:
    """`stages`, those reading an output of a transform `producer` picks not fused into its
    stage (Beam's `forced_root`)."""
    outputs = {
        pcoll
        for stage in stages
        for t in stage.transforms
        if producer(t)
        for pcoll in t.outputs.values()
    }
    for stage in stages:
        if any(pcoll in outputs for t in stage.transforms for pcoll in t.inputs.values()):
            stage.forced_root = True
        yield stage


def _consumers_of_sdfs_as_roots(
    stages: Iterable[translations.Stage], context: Any
) -> Iterable[translations.Stage]:
    """Stages reading what a splittable DoFn's Process outputs are not fused into it."""
    return _consumers_as_roots(list(stages), lambda t: t.spec.urn == urns.SPLITTABLE_PROCESS)


def _consumers_of_direct_stateful_as_roots(
    stages: Iterable[translations.Stage], context: Any
) -> Iterable[translations.Stage]:
    """Stages reading what a stateful ParDo that runs directly outputs are not fused into its
    stage, which then holds that ParDo alone (`direct_stateful.py`)."""
    pcolls = context.components.pcollections
    strategies = context.components.windowing_strategies
    return _consumers_as_roots(list(stages), lambda t: runs_directly(
        t, lambda pcoll: strategies[pcolls[pcoll].windowing_strategy_id]))


# Batch: combiners over merging windows stay unlifted (`grouping_paths.py`); a stateful DoFn
# that runs directly keeps its stage to itself (`direct_stateful.py`).
PHASES = [lift_combiners_unless_merging if phase is translations.lift_combiners else phase
          for phase in BEAM_PHASES]
PHASES.insert(PHASES.index(translations.greedily_fuse),
              _consumers_of_direct_stateful_as_roots)
STREAMING_PHASES = [
    *BEAM_PHASES[:BEAM_PHASES.index(translations.greedily_fuse)],
    _consumers_of_sdfs_as_roots,
    *BEAM_PHASES[BEAM_PHASES.index(translations.greedily_fuse):],
]


def plan_pipeline(
    proto: beam_runner_api_pb2.Pipeline,
    *,
    pickle_library: str = "default",
    is_drain: bool = False,
    streaming: bool = False,
    runner_urns: frozenset[str] = frozenset(),
    beam_phases: bool = False,
) -> Plan:
    """Fuses `proto` into stages and describes each for the executor; `runner_urns` are
    leaves the runner executes besides Flatten and GroupByKey (each gets a stage of its own);
    `beam_phases`: batch fused exactly as FnApiRunner fuses (`--spark_native=off`)."""
    phases = STREAMING_PHASES if streaming else BEAM_PHASES if beam_phases else PHASES
    try:
        context, stages = translations.create_and_optimize_stages(
            copy.deepcopy(proto),
            phases=phases,
            known_runner_urns=frozenset(
                [urns.FLATTEN, urns.GROUP_BY_KEY] + ([urns.TEST_STREAM] if streaming else [])
            ) | runner_urns,
            is_drain=is_drain,
        )
    except Exception as exc:
        raise PlanningError(f"fusing the pipeline into stages failed: {exc}") from exc
    comps = context.components
    channel_coders = dict(context.data_channel_coders)
    side_by_producer = FnApiRunnerExecutionContext._build_data_side_inputs_map(stages)
    side_uses = _side_input_uses(side_by_producer, channel_coders)
    keyed_buffers = {
        _buffer_id(t)
        for s in stages
        if _is_keyed(s)
        for t in s.transforms
        if t.spec.urn == urns.DATA_INPUT
    }
    by_name = {s.name: s for s in stages}
    planned = [_plan_stage(s, comps, channel_coders, side_uses, keyed_buffers) for s in stages]
    final = []
    for index, st in enumerate(_topological(planned)):
        label = f"stage-{index:03d}"
        descriptor = _descriptor(by_name[st.name], label, comps, channel_coders)
        final.append(
            dataclasses.replace(st, index=index, label=label, descriptor=descriptor)
        )
    return Plan(
        components=comps.SerializeToString(),
        stages=tuple(final),
        groupings=_groupings(comps, channel_coders),
        pickle_library=pickle_library,
    )


def _buffer_id(transform: beam_runner_api_pb2.PTransform) -> bytes:
    return bytes(transform.spec.payload)


def _is_keyed(stage: translations.Stage) -> bool:
    if stage.is_stateful():
        return True
    return any(
        t.spec.urn == urns.DATA_INPUT
        and translations.split_buffer_id(_buffer_id(t))[0] == "group"
        for t in stage.transforms
        if _buffer_id(t) != IMPULSE_BUFFER
    )


def _plan_stage(
    stage: translations.Stage,
    comps: beam_runner_api_pb2.Components,
    channel_coders: dict[str, str],
    side_uses: dict[str, list[SideInputUse]],
    keyed_buffers: set[bytes],
) -> Stage:
    inputs, outputs, timers, names = [], [], [], []
    splittable = False
    input_pcolls: dict[str, str] = {}
    for t in stage.transforms:
        if t.spec.urn == urns.DATA_INPUT:
            pcoll = _only(t.outputs.values())
            inputs.append(StageInput(t.unique_name, _buffer_id(t), channel_coders[pcoll]))
            input_pcolls[pcoll] = t.unique_name
        elif t.spec.urn == urns.DATA_OUTPUT:
            pcoll = _only(t.inputs.values())
            buffer_id = _buffer_id(t)
            coder_id = channel_coders[pcoll]
            needs_key = (
                translations.split_buffer_id(buffer_id)[0] == "group"
                or buffer_id in keyed_buffers
            )
            outputs.append(
                StageOutput(
                    t.unique_name,
                    buffer_id,
                    coder_id,
                    _key_coder_id(comps, coder_id, t.unique_name) if needs_key else None,
                )
            )
        else:
            names.append(t.unique_name)
        if t.spec.urn in translations.PAR_DO_URNS:
            payload = proto_utils.parse_Bytes(t.spec.payload, beam_runner_api_pb2.ParDoPayload)
            for family_id, spec in sorted(payload.timer_family_specs.items()):
                timers.append(
                    TimerFamily(
                        t.unique_name, family_id, spec.timer_family_coder_id, spec.time_domain
                    )
                )
        if t.spec.urn == urns.SPLITTABLE_PROCESS:
            splittable = splittable or any(p in input_pcolls for p in t.inputs.values())
    keyed = _is_keyed(stage)  # stateful, or reading a GroupByKey's output
    return Stage(
        index=-1,
        name=stage.name,
        label="",
        description=_describe(names),
        transforms=tuple(names),
        descriptor=b"",
        inputs=tuple(inputs),
        outputs=tuple(outputs),
        side_inputs=tuple(
            use for t in stage.transforms for use in side_uses.get(t.unique_name, [])
        ),
        timers=tuple(timers),
        kind=StageKind.of(stateful=stage.is_stateful(), grouped=keyed, splittable=splittable),
        environment_id=stage.environment or "",
        environment=(
            comps.environments[stage.environment].SerializeToString()
            if stage.environment and stage.environment in comps.environments else b""
        ),
    )


def _describe(names: list[str], limit: int = 160) -> str:
    text = ", ".join(names) if names else "(no user transforms)"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _key_coder_id(comps: beam_runner_api_pb2.Components, windowed_id: str, where: str) -> str:
    windowed = comps.coders[windowed_id]
    kv_id = windowed.component_coder_ids[0] if windowed.component_coder_ids else windowed_id
    kv = comps.coders[kv_id]
    if kv.spec.urn != "beam:coder:kv:v1" or len(kv.component_coder_ids) != 2:
        raise PlanningError(
            f"{where} feeds a keyed consumer but its elements are not key/value pairs "
            f"(coder {kv.spec.urn} of {len(kv.component_coder_ids)} components)"
        )
    return kv.component_coder_ids[0]


def _side_input_uses(
    by_producer: Mapping[str, Mapping[tuple[str, str], tuple[bytes, Any]]],
    channel_coders: dict[str, str],
) -> dict[str, list[SideInputUse]]:
    uses: dict[str, list[SideInputUse]] = {}
    for side_inputs in by_producer.values():
        for (transform_id, tag), (buffer_id, spec) in side_inputs.items():
            _, pcoll = translations.split_buffer_id(buffer_id)
            uses.setdefault(transform_id, []).append(
                SideInputUse(
                    transform_id, tag, buffer_id, spec.SerializeToString(), channel_coders[pcoll]
                )
            )
    return uses


def _groupings(
    comps: beam_runner_api_pb2.Components, channel_coders: dict[str, str]
) -> dict[bytes, Grouping]:
    out = {}
    for tid, t in comps.transforms.items():
        if t.spec.urn != urns.GROUP_BY_KEY:
            continue
        in_pc, out_pc = _only(t.inputs.values()), _only(t.outputs.values())
        if in_pc not in channel_coders or out_pc not in channel_coders:
            continue  # not executed (e.g. inside a composite that was replaced)
        buffer_id = translations.create_buffer_id(tid, kind="group")
        strategy = comps.windowing_strategies[comps.pcollections[in_pc].windowing_strategy_id]
        out[buffer_id] = Grouping(
            buffer_id=buffer_id,
            transform_id=t.unique_name or tid,
            input_coder_id=channel_coders[in_pc],
            output_coder_id=channel_coders[out_pc],
            windowing_strategy_id=comps.pcollections[in_pc].windowing_strategy_id,
            by_window=groups_by_window(strategy),
        )
    return out


def _descriptor(
    stage: translations.Stage,
    label: str,
    comps: beam_runner_api_pb2.Components,
    channel_coders: dict[str, str],
) -> bytes:
    transforms = {}
    for t in stage.transforms:
        t = copy.deepcopy(t)
        if t.spec.urn in (urns.DATA_INPUT, urns.DATA_OUTPUT):
            ends = t.outputs if t.spec.urn == urns.DATA_INPUT else t.inputs
            pcoll = _only(ends.values())
            port = beam_fn_api_pb2.RemoteGrpcPort(coder_id=channel_coders[pcoll])
            port.api_service_descriptor.url = EMBEDDED_URL
            t.spec.payload = port.SerializeToString()
        transforms[t.unique_name] = t
    return beam_fn_api_pb2.ProcessBundleDescriptor(
        id=label,
        transforms=transforms,
        pcollections=dict(comps.pcollections.items()),
        coders=dict(comps.coders.items()),
        windowing_strategies=dict(comps.windowing_strategies.items()),
        environments=dict(comps.environments.items()),
        timer_api_service_descriptor=endpoints_pb2.ApiServiceDescriptor(url=EMBEDDED_URL),
    ).SerializeToString()


def _topological(stages: list[Stage]) -> list[Stage]:
    """Orders stages so every buffer (data or side input) is produced before it is read."""
    producers: dict[bytes, set[str]] = {}
    for s in stages:
        for o in s.outputs:
            producers.setdefault(o.buffer_id, set()).add(s.name)
    deps = {
        s.name: {
            p
            for b in [i.buffer_id for i in s.inputs] + [si.buffer_id for si in s.side_inputs]
            for p in producers.get(b, set())
            if p != s.name
        }
        for s in stages
    }
    done: list[Stage] = []
    placed: set[str] = set()
    pending = list(stages)
    while pending:
        # Stages ready together in the order of their transforms' names, not Beam's (which
        # follows transform ids numbered per process): the same pipeline gets the same labels
        # and, in streaming, the same operator order in every run of its checkpoint.
        ready = sorted((s for s in pending if deps[s.name] <= placed),
                       key=lambda s: (s.transforms, s.name))
        if not ready:
            names = ", ".join(s.name for s in pending)
            raise PlanningError(f"stages depend on each other in a cycle: {names}")
        for s in ready:
            done.append(s)
            placed.add(s.name)
        pending = [s for s in pending if s.name not in placed]
    return done


def _only(values: Iterable[str]) -> str:
    items = list(values)
    if len(items) != 1:
        raise PlanningError(f"expected exactly one PCollection, got {items}")
    return items[0]
