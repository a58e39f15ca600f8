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

from sparkbeam.errors import ExecutionError, JobCancelledError, UserCodeError
from sparkbeam.execute import worker_context
from sparkbeam.execute.dataset import Datasets
from sparkbeam.execute.side_inputs import side_input_state
from sparkbeam.execute.stage_task import (
    METRICS_TAG,
    TaskSpec,
    parse_error_payload,
    run_stage_task,
)
from sparkbeam.plan.model import IMPULSE_BUFFER, Plan, Stage

_LOG = logging.getLogger(__name__)


@dataclass
class Progress:
    """What a running job has done so far; read by the result and the job service."""

    stages_done: int = 0
    stages_total: int = 0
    current: str = ""
    infos: list[metrics_pb2.MonitoringInfo] = field(default_factory=list)
    committed_attempts: set[bytes] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, infos: list[metrics_pb2.MonitoringInfo], attempts: set[bytes]) -> None:
        with self.lock:
            self.infos.extend(infos)
            self.committed_attempts |= attempts
            self.stages_done += 1

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


def _task(
    spec: TaskSpec, shipped: Any, rows: Iterator[tuple], attempt: tuple[int, int, int]
) -> Iterator[tuple]:
    side = shipped.value if shipped is not None else {}
    return run_stage_task(spec, rows, side, attempt)


class Executor:
    """Executes plans on one Datasets (SparkSession)."""

    def __init__(self, datasets: Datasets, settings: ExecutionSettings) -> None:
        self.ds = datasets
        self.settings = settings

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
        persisted: list[Any] = []
        progress.stages_total = len(plan.stages)
        ctx = worker_context.pipeline_context(plan.components)
        try:
            with self.ds.job_group(job_id, f"sparkbeam {job_id}"):
                for stage in plan.stages:
                    if cancelled.is_set():
                        raise JobCancelledError(f"{job_id} was cancelled before {stage.label}")
                    progress.current = stage.display
                    log(f"running {stage.display}")
                    out = self._run_stage(plan, stage, buffers, materialised, ctx, job_id,
                                          progress, cancelled)
                    persisted.append(out)
        finally:
            for df in persisted:
                self.ds.release(df)

    def _run_stage(
        self,
        plan: Plan,
        stage: Stage,
        buffers: dict[bytes, list[Any]],
        materialised: dict[bytes, list[bytes]],
        ctx: Any,
        job_id: str,
        progress: Progress,
        cancelled: threading.Event,
    ) -> Any:
        inputs = []
        for n, inp in enumerate(stage.inputs):
            if inp.buffer_id == IMPULSE_BUFFER:
                df = self.ds.impulse(ENCODED_IMPULSE_VALUE)
            else:
                df = self.ds.union(buffers.get(inp.buffer_id, []))
            inputs.append(self.ds.as_input(df, n))
        stage_in = self.ds.union(inputs)
        if stage.keyed_input:
            stage_in = self.ds.by_key(stage_in)
        elif stage.splittable:
            stage_in = self.ds.spread(stage_in)
        shipped = None
        if stage.side_inputs:
            for use in stage.side_inputs:
                if use.buffer_id not in materialised:
                    materialised[use.buffer_id] = self.ds.collect_values(
                        self.ds.union(buffers.get(use.buffer_id, []))
                    )
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
        )
        out = self.ds.map_stage(stage_in, functools.partial(_task, spec, shipped))
        self.ds.describe(f"{job_id} {stage.display}")
        try:
            rows = self.ds.collect_tag(out, METRICS_TAG)
            infos = [metrics_pb2.MonitoringInfo.FromString(value) for _, value in rows]
            attempts = {key for key, _ in rows if key is not None}
        except Exception as exc:  # noqa: BLE001 - Py4J/Spark errors are mapped below
            if cancelled.is_set():
                raise JobCancelledError(f"{job_id} was cancelled during {stage.label}") from None
            raise _stage_error(stage, exc) from None
        progress.add(infos, attempts)
        for index, output in enumerate(stage.outputs):
            buffers.setdefault(output.buffer_id, []).append(self.ds.select_tag(out, index))
        return out


def _stage_error(stage: Stage, exc: BaseException) -> Exception:
    text = str(exc)
    payload = parse_error_payload(text)
    if payload is not None:
        return UserCodeError(
            stage=payload["stage"],
            transform=payload["transform"],
            exc_type=payload["type"],
            exc_message=payload["message"],
            user_traceback=payload["traceback"],
        )
    lines = [ln for ln in text.splitlines() if ln.strip()]
    summary = "\n".join(lines[:3] + (["..."] if len(lines) > 6 else []) + lines[-3:])
    return ExecutionError(f"Spark failed to run {stage.display}: {type(exc).__name__}: {summary}")
