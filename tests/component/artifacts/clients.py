"""Clients for the component tests: Beam's own client side, and a hand-driven fake."""
from __future__ import annotations

import functools
import queue
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
from apache_beam.portability.api import (
    beam_artifact_api_pb2,
    beam_artifact_api_pb2_grpc,
    beam_runner_api_pb2,
)
from apache_beam.runners.portability import artifact_service as beam_artifacts

from sparkbeam.artifacts import ArtifactRetrievalService, ArtifactStagingService
from sparkbeam.artifacts.payloads import FILE_URN, STAGING_TO_URN

RPC_TIMEOUT = 30.0  # seconds: every client call is bounded, so no test can hang on the server


@dataclass
class Server:
    """One running server and what tests look at."""

    staging: ArtifactStagingService
    retrieval: ArtifactRetrievalService
    address: str
    messages: list[tuple[str, str]] = field(default_factory=list)
    channels: list[grpc.Channel] = field(default_factory=list)

    def channel(self) -> grpc.Channel:
        channel = grpc.insecure_channel(self.address)
        self.channels.append(channel)
        return channel

    def staging_stub(self) -> beam_artifact_api_pb2_grpc.ArtifactStagingServiceStub:
        return beam_artifact_api_pb2_grpc.ArtifactStagingServiceStub(self.channel())

    def retrieval_stub(self) -> beam_artifact_api_pb2_grpc.ArtifactRetrievalServiceStub:
        return beam_artifact_api_pb2_grpc.ArtifactRetrievalServiceStub(self.channel())

    def offer(self, token: str, provider: Any = None) -> None:
        """Stages `token`'s artifacts with Beam's own client (`offer_artifacts`), bounded."""
        stub = self.staging_stub()
        bounded = SimpleNamespace(
            ReverseArtifactRetrievalService=functools.partial(
                stub.ReverseArtifactRetrievalService, timeout=RPC_TIMEOUT
            )
        )
        beam_artifacts.offer_artifacts(bounded, provider or beam_provider(), token)

    def fetch(self, artifact: beam_runner_api_pb2.ArtifactInformation) -> bytes:
        """An artifact's bytes as a worker gets them from our retrieval service."""
        stub = self.retrieval_stub()
        request = beam_artifact_api_pb2.GetArtifactRequest(artifact=artifact)
        return b"".join(r.data for r in stub.GetArtifact(request, timeout=RPC_TIMEOUT))


def beam_provider(
    chunk_size: int = 64 << 10, file_reader: Callable[[str], Any] | None = None
) -> beam_artifacts.ArtifactRetrievalService:
    """Beam's client-side artifact provider, reading the client's temp files."""
    return beam_artifacts.ArtifactRetrievalService(
        file_reader or beam_artifacts.BeamFilesystemHandler(None).file_reader,
        chunk_size=chunk_size,
    )


def client_file(
    directory: Path, name: str, data: bytes, sha256: str = ""
) -> beam_runner_api_pb2.ArtifactInformation:
    """A FILE artifact of the client, as Beam's stager makes them (staging role, no digest)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_bytes(data)
    return beam_runner_api_pb2.ArtifactInformation(
        type_urn=FILE_URN,
        type_payload=beam_runner_api_pb2.ArtifactFilePayload(
            path=str(path), sha256=sha256
        ).SerializeToString(),
        role_urn=STAGING_TO_URN,
        role_payload=beam_runner_api_pb2.ArtifactStagingToRolePayload(
            staged_name=name
        ).SerializeToString(),
    )


def staged_path(artifact: beam_runner_api_pb2.ArtifactInformation) -> str:
    return str(beam_runner_api_pb2.ArtifactFilePayload.FromString(artifact.type_payload).path)


class FakeClient:
    """A hand-driven staging client: sends what the test says, when the test says it.

    Putting an exception makes the request stream raise, which makes gRPC cancel the call,
    as a client process dying mid-transfer would.
    """

    END = object()

    def __init__(self, server: Server) -> None:
        self._outgoing: queue.Queue[Any] = queue.Queue()
        self.call = server.staging_stub().ReverseArtifactRetrievalService(
            self._stream(), timeout=RPC_TIMEOUT
        )

    def _stream(self) -> Iterator[beam_artifact_api_pb2.ArtifactResponseWrapper]:
        while True:
            item = self._outgoing.get(timeout=RPC_TIMEOUT)
            if item is self.END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def send(self, item: Any) -> None:
        self._outgoing.put(item)

    def next_request(self) -> beam_artifact_api_pb2.ArtifactRequestWrapper:
        request: beam_artifact_api_pb2.ArtifactRequestWrapper = next(self.call)
        return request
