"""Artifact staging as the job service uses it, behind one factory: `new_artifact_services`.

The services are sparkbeam's own (`sparkbeam.artifacts`): reverse retrieval with a bounded
writer pool, safe names, dedup by content, and a failed session reported with its root cause.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from apache_beam.portability.api import beam_artifact_api_pb2_grpc, beam_runner_api_pb2

from sparkbeam.artifacts import (
    ArtifactDestination,
    ArtifactRetrievalService,
    ArtifactStagingService,
    FsspecDestination,
    LocalDirectory,
)
from sparkbeam.jobservice.protocol import DependencySets, StagingArea

# (staging token, text): a user-visible staging milestone for that job's message stream.
StagingMessage = Callable[[str, str], None]


@dataclass(frozen=True)
class ArtifactServices:
    """The two artifact servicers a job server serves, the staging side's job API, and how
    to release what they hold."""

    staging: StagingArea
    staging_servicer: beam_artifact_api_pb2_grpc.ArtifactStagingServiceServicer
    retrieval_servicer: beam_artifact_api_pb2_grpc.ArtifactRetrievalServiceServicer
    close: Callable[[], None] = lambda: None


def new_artifact_services(
    root: str, on_message: StagingMessage | None = None, max_staged_bytes: int | None = None
) -> ArtifactServices:
    """Staging and retrieval services that keep staged artifacts under `root`: a local
    directory, or any fsspec URL (`s3://bucket/staging`, `memory://...`); one job may stage
    at most `max_staged_bytes` (None: no cap)."""
    destination: ArtifactDestination = (
        FsspecDestination(root) if "://" in root else LocalDirectory(root)
    )
    staging = ArtifactStagingService(
        destination, on_message=on_message, max_staged_bytes=max_staged_bytes
    )
    return ArtifactServices(staging, staging, ArtifactRetrievalService(destination), staging.close)


def dependency_sets(pipeline: beam_runner_api_pb2.Pipeline) -> DependencySets:
    """Environment id -> the dependencies the client must stage for it."""
    return {
        env_id: list(env.dependencies)
        for env_id, env in pipeline.components.environments.items()
    }
