"""Artifact staging (Beam's reverse retrieval) and retrieval for the sparkbeam job server.

The job service registers a job's dependencies under a staging token, the client stages them
through `ArtifactStagingService`, `resolved_deps` gives them back as FILE artifacts in the
destination, and `ArtifactRetrievalService` serves them to workers.
"""
from __future__ import annotations

from sparkbeam.artifacts.destinations import ArtifactDestination, FsspecDestination, LocalDirectory
from sparkbeam.artifacts.naming import staged_name
from sparkbeam.artifacts.retrieval import ArtifactRetrievalService
from sparkbeam.artifacts.staging import ArtifactStagingService
from sparkbeam.errors import ArtifactStagingError

__all__ = [
    "ArtifactDestination",
    "ArtifactRetrievalService",
    "ArtifactStagingError",
    "ArtifactStagingService",
    "FsspecDestination",
    "LocalDirectory",
    "staged_name",
]
