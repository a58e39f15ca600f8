"""A streaming plan as one Structured Streaming query on the RocksDB state store (driver).

Roots -> one `sparkbeam_beam` source; stateless stages -> `mapInArrow` with the batch stage
task; GroupByKeys -> `transformWithState` (Append, ProcessingTime) feeding their consumers in
the same micro-batch; stages with side inputs -> `transformWithState` holding main-input elements
until their side inputs are ready (`sides.py`); splittable stages -> `transformWithState`
keeping residual restrictions until they may resume (`splittable.py`). The sink runs every leaf
stage each batch. The query ends when every endpoint is exhausted (or the job is drained) and no
stage holds work back, and the batches after that have run; or when cancelled.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sparkbeam.engine.task import TaskSpec
from sparkbeam.engine.task_errors import stage_error
from sparkbeam.errors import ExecutionError, JobCancelledError
from sparkbeam.plan.model import Stage, StageKind
from sparkbeam.streaming.beam_source import BeamSource, encode
from sparkbeam.streaming.buckets import bucket_count
from sparkbeam.streaming.checkpoint import (
    CheckpointLayout,
    FileHoldStore,
    OffsetLogClock,
    SideStore,
    anything_waiting,
    read_offset_entry,
)
from sparkbeam.streaming.operators import (
    ROW_SCHEMA,
    GroupByKeyProcessor,
    SideInputStageProcessor,
    SideWriter,
    SplittableSideInputProcessor,
    SplittableStageProcessor,
    StageTask,
    StatefulSideInputProcessor,
    StatefulStageProcessor,
)
from sparkbeam.streaming.plan import StreamingPlan, grouping_hold_label
from sparkbeam.streaming.script import MAX_MICROS
from sparkbeam.streaming.shell import Bindable, ProcessorShell
from sparkbeam.streaming.sides import SideCompactor
from sparkbeam.streaming.spark_streams import stream_reads
from sparkbeam.streaming.spark_writes import flush_spark_writes, spark_stream_writes
from sparkbeam.streaming.splittable import spread_endpoints
from sparkbeam.streaming.staged_writes import flush_staged, query_id, staged_writes

_LOG = logging.getLogger(__name__)
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


@dataclasses.dataclass(frozen=True)
class StreamingSettings:
    checkpoint_dir: str
    trigger_interval: str = "0 seconds"
    bundle_size: int = 1000
    bundle_bytes: int = 64 << 20
    metrics_address: str | None = None
    job_id: str = "job"
    extra_batches: int = 1  # batches run after the one that reached the final watermark
    partitions: int | None = None  # --parallelism: keyed stages' spread keys and buckets
    # The stateful operators' partitions when --parallelism is not given: the job's default
    # parallelism (a local master's cores), not the session's spark.sql.shuffle.partitions.
    default_partitions: int | None = None
    max_items_per_batch: int | None = None  # the work budget (`admission.py`)
    max_bytes_per_batch: int | None = None


def build_query_frame(spark: SparkSession, splan: StreamingPlan,
                      settings: StreamingSettings) -> DataFrame:
    """The DataFrame every micro-batch computes: the union of the leaf stages' outputs."""
    spark.dataSource.register(BeamSource)
    layout = CheckpointLayout(settings.checkpoint_dir)
    reader = (spark.readStream.format("sparkbeam_beam")
              .option("script", encode(splan.script))
              .option("drain_marker", layout.drain_marker))
    for name in ("max_items_per_batch", "max_bytes_per_batch"):
        if getattr(settings, name):
            reader = reader.option(name, str(getattr(settings, name)))
    streams = stream_reads(spark, splan, layout, settings.max_items_per_batch,
                           settings.max_bytes_per_batch)
    if streams:
        reader = reader.option("spark_streams", "\n".join(
            rows.clock.as_text() for rows, _ in streams.values()))
    splittable = [e for s in splan.stages if s.kind is StageKind.SPLITTABLE
                  for e in spread_endpoints(s.label, settings.partitions or 2)]
    if splittable:
        reader = reader.option("splittable_endpoints", ",".join(splittable))
    source = reader.load()
    plan = splan.plan
    producers: dict[int, list[DataFrame]] = {}
    root_tags = {row[0] for e in splan.script.endpoints for item in e.items for row in item.rows}
    for tag in sorted(root_tags):
        producers[tag] = [source.where(F.col("tag") == tag)]
    for tag, (rows, frame) in streams.items():
        producers[tag] = [frame.mapInArrow(rows, ROW_SCHEMA)]
    consumed = {i.buffer_id for s in splan.stages for i in s.inputs}
    consumed |= {u.buffer_id for s in splan.stages for u in s.side_inputs}
    consumed |= {w.buffer_id for w in plan.kafka_writes + plan.spark_writes}
    readers = _readers(splan)
    # The sparkbeam source plans every batch (the runner's time) even when no root reads it.
    leaves = [] if root_tags else [source.where(F.col("tag") == -1)]
    for stage in splan.stages:
        inputs = []
        for inp in stage.inputs:
            tag = splan.tag(inp.buffer_id)
            frames = producers.get(tag, [])
            if not frames:
                continue
            frame = _union(frames)
            grouping = plan.groupings.get(inp.buffer_id)
            if grouping is not None:
                label = grouping_hold_label(tag)
                processor = GroupByKeyProcessor(grouping, plan.components, plan.pickle_library,
                                                tag, settings.checkpoint_dir,
                                                splan.holds_of([inp.buffer_id]),
                                                label if label in splan.holding else None)
                frame = _keyed(frame, settings, processor)
            inputs.append(frame)
        if not inputs:
            continue  # nothing ever reaches this stage
        task = StageTask(
            spec=_spec(stage, splan, settings),
            input_tags={splan.tag(i.buffer_id): n for n, i in enumerate(stage.inputs)},
            output_tags=tuple(splan.tag(o.buffer_id) for o in stage.outputs),
        )
        row = (stage.kind, bool(stage.side_inputs))
        if row not in _OPERATORS:
            raise ExecutionError(f"{stage.display}: no streaming operator for a "
                                 f"{stage.kind.value} stage (Prepare should have refused it)")
        out = _OPERATORS[row](_union(inputs), task, stage, splan, settings)
        shared = sum(readers[o.buffer_id] for o in stage.outputs) > 1
        if shared:
            # Read by several consumers: each would compute the stage again in every micro-batch
            # (its user code too). An exchange that Spark reuses makes it one computation: the
            # consumers read the same shuffle (`spark.sql.exchange.reuse`). Hashed by the
            # element: round robin would sort each task's rows first, to be deterministic.
            out = out.repartition(settings.partitions or 2, "value")
        for output in stage.outputs:
            tag = splan.tag(output.buffer_id)
            producers.setdefault(tag, []).append(out.where(_tag_is(tag, above=shared)))
        if not any(o.buffer_id in consumed for o in stage.outputs):
            leaves.append(out)
    for n, write in enumerate(plan.kafka_writes):
        # An exactly-once write's input, staged until its micro-batch commits (`staged_writes`).
        # First in the union, so its partition numbers (which name the transactional ids) do
        # not shift with the other leaves' partition counts.
        frames = producers.get(splan.tag(write.buffer_id), [])
        if frames:
            leaves.insert(n, _union(frames).mapInArrow(SideWriter(layout.staged_dir(n)),
                                                       ROW_SCHEMA))
    for n, write in enumerate(plan.spark_writes):
        # A WriteToSpark's input, staged until its micro-batch commits (`spark_writes.py`).
        frames = producers.get(splan.tag(write.buffer_id), [])
        if frames:
            leaves.append(_union(frames).mapInArrow(SideWriter(layout.spark_staged_dir(n)),
                                                    ROW_SCHEMA))
    for tag in sorted(splan.side_tags):
        # Each batch's side-input elements, for the batches after it.
        writer = SideWriter(layout.side_dir(tag))
        leaves.append(_union(producers[tag]).mapInArrow(writer, ROW_SCHEMA))
    if not leaves:
        return source
    return _union(leaves)


def _tag_is(tag: int, above: bool) -> Any:
    """The condition that selects one output's rows. `above` a shared exchange it is one
    nondeterministic expression (the partition id, always >= 0, guards it): Catalyst pushes a
    deterministic filter, or each deterministic conjunct of one, below the exchange into each
    consumer's copy, which then no longer match and are not reused."""
    condition = F.col("tag") == tag
    if not above:
        return condition
    return F.when(F.spark_partition_id() >= 0, condition).otherwise(F.lit(False))


def _readers(splan: StreamingPlan) -> collections.Counter[bytes]:
    """How many parts of the query read each buffer: stage inputs, its side-input writer,
    Kafka and Spark writes (as `build_query_frame` unions them)."""
    plan = splan.plan
    readers = collections.Counter(i.buffer_id for s in splan.stages for i in s.inputs)
    readers.update(w.buffer_id for w in plan.kafka_writes + plan.spark_writes)
    side_tags = splan.side_tags
    readers.update({o.buffer_id for s in splan.stages for o in s.outputs
                    if splan.tag(o.buffer_id) in side_tags})
    return readers


def _stateless(frame: DataFrame, task: StageTask, stage: Stage, splan: StreamingPlan,
               settings: StreamingSettings) -> DataFrame:
    return frame.mapInArrow(_named(task, stage), ROW_SCHEMA)


def _spread(frame: DataFrame, settings: StreamingSettings) -> Any:
    """The rows keyed by a spread key: the hash of the element modulo --parallelism."""
    spread = F.pmod(F.xxhash64("value"), F.lit(settings.partitions or 2))
    key = spread.cast(T.StringType()).cast(T.BinaryType())
    return frame.withColumn("key", key).groupBy("key")


def _bucketed(frame: DataFrame, settings: StreamingSettings) -> Any:
    """The rows grouped by a bucket of their Beam key (`buckets.py`): Spark's per-key calls are
    paid per bucket, not per key."""
    bucket = F.pmod(F.xxhash64("key"), F.lit(bucket_count(settings.partitions or 2)))
    return frame.withColumn("bucket", bucket.cast(T.IntegerType())).groupBy("bucket")


def _keyed(frame: DataFrame, settings: StreamingSettings, processor: Bindable) -> DataFrame:
    """`processor` over `frame` in `transformWithState`, the rows grouped as it keys its state
    (buckets of Beam keys, or spread keys)."""
    grouped = (_bucketed if processor.bucketed else _spread)(frame, settings)
    return grouped.transformWithState(ProcessorShell(processor), ROW_SCHEMA, "Append",
                                      "ProcessingTime")


def _input_holds(stage: Stage, splan: StreamingPlan) -> tuple[str, ...]:
    return splan.holds_of([i.buffer_id for i in stage.inputs])


def _waiting_for_sides(frame: DataFrame, task: StageTask, stage: Stage, splan: StreamingPlan,
                       settings: StreamingSettings) -> DataFrame:
    # Main-input elements wait for their side inputs in the state of a spread key.
    return _keyed(frame, settings, SideInputStageProcessor(task, splan.sides[stage.label],
                                                           settings.checkpoint_dir))


def _splittable(frame: DataFrame, task: StageTask, stage: Stage, splan: StreamingPlan,
                settings: StreamingSettings) -> DataFrame:
    # Restrictions and their residuals live in the state of a spread key.
    return _keyed(frame, settings, SplittableStageProcessor(
        task, settings.checkpoint_dir, _input_holds(stage, splan)))


def _splittable_with_sides(frame: DataFrame, task: StageTask, stage: Stage,
                           splan: StreamingPlan, settings: StreamingSettings) -> DataFrame:
    # As `_splittable`; its restrictions read the side inputs (its elements waited for them
    # in the stage before, which reads them too).
    return _keyed(frame, settings, SplittableSideInputProcessor(
        task, splan.sides[stage.label], settings.checkpoint_dir, _input_holds(stage, splan)))


def _stateful(frame: DataFrame, task: StageTask, stage: Stage, splan: StreamingPlan,
              settings: StreamingSettings) -> DataFrame:
    # User state and timers: the stage runs per key in transformWithState.
    return _keyed(frame, settings, StatefulStageProcessor(
        task, settings.checkpoint_dir, _input_holds(stage, splan)))


def _stateful_with_sides(frame: DataFrame, task: StageTask, stage: Stage,
                         splan: StreamingPlan, settings: StreamingSettings) -> DataFrame:
    # User state and timers per key; main-input elements wait in the key's state for their
    # side inputs.
    return _keyed(frame, settings, StatefulSideInputProcessor(
        task, splan.sides[stage.label], settings.checkpoint_dir, _input_holds(stage, splan)))


# The operator of each (stage kind, reads side inputs): the rows of `plan.check`'s
# STREAMING_STAGES (a test keeps the two tables equal). GroupByKeys feeding a stage run before
# it (`transformWithState` in `build_query_frame`), so a GROUPED stage reads panes.
_OPERATORS: dict[tuple[StageKind, bool], Callable[..., DataFrame]] = {
    (StageKind.PLAIN, False): _stateless,
    (StageKind.GROUPED, False): _stateless,
    (StageKind.PLAIN, True): _waiting_for_sides,
    (StageKind.GROUPED, True): _waiting_for_sides,
    (StageKind.STATEFUL, False): _stateful,
    (StageKind.STATEFUL, True): _stateful_with_sides,
    (StageKind.SPLITTABLE, False): _splittable,
    (StageKind.SPLITTABLE, True): _splittable_with_sides,
}


def _spec(stage: Stage, splan: StreamingPlan, settings: StreamingSettings) -> TaskSpec:
    # Grouped inputs arrive grouped (panes from transformWithState): the stage runs them as a
    # plain stage.
    plain = dataclasses.replace(
        stage, kind=StageKind.PLAIN if stage.kind is StageKind.GROUPED else stage.kind)
    return TaskSpec(
        stage=plain,
        components=splan.plan.components,
        groupings={},
        pickle_library=splan.plan.pickle_library,
        bundle_size=settings.bundle_size,
        bundle_bytes=settings.bundle_bytes,
        job_id=settings.job_id,
        metrics_address=settings.metrics_address,
    )


def _named(task: StageTask, stage: Stage) -> Callable[..., Any]:
    """The task as a function named after the stage (the Spark UI's SQL tab shows the name)."""

    def run(batches: Any) -> Any:
        return task(batches)

    run.__name__ = run.__qualname__ = stage.label.replace("-", "_")
    return run


def _union(frames: list[DataFrame]) -> DataFrame:
    out = frames[0]
    for frame in frames[1:]:
        out = out.unionByName(frame)
    return out


class StreamingQueryRun:
    """Starts the query, watches it, stops it when the job is done or cancelled."""

    def __init__(self, spark: SparkSession, splan: StreamingPlan, settings: StreamingSettings,
                 log: Callable[[str], None]) -> None:
        self.spark = spark
        self.splan = splan
        # Side-input stages release what waited for the final watermark in later batches.
        self.settings = dataclasses.replace(
            settings, extra_batches=max(settings.extra_batches, splan.extra_batches))
        self.log = log
        self.batches = 0
        self._final_batch: int | None = None
        self._finished = threading.Event()
        self.layout = CheckpointLayout(settings.checkpoint_dir)
        self._holds = FileHoldStore(self.layout)
        self.query: Any = None
        self.progress: list[dict[str, Any]] = []  # per micro-batch: rows and durations
        self.throttle_ms: dict[str, int] = {}  # endpoint -> ms held back by the work budget
        self._admitted: dict[int, dict[str, int]] = {}  # batch -> items, bytes (budgeted)
        self._writes = staged_writes(self.layout, splan.plan.kafka_writes,
                                     splan.plan.components)
        self._spark_writes = spark_stream_writes(self.layout, splan.plan.spark_writes,
                                                 splan.plan.components)
        self._query_id: str | None = None
        self._clock: OffsetLogClock | None = None
        self._compactor = (SideCompactor(splan.sides, splan.plan.components,
                                         SideStore(self.layout), self._runner_watermark,
                                         self._holds)
                           if splan.sides else None)

    def _wait_for_commit(self, batch: int, timeout_s: float) -> None:
        _wait_until(lambda: os.path.exists(self.layout.commit_file(batch)), timeout_s, 0.05)

    def _wait_for_progress(self, batch: int, timeout_s: float) -> None:
        """Spark reports a batch's progress after its commit: the last batch's is waited for,
        so `streaming_batches` lists every batch the job ran."""
        def reported() -> bool:
            last = self.query.lastProgress
            return last is not None and last.batchId >= batch

        _wait_until(reported, timeout_s, 0.02)

    def _flush_committed(self) -> None:
        """Writes out what the committed batches staged (the query has stopped)."""
        if self._writes or self._spark_writes:
            self._flush(self.spark, self.layout.last_commit() + 1)

    def _flush(self, spark: SparkSession, before_batch: int) -> None:
        """Writes out what committed micro-batches staged for exactly-once writes."""
        if not (self._writes or self._spark_writes):
            return
        if self._query_id is None:  # Spark wrote it when the query started; it never changes
            self._query_id = query_id(self.layout)
        if flush_staged(spark, self._writes, self._query_id, before_batch):
            _LOG.debug("%s: staged writes before batch %s written", self.settings.job_id,
                       before_batch)
        flush_spark_writes(spark, self._spark_writes, self._query_id, before_batch)

    def _runner_watermark(self, batch: int) -> int:
        """The runner's watermark at the start of `batch` (its offset)."""
        if self._clock is None:
            self._clock = OffsetLogClock(self.layout)
        return self._clock.of_batch(batch).watermark_before

    def _sink(self, frame: DataFrame, batch_id: int) -> None:
        frame.write.format("noop").mode("overwrite").save()
        # This batch is not committed yet; every batch before it is.
        self._flush(frame.sparkSession, batch_id)
        if self._compactor is not None:  # this batch's tasks have read the side inputs
            self._compactor.compact(batch_id)
        self.batches = batch_id + 1
        entry = read_offset_entry(self.layout.offset_file(batch_id))
        offset = entry.offset if entry is not None else {}
        if "admitted" in offset:
            self.throttle_ms = dict(offset["throttle"])
            self._admitted[batch_id] = dict(offset["admitted"])
        if offset.get("done") and self._final_batch is None and (
            self._holds.hold(self.splan.holding, batch_id) >= MAX_MICROS
        ):
            # Inputs exhausted (or drained) and no stage holds work back.
            self._final_batch = batch_id
        if self._final_batch is not None and (
            batch_id >= self._final_batch + self.settings.extra_batches
            or self._settled(batch_id)
        ):
            self._finished.set()

    def _settled(self, batch: int) -> bool:
        """Past the end of input, nothing can happen after `batch`: no key of any keyed stage
        still waits (each batch past the end runs every waiting key at the final watermark,
        and its outputs reach the stages downstream in the same batch). Jobs with holding
        stages or side inputs keep their extra batches: what those release, or a side input
        written in this batch, is seen only in the next."""
        return (not self.splan.holding and not self.splan.sides
                and not anything_waiting(self.layout, batch))

    def run(self, cancelled: threading.Event, drain: threading.Event | None = None) -> None:
        self.spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
        frame = build_query_frame(self.spark, self.splan, self.settings)
        writer = (
            frame.writeStream.foreachBatch(self._sink)
            .outputMode("append")
            .option("checkpointLocation", self.settings.checkpoint_dir)
            .queryName(f"sparkbeam_{self.settings.job_id}".replace("-", "_"))
            .trigger(processingTime=self.settings.trigger_interval)
        )
        # The query's stateful operators keep this many partitions for its whole life (Spark
        # records it in the checkpoint and restores it on restart): --parallelism, else the
        # job's default parallelism, never the session's spark.sql.shuffle.partitions (200
        # unless set; sparkbeam's sessions 8). Every partition's task costs each micro-batch
        # its state store's commit and a Python round trip, input or not (~150-250 ms): 8
        # on two cores made an idle micro-batch ~1.2 s, 2 ~0.7 s. The buckets' count, which
        # must not move, stays --parallelism's (`buckets.py`).
        previous = self.spark.conf.get("spark.sql.shuffle.partitions") or "200"
        partitions = self.settings.partitions or self.settings.default_partitions
        if partitions:
            self.spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
        try:
            self.query = writer.start()
        finally:
            self.spark.conf.set("spark.sql.shuffle.partitions", previous)
        self.log(f"{self.settings.job_id}: streaming query started "
                 f"(checkpoint {self.settings.checkpoint_dir})")
        try:
            marked = False
            while not self._finished.wait(0.2):
                if cancelled.is_set():
                    raise JobCancelledError(f"{self.settings.job_id} was cancelled")
                if drain is not None and drain.is_set() and not marked:
                    with open(self.layout.drain_marker, "w") as f:
                        f.write(self.settings.job_id)
                    marked = True
                    self.log(f"{self.settings.job_id}: draining (no more input; the watermark "
                             "goes to its end)")
                exc = self.query.exception()
                if exc is not None:
                    raise stage_error(None, exc)
                if not self.query.isActive:
                    raise ExecutionError("the streaming query stopped unexpectedly")
            # The last batch's commit follows its sink: wait for it, so that what it staged
            # is written now (a batch the stop interrupts stays staged for a resume).
            if self._writes or self._spark_writes:
                self._wait_for_commit(self.batches - 1, timeout_s=30)
            self._wait_for_progress(self.batches - 1, timeout_s=10)
            self.query.stop()
            self._flush_committed()
        except JobCancelledError:
            with _suppress():
                self.query.stop()
                self._flush_committed()  # what committed batches staged, as at least once
            raise
        finally:
            with _suppress():
                self.query.stop()
            with _suppress():
                self.progress = [
                    {"batch": p.batchId, "rows": p.numInputRows, "ms": dict(p.durationMs),
                     "timestamp": p.timestamp} | (
                         {"admitted": self._admitted[p.batchId]}
                         if p.batchId in self._admitted else {})
                    for p in self.query.recentProgress
                ]
        self.log(f"{self.settings.job_id}: streaming query finished after {self.batches} "
                 f"micro-batches")


class _suppress:  # noqa: N801 - used as a statement
    """Logs, never raises: stopping a query that already failed must not hide the failure."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> bool:
        if exc[1] is not None:
            _LOG.warning("stopping the streaming query: %s", exc[1])
        return True


def _wait_until(done: Callable[[], bool], timeout_s: float, interval_s: float) -> None:
    """Polls `done` every `interval_s` until it holds or `timeout_s` has passed."""
    deadline = time.monotonic() + timeout_s
    while not done() and time.monotonic() < deadline:
        time.sleep(interval_s)
