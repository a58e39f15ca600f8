"""Every Job API RPC over real gRPC with raw stubs: codes, states, streams, staging."""
from __future__ import annotations

import grpc
import pytest
from apache_beam.portability import common_urns
from apache_beam.portability.api import (
    beam_artifact_api_pb2,
    beam_artifact_api_pb2_grpc,
    beam_job_api_pb2,
    beam_runner_api_pb2,
)
from apache_beam.runners.portability import artifact_service
from google.protobuf import struct_pb2

from tests.component.jobservice.conftest import RPC_TIMEOUT, wait_for
from tests.unit.jobservice.fakes import artifact, pipeline_proto

pytestmark = [
    pytest.mark.timeout(60),
]

pb = beam_job_api_pb2
S = pb.JobState


def prepare(stub, *labels: str, deps: tuple[str, ...] = (), streaming: bool = False
            ) -> pb.PrepareJobResponse:
    options = struct_pb2.Struct()
    if streaming:
        options.update({"beam:option:streaming:v1": True})
    return stub.Prepare(
        pb.PrepareJobRequest(job_name="raw", pipeline=pipeline_proto(*labels, deps=deps),
                             pipeline_options=options),
        timeout=RPC_TIMEOUT,
    )


def run(stub, *labels: str, streaming: bool = False) -> str:
    prepared = prepare(stub, *labels, streaming=streaming)
    return stub.Run(pb.RunJobRequest(preparation_id=prepared.preparation_id),
                    timeout=RPC_TIMEOUT).job_id


def state(stub, job_id: str) -> int:
    return stub.GetState(pb.GetJobStateRequest(job_id=job_id), timeout=RPC_TIMEOUT).state


def state_stream(stub, job_id: str) -> list[int]:
    return [e.state for e in stub.GetStateStream(pb.GetJobStateRequest(job_id=job_id),
                                                  timeout=RPC_TIMEOUT)]


def messages(stub, job_id: str) -> list[str]:
    return [r.message_response.message_text
            for r in stub.GetMessageStream(pb.JobMessagesRequest(job_id=job_id),
                                           timeout=RPC_TIMEOUT)
            if r.HasField("message_response")]


def refused(call, request) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        response = call(request, timeout=RPC_TIMEOUT)
        if not hasattr(response, "ByteSize"):  # a stream: errors come when it is read
            list(response)
    return info.value


def test_describe_pipeline_options_comes_from_the_executor(stub) -> None:
    response = stub.DescribePipelineOptions(pb.DescribePipelineOptionsRequest(),
                                            timeout=RPC_TIMEOUT)
    assert [o.name for o in response.options] == ["fake_bundle_size"]


@pytest.mark.parametrize(
    "rpc, request_type",
    [
        ("Run", lambda: pb.RunJobRequest(preparation_id="job-404")),
        ("GetState", lambda: pb.GetJobStateRequest(job_id="job-404")),
        ("GetPipeline", lambda: pb.GetJobPipelineRequest(job_id="job-404")),
        ("Cancel", lambda: pb.CancelJobRequest(job_id="job-404")),
        ("Drain", lambda: pb.DrainJobRequest(job_id="job-404")),
        ("GetJobMetrics", lambda: pb.GetJobMetricsRequest(job_id="job-404")),
        ("GetStateStream", lambda: pb.GetJobStateRequest(job_id="job-404")),
        ("GetMessageStream", lambda: pb.JobMessagesRequest(job_id="job-404")),
    ],
)
def test_unknown_ids_are_not_found(stub, rpc: str, request_type) -> None:
    error = refused(getattr(stub, rpc), request_type())
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert "no job or preparation has id 'job-404'" in error.details()


def test_bad_input_is_invalid_argument(stub) -> None:
    error = refused(stub.Prepare, pb.PrepareJobRequest(job_name="raw",
                                                       pipeline=pipeline_proto("BadInput")))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "BadInput" in error.details()


def test_streams_replay_the_history_to_late_subscribers(stub) -> None:
    job_id = run(stub, "Create")
    live = state_stream(stub, job_id)
    late = state_stream(stub, job_id)  # after the end: history only, then the stream ends
    assert live == late == [S.STOPPED, S.STARTING, S.RUNNING, S.DONE]
    replies = list(stub.GetMessageStream(pb.JobMessagesRequest(job_id=job_id),
                                         timeout=RPC_TIMEOUT))
    assert [r.state_response.state for r in replies if r.HasField("state_response")] == late
    assert [r.message_response.message_text for r in replies
            if r.HasField("message_response")] == [
        "job-001: stage-001 started", "job-001: stage-001 finished"
    ]
    pipeline = stub.GetPipeline(pb.GetJobPipelineRequest(job_id=job_id), timeout=RPC_TIMEOUT)
    assert pipeline.pipeline == pipeline_proto("Create")


def test_the_state_stream_of_a_preparation_starts_at_once(stub) -> None:
    job_id = prepare(stub).preparation_id
    stream = stub.GetStateStream(pb.GetJobStateRequest(job_id=job_id), timeout=RPC_TIMEOUT)
    assert next(stream).state == S.STOPPED  # what PortableRunner reads before Run
    stub.Run(pb.RunJobRequest(preparation_id=job_id), timeout=RPC_TIMEOUT)
    assert [e.state for e in stream] == [S.STARTING, S.RUNNING, S.DONE]


def test_run_twice_is_a_failed_precondition(stub) -> None:
    job_id = run(stub, "Block")
    error = refused(stub.Run, pb.RunJobRequest(preparation_id=job_id))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "job-001 cannot Run" in error.details()
    stub.Cancel(pb.CancelJobRequest(job_id=job_id), timeout=RPC_TIMEOUT)


def test_cancel_a_running_job(stub, executor) -> None:
    job_id = run(stub, "Block")
    wait_for(lambda: state(stub, job_id) == S.RUNNING)
    reply = stub.Cancel(pb.CancelJobRequest(job_id=job_id), timeout=RPC_TIMEOUT)
    assert reply.state in (S.CANCELLING, S.CANCELLED)
    assert state_stream(stub, job_id)[-2:] == [S.CANCELLING, S.CANCELLED]
    assert executor.handles[job_id].cancel_calls == 1


def test_drain_of_a_streaming_job_ends_it_drained(stub, executor) -> None:
    job_id = run(stub, "Block", streaming=True)
    wait_for(lambda: state(stub, job_id) == S.RUNNING)
    reply = stub.Drain(pb.DrainJobRequest(job_id=job_id), timeout=RPC_TIMEOUT)
    assert reply.state in (S.DRAINING, S.DRAINED)
    assert state_stream(stub, job_id)[-3:] == [S.RUNNING, S.DRAINING, S.DRAINED]
    assert executor.handles[job_id].drain_calls == 1


def test_drain_is_refused_for_batch_jobs(stub) -> None:
    job_id = run(stub, "Block")
    error = refused(stub.Drain, pb.DrainJobRequest(job_id=job_id))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "batch job" in error.details() and "use Cancel" in error.details()
    assert state(stub, job_id) in (S.STARTING, S.RUNNING)
    stub.Cancel(pb.CancelJobRequest(job_id=job_id), timeout=RPC_TIMEOUT)


def test_metrics_are_attempted_live_and_committed_at_the_end(stub, executor) -> None:
    job_id = run(stub, "Block")

    def metrics() -> pb.MetricResults:
        return stub.GetJobMetrics(pb.GetJobMetricsRequest(job_id=job_id),
                                  timeout=RPC_TIMEOUT).metrics

    wait_for(lambda: len(metrics().attempted) == 1)
    assert state(stub, job_id) == S.RUNNING and len(metrics().committed) == 0
    executor.handles[job_id].release.set()
    assert state_stream(stub, job_id)[-1] == S.DONE
    assert len(metrics().committed) == 1 and metrics().committed == metrics().attempted


def test_a_start_crash_fails_the_job_and_says_why(stub) -> None:
    job_id = run(stub, "CrashOnStart")
    assert state_stream(stub, job_id)[-1] == S.FAILED
    assert "the fake executor cannot start this job" in messages(stub, job_id)[-1]


def test_get_jobs_lists_every_job(stub) -> None:
    first = run(stub, "Create")
    second = prepare(stub).preparation_id
    state_stream(stub, first)
    infos = stub.GetJobs(pb.GetJobsRequest(), timeout=RPC_TIMEOUT).job_info
    assert [(i.job_id, i.job_name, i.state) for i in infos] == [
        (first, "raw", S.DONE), (second, "raw", S.STOPPED)
    ]


# --- artifact staging --------------------------------------------------------------------------


def staging_stub(channel) -> beam_artifact_api_pb2_grpc.ArtifactStagingServiceStub:
    return beam_artifact_api_pb2_grpc.ArtifactStagingServiceStub(channel)


def offer(channel, token: str) -> None:
    """What PortableRunner does: serve the client's files to the server's staging session."""
    artifact_service.offer_artifacts(
        staging_stub(channel),
        artifact_service.ArtifactRetrievalService(
            artifact_service.BeamFilesystemHandler(None).file_reader),
        token,
    )


def test_prepare_returns_the_staging_endpoint_and_token(stub, server) -> None:
    reply = prepare(stub)
    assert reply.staging_session_token == reply.preparation_id == "job-001"
    assert reply.artifact_staging_endpoint.url == f"127.0.0.1:{server.port}"


def test_staged_artifacts_reach_the_executor(stub, channel, executor, tmp_path) -> None:
    dep = tmp_path / "dep-1.0.whl"
    dep.write_bytes(b"wheel bytes")
    reply = prepare(stub, deps=(str(dep),))
    offer(channel, reply.staging_session_token)
    stub.Run(pb.RunJobRequest(preparation_id=reply.preparation_id), timeout=RPC_TIMEOUT)
    assert state_stream(stub, reply.preparation_id)[-1] == S.DONE
    [staged] = executor.handles["job-001"].artifacts["env"]
    assert staged.role_payload == artifact(str(dep)).role_payload
    # Staging milestones reach the job's message stream too.
    assert any("stag" in text.lower() for text in messages(stub, reply.preparation_id))


def test_run_is_refused_until_staging_completes(stub, channel, tmp_path) -> None:
    dep = tmp_path / "dep-1.0.whl"
    dep.write_bytes(b"wheel bytes")
    reply = prepare(stub, deps=(str(dep),))
    error = refused(stub.Run, pb.RunJobRequest(preparation_id=reply.preparation_id))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "job-001 cannot Run yet: its artifact staging is incomplete" in error.details()
    assert state(stub, reply.preparation_id) == S.STOPPED
    offer(channel, reply.staging_session_token)  # the client catches up: now it may run
    stub.Run(pb.RunJobRequest(preparation_id=reply.preparation_id), timeout=RPC_TIMEOUT)
    assert state_stream(stub, reply.preparation_id)[-1] == S.DONE


def test_failed_staging_refuses_run_with_the_root_cause(stub, channel, tmp_path) -> None:
    reply = prepare(stub, deps=(str(tmp_path / "missing-1.0.whl"),))
    with pytest.raises(FileNotFoundError):  # the client cannot read its own artifact
        offer(channel, reply.staging_session_token)
    error = refused(stub.Run, pb.RunJobRequest(preparation_id=reply.preparation_id))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "job-001 cannot Run: artifact staging failed" in error.details()
    assert state_stream(stub, reply.preparation_id) == [S.STOPPED, S.FAILED]
    assert "client" in error.details()  # the root cause: the client broke off the stream
    assert "client" in messages(stub, reply.preparation_id)[-1]


def test_an_unknown_staging_token_is_not_found(channel) -> None:
    with pytest.raises(grpc.RpcError) as info:
        offer(channel, "job-404")
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


# How the retrieval service may refuse (Beam's adapter and sparkbeam.artifacts word it apart).
REFUSALS = {grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.NOT_FOUND,
            grpc.StatusCode.INVALID_ARGUMENT}


def url_artifact(url: str) -> beam_runner_api_pb2.ArtifactInformation:
    return beam_runner_api_pb2.ArtifactInformation(
        type_urn=common_urns.artifact_types.URL.urn,
        type_payload=beam_runner_api_pb2.ArtifactUrlPayload(url=url).SerializeToString(),
    )


@pytest.mark.parametrize(
    "outside", [artifact("/etc/hostname"), url_artifact("http://169.254.169.254/")],
    ids=["file-outside-the-staging-dir", "url"],
)
def test_retrieval_serves_only_the_staging_directory(channel, outside) -> None:
    retrieval = beam_artifact_api_pb2_grpc.ArtifactRetrievalServiceStub(channel)
    chunks = retrieval.GetArtifact(
        beam_artifact_api_pb2.GetArtifactRequest(artifact=outside), timeout=RPC_TIMEOUT
    )
    with pytest.raises(grpc.RpcError) as info:
        list(chunks)
    assert info.value.code() in REFUSALS
