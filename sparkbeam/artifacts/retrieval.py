"""Serves staged artifacts back to SDK workers (Beam's `ArtifactRetrievalService`).

Workers receive the FILE artifacts that `ArtifactStagingService.resolved_deps` returned and
fetch them here by path. Only staged files are served: a path must name a file directly under
the destination's root, with a staged name (never a temporary one), that exists. Anything
else is NOT_FOUND (or INVALID_ARGUMENT for a non-FILE artifact), never a read of some other
file of the server's machine.

To serve: `beam_artifact_api_pb2_grpc.add_ArtifactRetrievalServiceServicer_to_server(
service, server)`.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import Any

from apache_beam.portability.api import (
    beam_artifact_api_pb2,
    beam_artifact_api_pb2_grpc,
    beam_runner_api_pb2,
)

from sparkbeam.artifacts.destinations import ArtifactDestination
from sparkbeam.artifacts.failures import ArtifactNotFound, ArtifactStorageError, grpc_errors
from sparkbeam.artifacts.naming import is_staged_name
from sparkbeam.artifacts.payloads import file_path

_LOGGER = logging.getLogger(__name__)

DEFAULT_CHUNK_SIZE = 2 << 20  # as Beam's own retrieval service


class ArtifactRetrievalService(beam_artifact_api_pb2_grpc.ArtifactRetrievalServiceServicer):
    """Resolves and streams artifacts staged in `destination`, `chunk_size` bytes at a time."""

    def __init__(
        self, destination: ArtifactDestination, *, chunk_size: int = DEFAULT_CHUNK_SIZE
    ) -> None:
        if chunk_size <= 0:
            raise ValueError(f"chunk_size must be positive, got {chunk_size}")
        self.destination = destination
        self.chunk_size = chunk_size

    def ResolveArtifacts(  # noqa: N802 - the proto's name
        self, request: beam_artifact_api_pb2.ResolveArtifactsRequest, context: Any
    ) -> beam_artifact_api_pb2.ResolveArtifactsResponse:
        with grpc_errors(context, "ResolveArtifacts"):
            return beam_artifact_api_pb2.ResolveArtifactsResponse(
                replacements=self.resolve(request.artifacts)
            )
        raise AssertionError("unreachable: grpc_errors aborts the call")  # pragma: no cover

    def GetArtifact(  # noqa: N802 - the proto's name
        self, request: beam_artifact_api_pb2.GetArtifactRequest, context: Any
    ) -> Iterator[beam_artifact_api_pb2.GetArtifactResponse]:
        with grpc_errors(context, "GetArtifact"):
            for chunk in self.read(request.artifact):
                yield beam_artifact_api_pb2.GetArtifactResponse(data=chunk)

    def resolve(
        self, artifacts: Iterable[beam_runner_api_pb2.ArtifactInformation]
    ) -> list[beam_runner_api_pb2.ArtifactInformation]:
        """The artifacts as they are: staged files need no further resolution.

        Checks each is a staged file here, so a worker learns of a missing one at once.
        """
        artifacts = list(artifacts)
        for artifact in artifacts:
            self._staged_name(artifact)
        return artifacts

    def read(self, artifact: beam_runner_api_pb2.ArtifactInformation) -> Iterator[bytes]:
        """The bytes of a staged FILE artifact, in chunks of at most `chunk_size`."""
        name = self._staged_name(artifact)
        location = self.destination.location(name)
        try:
            handle = self.destination.open_read(name)
        except FileNotFoundError as exc:
            raise ArtifactNotFound(f"staged artifact {location} is gone") from exc
        except OSError as exc:
            raise ArtifactStorageError(f"cannot open staged artifact {location}: {exc}") from exc
        with handle:
            while True:
                try:
                    chunk = handle.read(self.chunk_size)
                except OSError as exc:
                    raise ArtifactStorageError(
                        f"reading staged artifact {location} failed: {exc}"
                    ) from exc
                if not chunk:
                    return
                yield chunk

    def _staged_name(self, artifact: beam_runner_api_pb2.ArtifactInformation) -> str:
        path = file_path(artifact)
        name = self.destination.name_at(path)
        if name is None or not is_staged_name(name):
            raise ArtifactNotFound(
                f"{path!r} is not an artifact staged in {self.destination!r} (expected the "
                "path of a staged artifact, as resolved_deps gives it)"
            )
        if not self.destination.exists(name):
            raise ArtifactNotFound(f"staged artifact {path!r} does not exist (any more)")
        return name
