"""What one Spark task of a stage does: stream its partition through the bundle processor.

Runs in the Spark Python worker and imports no pyspark: it is a function of (stage, input rows,
shipped side inputs) -> output rows, so the streaming engine can reuse it.

Rows are (input index, key, value): `value` is one element encoded in the nested context,
`key` its encoded key where a keyed consumer needs it. A keyed stage receives its rows sorted by
key; it groups GroupByKey inputs key by key and, for stateful stages, fires a key's timers and
drops its state as soon as the key's input is done (batch: the watermark is +inf for a key once
all its input has been seen), so memory holds one key's state, never a partition's.
"""
from __future__ import annotations

import contextlib
import heapq
import json
import logging
import time
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager as ContextManager
from dataclasses import dataclass
from typing import Any

from apache_beam.coders.coder_impl import create_OutputStream
from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_fn_api_pb2, beam_runner_api_pb2, metrics_pb2
from apache_beam.runners.portability.fn_api_runner.execution import GroupingBuffer
from apache_beam.transforms import userstate
from apache_beam.utils import timestamp

from sparkbeam.control.embedded import WORKERS, BundleResult
from sparkbeam.control.metrics_channel import AttemptKey, MetricsReporter
from sparkbeam.control.rebalance_channel import RebalanceClient
from sparkbeam.errors import SdkWorkerError
from sparkbeam.execute import worker_context
from sparkbeam.execute.task_errors import error_payload
from sparkbeam.execute.task_splits import Chunks, TaskSplitter
from sparkbeam.metrics import merge_infos
from sparkbeam.plan.model import Grouping, Stage

_LOG = logging.getLogger(__name__)
TRUNCATE_URN = common_urns.sdf_components.TRUNCATE_SIZED_RESTRICTION.urn
GRPC_ENVIRONMENT_URNS = frozenset(
    [common_urns.environments.PROCESS.urn, common_urns.environments.EXTERNAL.urn]
)
METRICS_TAG = -1
_MAX_TIMER_ROUNDS = 1_000_000

Row = tuple[int, bytes | None, bytes]  # (input index, key, value)
OutRow = tuple[int, bytes | None, bytes]  # (output index or METRICS_TAG, key, value)


@dataclass(frozen=True)
class TaskSpec:
    """Everything a task needs, shipped (pickled) with the Spark job."""

    stage: Stage
    components: bytes
    groupings: dict[bytes, Grouping]
    pickle_library: str
    bundle_size: int
    bundle_bytes: int
    job_id: str = ""
    metrics_address: str | None = None  # driver's MetricsCollector, for attempted metrics
    rebalance_address: str | None = None  # driver's RebalanceServer (splittable stages)
    partitions: int = 1  # how many tasks the stage has
    pipeline_options: dict | None = None  # for SDK workers of PROCESS/EXTERNAL environments
    worker_connect_timeout_s: float = 60.0


def run_stage_task(
    spec: TaskSpec,
    rows: Iterable[Row],
    side_inputs: dict[bytes, list[bytes]],
    attempt: tuple[int, int, int] = (0, 0, 0),
    fresh_worker: bool = False,
) -> Iterator[OutRow]:
    """Runs one partition of `spec.stage`; yields output rows, then metric rows.

    `attempt` is Spark's (stage id, partition id, attempt number) of this task; metric rows
    carry it as their key, so the driver can tell committed attempts from the others.
    """
    worker_context.prepare(spec.pickle_library)
    stage = spec.stage
    key = AttemptKey(spec.job_id, stage.label, *attempt)
    reporter = MetricsReporter(spec.metrics_address, key) if spec.metrics_address else None
    with contextlib.ExitStack() as stack:
        try:
            worker = stack.enter_context(_lease(spec, fresh_worker))
        except SdkWorkerError as exc:
            raise RuntimeError(error_payload(stage, exc, kind="worker")) from None
        yield from _run_leased(spec, worker, rows, side_inputs, attempt, key, reporter)


def _run_leased(
    spec: TaskSpec,
    worker: Any,
    rows: Iterable[Row],
    side_inputs: dict[bytes, list[bytes]],
    attempt: tuple[int, int, int],
    key: AttemptKey,
    reporter: MetricsReporter | None,
) -> Iterator[OutRow]:
    stage = spec.stage
    worker.state.bind_side_inputs(side_inputs)
    driver = _StageDriver(spec, worker, reporter)
    try:
        if spec.rebalance_address and stage.splittable and not stage.keyed_input:
            driver.splitter = _splitter(spec, driver, attempt)
        if stage.keyed_input:
            yield from driver.run_keyed(rows)
        else:
            yield from driver.run_plain(rows)
        yield from driver.drain_residuals()
        if driver.splitter is not None:
            for chunks in driver.splitter.more_work():
                yield from driver.run_bundle(chunks)
                yield from driver.drain_residuals()
            driver.splitter.close()
    except Exception as exc:  # noqa: BLE001 - any failure is reported with its payload
        if reporter is not None:
            reporter.report(driver.infos + worker.failed_bundle_infos, final=True, ok=False)
        kind = "worker" if isinstance(exc, SdkWorkerError) else "user"
        raise RuntimeError(error_payload(stage, exc, kind=kind)) from None
    infos = merge_infos(driver.infos)
    if reporter is not None:
        reporter.report(infos, final=True)
    encoded_key = json.dumps(key.__dict__).encode()
    for info in infos:
        yield METRICS_TAG, encoded_key, info.SerializeToString()


def _splitter(
    spec: TaskSpec, driver: _StageDriver, attempt: tuple[int, int, int]
) -> TaskSplitter | None:
    """This task's end of dynamic rebalancing; None (the task runs unsplit) when a first
    attempt cannot reach the driver. A retry must: an earlier attempt may have split."""
    assert spec.rebalance_address is not None
    try:
        client = RebalanceClient(spec.rebalance_address, spec.job_id, spec.stage.label, attempt[1])
        return TaskSplitter(client, spec.partitions, driver._input_ids, driver.route)
    except (OSError, ConnectionError) as exc:
        if attempt[2] > 0:
            raise
        _LOG.warning("%s: no dynamic splitting (driver unreachable at %s: %s)",
                     spec.stage.label, spec.rebalance_address, exc)
        return None


def _lease(spec: TaskSpec, fresh: bool = False) -> ContextManager[Any]:
    """The worker for the stage's environment: the bundle processor embedded in this
    process, or an SDK worker over gRPC for PROCESS and EXTERNAL environments."""
    if spec.stage.environment:
        env = beam_runner_api_pb2.Environment.FromString(spec.stage.environment)
        if env.urn in GRPC_ENVIRONMENT_URNS:
            from sparkbeam.control.grpc_worker import WORKERS as GRPC_WORKERS

            return GRPC_WORKERS.lease(
                spec.stage.descriptor, env, spec.pipeline_options or {},
                spec.worker_connect_timeout_s,
            )
    return WORKERS.lease(spec.stage.descriptor, fresh=fresh)


class _StageDriver:
    """Builds bundles from rows, runs them, and turns their results into output rows."""

    def __init__(
        self, spec: TaskSpec, worker: Any, reporter: MetricsReporter | None = None
    ) -> None:
        self.spec = spec
        self.reporter = reporter
        self.stage = spec.stage
        self.worker = worker
        self.infos: list[metrics_pb2.MonitoringInfo] = []
        ctx = worker_context.pipeline_context(spec.components)
        self._out_index = {o.transform_id: i for i, o in enumerate(self.stage.outputs)}
        self._key_impls = {
            o.transform_id: (
                ctx.coders[o.coder_id].get_impl(),
                ctx.coders[o.key_coder_id].get_impl(),
            )
            for o in self.stage.outputs
            if o.key_coder_id
        }
        self._input_ids = [i.transform_id for i in self.stage.inputs]
        self._groupers = {
            n: _Grouper(spec.groupings[i.buffer_id], ctx)
            for n, i in enumerate(self.stage.inputs)
            if i.buffer_id in spec.groupings
        }
        self._timer_impls = {
            (t.transform_id, t.family_id): ctx.coders[t.coder_id].get_impl()
            for t in self.stage.timers
        }
        self._timer_domain = {
            (t.transform_id, t.family_id): t.time_domain for t in self.stage.timers
        }
        pcoll_to_input = {}
        for tid in self._input_ids:
            transform = worker.descriptor.transforms[tid]
            for pcoll in transform.outputs.values():
                pcoll_to_input[pcoll] = tid
        # A residual addressed to an SDF's Process reads what Truncate made (drained jobs):
        # route it back through the data input that feeds the Truncate, as FnApiRunner does.
        for transform in worker.descriptor.transforms.values():
            if transform.spec.urn == TRUNCATE_URN:
                source = next(iter(transform.inputs.values()))
                for pcoll in transform.outputs.values():
                    if source in pcoll_to_input:
                        pcoll_to_input[pcoll] = pcoll_to_input[source]
        self._pcoll_to_input = pcoll_to_input
        self.splitter: TaskSplitter | None = None
        self._residuals: list[tuple[float, int, beam_fn_api_pb2.BundleApplication]] = []
        self._seq = 0
        # Pending timers of unfinished keys: (transform, family) -> {(key, tag, window): Timer}
        self._timers: dict[tuple[str, str], dict[tuple, userstate.Timer]] = {}

    # -- bundles ---------------------------------------------------------------------------

    def _run(
        self,
        inputs: list[beam_fn_api_pb2.Elements.Data | beam_fn_api_pb2.Elements.Timers],
        counts: dict[str, int] | None = None,
    ) -> Iterator[OutRow]:
        result: BundleResult = self.worker.process(inputs, counts=counts)
        self.infos.extend(result.monitoring_infos)
        if len(self.infos) > 2000:
            self.infos = merge_infos(self.infos)
        if self.reporter is not None:
            self.reporter.report(self.infos)
        for reschedule in result.reschedules:
            self._seq += 1
            heapq.heappush(
                self._residuals, (reschedule.not_before, self._seq, reschedule.application))
        if result.timers:
            self._collect_timers(result.timers)
        for transform_id, data in result.outputs:
            keyed = self._key_impls.get(transform_id)
            key = None
            if keyed is not None:
                wv = keyed[0].decode_nested(data)
                key = keyed[1].encode_nested(wv.value[0])
            yield self._out_index[transform_id], key, data

    def _run_chunks(self, chunks: Chunks) -> Iterator[OutRow]:
        """One bundle of data elements (input index -> encoded elements)."""
        counts = {self._input_ids[n]: len(parts) for n, parts in chunks.items() if parts}
        return self._run(self._data(chunks), counts)

    def _data(self, chunks: dict[int, list[bytes]]) -> list[beam_fn_api_pb2.Elements.Data]:
        return [
            beam_fn_api_pb2.Elements.Data(
                transform_id=self._input_ids[n], data=b"".join(parts)
            )
            for n, parts in chunks.items()
            if parts
        ]

    def run_plain(self, rows: Iterable[Row]) -> Iterator[OutRow]:
        chunks: dict[int, list[bytes]] = {}
        count = size = 0
        for n, _key, value in rows:
            chunks.setdefault(n, []).append(value)
            count += 1
            size += len(value)
            if count >= self.spec.bundle_size or size >= self.spec.bundle_bytes:
                yield from self.run_bundle(chunks)
                chunks, count, size = {}, 0, 0
        if count or not self.stage.inputs:
            yield from self.run_bundle(chunks)

    def run_bundle(self, chunks: Chunks) -> Iterator[OutRow]:
        """One bundle of a plain stage; splittable when the driver rebalances the stage."""
        if self.splitter is None:
            yield from self._run_chunks(chunks)
            return
        seq, chunks, may_split = self.splitter.next_bundle(chunks)
        if not may_split:
            yield from self._run_chunks(chunks)
            return
        with self.splitter.watching(seq, chunks, self.worker):
            rows = list(self._run_chunks(chunks))
        yield from rows

    def route(self, app: beam_fn_api_pb2.BundleApplication) -> int:
        """The stage input a residual or primary root is fed back through."""
        pcoll = self.worker.descriptor.transforms[app.transform_id].inputs[app.input_id]
        return self._input_ids.index(self._pcoll_to_input[pcoll])

    def run_keyed(self, rows: Iterable[Row]) -> Iterator[OutRow]:
        """Rows arrive sorted by (key, input); bundles end at key boundaries when full."""
        chunks: dict[int, list[bytes]] = {}
        count = size = 0
        current: tuple[bytes | None, int] | None = None
        run: list[bytes] = []

        def close_run() -> None:
            nonlocal count, size
            if current is None:
                return
            n = current[1]
            data = self._groupers[n].group(run) if n in self._groupers else run
            for element in data:
                chunks.setdefault(n, []).append(element)
                count += 1
                size += len(element)
            run.clear()

        for n, key, value in rows:
            if current is not None and (key, n) != current:
                close_run()
                if key != current[0] and (
                    count >= self.spec.bundle_size or size >= self.spec.bundle_bytes
                ):
                    yield from self._run_chunks(chunks)
                    chunks, count, size = {}, 0, 0
                    yield from self._finish_keys()
            elif n not in self._groupers and (
                count >= self.spec.bundle_size or size >= self.spec.bundle_bytes
            ):
                # One key bigger than a bundle: cut the bundle inside the key, finish it later.
                yield from self._run_chunks(chunks)
                chunks, count, size = {}, 0, 0
            current = (key, n)
            if n in self._groupers:
                run.append(value)
            else:
                chunks.setdefault(n, []).append(value)
                count += 1
                size += len(value)
        close_run()
        if count:
            yield from self._run_chunks(chunks)
        yield from self._finish_keys()

    # -- timers ----------------------------------------------------------------------------

    def _collect_timers(self, written: dict[tuple[str, str], list[bytes]]) -> None:
        for family, chunks in written.items():
            impl = self._timer_impls[family]
            pending = self._timers.setdefault(family, {})
            for chunk in chunks:
                for timer in impl.decode_all(chunk):
                    ident = (
                        impl._key_coder_impl.encode_nested(timer.user_key),
                        timer.dynamic_timer_tag,
                        timer.windows[0] if timer.windows else None,
                    )
                    if timer.clear_bit:
                        pending.pop(ident, None)
                    else:
                        pending[ident] = timer

    def _finish_keys(self) -> Iterator[OutRow]:
        """Batch: input of the keys seen so far is complete, so their timers fire, earliest
        first per key (timers set while firing join in), then their state is dropped."""
        if not self.stage.stateful:
            return
        rounds = 0
        while any(self._timers.values()):
            rounds += 1
            if rounds > _MAX_TIMER_ROUNDS:
                raise RuntimeError(
                    f"timers of {self.stage.label} kept re-arming for {_MAX_TIMER_ROUNDS} rounds"
                )
            due: dict[bytes, tuple[int, timestamp.Timestamp | None]] = {}
            for family, pending in self._timers.items():
                domain = self._timer_domain[family]
                for (key, _tag, _w), timer in pending.items():
                    order = (domain, timer.fire_timestamp)
                    if key not in due or order < due[key]:
                        due[key] = order
            firing: dict[tuple[str, str], list] = {}
            for family, pending in self._timers.items():
                domain = self._timer_domain[family]
                for ident in [i for i, t in pending.items()
                              if due[i[0]] == (domain, t.fire_timestamp)]:
                    firing.setdefault(family, []).append(pending.pop(ident))
            for batch in self._timer_bundles(firing):
                yield from self._run(batch)
        self.worker.state.drop_user_state()

    def _timer_bundles(
        self, firing: dict[tuple[str, str], list]
    ) -> Iterator[list[beam_fn_api_pb2.Elements.Timers]]:
        batch: list[beam_fn_api_pb2.Elements.Timers] = []
        count = 0
        for (transform_id, family_id), timers in firing.items():
            impl = self._timer_impls[(transform_id, family_id)]
            for start in range(0, len(timers), self.spec.bundle_size):
                out = create_OutputStream()
                part = timers[start:start + self.spec.bundle_size]
                for timer in part:
                    impl.encode_to_stream(timer, out, True)
                batch.append(beam_fn_api_pb2.Elements.Timers(
                    transform_id=transform_id, timer_family_id=family_id, timers=out.get()))
                count += len(part)
                if count >= self.spec.bundle_size:
                    yield batch
                    batch, count = [], 0
        if batch:
            yield batch

    # -- residuals (self-checkpoints of splittable DoFns) -------------------------------------

    def drain_residuals(self) -> Iterator[OutRow]:
        """Reschedules residual roots until none remain, honouring requested delays."""
        while self._residuals:
            due_at = self._residuals[0][0]
            wait = due_at - time.time()
            if wait > 0:
                time.sleep(wait)
            now = time.time()
            chunks: dict[int, list[bytes]] = {}
            count = 0
            while self._residuals and self._residuals[0][0] <= now and (
                count < self.spec.bundle_size
            ):
                _, _, app = heapq.heappop(self._residuals)
                chunks.setdefault(self.route(app), []).append(app.element)
                count += 1
            yield from self._run_chunks(chunks)
            yield from self._finish_keys()


class _Grouper:
    """Groups one key's values of a GroupByKey input by window, with Beam's trigger driver."""

    def __init__(self, grouping: Grouping, ctx) -> None:  # type: ignore[no-untyped-def]
        self._pre = ctx.coders[grouping.input_coder_id]
        self._post = ctx.coders[grouping.output_coder_id]
        self._windowing = ctx.windowing_strategies[grouping.windowing_strategy_id]

    def group(self, values: list[bytes]) -> list[bytes]:
        """One chunk holding the key's grouped element(s), one per window/pane."""
        buffer = GroupingBuffer(self._pre, self._post, self._windowing)
        buffer.append(b"".join(values))
        return [chunk for chunk in buffer.partition(1)[0] if chunk]
