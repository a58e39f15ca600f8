"""A real gRPC server on 127.0.0.1 (port 0) serving our staging and retrieval services."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
from apache_beam.portability.api import beam_artifact_api_pb2_grpc

from sparkbeam.artifacts import (
    ArtifactDestination,
    ArtifactRetrievalService,
    ArtifactStagingService,
    LocalDirectory,
)
from tests.component.artifacts.clients import Server


@pytest.fixture
def make_server(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    """Starts servers; each is stopped and its services closed at the end of the test."""
    servers: list[tuple[grpc.Server, Server]] = []

    def make(destination: ArtifactDestination | None = None, **options: Any) -> Server:
        destination = destination or LocalDirectory(tmp_path / "staged")
        messages: list[tuple[str, str]] = []
        staging = ArtifactStagingService(
            destination, on_message=lambda token, text: messages.append((token, text)),
            **options,
        )
        retrieval = ArtifactRetrievalService(destination)
        server = grpc.server(ThreadPoolExecutor(max_workers=4))
        beam_artifact_api_pb2_grpc.add_ArtifactStagingServiceServicer_to_server(staging, server)
        beam_artifact_api_pb2_grpc.add_ArtifactRetrievalServiceServicer_to_server(
            retrieval, server
        )
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        running = Server(staging, retrieval, f"127.0.0.1:{port}", messages)
        servers.append((server, running))
        return running

    yield make
    for server, running in servers:
        for channel in running.channels:
            channel.close()
        server.stop(grace=None).wait(10)
        running.staging.close()
