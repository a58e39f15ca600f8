"""Runs a Plan on Spark, stage by stage, in topological order (the driver side)."""
from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from apache_beam.portability.api import metrics_pb2
from apache_beam.runners.common import ENCODED_IMPULSE_VALUE

from sparkbeam.engine.context import pipeline_context
from sparkbeam.engine.side_inputs import side_input_state
from sparkbeam.engine.task import METRICS_TAG, TaskSpec, run_stage_task
from sparkbeam.engine.task_errors import stage_error
from sparkbeam.errors import ExecutionError, JobCancelledError
from sparkbeam.execute.dataset import Datasets
from sparkbeam.plan.model import IMPULSE_BUFFER, Plan, Stage, StageKind

_LOG = logging.getLogger(__name__)

# How each kind of stage gets its input: as its producers left it, partitioned and sorted by
# the encoded key (each key in one task, its rows together), or dealt round-robin over the
# partitions (the restrictions of a splittable read). A kind without a row is an error.
_ARRANGE: dict[StageKind, Callable[[Datasets, Any], Any] | None] = {
    StageKind.PLAIN: None,
    StageKind.GROUPED: Datasets.by_key,
    StageKind.STATEFUL: Datasets.by_key,
    StageKind.STATEFUL_SPLITTABLE: Datasets.by_key,
    StageKind.SPLITTABLE: Datasets.spread,
}


@dataclass
class Progress:
    """The committed metrics of a job and the task attempts they came from."""

    infos: list[metrics_pb2.MonitoringInfo] = field(default_factory=list)
    committed_attempts: set[bytes] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, infos: list[metrics_pb2.MonitoringInfo], attempts: set[bytes]) -> None:
        with self.lock:
            self.infos.extend(infos)
            self.committed_attempts |= attempts

    def committed_keys(self) -> set[bytes]:
        with self.lock:
            return set(self.committed_attempts)

    def snapshot(self) -> list[metrics_pb2.MonitoringInfo]:
        with self.lock:
            return list(self.infos)


@dataclass(frozen=True)
class ExecutionSettings:
    bundle_size: int
    bundle_bytes: int
    metrics_address: str | None = None
    rebalance_address: str | None = None
    pipeline_options: dict | None = None  # handed to SDK workers through provisioning
    worker_connect_timeout_s: float = 60.0


def _task(
    spec: TaskSpec, shipped: Any, rows: Iterator[tuple], attempt: tuple[int, int, int]
) -> Iterator[tuple]:
    side = shipped.value if shipped is not None else {}
    return run_stage_task(spec, rows, side, attempt)


class Executor:
    """Executes plans on one Datasets (SparkSession).

    Stages are declared in topological order as persisted DataFrames; Spark computes each one
    when something first needs it: a side input being collected, or the final job that gathers
    every stage's metric rows (which also runs the stages nothing else reads, the sinks). One
    Spark action per side input plus one at the end, instead of one per stage: small stages
    cost little, and independent stages run side by side in the same Spark job.
    """

    def __init__(self, datasets: Datasets, settings: ExecutionSettings) -> None:
        self.ds = datasets
        self.settings = settings
        self._partitions: dict[int, int] = {}  # id(buffer DataFrame) -> its partitions
        self.stage_partitions: dict[str, int] = {}  # stage label -> its tasks

    def run(
        self,
        plan: Plan,
        job_id: str,
        progress: Progress,
        cancelled: threading.Event,
        log: Callable[[str], None] = lambda _m: None,
    ) -> None:
        buffers: dict[bytes, list[Any]] = {}
        materialised: dict[bytes, list[bytes]] = {}
        outputs: list[tuple[Stage, Any]] = []
        ctx = pipeline_context(plan.components)
        try:
            with self.ds.job_group(job_id, f"sparkbeam {job_id}"):
                for stage in plan.stages:
                    if cancelled.is_set():
                        raise JobCancelledError(f"{job_id} was cancelled before {stage.label}")
                    log(f"planning {stage.display}")
                    out = self._declare_stage(
                        plan, stage, buffers, materialised, ctx, job_id, cancelled
                    )
                    outputs.append((stage, out))
                log(f"running {len(outputs)} stage(s)")
                self.ds.describe(f"{job_id}: run stages, gather metrics")
                rows = self._act(
                    lambda: self.ds.collect_tag(
                        self.ds.union_tagged([out for _, out in outputs]), METRICS_TAG
                    ),
                    None, job_id, cancelled,
                )
            infos = [metrics_pb2.MonitoringInfo.FromString(value) for _, value in rows]
            progress.add(infos, {key for key, _ in rows if key is not None})
        finally:
            for _, df in outputs:
                self.ds.release(df)

    def _act(
        self,
        action: Callable[[], Any],
        stage: Stage | None,
        job_id: str,
        cancelled: threading.Event,
    ) -> Any:
        """Runs a Spark action; a failure names the stage whose task failed."""
        try:
            return action()
        except Exception as exc:  # noqa: BLE001 - Py4J/Spark errors are mapped below
            if cancelled.is_set():
                raise JobCancelledError(f"{job_id} was cancelled while running") from None
            raise stage_error(stage, exc) from None

    def _declare_stage(
        self,
        plan: Plan,
        stage: Stage,
        buffers: dict[bytes, list[Any]],
        materialised: dict[bytes, list[bytes]],
        ctx: Any,
        job_id: str,
        cancelled: threading.Event,
    ) -> Any:
        inputs = []
        partitions = 0  # how many tasks the stage will have (mapInArrow keeps partitioning)
        for n, inp in enumerate(stage.inputs):
            if inp.buffer_id == IMPULSE_BUFFER:
                df = self.ds.impulse(ENCODED_IMPULSE_VALUE)
                partitions += 1
            else:
                parts = buffers.get(inp.buffer_id, [])
                df = self.ds.union(parts)
                partitions += sum(self._partitions.get(id(part), 1) for part in parts)
            inputs.append(self.ds.as_input(df, n))
        stage_in = self.ds.union(inputs)
        if stage.kind not in _ARRANGE:
            raise ExecutionError(f"{stage.display}: the batch executor has no rule for a "
                                 f"{stage.kind.value} stage")
        arrange = _ARRANGE[stage.kind]
        if arrange is not None:
            stage_in = arrange(self.ds, stage_in)
            partitions = self.ds.parallelism
        shipped = None
        if stage.side_inputs:
            missing = list(dict.fromkeys(
                use.buffer_id for use in stage.side_inputs if use.buffer_id not in materialised))
            if missing:
                # One Spark action for all of the stage's side inputs (WriteToText's finalize
                # reads three): each action costs a job per shuffle under adaptive execution.
                self.ds.describe(f"{job_id}: side inputs for {stage.display}")
                sources = [self.ds.union(buffers.get(b, [])) for b in missing]
                collected = self._act(
                    functools.partial(self.ds.collect_values_of, sources),
                    stage, job_id, cancelled,
                )
                materialised.update(zip(missing, collected, strict=True))
            shipped = self.ds.ship(side_input_state(stage.side_inputs, materialised, ctx))
        spec = TaskSpec(
            stage=stage,
            components=plan.components,
            groupings={i.buffer_id: plan.groupings[i.buffer_id]
                       for i in stage.inputs if i.buffer_id in plan.groupings},
            pickle_library=plan.pickle_library,
            bundle_size=self.settings.bundle_size,
            bundle_bytes=self.settings.bundle_bytes,
            job_id=job_id,
            metrics_address=self.settings.metrics_address,
            rebalance_address=(self.settings.rebalance_address
                               if stage.kind is StageKind.SPLITTABLE else None),
            partitions=max(1, partitions),
            pipeline_options=self.settings.pipeline_options,
            worker_connect_timeout_s=self.settings.worker_connect_timeout_s,
        )
        out = self.ds.map_stage(stage_in, functools.partial(_task, spec, shipped), stage.display)
        for index, output in enumerate(stage.outputs):
            selected = self.ds.select_tag(out, index)
            self._partitions[id(selected)] = max(1, partitions)
            buffers.setdefault(output.buffer_id, []).append(selected)
        self.stage_partitions[stage.label] = max(1, partitions)
        return out
