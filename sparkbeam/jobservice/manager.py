"""The jobs of one job service: prepare, check staging, run, look up.

The preparation id is also the job id and the staging token (`job-001`, `job-002`, ...), so
every log line and error names the job the same way from Prepare to the end of the run.
"""
from __future__ import annotations

import itertools
import logging
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
    ) -> None:
        self.executor = executor
        self._staging = staging
        self._staging_endpoint = staging_endpoint
        self._staging_grace = staging_grace
        self._lock = threading.Lock()
        self._jobs: dict[str, Job] = {}
        self._ids = itertools.count(1)

    def prepare(
        self, job_name: str, pipeline: beam_runner_api_pb2.Pipeline, options: struct_pb2.Struct
    ) -> Preparation:
        """Checks the pipeline with the executor, then expects its artifacts to be staged.

        Raises what `executor.prepare` raises (every unsupported feature in one error).
        """
        self.executor.prepare(pipeline, options)
        deps = dependency_sets(pipeline)
        with self._lock:
            job_id = f"job-{next(self._ids):03d}"
            self._jobs[job_id] = Job(job_id, job_name, pipeline, options)
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
            listed = ", ".join(known[-5:]) or "none yet"
            raise JobNotFoundError(
                f"no job or preparation has id {job_id!r} (latest known: {listed})"
            )
        return job

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
