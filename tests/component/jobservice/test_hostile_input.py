"""Broken and hostile requests get a status with a message; the server stays up.

A real server on 127.0.0.1 with the real executor's Prepare (which plans without Spark): raw
bytes on the wire, malformed protos, options of the wrong types, oversize requests, artifacts
over the staging quota, binding an address other hosts can reach.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import apache_beam as beam
import grpc
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.portability.api import beam_job_api_pb2, beam_runner_api_pb2
from google.protobuf import struct_pb2

from sparkbeam.errors import SparkBeamError
from sparkbeam.jobservice import JobServer
from sparkbeam.jobservice.manager import Retention
from sparkbeam.jobservice.server import is_loopback, main, parse_duration
from sparkbeam.spark_executor import SparkJobExecutor
from tests.component.jobservice.conftest import RPC_TIMEOUT, wait_for
from tests.unit.jobservice.fakes import FakeExecutor
from tests.unit.test_validate import nest

pytestmark = pytest.mark.timeout(120)

pb = beam_job_api_pb2
PREPARE = "/org.apache.beam.model.job_management.v1.JobService/Prepare"


@pytest.fixture(scope="module")
def real_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JobServer]:
    server = JobServer(
        SparkJobExecutor(), artifacts_dir=str(tmp_path_factory.mktemp("artifacts")),
        max_request_bytes=16 << 20,
    )
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def raw_prepare(real_server: JobServer) -> Iterator[grpc.UnaryUnaryMultiCallable]:
    with grpc.insecure_channel(
        f"127.0.0.1:{real_server.port}", options=[("grpc.max_send_message_length", -1)]
    ) as channel:
        yield channel.unary_unary(PREPARE)


def good_pipeline() -> beam_runner_api_pb2.Pipeline:
    p = beam.Pipeline()
    _ = p | beam.Create([1, 2]) | beam.Map(lambda x: x + 1)
    return p.to_runner_api()


def prepare_bytes(pipeline: beam_runner_api_pb2.Pipeline, options: dict | None = None) -> bytes:
    struct = struct_pb2.Struct()
    struct.update(options or {})
    return pb.PrepareJobRequest(
        pipeline=pipeline, job_name="hostile", pipeline_options=struct
    ).SerializeToString()


def refused(raw_prepare: grpc.UnaryUnaryMultiCallable, request: bytes) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        raw_prepare(request, timeout=RPC_TIMEOUT)
    return info.value


def test_bytes_that_are_no_request_are_invalid_argument(raw_prepare) -> None:
    good = prepare_bytes(good_pipeline())
    for garbage in (good[: len(good) // 2], os.urandom(4096), b"\xff" * 64):
        error = refused(raw_prepare, garbage)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "Prepare: the request is not a valid " \
               "org.apache.beam.model.job_management.v1.PrepareJobRequest" in error.details()
    assert pb.PrepareJobResponse.FromString(raw_prepare(good, timeout=RPC_TIMEOUT)).preparation_id


def test_malformed_pipelines_are_invalid_argument(raw_prepare) -> None:
    empty = refused(raw_prepare, prepare_bytes(beam_runner_api_pb2.Pipeline()))
    assert empty.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "the pipeline has no root transforms" in empty.details()

    deep = refused(raw_prepare, prepare_bytes(nest(good_pipeline(), 10_000)))
    assert deep.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "composite transforms nest deeper than 100 levels" in deep.details()


@pytest.mark.parametrize(("options", "message"), [
    ({"beam:option:parallelism:v1": "abc"}, "argument --parallelism: invalid int value: 'abc'"),
    ({"beam:option:streaming:v1": "yes"}, "argument --streaming: ignored explicit argument"),
    ({"beam:option:bundle_size:v1": {"a": 1}}, "argument --bundle_size: invalid int value"),
])
def test_options_of_the_wrong_type_are_invalid_argument(raw_prepare, options, message) -> None:
    error = refused(raw_prepare, prepare_bytes(good_pipeline(), options))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "the pipeline options could not be read" in error.details()
    assert message in error.details()


def test_an_oversize_request_is_resource_exhausted_and_the_server_goes_on(raw_prepare) -> None:
    big = good_pipeline()
    big.components.coders["ballast"].spec.payload = b"x" * (200 << 20)  # the server takes 16 MB
    error = refused(raw_prepare, prepare_bytes(big))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "Received message larger than max" in error.details()
    assert raw_prepare(prepare_bytes(good_pipeline()), timeout=RPC_TIMEOUT)


def test_artifacts_over_the_staging_quota_are_resource_exhausted(tmp_path: Path) -> None:
    executor = FakeExecutor()
    server = JobServer(executor, artifacts_dir=str(tmp_path / "artifacts"),
                       max_staged_bytes=1 << 20, staging_grace=0.5)
    server.start()
    try:
        package = tmp_path / "huge-1.0.tar.gz"
        package.write_bytes(os.urandom(3 << 20))
        p = beam.Pipeline(options=PipelineOptions([
            "--runner=PortableRunner", f"--job_endpoint=localhost:{server.port}",
            "--environment_type=LOOPBACK", f"--extra_package={package}",
        ]))
        _ = p | beam.Create([1])
        with pytest.raises(Exception, match="RESOURCE_EXHAUSTED") as info:
            p.run()
        assert "passed its staging quota of 1048576 bytes" in str(info.value)
        assert executor.handles == {}  # nothing ran
        staged = [f for f in os.listdir(tmp_path / "artifacts") if "huge" in f]
        assert staged == []  # the partial artifact was deleted
    finally:
        server.stop()


def test_evicted_jobs_are_not_found_and_their_artifacts_are_deleted(tmp_path: Path) -> None:
    executor = FakeExecutor()
    # Kept 5 s: long enough for the client to see its job end and the test to look at the
    # artifacts on a loaded machine (0.5 s was not always), short enough to wait out.
    server = JobServer(executor, artifacts_dir=str(tmp_path / "artifacts"), staging_grace=0.5,
                       retention=Retention(seconds=5, jobs=100))
    server.start()
    try:
        package = tmp_path / "dep-1.0.tar.gz"
        package.write_bytes(os.urandom(1000))
        p = beam.Pipeline(options=PipelineOptions([
            "--runner=PortableRunner", f"--job_endpoint=localhost:{server.port}",
            "--environment_type=LOOPBACK", f"--extra_package={package}",
        ]))
        _ = p | beam.Create([1])
        assert p.run().wait_until_finish() == "DONE"
        assert any("dep-1.0" in f for f in os.listdir(tmp_path / "artifacts"))
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = beam_job_api_pb2_grpc_stub(channel)
            wait_for(lambda: not stub.GetJobs(pb.GetJobsRequest(), timeout=RPC_TIMEOUT).job_info,
                     timeout=30)
            with pytest.raises(grpc.RpcError) as info:
                stub.GetState(pb.GetJobStateRequest(job_id="job-001"), timeout=RPC_TIMEOUT)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        assert "job-001 expired: the job server keeps jobs 5 s after they end" in (
            info.value.details())
        assert not any("dep-1.0" in f for f in os.listdir(tmp_path / "artifacts"))
    finally:
        server.stop()


def beam_job_api_pb2_grpc_stub(channel: grpc.Channel):  # type: ignore[no-untyped-def]
    from apache_beam.portability.api import beam_job_api_pb2_grpc

    return beam_job_api_pb2_grpc.JobServiceStub(channel)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "host.invalid"])
def test_an_address_other_hosts_can_reach_needs_allow_remote(host: str) -> None:
    with pytest.raises(SparkBeamError, match="pass --allow-remote"):
        JobServer(FakeExecutor(), host=host)


def test_allow_remote_warns_that_the_job_api_has_no_authentication(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="sparkbeam.jobservice.server"):
        JobServer(FakeExecutor(), host="0.0.0.0", allow_remote=True)  # not started
    assert "runs any pipeline sent to it, with this server's rights" in caplog.text
    assert "authenticating proxy or a tunnel" in caplog.text


def test_the_command_refuses_a_remote_host_without_the_flag(capfd) -> None:
    assert main(["--host", "0.0.0.0", "--port", "0"], lambda args: FakeExecutor()) == 1
    assert "pass --allow-remote" in capfd.readouterr().err


def test_loopback_names_and_durations() -> None:
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "10.0.0.1", "8.8.8.8", "::"))
    assert [parse_duration(t) for t in ("3600", "90s", "30m", "1h", "0.5")] == [
        3600, 90, 1800, 3600, 0.5]
    with pytest.raises(Exception, match="expected a duration such as 3600"):
        parse_duration("soon")
