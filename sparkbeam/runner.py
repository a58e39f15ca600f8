"""SparkRunner: `--runner=sparkbeam.SparkRunner` runs a Beam pipeline on a SparkSession."""
from __future__ import annotations

import dataclasses
import itertools
import os
import json
import logging
import threading
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from apache_beam.options import pipeline_options
from apache_beam.options.value_provider import RuntimeValueProvider
from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.runners.runner import PipelineResult, PipelineRunner, PipelineState
from apache_beam.transforms import environments

from sparkbeam.control.metrics_channel import (
    MetricsCollector,
    shared_collector,
)
from sparkbeam.control.progress import ProgressTracker
from sparkbeam.control.rebalance_channel import RebalanceServer, shared_rebalancer
from sparkbeam.errors import (
    ExecutionError,
    JobCancelledError,
    JobStateError,
    SparkBeamError,
    Unsupported,
    UnsupportedFeatureError,
)
from sparkbeam.metrics import SparkMetrics
from sparkbeam.mode import inferred_streaming
from sparkbeam.options import SparkOptions, positive_or_none
from sparkbeam.plan.arrow_batches import batch_limits
from sparkbeam.plan.check import (
    CONNECT_STREAMING,
    find_unsupported,
    is_local_master,
    option_problems,
    plan_problems,
)
from sparkbeam.plan.fingerprint import dumps, pipeline_fingerprint
from sparkbeam.plan.stream_plan import plan_streaming
from sparkbeam.plan.batch import plan_batch
from sparkbeam.plan.model import Plan
from sparkbeam.plan.validate import check_structure
from sparkbeam.progress_watch import ProgressWatch, terminal_attached

if TYPE_CHECKING:
    from sparkbeam.execute.dataset import Datasets

_LOG = logging.getLogger(__name__)
_JOB_IDS = itertools.count(1)

TERMINAL = frozenset(
    [PipelineState.DONE, PipelineState.FAILED, PipelineState.CANCELLED, PipelineState.UPDATED,
     PipelineState.DRAINED]
)


def prepare(
    proto: beam_runner_api_pb2.Pipeline,
    options: pipeline_options.PipelineOptions,
    *,
    is_drain: bool = False,
) -> Plan:
    """Checks (every unsupported feature at once) and plans a pipeline; no Spark work.

    A malformed proto is refused first (`InvalidPipelineError`), before anything reads it.
    """
    check_structure(proto)
    standard = options.view_as(pipeline_options.StandardOptions)
    reason = inferred_streaming(
        proto, streaming=bool(standard.streaming),
        experiments=options.view_as(pipeline_options.DebugOptions).experiments or [])
    if reason:
        # As Beam's Dataflow runner does: the rest of the job reads the flag. The job says
        # so when it starts (`SparkJob._run_streaming`), in its log and message stream.
        standard.streaming = True
    streaming = bool(standard.streaming)
    spark_options = options.view_as(SparkOptions)
    problems = find_unsupported(proto, streaming=streaming)
    pickle_library = options.view_as(pipeline_options.SetupOptions).pickle_library or "default"
    plan = None
    if not problems:
        plan = (plan_streaming(proto, pickle_library=pickle_library, is_drain=is_drain)
                if streaming
                else plan_batch(proto, pickle_library=pickle_library, is_drain=is_drain,
                                native=spark_options.spark_native == "on",
                                packing=spark_options.arrow_batch_bytes != "rows"))
        problems.extend(plan_problems(plan, streaming=streaming))
    problems.extend(option_problems(
        streaming=streaming, checkpoint_dir=spark_options.checkpoint_dir,
        budgets={flag: getattr(spark_options, flag)
                 for flag in ("max_items_per_batch", "max_bytes_per_batch")},
        master=spark_options.spark_master, remote=spark_options.spark_remote,
        arrow_batch_bytes=spark_options.arrow_batch_bytes))
    if plan is not None and streaming:
        fingerprint = pipeline_fingerprint(proto, plan)
        plan = dataclasses.replace(plan, streaming_reason=reason or "",
                                   fingerprint=dumps(fingerprint))
        if spark_options.checkpoint_dir:
            # Imported here: the runner module loads no streaming code for batch jobs.
            from sparkbeam.streaming.pipeline_record import checkpoint_problem

            problem = checkpoint_problem(spark_options.checkpoint_dir, fingerprint)
            if problem:
                problems.append(Unsupported("a checkpoint directory of another pipeline",
                                            "--checkpoint_dir", problem))
    if problems:
        raise UnsupportedFeatureError(problems)
    assert plan is not None
    return plan


class SparkJob:
    """One pipeline run on Spark in a thread of its own; the state machine the result reads."""

    def __init__(
        self,
        plan: Plan,
        options: pipeline_options.PipelineOptions,
        job_id: str | None = None,
        on_message: Callable[[str], None] | None = None,
        on_state: Callable[[str], None] | None = None,
        py_files: list[str] | None = None,
        session_defaults: dict[str, str] | None = None,
    ) -> None:
        from sparkbeam.execute.executor import Progress

        self.plan = plan
        self.options = options
        self.job_id = job_id or f"job-{next(_JOB_IDS):03d}"
        # The Spark job group: unique in the SparkContext, which may serve several job
        # servers and runners whose job ids repeat (cancelling one must not cancel another).
        self.spark_group = f"sparkbeam-{self.job_id}-{uuid.uuid4().hex[:8]}"
        self.progress = Progress()
        self.state = PipelineState.STOPPED
        self.error: BaseException | None = None
        self.cancelled = threading.Event()
        self.drained = threading.Event()
        self._done = threading.Event()
        self._on_message = on_message or (lambda m: None)
        # A live progress display on a terminal: only for a job run here, in the foreground
        # (a job server's jobs report to their clients' message streams).
        self._terminal = on_message is None and terminal_attached()
        self._on_state = on_state or (lambda s: None)
        self._py_files = list(py_files or [])
        self._session_defaults = dict(session_defaults or {})  # for a session made here
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"sparkbeam-{self.job_id}")
        self._datasets: Datasets | None = None
        self._collector: MetricsCollector | None = None
        self.split_stats: dict[str, dict[str, int]] = {}
        self.split_history: dict[str, list[str]] = {}  # stage label -> rebalancer decisions
        self.spark_jobs: int | None = None  # Spark jobs a finished batch run took
        self.streaming = False
        self.streaming_batches: list[dict[str, Any]] = []  # micro-batches: rows, durations
        self._streaming_run: Any = None  # the streaming query run, once started
        # Metrics as the run ended: the collector's reports of this job are then dropped, so a
        # long-lived driver (the job server) does not keep every past job's reports.
        self._final_metrics: SparkMetrics | None = None

    def start(self) -> None:
        self._set_state(PipelineState.STARTING)
        self._thread.start()

    def _set_state(self, state: str) -> None:
        with self._lock:
            if self.state in TERMINAL:
                return  # terminal states are sticky
            self.state = state
        self._on_state(state)
        self._on_message(f"{self.job_id} is {state}")

    def _run(self) -> None:
        from sparkbeam.execute.dataset import Datasets
        from sparkbeam.execute.session import get_session
        from sparkbeam.execute.executor import ExecutionSettings, Executor
        from sparkbeam.execute.warm_up import warm_python_workers

        try:
            spark_options = self.options.view_as(SparkOptions)
            spark = get_session(spark_options, self._session_defaults)
            warm_python_workers(spark)  # while this job plans (execute/warm_up.py)
            datasets = Datasets(spark, positive_or_none(spark_options.parallelism))
            self._datasets = datasets
            if datasets.ship_sparkbeam():
                self._log(f"{self.job_id}: shipped sparkbeam to the executors")
            for path in self._py_files:
                datasets.add_py_file(path)
                self._log(f"{self.job_id}: shipped {os.path.basename(path)} to the executors")
            self._collector = shared_collector(datasets.driver_host())
            if self.options.view_as(pipeline_options.StandardOptions).streaming:
                self._run_streaming(spark)
                return
            rebalancer = (
                shared_rebalancer(datasets.driver_host())
                if spark_options.dynamic_splitting != "off" else None
            )
            arrow_bytes, arrow_rows, why = batch_limits(spark_options.arrow_batch_bytes,
                                                        self.plan, datasets.session_arrow_rows())
            executor = Executor(
                datasets,
                ExecutionSettings(
                    bundle_size=(max(1, spark_options.bundle_size)
                                 if spark_options.bundle_size is not None else None),
                    bundle_bytes=max(1, spark_options.bundle_bytes),
                    metrics_address=self._collector.address,
                    rebalance_address=rebalancer.address if rebalancer else None,
                    pipeline_options=_worker_options(self.options),
                    worker_connect_timeout_s=spark_options.worker_connect_timeout,
                    arrow_batch_bytes=arrow_bytes,
                    arrow_batch_rows=arrow_rows,
                ),
            )
            self._set_state(PipelineState.RUNNING)
            for decision in (*self.plan.decisions, why):
                self._log(f"{self.job_id}: {decision}")
            started = time.time()
            watch = ProgressWatch(
                self.job_id, ProgressTracker(self.plan.stages), self._collector,
                executor.stage_partitions, spark_options.progress_interval, self._log,
                terminal=self._terminal,
            )
            watch.start()
            try:
                executor.run(self.plan, self.job_id, self.progress, self.cancelled,
                             log=self._log, group=self.spark_group)
            finally:
                watch.finish(self.progress.committed_keys())
                if rebalancer is not None:
                    self._report_splits(rebalancer)
            self.spark_jobs = datasets.spark_jobs(self.spark_group)
            jobs = "" if self.spark_jobs is None else f" ({self.spark_jobs} Spark jobs)"
            self._log(f"{self.job_id} finished in {time.time() - started:.1f}s{jobs}")
            self._set_state(PipelineState.DONE)
        except JobCancelledError as exc:
            self.error = exc
            self._set_state(PipelineState.CANCELLED)
        except BaseException as exc:  # noqa: BLE001 - the job fails, the caller gets it
            if self.cancelled.is_set():
                self.error = exc
                self._set_state(PipelineState.CANCELLED)
            else:
                self.error = exc
                _LOG.error("%s failed: %s", self.job_id, exc)
                self._free_job_group()
                self._on_message(f"{self.job_id} failed: {exc}")
                self._set_state(PipelineState.FAILED)
        finally:
            self._keep_final_metrics()
            self._done.set()

    def _free_job_group(self) -> None:
        """Cancels what is left of a failed job on Spark (its other tasks may still run, e.g.
        waiting for an SDK worker that is gone), so it holds no executor slots."""
        if self._datasets is None:
            return
        try:
            self._datasets.cancel(self.spark_group)
        except Exception:  # noqa: BLE001 - the job has failed already; this is tidying up
            _LOG.warning("%s: could not cancel its Spark job group", self.job_id, exc_info=True)

    def _keep_final_metrics(self) -> None:
        if self._collector is None:
            return
        try:
            self._final_metrics = self._metrics_now()
        except Exception:  # noqa: BLE001 - a job without final metrics still ends
            _LOG.warning("%s: could not gather its final metrics", self.job_id, exc_info=True)
            self._final_metrics = SparkMetrics(self.progress.snapshot())
        self._collector.forget(self.job_id)

    def _run_streaming(self, spark: Any) -> None:
        from sparkbeam.streaming.job import run_streaming
        from sparkbeam.streaming.pipeline_record import record_pipeline

        assert self._collector is not None and self._datasets is not None
        self.streaming = True
        if self.plan.streaming_reason:
            self._log(f"{self.job_id} runs as a stream: {self.plan.streaming_reason} (no "
                      "--streaming needed)")
        for decision in self.plan.decisions:
            self._log(f"{self.job_id}: {decision}")
        if self._datasets.connect:
            # An active Connect session, not named by the options (`option_problems`).
            raise UnsupportedFeatureError([Unsupported(
                "a streaming pipeline", f"job {self.job_id} on a Spark Connect session",
                CONNECT_STREAMING)])
        checkpoint_dir = self._checkpoint_dir(self._datasets)
        record_pipeline(checkpoint_dir, self.plan.fingerprint)
        self._set_state(PipelineState.RUNNING)
        started = time.time()
        run_streaming(spark, self.plan, self.options, self.job_id, self._collector,
                      self.cancelled, self._log, on_progress=self._keep_batches,
                      drain=self.drained, on_run=self._keep_run,
                      checkpoint_dir=checkpoint_dir,
                      default_partitions=self._datasets.parallelism)
        self._log(f"{self.job_id} finished in {time.time() - started:.1f}s")
        self._set_state(PipelineState.DRAINED if self.drained.is_set() else PipelineState.DONE)

    def _checkpoint_dir(self, datasets: Datasets) -> str:
        """--checkpoint_dir, else (on a local master only) a fresh directory, named in the log
        with how to resume from it."""
        given = self.options.view_as(SparkOptions).checkpoint_dir
        if given:
            return str(given)
        master = datasets.master()
        if datasets.connect or not is_local_master(master):
            raise ExecutionError(
                f"{self.job_id}: streaming on {'Spark Connect' if datasets.connect else master} "
                "needs --checkpoint_dir, a directory the driver and every executor share "
                "(executors read the query's offset log)")
        path = tempfile.mkdtemp(prefix=f"sparkbeam-checkpoint-{self.job_id}-")
        self._log(f"{self.job_id}: checkpointing to {path} (no --checkpoint_dir given); run "
                  f"the same pipeline with --checkpoint_dir={path} to resume where it stops")
        return path

    def _keep_run(self, run: Any) -> None:
        self._streaming_run = run

    def _keep_batches(self, progress: list[dict[str, Any]]) -> None:
        self.streaming_batches = progress

    def _report_splits(self, rebalancer: RebalanceServer) -> None:
        for stage in self.plan.stages:
            stats = rebalancer.stats(self.job_id, stage.label)
            self.split_stats[stage.label] = stats
            history = rebalancer.history(self.job_id, stage.label)
            if history:
                self.split_history[stage.label] = history
            if stats["splits"]:
                self._log(
                    f"{stage.display}: {stats['splits']} runner-initiated split(s) moved "
                    f"{stats['items_moved']} element(s) or restriction(s) to idle tasks"
                )
        rebalancer.forget(self.job_id)

    def _log(self, message: str) -> None:
        _LOG.info("%s", message)
        self._on_message(message)

    def wait(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    def cancel(self) -> None:
        self.cancelled.set()
        if self._datasets is not None:
            self._datasets.cancel(self.spark_group)
        if not self._thread.is_alive() and self.state not in TERMINAL:
            self._set_state(PipelineState.CANCELLED)

    def drain(self) -> None:
        """Streaming jobs: stop reading input, fire what the watermark then allows (it goes to
        its end), end in DRAINED. Returns at once."""
        if not self.options.view_as(pipeline_options.StandardOptions).streaming:
            raise JobStateError(f"{self.job_id} cannot drain: it is a batch job; use cancel")
        if self.state in TERMINAL:
            return
        self.drained.set()
        self._set_state(PipelineState.DRAINING)

    def metrics(self) -> SparkMetrics:
        """Committed: the metric rows of successful attempts. Attempted: those plus the live
        reports of every other attempt (failed, retried, or still running)."""
        if self._final_metrics is not None:
            return self._final_metrics
        return self._metrics_now()

    def _metrics_now(self) -> SparkMetrics:
        if self.streaming and self._collector is not None:
            from sparkbeam.streaming.job import streaming_metrics

            return SparkMetrics(*streaming_metrics(self._collector, self.job_id,
                                                   self._streaming_run))
        committed = self.progress.snapshot()
        if self._collector is None:
            return SparkMetrics(committed)
        done = self.progress.committed_keys()
        others = [
            info
            for key, infos in self._collector.reports(self.job_id).items()
            if json.dumps(key.__dict__).encode() not in done
            for info in infos
        ]
        return SparkMetrics(committed, committed + others)


def _default_environment(options: pipeline_options.PipelineOptions) -> Any:
    """Embedded (the bundle processor inside Spark's Python workers) unless the user asked
    for SDK workers of a PROCESS or EXTERNAL environment."""
    kind = options.view_as(pipeline_options.PortableOptions).environment_type or ""
    if kind.upper() in ("PROCESS", "EXTERNAL") or kind in (
        common_urns.environments.PROCESS.urn, common_urns.environments.EXTERNAL.urn
    ):
        return environments.Environment.from_options(
            options.view_as(pipeline_options.PortableOptions))
    return environments.EmbeddedPythonEnvironment.default()


def _worker_options(options: pipeline_options.PipelineOptions) -> dict[str, Any]:
    """The options SDK workers receive (JSON-safe values only)."""
    out: dict[str, Any] = {}
    for key, value in options.get_all_options(drop_default=True).items():
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            continue
        # Provisioning carries options in a protobuf Struct, where numbers become floats the
        # worker's int flags reject ("2.0"): integers travel as text.
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        out[key] = value
    return out


class SparkPipelineResult(PipelineResult):
    """The result of a pipeline run by SparkRunner."""

    def __init__(self, job: SparkJob) -> None:
        super().__init__(job.state)
        self._job = job

    @property
    def job_id(self) -> str:
        return self._job.job_id

    @property
    def state(self) -> str:
        return self._job.state

    @property
    def streaming_batches(self) -> list[dict[str, Any]]:
        """A finished streaming job's micro-batches (Spark's progress: batch id, rows read,
        durations); empty for a batch job."""
        return list(self._job.streaming_batches)

    def wait_until_finish(self, duration: int | None = None) -> str:
        """Waits for the job (at most `duration` milliseconds); raises if it failed."""
        finished = self._job.wait(None if duration is None else duration / 1000.0)
        if not finished:
            return self._job.state
        if self._job.state == PipelineState.FAILED and self._job.error is not None:
            raise self._job.error
        return self._job.state

    def cancel(self) -> str:
        self._job.cancel()
        self._job.wait(60)
        return self._job.state

    def drain(self) -> str:
        """Drains a streaming job (see `SparkJob.drain`); returns its state at once (DRAINING)."""
        self._job.drain()
        return self._job.state

    def metrics(self) -> SparkMetrics:
        return self._job.metrics()

    @property
    def spark_jobs(self) -> int | None:
        """How many Spark jobs a finished batch run took (None over Spark Connect, or before
        the run ends)."""
        return self._job.spark_jobs

    @property
    def split_stats(self) -> dict[str, dict[str, int]]:
        """Runner-initiated splits per stage label: {"splits": n, "items_moved": m}."""
        return dict(self._job.split_stats)

    @property
    def split_history(self) -> dict[str, list[str]]:
        """The rebalancer's decisions per splittable stage label, in order: who reported a
        bundle, who was asked to split, who waited or left. For a run that split less than
        expected."""
        return dict(self._job.split_history)

    def monitoring_infos(self):  # type: ignore[no-untyped-def]
        return self._job.metrics().monitoring_infos()


class SparkRunner(PipelineRunner):
    """Runs Beam pipelines on Apache Spark through PySpark (batch).

    `is_drain=True` plans splittable DoFns as a drained job would run them (restrictions
    truncated), as FnApiRunner(is_drain=True) does.
    """

    def __init__(self, is_drain: bool = False) -> None:
        super().__init__()
        self._is_drain = is_drain

    def run_pipeline(self, pipeline, options):  # type: ignore[no-untyped-def, override]
        RuntimeValueProvider.set_runtime_options({})
        from sparkbeam.execute.session import active_session
        from sparkbeam.execute.warm_up import warm_python_workers

        active = active_session()  # the session the job will run on, if one is up already
        if active is not None:
            warm_python_workers(active)  # while Beam builds the proto and the job plans
        debug = options.view_as(pipeline_options.DebugOptions)
        experiments = debug.experiments or []
        if "beam_fn_api" not in experiments:
            experiments.append("beam_fn_api")
        debug.experiments = experiments
        from apache_beam.runners.portability.fn_api_runner.fn_runner import (
            group_by_key_input_visitor,
        )

        pipeline.visit(
            group_by_key_input_visitor(
                not options.view_as(pipeline_options.TypeOptions).allow_non_deterministic_key_coders
            )
        )
        proto = pipeline.to_runner_api(default_environment=_default_environment(options))
        return self.run_portable_pipeline(proto, options)

    def spark_session(self, options: pipeline_options.PipelineOptions) -> Any:
        """The SparkSession a pipeline with `options` runs on (started now if none is): a
        `ReadFromSpark` asks for it to learn its query's schema as the pipeline is built."""
        from sparkbeam.execute.session import get_session

        return get_session(options.view_as(SparkOptions))

    def run_portable_pipeline(self, proto, options):  # type: ignore[no-untyped-def, override]
        plan = prepare(proto, options, is_drain=self._is_drain)
        job = SparkJob(plan, options)
        result = SparkPipelineResult(job)
        job.start()
        return result


__all__ = ["SparkBeamError", "SparkJob", "SparkPipelineResult", "SparkRunner", "prepare"]
