"""JobManager and Job with a fake executor and fake staging: no network, no Spark."""
from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence

import pytest
from apache_beam.portability.api import beam_job_api_pb2, beam_runner_api_pb2
from google.protobuf import struct_pb2

from sparkbeam.errors import (
    JobNotFoundError,
    JobStateError,
    SparkBeamError,
    UnsupportedFeatureError,
)
from sparkbeam.jobservice import state as st
from sparkbeam.jobservice.job import Job
from sparkbeam.jobservice.manager import JobManager
from tests.unit.jobservice.fakes import FakeExecutor, artifact, pipeline_proto

pytestmark = pytest.mark.timeout(30)



def pipeline(*labels: str, deps: int = 0) -> beam_runner_api_pb2.Pipeline:
    return pipeline_proto(*labels, deps=[f"/client/dep-{i}.whl" for i in range(deps)])


class FakeStaging:
    """StagingArea whose outcome per token the test sets: complete, incomplete or an error."""

    def __init__(self) -> None:
        self.registered: dict[str, dict[str, list]] = {}
        self.outcomes: dict[str, object] = {}
        self.released: list[str] = []

    def release(self, staging_token: str) -> None:
        self.released.append(staging_token)
        self.registered.pop(staging_token, None)

    def register_job(
        self, staging_token: str,
        dependency_sets: Mapping[str, Sequence[beam_runner_api_pb2.ArtifactInformation]],
    ) -> None:
        self.registered[staging_token] = {k: list(v) for k, v in dependency_sets.items()}

    def resolved_deps(
        self, staging_token: str, timeout: float | None = None
    ) -> dict[str, list[beam_runner_api_pb2.ArtifactInformation]]:
        outcome = self.outcomes.get(staging_token, "complete")
        if outcome == "incomplete":
            raise TimeoutError(f"staging {staging_token} still under way")
        if isinstance(outcome, Exception):
            raise outcome
        return {
            env: [artifact(f"/staged/{staging_token}/{i}") for i, _ in enumerate(deps)]
            for env, deps in self.registered[staging_token].items()
        }


@pytest.fixture
def executor() -> FakeExecutor:
    return FakeExecutor()


@pytest.fixture
def staging() -> FakeStaging:
    return FakeStaging()


@pytest.fixture
def jobs(executor: FakeExecutor, staging: FakeStaging):
    manager = JobManager(executor, staging, "127.0.0.1:1234")
    yield manager
    manager.shutdown()


def options() -> struct_pb2.Struct:
    return struct_pb2.Struct()


def states(job: Job) -> list[str]:
    """Follows the job's state stream to its end."""
    return [st.state_name(e.state) for e in job.follow_states(lambda: True)]


def texts(job: Job) -> list[str]:
    return [
        m.message_response.message_text
        for m in job.follow_messages(lambda: True)
        if m.HasField("message_response")
    ]


def test_prepare_gives_readable_ids_and_registers_staging(jobs, staging) -> None:
    first = jobs.prepare("job", pipeline(deps=2), options())
    second = jobs.prepare("job", pipeline(), options())
    assert (first.preparation_id, second.preparation_id) == ("job-001", "job-002")
    assert first.staging_token == "job-001"
    assert first.staging_endpoint == "127.0.0.1:1234"
    assert [len(v) for v in staging.registered["job-001"].values()] == [2]
    assert jobs.get("job-001").state == st.STOPPED


def test_prepare_raises_every_unsupported_feature_and_registers_nothing(jobs, staging) -> None:
    with pytest.raises(UnsupportedFeatureError, match="2 unsupported") as info:
        jobs.prepare("job", pipeline("UnsupportedA", "Create", "UnsupportedB"), options())
    assert [f.where for f in info.value.features] == [
        "transform 'UnsupportedA'", "transform 'UnsupportedB'"
    ]
    with pytest.raises(SparkBeamError, match="BadInput"):
        jobs.prepare("job", pipeline("BadInput"), options())
    assert jobs.jobs() == [] and staging.registered == {}


def test_a_job_runs_to_done_with_staged_artifacts_and_messages(jobs, executor) -> None:
    job_id = jobs.run(jobs.prepare("job", pipeline(deps=1), options()).preparation_id)
    job = jobs.get(job_id)
    assert states(job) == ["STOPPED", "STARTING", "RUNNING", "DONE"]
    assert texts(job) == ["job-001: stage-001 started", "job-001: stage-001 finished"]
    assert executor.handles[job_id].artifacts == {"env": [artifact("/staged/job-001/0")]}
    committed, attempted = job.metrics()
    assert committed == attempted and len(committed) == 1


def test_unknown_ids_are_job_not_found(jobs) -> None:
    jobs.prepare("job", pipeline(), options())
    for call in (jobs.get, jobs.run):
        with pytest.raises(JobNotFoundError, match=r"no job or preparation has id 'job-404' "
                                                   r"\(latest known: job-001\)"):
            call("job-404")


def test_run_twice_is_refused(jobs) -> None:
    job_id = jobs.prepare("job", pipeline("Block"), options()).preparation_id
    jobs.run(job_id)
    with pytest.raises(JobStateError, match="job-001 cannot Run: it is (STARTING|RUNNING)"):
        jobs.run(job_id)


def test_incomplete_staging_refuses_run_and_keeps_the_job_runnable(jobs, staging) -> None:
    job_id = jobs.prepare("job", pipeline(deps=1), options()).preparation_id
    staging.outcomes[job_id] = "incomplete"
    with pytest.raises(JobStateError, match="staging is incomplete.*still under way"):
        jobs.run(job_id)
    assert jobs.get(job_id).state == st.STOPPED
    staging.outcomes[job_id] = "complete"
    jobs.run(job_id)
    assert states(jobs.get(job_id))[-1] == "DONE"


def test_failed_staging_refuses_run_with_the_root_cause_and_fails_the_job(jobs, staging) -> None:
    job_id = jobs.prepare("job", pipeline(deps=1), options()).preparation_id
    staging.outcomes[job_id] = SparkBeamError("dep-0.whl: client went away after 3 of 9 chunks")
    with pytest.raises(JobStateError, match="staging failed: dep-0.whl: client went away"):
        jobs.run(job_id)
    job = jobs.get(job_id)
    assert states(job) == ["STOPPED", "FAILED"]
    assert "client went away" in texts(job)[-1]


def test_no_artifacts_means_no_wait_for_staging(jobs, staging) -> None:
    job_id = jobs.prepare("job", pipeline(), options()).preparation_id
    staging.outcomes[job_id] = "incomplete"  # never asked: nothing to stage
    jobs.run(job_id)
    assert states(jobs.get(job_id))[-1] == "DONE"


def test_an_executor_failure_reaches_the_message_stream_before_failed(jobs) -> None:
    job = jobs.get(jobs.run(jobs.prepare("job", pipeline("Fail"), options()).preparation_id))
    assert states(job)[-1] == "FAILED"
    messages = list(job.follow_messages(lambda: True))
    error = messages[-2].message_response
    assert error.importance == beam_job_api_pb2.JobMessage.JOB_MESSAGE_ERROR
    assert "job-001 failed: UserCodeError" in error.message_text
    assert "raise ValueError('boom at element 3')" in error.message_text
    assert messages[-1].state_response.state == st.FAILED


def test_a_start_crash_fails_the_job(jobs) -> None:
    job = jobs.get(jobs.run(jobs.prepare("job", pipeline("CrashOnStart"), options())
                            .preparation_id))
    assert states(job) == ["STOPPED", "STARTING", "FAILED"]
    assert "the fake executor cannot start this job" in texts(job)[-1]


def test_a_handle_that_breaks_fails_its_job(jobs) -> None:
    job = jobs.get(jobs.run(jobs.prepare("job", pipeline("BrokenWait"), options())
                            .preparation_id))
    assert states(job)[-1] == "FAILED"
    assert "RuntimeError: lost contact with the Spark driver" in texts(job)[-1]


def test_cancel_stops_the_run_once(jobs, executor) -> None:
    job = jobs.get(jobs.run(jobs.prepare("job", pipeline("Block"), options()).preparation_id))
    wait_for(lambda: job.state == st.RUNNING)
    assert job.cancel() in (st.CANCELLING, st.CANCELLED)
    assert job.cancel() in (st.CANCELLING, st.CANCELLED)
    assert states(job)[-2:] == ["CANCELLING", "CANCELLED"]
    assert executor.handles["job-001"].cancel_calls == 1
    assert job.cancel() == st.CANCELLED  # idempotent after the end


def test_cancel_before_run(jobs, executor) -> None:
    job = jobs.get(jobs.prepare("job", pipeline(), options()).preparation_id)
    assert job.cancel() == st.CANCELLED
    with pytest.raises(JobStateError, match="cannot Run: it is CANCELLED"):
        jobs.run(job.job_id)
    assert executor.handles == {}


def test_drain_is_refused(jobs) -> None:
    job = jobs.get(jobs.run(jobs.prepare("job", pipeline("Block"), options()).preparation_id))
    with pytest.raises(JobStateError, match="batch job"):
        job.drain()
    job.cancel()


def test_metrics_are_attempted_while_running_and_committed_at_the_end(jobs, executor) -> None:
    job = jobs.get(jobs.run(jobs.prepare("job", pipeline("Block"), options()).preparation_id))
    wait_for(lambda: bool(job.metrics()[1]))
    committed, attempted = job.metrics()
    assert committed == [] and len(attempted) == 1
    executor.handles[job.job_id].release.set()
    assert states(job)[-1] == "DONE"
    committed, attempted = job.metrics()
    assert committed == attempted and len(committed) == 1


def test_late_subscribers_get_the_history_and_live_ones_the_rest(jobs, executor) -> None:
    job = jobs.get(jobs.prepare("job", pipeline("Block"), options()).preparation_id)
    early: list[str] = []
    follower = threading.Thread(target=lambda: early.extend(states(job)))
    follower.start()
    jobs.run(job.job_id)
    wait_for(lambda: job.state == st.RUNNING)
    executor.handles[job.job_id].release.set()
    follower.join(10)
    assert early == states(job) == ["STOPPED", "STARTING", "RUNNING", "DONE"]


def test_a_stream_ends_when_its_client_goes_away(jobs) -> None:
    job = jobs.get(jobs.prepare("job", pipeline(), options()).preparation_id)
    stream = job.follow_states(lambda: False)
    assert [e.state for e in stream] == [st.STOPPED]  # history, then no client: end


def test_shutdown_cancels_running_jobs_and_ends_streams(executor, staging) -> None:
    manager = JobManager(executor, staging, "127.0.0.1:1234")
    job = manager.get(manager.run(manager.prepare("job", pipeline("Block"), options())
                                  .preparation_id))
    wait_for(lambda: job.state == st.RUNNING)
    manager.shutdown()
    assert states(job)[-1] == "CANCELLED"


def test_jobs_do_not_disturb_each_other(jobs) -> None:
    ids = [jobs.run(jobs.prepare("job", pipeline(label), options()).preparation_id)
           for label in ("Fail", "Create", "CrashOnStart", "Create")]
    ends = [states(jobs.get(i))[-1] for i in ids]
    assert ends == ["FAILED", "DONE", "FAILED", "DONE"]


def wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)
