"""Beam's own PortableRunner client against the job server (real gRPC, fake executor)."""
from __future__ import annotations

import tarfile
import threading
from pathlib import Path

import apache_beam as beam
import grpc
import pytest
from apache_beam.portability import common_urns
from apache_beam.portability.api import (
    beam_artifact_api_pb2,
    beam_artifact_api_pb2_grpc,
    beam_job_api_pb2,
    beam_runner_api_pb2,
)
from apache_beam.runners.runner import PipelineState

from tests.component.jobservice.conftest import RPC_TIMEOUT, wait_for

pytestmark = pytest.mark.timeout(90)

pb = beam_job_api_pb2


def build(p: beam.Pipeline, *labels: str) -> beam.Pipeline:
    """Create([1, 2, 3]) followed by identity Maps with these labels (the fake reads them)."""
    pcoll = p | "Create" >> beam.Create([1, 2, 3])
    for label in labels:
        pcoll = pcoll | label >> beam.Map(lambda x: x)
    return p


def messages(result) -> list[str]:
    return [m.message_response.message_text for m in result._messages
            if m.HasField("message_response")]


def test_a_pipeline_runs_to_done_with_metrics_and_milestones(portable, stub) -> None:
    result = build(portable(), "Double").run()
    assert result.wait_until_finish() == PipelineState.DONE
    assert result.state == PipelineState.DONE  # GetState
    counters = result.metrics().query()["counters"]  # GetJobMetrics
    assert [(c.key.metric.name, c.committed, c.attempted) for c in counters] == [
        ("elements", 3, 3)
    ]
    assert "job-001: stage-001 started" in messages(result)
    [info] = stub.GetJobs(pb.GetJobsRequest(), timeout=RPC_TIMEOUT).job_info
    assert (info.job_id, info.state) == ("job-001", pb.JobState.DONE)


def test_an_executor_failure_reaches_the_client_with_the_user_traceback(portable) -> None:
    result = build(portable(), "Fail").run()
    with pytest.raises(RuntimeError, match="job-001 failed in state FAILED") as info:
        result.wait_until_finish()
    text = str(info.value)
    assert "user code failed in transform 'Fail' of stage-001" in text
    assert 'File "my_pipeline.py", line 7, in explode' in text
    errors = [m.message_response for m in result._messages if m.HasField("message_response")
              and m.message_response.importance == pb.JobMessage.JOB_MESSAGE_ERROR]
    assert len(errors) == 1 and "boom at element 3" in errors[0].message_text


def test_unsupported_features_are_all_listed_as_unimplemented(portable, executor) -> None:
    p = build(portable(), "UnsupportedTimers", "Fine", "UnsupportedSideInput")
    with pytest.raises(grpc.RpcError) as info:
        p.run()
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    details = info.value.details()
    assert "2 unsupported feature(s)" in details
    assert "transform 'UnsupportedTimers'" in details
    assert "transform 'UnsupportedSideInput'" in details
    assert executor.handles == {}


def test_cancel_from_the_client(portable, executor) -> None:
    result = build(portable(), "Block").run()
    wait_for(lambda: result.state == PipelineState.RUNNING)
    result.cancel()
    with pytest.raises(RuntimeError, match="failed in state CANCELLED"):
        result.wait_until_finish()
    assert executor.handles["job-001"].cancel_calls == 1
    assert result.state == PipelineState.CANCELLED


def test_two_concurrent_jobs_one_failing_leave_the_other_alone(portable, executor) -> None:
    outcomes: dict[str, object] = {}

    def run(label: str) -> None:
        try:
            outcomes[label] = build(portable(), label).run().wait_until_finish()
        except RuntimeError as exc:
            outcomes[label] = exc

    def blocked_handle():
        return next((h for h in executor.handles.values() if "Block" in h._names), None)

    threads = {label: threading.Thread(target=run, args=(label,)) for label in ("Block", "Fail")}
    threads["Block"].start()
    try:
        wait_for(lambda: blocked_handle() is not None and blocked_handle().state == "RUNNING")
        threads["Fail"].start()
        threads["Fail"].join(30)
        assert isinstance(outcomes["Fail"], RuntimeError)
        assert "boom at element 3" in str(outcomes["Fail"])
        assert blocked_handle().state == "RUNNING"  # undisturbed by its neighbour's failure
    finally:
        if blocked_handle() is not None:
            blocked_handle().release.set()
        threads["Block"].join(30)
    assert outcomes["Block"] == PipelineState.DONE


def test_artifacts_are_staged_handed_to_the_executor_and_served_back(
    portable, executor, server, channel, tmp_path: Path
) -> None:
    package = tmp_path / "mydep-1.0.tar.gz"
    (tmp_path / "payload.txt").write_text("staged by the client")
    with tarfile.open(package, "w:gz") as tar:
        tar.add(tmp_path / "payload.txt", arcname="payload.txt")
    result = build(portable(f"--extra_package={package}")).run()
    assert result.wait_until_finish() == PipelineState.DONE

    [staged] = executor.handles["job-001"].artifacts.values()
    paths = [beam_runner_api_pb2.ArtifactFilePayload.FromString(a.type_payload).path
             for a in staged]
    assert all(a.type_urn == common_urns.artifact_types.FILE.urn for a in staged)
    assert all(Path(p).is_relative_to(server.artifacts_dir) for p in paths)
    [tarball] = [p for p in paths if p.endswith("mydep-1.0.tar.gz")]
    assert Path(tarball).read_bytes() == package.read_bytes()

    retrieval = beam_artifact_api_pb2_grpc.ArtifactRetrievalServiceStub(channel)
    [artifact] = [a for a, p in zip(staged, paths, strict=True) if p == tarball]
    chunks = retrieval.GetArtifact(
        beam_artifact_api_pb2.GetArtifactRequest(artifact=artifact), timeout=RPC_TIMEOUT
    )
    assert b"".join(c.data for c in chunks) == package.read_bytes()
