"""`--artifacts-dir` as an fsspec URL: artifacts staged to, and served back from, memory://."""
from __future__ import annotations

import uuid
from pathlib import Path

import apache_beam as beam
import grpc
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.portability.api import (
    beam_artifact_api_pb2,
    beam_artifact_api_pb2_grpc,
    beam_runner_api_pb2,
)
from apache_beam.runners.runner import PipelineState

from sparkbeam.jobservice import JobServer
from tests.component.jobservice.conftest import RPC_TIMEOUT
from tests.unit.jobservice.fakes import FakeExecutor


def test_artifacts_go_to_an_fsspec_url_and_are_served_back(tmp_path: Path) -> None:
    executor = FakeExecutor()
    root = f"memory://sparkbeam-{uuid.uuid4().hex}"
    server = JobServer(executor, port=0, artifacts_dir=root, staging_grace=0.5)
    server.start()
    try:
        package = tmp_path / "dep-1.0.zip"
        package.write_bytes(b"PK\x05\x06" + b"\x00" * 18)  # an empty zip archive
        options = PipelineOptions([
            "--runner=PortableRunner", f"--job_endpoint=localhost:{server.port}",
            "--environment_type=LOOPBACK", "--job_server_timeout=30",
            f"--extra_package={package}",
        ])
        p = beam.Pipeline(options=options)
        _ = p | beam.Create([1]) | beam.Map(lambda x: x)
        assert p.run().wait_until_finish() == PipelineState.DONE

        [staged] = executor.handles["job-001"].artifacts.values()
        paths = [beam_runner_api_pb2.ArtifactFilePayload.FromString(a.type_payload).path
                 for a in staged]
        [zipped] = [p for p in paths if p.endswith("dep-1.0.zip")]
        assert zipped.startswith("memory://") and root.split("://", 1)[1] in zipped
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            retrieval = beam_artifact_api_pb2_grpc.ArtifactRetrievalServiceStub(channel)
            [artifact] = [a for a, p in zip(staged, paths, strict=True) if p == zipped]
            chunks = retrieval.GetArtifact(
                beam_artifact_api_pb2.GetArtifactRequest(artifact=artifact), timeout=RPC_TIMEOUT
            )
            assert b"".join(c.data for c in chunks) == package.read_bytes()
    finally:
        server.stop()
