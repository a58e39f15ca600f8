"""A real job server on 127.0.0.1, port 0, with a fake executor; stubs and Beam clients."""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import apache_beam as beam
import grpc
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.portability.api import beam_job_api_pb2_grpc

from sparkbeam.jobservice import JobServer
from tests.unit.jobservice.fakes import FakeExecutor

RPC_TIMEOUT = 10.0  # every unary call and stream in these tests is bounded by this


@pytest.fixture
def executor() -> FakeExecutor:
    return FakeExecutor()


@pytest.fixture
def server(executor: FakeExecutor, tmp_path: Path) -> Iterator[JobServer]:
    job_server = JobServer(
        executor, port=0, artifacts_dir=str(tmp_path / "artifacts"), staging_grace=0.5
    )
    job_server.start()
    yield job_server
    job_server.stop()


@pytest.fixture
def channel(server: JobServer) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as chan:
        yield chan


@pytest.fixture
def stub(channel: grpc.Channel) -> beam_job_api_pb2_grpc.JobServiceStub:
    return beam_job_api_pb2_grpc.JobServiceStub(channel)


@pytest.fixture
def portable(server: JobServer) -> Callable[..., beam.Pipeline]:
    """A Beam pipeline whose runner is PortableRunner pointed at the server (LOOPBACK)."""

    def make(*args: str) -> beam.Pipeline:
        return beam.Pipeline(options=PipelineOptions([
            "--runner=PortableRunner",
            f"--job_endpoint=localhost:{server.port}",
            "--environment_type=LOOPBACK",
            "--job_server_timeout=30",
            *args,
        ]))

    return make


def wait_for(condition: Callable[[], object], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)
