"""Runs a Plan on Spark, stage by stage, in topological order (the driver side)."""
from __future__ import annotations

import dataclasses
import functools
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from apache_beam.portability.api import metrics_pb2
from apache_beam.runners.common import ENCODED_IMPULSE_VALUE

from sparkbeam.engine.arrow import arrow_rows, encoded_lines
from sparkbeam.engine.context import pipeline_context
from sparkbeam.engine.placement import driver_stages, gathered_once, shuffled_through
from sparkbeam.engine.side_inputs import side_input_state
from sparkbeam.engine.task import METRICS_TAG, TaskSpec, run_stage_task
from sparkbeam.engine.task_errors import stage_error
from sparkbeam.errors import ExecutionError, JobCancelledError
from sparkbeam.execute.dataset import BatchReader, Datasets
from sparkbeam.execute.spark_io import read_buffer, read_query, write_buffer
from sparkbeam.options import DEFAULT_BUNDLE_SIZE, PLAIN_BUNDLE_SIZE
from sparkbeam.plan.model import IMPULSE_BUFFER, Plan, Stage, StageKind
from sparkbeam.plan.packed_rows import packed_tags, session_tags

_LOG = logging.getLogger(__name__)

# How each kind of stage gets its input, given its number of inputs, and how its tasks read it:
# as its producers left it, partitioned by the encoded key (each key in one task, its rows
# together), or dealt round-robin over the partitions (the restrictions of a splittable read).
# A kind without a row is an error.
_ARRANGE: dict[StageKind,
               Callable[[Datasets, Any, int], tuple[Any, BatchReader | None]] | None] = {
    StageKind.PLAIN: None,
    StageKind.GROUPED: Datasets.by_key,
    StageKind.STATEFUL: Datasets.by_key,
    StageKind.STATEFUL_SPLITTABLE: Datasets.by_key,
    StageKind.SPLITTABLE: lambda ds, df, _inputs: (ds.spread(df), None),
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
    bundle_size: int | None  # None: by stage kind (`options.PLAIN_BUNDLE_SIZE`)
    bundle_bytes: int
    metrics_address: str | None = None
    rebalance_address: str | None = None
    pipeline_options: dict | None = None  # handed to SDK workers through provisioning
    worker_connect_timeout_s: float = 60.0
    # The byte and row limits of the Arrow batches stages' Python workers get (None: Spark's
    # own): `plan/arrow_batches.py`.
    arrow_batch_bytes: int | None = None
    arrow_batch_rows: int | None = None


def _task(
    spec: TaskSpec, shipped: Any, rows: Iterable[tuple], attempt: tuple[int, int, int]
) -> Iterator[tuple]:
    side = shipped.value if shipped is not None else {}
    return run_stage_task(spec, rows, side, attempt)


class Executor:
    """Executes plans on one Datasets (SparkSession).

    Stages are declared in topological order as DataFrames; Spark computes each one when
    something first needs it. A stage's output is persisted unless it has one reader: one
    stage, through its shuffle or in the same tasks (`shuffled_through`), or the next action
    alone, when only the driver reads it (`gathered_once`). Spark actions happen only where
    the driver must see data: once for the side inputs a stage reads that no earlier action
    brought back, and once at the end; each action also brings back the metric rows of every
    stage declared so far (and so runs them, side by side where independent), so the end needs
    an action only for stages declared after the last side input. The stages
    `engine/placement.py` picks (impulses in; out, nothing but side inputs and the inputs of
    other such stages: WriteToText's initialisation and finalisation, a singleton computed from
    nothing) run in the driver, on the values it already holds: no Spark job for a step of one
    element.
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
        group: str | None = None,
    ) -> None:
        """Runs `plan` as job `job_id`, its Spark jobs in the job group `group` (the job id
        unless given)."""
        exported = {op.buffer_id for op in plan.spark_writes}
        # Over Connect this process is a client, not Spark's driver.
        on_driver = set() if self.ds.connect else driver_stages(
            plan.stages, exported=exported, kept=plan.kept_in_spark)
        sides = {u.buffer_id for s in plan.stages for u in s.side_inputs}
        run = _Run(plan, job_id, progress, cancelled, pipeline_context(plan.components),
                   on_driver=on_driver,
                   plan_shuffled=shuffled_through(plan.stages, on_driver, exported, sides),
                   plan_once=gathered_once(plan.stages, on_driver, exported), sides=sides)
        try:
            with self.ds.job_group(group or job_id, f"sparkbeam {job_id}"), \
                    self.ds.arrow_batch_limits(self.settings.arrow_batch_bytes,
                                             self.settings.arrow_batch_rows):
                for stage in plan.stages:
                    if cancelled.is_set():
                        raise JobCancelledError(f"{job_id} was cancelled before {stage.label}")
                    side = self._side_inputs(run, stage)
                    spec = self._spec(plan, stage, job_id)
                    if stage.label in run.on_driver:
                        log(f"running {stage.display} in the driver (from an impulse, for "
                            f"side inputs)")
                        self._run_on_driver(run, spec, side)
                    else:
                        log(f"planning {stage.display}")
                        self._declare_stage(run, spec, side)
                if run.pending:
                    log(f"running {len(run.pending)} stage(s)")
                    self.ds.describe(f"{job_id}: run stages, gather metrics")
                    self._gather(run, [], None)
                # Spark writes last: every stage has succeeded (what they read is persisted) before
                # any write commits, so a failing stage leaves no target half-written.
                for op in plan.spark_writes:
                    if cancelled.is_set():
                        raise JobCancelledError(f"{job_id} was cancelled before {op.transform}")
                    target, write = write_buffer(self.ds, op, run.buffers.get(op.buffer_id, []),
                                                 plan.components)
                    log(f"{op.transform}: writing to {target.describe()}")
                    self.ds.describe(f"{job_id}: {op.transform} writes to {target.describe()}")
                    self._act(write, None, run, op.transform)
        finally:
            for df in run.outputs:
                self.ds.release(df)

    def _act(self, action: Callable[[], Any], stage: Stage | None, run: _Run,
             writing: str = "") -> Any:
        """Runs a Spark action; a failure names the stage whose task failed (or the
        WriteToSpark, `writing`, whose write did)."""
        try:
            return action()
        except Exception as exc:  # noqa: BLE001 - Py4J/Spark errors are mapped below
            if run.cancelled.is_set():
                raise JobCancelledError(f"{run.job_id} was cancelled while running") from None
            raise stage_error(stage, exc, writing) from None

    def _gather(self, run: _Run, sides: list[Any], stage: Stage | None) -> list[list[bytes]]:
        """One action: the side-input buffers' values, and the metric rows of every stage
        declared since the last action (recorded as committed), with the side inputs among
        the outputs of those stages read only here (`gathered_once`; materialised)."""
        outs = [(out, tuple(read_here)) for out, read_here in run.pending]
        values, metric_rows, out_values = self._act(
            functools.partial(self.ds.gather, sides, outs, METRICS_TAG), stage, run)
        for (_, read_here), by_tag in zip(run.pending, out_values, strict=True):
            for tag, buffer_id in read_here.items():
                run.materialised[buffer_id] = by_tag[tag]
        run.pending.clear()
        run.record(metric_rows)
        return values  # type: ignore[no-any-return]

    def _side_inputs(self, run: _Run, stage: Stage) -> dict[Any, Any] | None:
        """The side-input state of `stage`, collecting the buffers no earlier action or
        driver-run stage brought back (all of them in one action)."""
        if not stage.side_inputs:
            return None
        missing = list(dict.fromkeys(
            use.buffer_id for use in stage.side_inputs if use.buffer_id not in run.materialised))
        if missing:
            self.ds.describe(f"{run.job_id}: side inputs for {stage.display}")
            # Those of a stage read only by this action come with its metric rows.
            coming = {b for _, read_here in run.pending for b in read_here.values()}
            fetch = [b for b in missing if b not in coming]
            sources = [self.ds.union(run.buffers.get(b, [])) for b in fetch]
            collected = self._gather(run, sources, stage)
            run.materialised.update(zip(fetch, collected, strict=True))
        return side_input_state(stage.side_inputs, run.materialised, run.ctx)

    def _run_on_driver(self, run: _Run, spec: TaskSpec, side: dict[Any, Any] | None) -> None:
        stage = spec.stage
        if spec.packed_tags or spec.counted_tags or spec.session_tags:  # values, not keys
            raise ExecutionError(f"{stage.display}: planned to run in the driver, but its "
                                 "output is packed for a keyed reader")
        rows = [(n, None, value) for n, i in enumerate(stage.inputs)
                for value in ([ENCODED_IMPULSE_VALUE] if i.buffer_id == IMPULSE_BUFFER
                              else run.materialised[i.buffer_id])]
        values: dict[bytes, list[bytes]] = {
            o.buffer_id: run.materialised.get(o.buffer_id, []) for o in stage.outputs}
        metric_rows: list[tuple[bytes | None, bytes]] = []
        try:
            # As Arrow columns, as a task gets them: its functions may then run directly.
            for tag, key, value in run_stage_task(spec, arrow_rows(rows), side or {},
                                                  DRIVER_ATTEMPT):
                if tag == METRICS_TAG:
                    metric_rows.append((key, bytes(value)))
                else:
                    values[stage.outputs[tag].buffer_id].append(bytes(value))
        except Exception as exc:  # noqa: BLE001 - reported like a failed task of the stage
            if run.cancelled.is_set():
                raise JobCancelledError(f"{run.job_id} was cancelled while running") from None
            raise stage_error(stage, exc) from None
        run.materialised.update(values)
        run.record(metric_rows)
        self.stage_partitions[stage.label] = 1

    def _spec(self, plan: Plan, stage: Stage, job_id: str) -> TaskSpec:
        packed, counted = packed_tags(plan, stage)
        return TaskSpec(
            packed_tags=packed,
            counted_tags=counted,
            session_tags=session_tags(plan, stage),
            stage=stage,
            components=plan.components,
            groupings={i.buffer_id: plan.groupings[i.buffer_id]
                       for i in stage.inputs if i.buffer_id in plan.groupings},
            pickle_library=plan.pickle_library,
            bundle_size=self.settings.bundle_size or (
                PLAIN_BUNDLE_SIZE if stage.kind is StageKind.PLAIN else DEFAULT_BUNDLE_SIZE),
            bundle_bytes=self.settings.bundle_bytes,
            file_records=self.settings.bundle_size or PLAIN_BUNDLE_SIZE,
            job_id=job_id,
            metrics_address=self.settings.metrics_address,
            rebalance_address=(self.settings.rebalance_address
                               if stage.kind is StageKind.SPLITTABLE else None),
            pipeline_options=self.settings.pipeline_options,
            worker_connect_timeout_s=self.settings.worker_connect_timeout_s,
        )

    def _declare_stage(self, run: _Run, spec: TaskSpec, side: dict[Any, Any] | None) -> None:
        stage = spec.stage
        inputs = []
        partitions = 0  # how many tasks the stage will have (mapInArrow keeps partitioning)
        prepare = None
        # A stage's one input, where nothing arranges it: its tasks may read a query's rows.
        only = (stage.inputs[0] if len(stage.inputs) == 1 and stage.kind in _ARRANGE
                and _ARRANGE[stage.kind] is None else None)
        if only is not None and only.buffer_id in run.plan.spark_reads:
            # The query's rows encoded by the stage's own tasks, as they read them.
            stage_in, prepare = read_query(self.ds, run.plan.spark_reads[only.buffer_id],
                                           only.coder_id, run.plan.components)
            partitions = self.ds.parallelism  # a guess: the query decides
        elif only is not None and only.buffer_id in run.plan.text_reads:
            # Spark's lines made elements by the stage's own tasks, as they read them: the
            # encoding as Spark expressions cost the driver more than the tasks (ANALYSIS).
            read = run.plan.text_reads[only.buffer_id]
            if read.files:
                stage_in, prepare = self.ds.raw_lines(list(read.files)), encoded_lines(
                    read.prefix)
                partitions = self.ds.file_partitions(read.sizes)
        for n, inp in enumerate(() if prepare is not None else stage.inputs):
            if inp.buffer_id == IMPULSE_BUFFER:
                df = self.ds.impulse(ENCODED_IMPULSE_VALUE)
                partitions += 1
            elif inp.buffer_id in run.plan.spark_reads:
                df = read_buffer(self.ds, run.plan.spark_reads[inp.buffer_id], inp.coder_id,
                                 run.plan.components)
                partitions += self.ds.parallelism  # a guess: the query decides
            elif inp.buffer_id in run.plan.text_reads:
                read = run.plan.text_reads[inp.buffer_id]
                df = self.ds.text_lines(list(read.files), read.prefix)
                partitions += self.ds.file_partitions(read.sizes)
            elif inp.buffer_id in run.shuffled:
                # The producer's whole output, its metric rows as input -1 (forwarded).
                out, partitions_in = run.shuffled[inp.buffer_id]
                inputs.append(self.ds.with_metric_rows(out, 0, n, METRICS_TAG))
                partitions += partitions_in
                spec = dataclasses.replace(spec, forwards_metrics=True)
                continue
            else:
                parts = run.buffers.get(inp.buffer_id, [])
                df = self.ds.union(parts)
                partitions += sum(self._partitions.get(id(part), 1) for part in parts)
            inputs.append(self.ds.as_input(df, n))
        if prepare is None:
            stage_in = self.ds.union(inputs)
        if stage.kind not in _ARRANGE:
            raise ExecutionError(f"{stage.display}: the batch executor has no rule for a "
                                 f"{stage.kind.value} stage")
        arrange = _ARRANGE[stage.kind]
        if arrange is not None:
            # A stage that is arranged reads no query, so `prepare` was None until here.
            stage_in, prepare = arrange(self.ds, stage_in, len(stage.inputs))
            partitions = self.ds.parallelism
        shipped = self.ds.ship(side) if side is not None else None
        spec = dataclasses.replace(spec, partitions=max(1, partitions))
        into_shuffle = [o.buffer_id for o in stage.outputs if o.buffer_id in run.plan_shuffled]
        once = stage.label in run.plan_once
        out = self.ds.map_stage(stage_in, functools.partial(_task, spec, shipped), stage.display,
                                prepare, persist=not (into_shuffle or once))
        self.stage_partitions[stage.label] = max(1, partitions)
        if into_shuffle:  # read once, by its one consumer (`shuffled_through`)
            run.shuffled[into_shuffle[0]] = (out, max(1, partitions))
            return
        if once:  # read once, by the next action (`gathered_once`)
            run.pending.append((out, {index: o.buffer_id for index, o in enumerate(stage.outputs)
                                      if o.buffer_id in run.sides}))
            return
        for index, output in enumerate(stage.outputs):
            selected = self.ds.select_tag(out, index)
            self._partitions[id(selected)] = max(1, partitions)
            run.buffers.setdefault(output.buffer_id, []).append(selected)
        run.outputs.append(out)
        run.pending.append((out, {}))


# The attempt key of a stage run in the driver: no Spark stage, one partition, first attempt.
DRIVER_ATTEMPT = (-1, 0, 0)


@dataclass
class _Run:
    """One run of a plan: the buffers declared so far and what the driver holds."""

    plan: Plan
    job_id: str
    progress: Progress
    cancelled: threading.Event
    ctx: Any
    buffers: dict[bytes, list[Any]] = field(default_factory=dict)  # buffer -> DataFrames
    materialised: dict[bytes, list[bytes]] = field(default_factory=dict)  # in the driver
    outputs: list[Any] = field(default_factory=list)  # persisted outputs, released at end
    # Outputs whose metric rows are not in yet, each with the side inputs among its outputs
    # that only the next action reads (by tag; a `gathered_once` stage's, else none).
    pending: list[tuple[Any, dict[int, bytes]]] = field(default_factory=list)
    on_driver: set[str] = field(default_factory=set)  # labels of the stages run here
    # Buffers only one stage reads, through its shuffle or in its tasks (`shuffled_through`),
    # and, once declared, their producer's unpersisted output with its partition count.
    plan_shuffled: set[bytes] = field(default_factory=set)
    shuffled: dict[bytes, tuple[Any, int]] = field(default_factory=dict)
    plan_once: set[str] = field(default_factory=set)  # stages only the next action reads
    sides: set[bytes] = field(default_factory=set)  # every buffer read as a side input

    def record(self, metric_rows: list[tuple[bytes | None, bytes]]) -> None:
        infos = [metrics_pb2.MonitoringInfo.FromString(value) for _, value in metric_rows]
        self.progress.add(infos, {key for key, _ in metric_rows if key is not None})
