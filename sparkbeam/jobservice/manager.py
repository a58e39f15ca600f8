"""The jobs of one job service: prepare, check staging, run, look up, and forget.

The preparation id is also the job id and the staging token (`job-001`, `job-002`, ...), so
every log line and error names the job the same way from Prepare to the end of the run.

A server lives long and sees many jobs, so what it keeps is bounded (`Retention`): an ended
job stays for `seconds` after its end and among the `jobs` most recently ended; a prepared job
that never ran stays for `seconds` after Prepare. Then it is evicted: its streams end, its
state, messages and metrics are dropped, and its staged artifacts are released. Ids are never
reused, so an id below the next one that is not held any more is one that expired.
"""
from __future__ import annotations

import logging
import re
import threading
import time
from dataclasses import dataclass

from apache_beam.portability.api import beam_runner_api_pb2
from google.protobuf import struct_pb2

from sparkbeam.errors import JobNotFoundError, JobStateError
from sparkbeam.jobservice.job import Job
from sparkbeam.jobservice.protocol import DependencySets, JobExecutor, StagingArea
from sparkbeam.jobservice.staging import dependency_sets

_LOGGER = logging.getLogger(__name__)

# How long Run waits for a staging session that the client has just finished: its last
# reply and the server's bookkeeping race by a few milliseconds.
STAGING_GRACE_SECONDS = 5.0

_JOB_ID = re.compile(r"job-(\d+)")


@dataclass(frozen=True)
class Retention:
    """How long, and how many, jobs a server keeps after they end (see the module doc); the
    same bounds apply to prepared jobs that have not run."""

    seconds: float = 3600.0
    jobs: int = 100

    def __post_init__(self) -> None:
        if self.seconds <= 0 or self.jobs < 1:
            raise ValueError(
                f"job retention must be positive: got {self.seconds:g} s and {self.jobs} jobs"
            )

    def describe(self) -> str:
        return f"{_duration(self.seconds)} after they end, at most {self.jobs} ended jobs"


@dataclass(frozen=True)
class Preparation:
    """What Prepare hands back to the client."""

    preparation_id: str
    staging_endpoint: str
    staging_token: str


class JobManager:
    """Holds every job of a server; the servicer's only collaborator besides the executor."""

    def __init__(
        self,
        executor: JobExecutor,
        staging: StagingArea,
        staging_endpoint: str,
        *,
        staging_grace: float = STAGING_GRACE_SECONDS,
        retention: Retention | None = None,
    ) -> None:
        self.executor = executor
        self.retention = retention or Retention()
        self._staging = staging
        self._staging_endpoint = staging_endpoint
        self._staging_grace = staging_grace
        self._lock = threading.Lock()
        self._jobs: dict[str, Job] = {}
        self._issued = 0  # the highest job number handed out (ids are never reused)
        self.evicted = 0  # jobs evicted so far

    def prepare(
        self, job_name: str, pipeline: beam_runner_api_pb2.Pipeline, options: struct_pb2.Struct
    ) -> Preparation:
        """Checks the pipeline with the executor, then expects its artifacts to be staged.

        Raises what `executor.prepare` raises (every unsupported feature in one error).
        """
        self.executor.prepare(pipeline, options)
        deps = dependency_sets(pipeline)
        self.evict_expired()
        with self._lock:
            self._issued += 1
            job_id = f"job-{self._issued:03d}"
            self._jobs[job_id] = Job(
                job_id, job_name, pipeline, options, on_end=self._job_ended
            )
        try:
            self._staging.register_job(job_id, deps)
        except BaseException:
            with self._lock:
                del self._jobs[job_id]
            raise
        _LOGGER.info(
            "%s: prepared %r (%d transforms, %d artifacts to stage)", job_id, job_name,
            len(pipeline.components.transforms), sum(len(d) for d in deps.values()),
        )
        return Preparation(job_id, self._staging_endpoint, job_id)

    def run(self, preparation_id: str) -> str:
        """Starts a prepared job whose artifacts are staged; returns its job id.

        Refuses (JobStateError) a job that is not STOPPED, whose staging is still under way,
        or whose staging failed (the job then ends in FAILED with the root cause).
        """
        job = self.get(preparation_id)
        with job.run_lock:
            job.check_can_run()
            job.start(self.executor, self._staged_artifacts(job))
        return job.job_id

    def get(self, job_id: str) -> Job:
        """The job with this job id or preparation id."""
        with self._lock:
            job = self._jobs.get(job_id)
            known = sorted(self._jobs)
        if job is None:
            if self._expired(job_id):
                raise JobNotFoundError(
                    f"{job_id} expired: the job server keeps jobs {self.retention.describe()} "
                    "(--job-retention, --job-retention-count), and prepared jobs that never "
                    f"ran for {_duration(self.retention.seconds)}"
                )
            listed = ", ".join(known[-5:]) or "none yet"
            raise JobNotFoundError(
                f"no job or preparation has id {job_id!r} (latest known: {listed})"
            )
        return job

    def evict_expired(self, now: float | None = None) -> list[str]:
        """Evicts the jobs the retention no longer covers; returns their ids."""
        now = time.monotonic() if now is None else now
        limit = self.retention
        with self._lock:
            jobs = list(self._jobs.values())
        ended = sorted((j for j in jobs if j.ended_at is not None),
                       key=lambda j: j.ended_at or 0.0)
        waiting = sorted((j for j in jobs if j.ended_at is None and j.never_ran),
                         key=lambda j: j.prepared_at)
        doomed = []
        for kept, when in ((ended, lambda j: j.ended_at), (waiting, lambda j: j.prepared_at)):
            surplus = max(0, len(kept) - limit.jobs)  # the oldest beyond the count go
            doomed += kept[:surplus]
            doomed += [j for j in kept[surplus:] if now - when(j) > limit.seconds]
        if not doomed:
            return []
        with self._lock:
            for job in doomed:
                self._jobs.pop(job.job_id, None)
            self.evicted += len(doomed)
        for job in doomed:
            job.close()
            try:
                self._staging.release(job.job_id)
            except Exception:  # noqa: BLE001 - a file left behind must not stop the eviction
                _LOGGER.warning("%s: releasing its staged artifacts failed", job.job_id,
                                exc_info=True)
        _LOGGER.info("evicted %d job(s): %s", len(doomed), ", ".join(j.job_id for j in doomed))
        return [j.job_id for j in doomed]

    def _job_ended(self, job: Job) -> None:
        self.evict_expired()  # the count bound may now let an older job go

    def _expired(self, job_id: str) -> bool:
        match = _JOB_ID.fullmatch(job_id)
        with self._lock:
            return match is not None and 0 < int(match.group(1)) <= self._issued

    def note_staging(self, staging_token: str, text: str) -> None:
        """Puts a staging milestone in the message stream of the job it belongs to."""
        with self._lock:
            job = self._jobs.get(staging_token)
        if job is None:
            _LOGGER.info("staging %s (no such job): %s", staging_token, text)
        else:
            job.note(text)

    def jobs(self) -> list[Job]:
        """Every job, in the order they were prepared."""
        with self._lock:
            return list(self._jobs.values())

    def shutdown(self, timeout: float = 5.0) -> None:
        """Cancels the jobs still running, gives them `timeout` seconds to end, then ends
        every stream."""
        jobs = self.jobs()
        for job in jobs:
            job.cancel()  # a no-op for jobs that have ended
        deadline = time.monotonic() + timeout
        for job in jobs:
            if not job.wait_ended(max(0.0, deadline - time.monotonic())):
                _LOGGER.warning("%s: still %s at shutdown", job.job_id, job.state_name)
            job.close()

    def _staged_artifacts(self, job: Job) -> DependencySets:
        requested = dependency_sets(job.pipeline)
        if not any(requested.values()):
            return requested  # nothing to stage: no need to wait for the client's session
        try:
            staged = self._staging.resolved_deps(job.job_id, timeout=self._staging_grace)
        except TimeoutError as exc:
            raise JobStateError(
                f"{job.job_id} cannot Run yet: its artifact staging is incomplete ({exc}); "
                "stage every artifact through the endpoint Prepare returned, then Run"
            ) from exc
        except Exception as exc:
            text = f"{job.job_id} cannot Run: artifact staging failed: {exc}"
            job.fail_staging(text)
            raise JobStateError(text) from exc
        return {env_id: list(deps) for env_id, deps in staged.items()}


def _duration(seconds: float) -> str:
    for unit, size in (("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g} {unit}"
    return f"{seconds:g} s"
