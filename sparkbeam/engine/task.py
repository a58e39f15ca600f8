"""What one task of a stage does: stream its rows through the bundle processor (no pyspark).

A function of (stage, input rows, shipped side inputs) -> output rows, used by the batch
executor for every stage and by the streaming engine for stateless stages. A keyed stage
receives each key's rows together: GroupByKey inputs are grouped key by key and, for stateful
stages, a key's timers fire and its state is dropped as soon as its input is done (batch: the
watermark is the end of time for a key once all its input has been seen), so memory holds the
state of the keys of one bundle, never a partition's. Residual roots are run again, after the
delay they ask for, until none is left.
"""
from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sparkbeam.control.lease import LeasedOnUse, lease_worker
from sparkbeam.control.metrics_channel import AttemptKey, MetricsReporter
from sparkbeam.control.rebalance_channel import RebalanceClient
from sparkbeam.control.worker import Worker
from sparkbeam.engine import context
from sparkbeam.engine.arrow import ArrowRows, Columns, arrow_rows, rows_of
from sparkbeam.engine.direct import DirectRun
from sparkbeam.engine.direct_stateful import StatefulRun
from sparkbeam.engine.keyed_columns import keyed_column_bundles
from sparkbeam.engine.bundles import (
    Bundle,
    GroupedBatch,
    Row,
    column_bundles,
    grouped_batches,
    keyed_bundles,
    plain_bundles,
)
from sparkbeam.engine.grouping import ByWindowGrouper
from sparkbeam.engine.packed_rows import counted_value, packed
from sparkbeam.engine.session_rows import layout_of
from sparkbeam.engine.program import Chunks, OutRow, StageProgram, program_for
from sparkbeam.engine.run import StageRun
from sparkbeam.engine.task_errors import error_payload
from sparkbeam.engine.task_splits import TaskSplitter
from sparkbeam.engine.timers import ALL, Ordering
from sparkbeam.errors import SdkWorkerError
from sparkbeam.metrics import merge_infos
from sparkbeam.plan.model import Grouping, Stage, StageKind

_LOG = logging.getLogger(__name__)
METRICS_TAG = -1  # the tag of metric rows: (METRICS_TAG, attempt key, MonitoringInfo)


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
    # Input rows numbered METRICS_TAG are an unpersisted producer's metric rows, come through
    # this stage's shuffle or from the producer in the same task: passed on as this task's
    # output, after its own.
    forwards_metrics: bool = False
    # The most records a file of a direct stage's write holds (None: `bundle_size`). Larger
    # than a grouped stage's bundle of keys by default: each file costs its task an open and
    # a close, and the finalisation a rename (a 0.5 MB word count wrote 13 files, not 2).
    file_records: int | None = None
    # Output tags whose rows are packed per key (`engine/packed_rows.py`): every reader of
    # their buffers takes several of a key's elements in a row (`plan/packed_rows.py`).
    packed_tags: frozenset[int] = frozenset()
    # Output tags whose rows are counted (`engine/packed_rows.py`): every reader of their
    # buffers groups the global window from columns and takes each row for a count and values.
    counted_tags: frozenset[int] = frozenset()
    # Output tags whose rows are session rows (`engine/session_rows.py`): every reader of
    # their buffers groups Beam's Sessions per window from window bounds and values.
    session_tags: frozenset[int] = frozenset()


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
    context.prepare(spec.pickle_library)
    stage = spec.stage
    key = AttemptKey(spec.job_id, stage.label, *attempt)
    reporter = MetricsReporter(spec.metrics_address, key) if spec.metrics_address else None
    program = program_for(stage, spec.components, spec.groupings)

    def lease() -> contextlib.AbstractContextManager[Worker]:
        return lease_worker(
            stage.descriptor, stage.environment, spec.pipeline_options,
            spec.worker_connect_timeout_s, fresh=fresh_worker,
            # The same stage in another job (same descriptor) reads other side inputs.
            scope=spec.job_id if stage.side_inputs else "")

    with contextlib.ExitStack() as stack:
        worker = LeasedOnUse(stack, lease, side_inputs)
        out = _run_leased(spec, program, worker, rows, side_inputs, attempt, key, reporter)
        try:
            if spec.packed_tags or spec.counted_tags or spec.session_tags:
                counted = {n: counted_value(program.out_coders[n]) for n in spec.counted_tags}
                sessions = {n: layout_of(program.out_coders[n]) for n in spec.session_tags}
                yield from packed(out, spec.packed_tags, counted=counted, sessions=sessions)
            else:
                yield from out
        finally:
            out.close()  # its own clean-up before the lease's, were this task closed early


def _counted_rows(spec: TaskSpec, program: StageProgram, rows: Iterable[Row]) -> Iterable[Row]:
    """`rows`, as Arrow batches where an input's rows are counted (`engine/packed_rows.py`):
    only the grouping from columns reads those, and it reads Arrow batches. A plan that counts
    rows no such grouping reads is a bug to report, not rows to take for elements."""
    counted = [i.buffer_id for i in spec.stage.inputs
               if i.buffer_id in spec.groupings and spec.groupings[i.buffer_id].counted]
    if not counted:
        return rows
    if not program.column_groupings or not spec.stage.kind.keyed:
        names = ", ".join(sorted(spec.groupings[b].transform_id for b in counted))
        raise ValueError(f"{spec.stage.display}: the input of {names} is packed as counted "
                         "values, but this stage does not group it from columns")
    return rows if isinstance(rows, ArrowRows) else arrow_rows(list(rows))  # type: ignore[arg-type]


def report_infos(spec: TaskSpec, attempt: tuple[int, int, int], infos: list[Any],
                 ok: bool = True) -> None:
    """Sends the final monitoring infos of one attempt (stage id or micro-batch, partition,
    attempt number) of `spec.stage` to the driver, when it collects them."""
    if spec.metrics_address:
        key = AttemptKey(spec.job_id, spec.stage.label, *attempt)
        MetricsReporter(spec.metrics_address, key).report(infos, final=True, ok=ok)


def _run_leased(
    spec: TaskSpec,
    program: StageProgram,
    worker: LeasedOnUse,
    rows: Iterable[Row],
    side_inputs: dict[bytes, list[bytes]],
    attempt: tuple[int, int, int],
    key: AttemptKey,
    reporter: MetricsReporter | None,
) -> Generator[OutRow, None, None]:
    stage = spec.stage
    forwarded: list[OutRow] = []
    if spec.forwards_metrics:
        rows = _without_metric_rows(rows, forwarded)
    rows = _counted_rows(spec, program, rows)
    run = StageRun(program, worker, spec.bundle_size, reporter)
    try:
        if program.direct is None and program.stateful is None:
            # Beam's bundle processor runs the stage: built (its DoFns set up) before any row.
            # Direct functions lease it only if they hand over.
            worker.lease()
        splitter = (_splitter(spec, run, attempt)
                    if spec.rebalance_address and stage.kind is StageKind.SPLITTABLE else None)
        bundles: Iterator[Bundle]
        if program.stateful is not None:
            yield from _run_direct_stateful(spec, run, rows)
            bundles = iter(())
        elif program.direct is not None and stage.kind is StageKind.GROUPED:
            yield from _run_direct_grouped(spec, run, rows, side_inputs)
            bundles = iter(())
        elif stage.kind.keyed and program.column_groupings and isinstance(rows, ArrowRows):
            bundles = keyed_column_bundles(rows.batches, spec.bundle_size, spec.bundle_bytes,
                                           program.column_groupings)
        elif stage.kind.keyed:
            bundles = keyed_bundles(rows, spec.bundle_size, spec.bundle_bytes, program.groupers)
        elif program.direct is not None and isinstance(rows, ArrowRows):
            yield from _run_direct(spec, run, rows, side_inputs)
            bundles = iter(())
        elif stage.kind is StageKind.PLAIN and isinstance(rows, ArrowRows):
            bundles = column_bundles(rows.columns(), spec.bundle_size, spec.bundle_bytes,
                                     always=not stage.inputs)
        else:
            bundles = plain_bundles(rows, spec.bundle_size, spec.bundle_bytes,
                                    always=not stage.inputs)
        for bundle in bundles:
            yield from _run_bundle(run, bundle, splitter)
        yield from _drain_residuals(run, spec.bundle_size)
        if splitter is not None:
            for chunks in splitter.more_work():
                yield from _run_bundle(run, Bundle.of(chunks), splitter)
                yield from _drain_residuals(run, spec.bundle_size)
            splitter.close()
    except Exception as exc:  # noqa: BLE001 - any failure is reported with its payload
        if reporter is not None:
            reporter.report(run.infos + worker.failed_bundle_infos, final=True, ok=False)
        kind = "worker" if isinstance(exc, SdkWorkerError) else "user"
        raise RuntimeError(error_payload(stage, exc, kind=kind)) from None
    infos = merge_infos(run.infos)
    if reporter is not None:
        reporter.report(infos, final=True)
    encoded_key = json.dumps(key.__dict__).encode()
    for info in infos:
        yield METRICS_TAG, encoded_key, info.SerializeToString()
    yield from forwarded


def _without_metric_rows(rows: Iterable[Row], forwarded: list[OutRow]) -> Iterable[Row]:
    """`rows` less those numbered METRICS_TAG, which go to `forwarded` as output rows."""
    if isinstance(rows, ArrowRows):
        return ArrowRows(_batches_without_metric_rows(rows.batches, forwarded))

    def plain() -> Iterator[Row]:
        for row in rows:
            if row[0] == METRICS_TAG:
                forwarded.append((METRICS_TAG, row[1], row[2]))
            else:
                yield row

    return plain()


def _batches_without_metric_rows(batches: Iterator[pa.RecordBatch], forwarded: list[OutRow]
                                 ) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        metric = pc.equal(batch.column(0), METRICS_TAG)
        if not pc.any(metric).as_py():
            yield batch
            continue
        for _, key, value in rows_of(iter([batch.filter(metric)])):
            forwarded.append((METRICS_TAG, key, value))
        yield batch.filter(pc.invert(metric))


def _file_records(spec: TaskSpec) -> int:
    return spec.bundle_size if spec.file_records is None else spec.file_records


def _run_direct(spec: TaskSpec, run: StageRun, rows: ArrowRows,
                side_inputs: dict[bytes, list[bytes]]) -> Iterator[OutRow]:
    """The stage's functions called directly (`engine/direct.py`); the bundle processor takes
    over from the first batch they cannot run as Beam would."""
    assert run.program.direct is not None
    direct = DirectRun(run.program.direct, side_inputs, _file_records(spec), spec.bundle_bytes)

    def general(columns: Iterator[Columns]) -> Iterator[OutRow]:
        for bundle in column_bundles(columns, spec.bundle_size, spec.bundle_bytes):
            yield from _run_bundle(run, bundle, None)

    try:
        yield from direct.run(rows.columns(), general)
    finally:
        run.infos.extend(direct.infos)


def _run_direct_grouped(spec: TaskSpec, run: StageRun, rows: Iterable[Row],
                        side_inputs: dict[bytes, list[bytes]]) -> Iterator[OutRow]:
    """A grouped stage's functions called directly on its grouped elements, bundle by bundle
    as the grouping cuts them: as the grouper makes them where their windows are what
    decoding them gives (`ByWindowGrouper.exact_windows`), else encoded and decoded again.
    The bundle processor takes over from the first bundle they cannot run as Beam would."""
    program = run.program
    assert program.direct is not None
    direct = DirectRun(program.direct, side_inputs, _file_records(spec), spec.bundle_bytes)
    grouper = program.groupers.get(0)
    encode: Any = None  # the grouper's, for batches it made
    decode: Callable[[Any], Any]
    if program.column_groupings and isinstance(rows, ArrowRows):
        batches: Iterator[Any] = keyed_column_bundles(
            rows.batches, spec.bundle_size, spec.bundle_bytes, program.column_groupings)
        decode = direct.decode_grouped
    elif isinstance(grouper, ByWindowGrouper) and grouper.exact_windows:
        batches = grouped_batches(rows, spec.bundle_size, spec.bundle_bytes,
                                  lambda values, key: grouper.grouped(values, True, key))
        decode = direct.decode_windowed
        encode = grouper.encode
    else:
        batches = keyed_bundles(rows, spec.bundle_size, spec.bundle_bytes, program.groupers)
        decode = direct.decode_grouped

    def general(rest: Iterator[Any]) -> Iterator[OutRow]:
        for batch in rest:
            bundle = batch.bundle(encode) if isinstance(batch, GroupedBatch) else batch
            yield from _run_bundle(run, bundle, None)

    try:
        yield from direct.run(batches, general, decode)
    finally:
        run.infos.extend(direct.infos)


def _run_direct_stateful(spec: TaskSpec, run: StageRun, rows: Iterable[Row]
                         ) -> Iterator[OutRow]:
    """The stage's stateful DoFn called directly (`engine/direct_stateful.py`); the bundle
    processor takes over from the first key it cannot run as Beam would."""
    assert run.program.stateful is not None
    stateful = StatefulRun(run.program.stateful)

    def general(rest: Iterable[Row]) -> Iterator[OutRow]:
        for bundle in keyed_bundles(rest, spec.bundle_size, spec.bundle_bytes,
                                    run.program.groupers):
            yield from _run_bundle(run, bundle, None)

    try:
        yield from stateful.run(rows, general)
    finally:
        run.infos.extend(stateful.infos)


def _run_bundle(run: StageRun, bundle: Bundle, splitter: TaskSplitter | None
                ) -> Iterator[OutRow]:
    """One bundle (split by the driver if it rebalances the stage; an empty one that closes
    keys only closes them); then, if it closes its keys, their timers fire (at the end of
    time) and their state is dropped."""
    if splitter is None:
        if bundle.count or not bundle.closes_keys:
            yield from run.run_chunks(bundle.chunks, bundle.counts)
    elif bundle.count or not bundle.closes_keys:
        yield from _splittable(run, bundle.chunks, splitter)
    if bundle.closes_keys and run.program.stage.kind.stateful:
        yield from run.fire_timers(ALL, Ordering.EVENT_TIME_FIRST)
        run.worker.state.drop_user_state()


def _splittable(run: StageRun, chunks: Chunks, splitter: TaskSplitter) -> Iterator[OutRow]:
    seq, chunks, may_split = splitter.next_bundle(chunks)
    if not may_split:
        yield from run.run_chunks(chunks)
        return
    with splitter.watching(seq, chunks, run.worker):
        rows = run.run_chunks(chunks)
    yield from rows


def _drain_residuals(run: StageRun, bundle_size: int) -> Iterator[OutRow]:
    """Reschedules residual roots until none remain, honouring requested delays."""
    while run.residuals:
        run.wait_for_residual()
        due = run.take_due_residuals(time.time(), bundle_size)
        yield from _run_bundle(run, Bundle.of(due, closes_keys=True), None)


def _splitter(spec: TaskSpec, run: StageRun, attempt: tuple[int, int, int]
              ) -> TaskSplitter | None:
    """This task's end of dynamic rebalancing (splittable stages only); None (the task runs
    unsplit) when a first attempt cannot reach the driver. A retry must: an earlier attempt
    may have split."""
    assert spec.rebalance_address is not None
    try:
        client = RebalanceClient(spec.rebalance_address, spec.job_id, spec.stage.label, attempt[1])
        return TaskSplitter(client, spec.partitions, list(run.program.input_ids),
                            run.program.route)
    except (OSError, ConnectionError) as exc:
        if attempt[2] > 0:
            raise
        _LOG.warning("%s: no dynamic splitting (driver unreachable at %s: %s)",
                     spec.stage.label, spec.rebalance_address, exc)
        return None
