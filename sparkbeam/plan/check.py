"""Prepare-time checks: every feature of a pipeline that sparkbeam cannot run, found at once.

Every check Prepare makes lives here and runs once (`runner.prepare` gathers them into one
`UnsupportedFeatureError`): the proto's transforms, environments, coders and windowing
(`find_unsupported`), the planned stages (`plan_problems`: a splittable DoFn with user state,
which Beam's SDK cannot run; in streaming, by the stage's kind and side inputs, through
`STREAMING_STAGES`) and the options (`option_problems`). Each fails
closed, like a translation table: a leaf transform whose URN has no rule here or in the SDK's
bundle processor, or a streaming stage whose (kind, side inputs) has no row, is reported,
never silently mis-executed. (The well-formedness of the proto is `validate.py`'s, first.)
"""
from __future__ import annotations

import logging

from apache_beam.portability import common_urns, python_urns
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.runners import pipeline_context
from apache_beam.runners.worker import bundle_processor

from sparkbeam import urns
from sparkbeam.errors import Unsupported, UnsupportedFeatureError
from sparkbeam.mode import BATCH_EXPERIMENT
from sparkbeam.plan.arrow_batches import setting_problem
from sparkbeam.plan.model import Plan, Stage, StageKind, side_input_proto
from sparkbeam.plan.native_spark import spark_io_problems

_LOG = logging.getLogger(__name__)

# Leaf transforms the runner executes itself (the rest run in the SDK's bundle processor).
RUNNER_EXECUTED = {
    urns.IMPULSE: "Impulse: a one-row DataFrame",
    urns.GROUP_BY_KEY: "GroupByKey: a Spark shuffle on the encoded key, grouped per window",
    urns.FLATTEN: "Flatten: a union of buffers",
}


_WORKER_ONLY = frozenset([urns.INTO_GLOBAL_WINDOW])


def _sdk_executed() -> frozenset[str]:
    known = set(bundle_processor.BeamTransformFactory._known_urns)
    # Beam ships handlers for Java-only URNs too; those cannot run in a Python worker. The
    # operations of sparkbeam's own worker (registered when it is imported) run only what the
    # plan rewrote, never a pipeline's transform.
    return frozenset(u for u in known if "java" not in u and u not in _WORKER_ONLY)


def supported_transform_urns() -> dict[str, str]:
    """URN -> how it runs; the support table of the README is generated from this."""
    table = dict(RUNNER_EXECUTED)
    for urn in sorted(_sdk_executed()):
        table.setdefault(urn, "in the SDK bundle processor inside a Spark task")
    return table


def support_table_markdown() -> str:
    """The README's support table, generated from the rules above."""
    lines = ["| transform URN | how it runs |", "|---|---|"]
    for urn, how in supported_transform_urns().items():
        lines.append(f"| `{urn}` | {how} |")
    return "\n".join(lines)


def find_unsupported(
    proto: beam_runner_api_pb2.Pipeline, *, streaming: bool = False
) -> list[Unsupported]:
    """Every unsupported feature of `proto`, in a stable order."""
    found: list[Unsupported] = []
    comps = proto.components
    supported = supported_transform_urns()
    for req in proto.requirements:
        if req not in urns.SUPPORTED_REQUIREMENTS:
            found.append(Unsupported(f"pipeline requirement {req}", "the pipeline"))
    for tid in sorted(comps.transforms):
        t = comps.transforms[tid]
        name = t.unique_name or tid
        if t.subtransforms:
            continue  # composites run as their parts
        if set(t.outputs.values()) <= set(t.inputs.values()):
            continue  # an empty composite that passes its input through
        urn = t.spec.urn
        if urn == urns.TEST_STREAM and not streaming:
            # Reached only when the batch experiment overrides `sparkbeam.mode`'s inference.
            found.append(Unsupported(
                "TestStream in batch", f"transform '{name}'",
                f"a TestStream runs as a stream; drop the experiment {BATCH_EXPERIMENT}"))
        elif urn and urn not in supported and not (streaming and urn == urns.TEST_STREAM):
            hint = "a cross-language or runner-specific transform" if ":" in urn else ""
            found.append(Unsupported(f"transform URN {urn}", f"transform '{name}'", hint))
        if t.environment_id and t.environment_id in comps.environments:
            env = comps.environments[t.environment_id]
            problem = _environment_problem(env)
            if problem:
                found.append(Unsupported(problem, f"transform '{name}'"))
    unbounded = [
        pc.unique_name or pid
        for pid, pc in sorted(comps.pcollections.items())
        if pc.is_bounded == beam_runner_api_pb2.IsBounded.UNBOUNDED
    ]
    if unbounded and not streaming:
        # Like FnApiRunner, batch runs an unbounded splittable DoFn until it stops claiming
        # work (PeriodicImpulse with a stop time, a finite `data` list...).
        _LOG.warning(
            "%d PCollection(s) are unbounded (e.g. %s); running in batch mode until their "
            "sources finish", len(unbounded), unbounded[0],
        )
    found.extend(Unsupported(what, f"transform '{name}'")
                 for name, what in spark_io_problems(proto, streaming))
    found.extend(_unbuildable_components(comps))
    return _dedup(found)


def check_pipeline(proto: beam_runner_api_pb2.Pipeline, *, streaming: bool = False) -> None:
    """Raises one UnsupportedFeatureError listing every problem, or returns."""
    found = find_unsupported(proto, streaming=streaming)
    if found:
        raise UnsupportedFeatureError(found)


def _environment_problem(env: beam_runner_api_pb2.Environment) -> str | None:
    if env.urn == common_urns.environments.DOCKER.urn:
        payload = beam_runner_api_pb2.DockerPayload.FromString(env.payload)
        image = payload.container_image.lower()
        if image and "python" not in image and "beam_python" not in image:
            return f"a non-Python SDK environment (container image {payload.container_image})"
    if env.urn and env.urn not in urns.PYTHON_ENVIRONMENT_URNS:
        return f"environment URN {env.urn}"
    return None


def _unbuildable_components(comps: beam_runner_api_pb2.Components) -> list[Unsupported]:
    """Coders and windowing strategies the Python SDK cannot construct."""
    found: list[Unsupported] = []
    context = pipeline_context.PipelineContext(comps)
    for cid in sorted(comps.coders):
        try:
            context.coders.get_by_id(cid)
        except Exception as exc:  # noqa: BLE001 - any failure means we cannot decode it
            urn = comps.coders[cid].spec.urn
            found.append(Unsupported(f"coder {urn}", f"coder '{cid}'", _first_line(exc)))
    for wid in sorted(comps.windowing_strategies):
        try:
            context.windowing_strategies.get_by_id(wid)
        except Exception as exc:  # noqa: BLE001
            urn = comps.windowing_strategies[wid].window_fn.urn
            found.append(
                Unsupported(f"window function {urn}", f"windowing strategy '{wid}'",
                            _first_line(exc))
            )
    return found


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def _dedup(items: list[Unsupported]) -> list[Unsupported]:
    seen: set[Unsupported] = set()
    out = []
    for item in items:
        if item not in seen:
            seen.add(item)
            out.append(item)
    return out


# The streaming engine's operators, by (stage kind, reads side inputs). The streaming query
# builds each stage from the row of this table (`streaming/query.py`, tested to agree); a
# combination without a row is refused at Prepare (fail closed). Every kind Beam's SDK can run
# has both rows.
STREAMING_STAGES: dict[tuple[StageKind, bool], str] = {
    (StageKind.PLAIN, False): "mapInArrow over each micro-batch",
    (StageKind.GROUPED, False): "mapInArrow over the panes of its GroupByKey",
    (StageKind.PLAIN, True): "transformWithState: elements wait for their side inputs",
    (StageKind.GROUPED, True): "transformWithState: panes wait for their side inputs",
    (StageKind.STATEFUL, False): "transformWithState: user state and timers per key",
    (StageKind.STATEFUL, True): "transformWithState: user state and timers per key, elements "
                                "waiting in it for their side inputs",
    (StageKind.SPLITTABLE, False): "transformWithState: restrictions per spread key",
    (StageKind.SPLITTABLE, True): "transformWithState: restrictions per spread key, run with "
                                  "the side inputs their elements waited for upstream",
}

# Why refused in batch and streaming alike: Beam's Python SDK (2.77) cannot run one. Its bundle
# processor encodes the state key of a splittable DoFn's Process with the coder of the
# (element, restriction) pair but passes the element's key, so the first state or timer access
# fails ("Number of components does not match number of coders") on FnApiRunner and the
# DirectRunner as on Spark; refused here, it is named before any work is done.
STATEFUL_SPLITTABLE_REFUSED = (
    "a splittable DoFn with user state or timers",
    "Beam's Python SDK cannot give a splittable DoFn's restrictions user state or timers (its "
    "own runners fail at the first access); keep the state in a stateful DoFn after the read")


def plan_problems(plan: Plan, *, streaming: bool) -> list[Unsupported]:
    """What the engine cannot run of the planned stages: a splittable DoFn with user state
    (the SDK's limit), and in streaming every (kind, side inputs) without an operator."""
    found: list[Unsupported] = []
    for stage in plan.stages:
        where = f"{stage.label} [{stage.description}]"
        if stage.kind is StageKind.STATEFUL_SPLITTABLE:
            what, hint = STATEFUL_SPLITTABLE_REFUSED
            found.append(Unsupported(what, where, hint))
            continue
        if not streaming:
            continue
        row = (stage.kind, bool(stage.side_inputs))
        if row not in STREAMING_STAGES:
            found.append(Unsupported(
                f"a {stage.kind.value} stage{' with side inputs' * row[1]} in streaming", where,
                "no streaming operator for it"))
        found.extend(_side_mapping_problems(stage, where))
    return found


# Why: the query's foreachBatch sink is the runner's driver-side bookkeeping (commits, metrics,
# exactly-once writes), which Connect would run on its server, apart from the job.
CONNECT_STREAMING = ("sparkbeam's streaming engine needs a classic Spark session: run it with "
                     "--spark_master=... instead of --spark_remote")


def option_problems(*, streaming: bool, checkpoint_dir: str | None,
                    budgets: dict[str, int | None], master: str | None = None,
                    remote: str | None = None, arrow_batch_bytes: str = "auto"
                    ) -> list[Unsupported]:
    """Options that make the job impossible, whatever the pipeline. Streaming without
    `--checkpoint_dir` is refused here only when the options name a cluster; on a local
    master the job makes a fresh directory when it starts (the session decides, at run)."""
    found = []
    if streaming and remote:
        found.append(Unsupported(
            "a streaming pipeline", f"the pipeline options (Spark Connect {remote})",
            CONNECT_STREAMING))
    if streaming and not checkpoint_dir and (remote or not is_local_master(master)):
        where = f"Spark Connect {remote}" if remote else f"master {master}"
        found.append(Unsupported(
            "streaming without --checkpoint_dir", f"the pipeline options ({where})",
            "on a cluster the checkpoint directory must be one the driver and every executor "
            "share (executors read its offset log); give --checkpoint_dir"))
    for flag, value in budgets.items():
        if value is not None and value < 1:
            found.append(Unsupported(f"--{flag}={value}", "the pipeline options",
                                     "a work budget must be at least 1"))
    problem = setting_problem(arrow_batch_bytes)
    if problem:
        found.append(Unsupported(f"--arrow_batch_bytes={arrow_batch_bytes}",
                                 "the pipeline options", problem))
    return found


def is_local_master(master: str | None) -> bool:
    """Whether a master runs driver and executors on this machine (None: sparkbeam's default,
    local[*], unless spark-submit gave one, which the session finds at run)."""
    return master is None or master.startswith("local")


def _side_mapping_problems(stage: Stage, where: str) -> list[Unsupported]:
    """Streaming side inputs wait for their window: the mapping must be a Python one."""
    found = []
    for use in stage.side_inputs:
        spec = side_input_proto(stage, use).window_mapping_fn
        if spec.urn != python_urns.PICKLED_WINDOW_MAPPING_FN:
            found.append(Unsupported(f"side input window mapping {spec.urn or '(none)'}",
                                     f"{where}, side input '{use.tag}'",
                                     "only Python window mapping functions are supported"))
    return found
