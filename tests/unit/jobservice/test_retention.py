"""Ended jobs are kept for a bounded time and count, then evicted (no network, no Spark)."""
from __future__ import annotations

import time

import pytest

from sparkbeam.errors import JobNotFoundError
from sparkbeam.jobservice import state as st
from sparkbeam.jobservice.manager import JobManager, Retention
from tests.unit.jobservice.fakes import FakeExecutor
from tests.unit.jobservice.test_manager import FakeStaging, options, pipeline, states

pytestmark = pytest.mark.timeout(30)


def manager(retention: Retention) -> tuple[JobManager, FakeStaging]:
    staging = FakeStaging()
    return JobManager(FakeExecutor(), staging, "127.0.0.1:1", retention=retention), staging


def run_to_end(jobs: JobManager, *labels: str) -> str:
    job_id = jobs.run(jobs.prepare("job", pipeline(*labels), options()).preparation_id)
    assert states(jobs.get(job_id))[-1] == "DONE"
    return job_id


def test_the_oldest_ended_jobs_go_beyond_the_count_with_their_artifacts() -> None:
    jobs, staging = manager(Retention(seconds=3600, jobs=3))
    ids = [run_to_end(jobs) for _ in range(5)]
    # The count is applied when a job ends (on its thread, just after its last state).
    deadline = time.monotonic() + 10
    while jobs.evicted < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [j.job_id for j in jobs.jobs()] == ids[2:]
    assert staging.released == ids[:2]
    assert jobs.evicted == 2
    with pytest.raises(JobNotFoundError, match=r"job-001 expired: the job server keeps jobs "
                       r"1 h after they end, at most 3 ended jobs \(--job-retention"):
        jobs.get("job-001")
    with pytest.raises(JobNotFoundError, match="no job or preparation has id 'job-006'"):
        jobs.get("job-006")  # never issued: unknown, not expired


def test_ended_jobs_go_after_the_retention_time_and_running_ones_stay() -> None:
    jobs, staging = manager(Retention(seconds=60, jobs=100))
    done = run_to_end(jobs)
    running = jobs.run(jobs.prepare("job", pipeline("Block"), options()).preparation_id)
    now = time.monotonic()
    assert jobs.evict_expired(now + 30) == []
    assert jobs.evict_expired(now + 61) == [done]
    assert [j.job_id for j in jobs.jobs()] == [running]
    assert staging.released == [done]
    jobs.get(running).cancel()
    jobs.shutdown()


def test_a_prepared_job_that_never_runs_expires_and_its_streams_end() -> None:
    jobs, staging = manager(Retention(seconds=60, jobs=100))
    job_id = jobs.prepare("job", pipeline(deps=1), options()).preparation_id
    job = jobs.get(job_id)
    assert jobs.evict_expired(time.monotonic() + 61) == [job_id]
    assert states(job) == ["STOPPED"]  # the stream ended when the job was evicted
    assert staging.released == [job_id]
    with pytest.raises(JobNotFoundError, match="job-001 expired"):
        jobs.run(job_id)


def test_unrun_preparations_are_bounded_by_count_too() -> None:
    jobs, staging = manager(Retention(seconds=3600, jobs=2))
    ids = [jobs.prepare("job", pipeline(), options()).preparation_id for _ in range(4)]
    jobs.evict_expired()
    assert [j.job_id for j in jobs.jobs()] == ids[2:]
    assert staging.released == ids[:2]


def test_retention_must_be_positive() -> None:
    with pytest.raises(ValueError, match="job retention must be positive"):
        Retention(seconds=0)
    with pytest.raises(ValueError, match="job retention must be positive"):
        Retention(jobs=0)


def test_an_ended_job_keeps_its_outcome_but_not_the_run() -> None:
    jobs, _ = manager(Retention())
    job = jobs.get(run_to_end(jobs))
    committed, attempted = job.metrics()
    assert len(committed) == 1 and committed == attempted
    assert job._handle is None  # the executor's run object is not kept with the job
    assert job.state == st.DONE
