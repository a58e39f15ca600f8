"""The streaming side of SparkJob: plan -> query -> metrics (driver)."""
from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from apache_beam.options import pipeline_options
from apache_beam.metrics import monitoring_infos
from apache_beam.portability.api import metrics_pb2

from sparkbeam.options import DEFAULT_BUNDLE_SIZE, SparkOptions, positive_or_none
from sparkbeam.plan.model import Plan
from sparkbeam.streaming.budget import THROTTLE_COUNTER, THROTTLE_NAMESPACE
from sparkbeam.streaming.plan import streaming_plan
from sparkbeam.streaming.query import StreamingQueryRun, StreamingSettings


class MetricsCollector(Protocol):
    """The driver's collector of task reports (`control.metrics_channel`), as used here."""

    address: str

    def attempt_reports(self, job: str) -> Mapping[Any, Any]: ...


def run_streaming(
    spark: Any,
    plan: Plan,
    options: pipeline_options.PipelineOptions,
    job_id: str,
    collector: MetricsCollector,
    cancelled: threading.Event,
    log: Callable[[str], None],
    on_progress: Callable[[list[dict[str, Any]]], None] = lambda progress: None,
    drain: threading.Event | None = None,
    on_run: Callable[[StreamingQueryRun], None] = lambda run: None,
    *,
    checkpoint_dir: str,
    default_partitions: int | None = None,
) -> StreamingQueryRun:
    """Runs the plan as one streaming query on `checkpoint_dir` (the job resolves it: the
    option, or a fresh directory on a local master); its stateful operators take
    `default_partitions` partitions when --parallelism is not given."""
    spark_options = options.view_as(SparkOptions)
    settings = StreamingSettings(
        checkpoint_dir=checkpoint_dir,
        trigger_interval=spark_options.trigger_interval,
        bundle_size=max(1, spark_options.bundle_size or DEFAULT_BUNDLE_SIZE),
        bundle_bytes=max(1, spark_options.bundle_bytes),
        metrics_address=collector.address,
        job_id=job_id,
        partitions=positive_or_none(spark_options.parallelism),
        default_partitions=default_partitions,
        max_items_per_batch=spark_options.max_items_per_batch,
        max_bytes_per_batch=spark_options.max_bytes_per_batch,
    )
    run = StreamingQueryRun(spark, streaming_plan(plan), settings, log)
    on_run(run)
    try:
        run.run(cancelled, drain)
    finally:
        on_progress(run.progress)
    return run


def throttle_infos(run: StreamingQueryRun | None) -> list[metrics_pb2.MonitoringInfo]:
    """The work budget's throttle time per source transform (the seed's throttle time), as the
    user counter `sparkbeam.streaming:throttling-msecs`: milliseconds its endpoint had input
    the budget held back, up to the last planned micro-batch."""
    if run is None:
        return []
    steps = run.splan.steps
    return [
        monitoring_infos.int64_user_counter(THROTTLE_NAMESPACE, THROTTLE_COUNTER, ms,
                                            ptransform=steps.get(endpoint, endpoint))
        for endpoint, ms in sorted(run.throttle_ms.items())
        if endpoint in steps or ms  # Impulse roots: reported only if ever held back
    ]


def streaming_metrics(
    collector: MetricsCollector, job_id: str, run: StreamingQueryRun | None = None
) -> tuple[list[metrics_pb2.MonitoringInfo], list[metrics_pb2.MonitoringInfo]]:
    """(committed, attempted): one successful report per (stage, batch, partition) commits;
    a stage computed for several consumers in one batch reports the same partition twice.
    The budget's throttle counters come from the offsets of planned batches (committed)."""
    reports = collector.attempt_reports(job_id)
    committed: dict[tuple[str, int, int], list[metrics_pb2.MonitoringInfo]] = {}
    attempted: list[metrics_pb2.MonitoringInfo] = []
    for key, report in reports.items():
        task = (key.stage, key.spark_stage, key.partition)
        if report.succeeded:
            committed.setdefault(task, report.infos)
    for key, report in reports.items():
        task = (key.stage, key.spark_stage, key.partition)
        if not report.succeeded or committed.get(task) is not report.infos:
            attempted.extend(report.infos)
    done = [info for infos in committed.values() for info in infos] + throttle_infos(run)
    return done, done + attempted
