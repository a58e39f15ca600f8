"""The seams of the job service: what it needs of an executor and of artifact staging.

The job service never imports the Spark executor (ARCHITECTURE.md, dependency rules): whoever
builds the server injects an object that satisfies `JobExecutor`. Tests inject a fake.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from apache_beam.portability.api import beam_job_api_pb2, beam_runner_api_pb2
from google.protobuf import struct_pb2

# Environment id -> that environment's dependencies (as submitted, or as staged).
DependencySets = dict[str, list[beam_runner_api_pb2.ArtifactInformation]]


class RunHandle(Protocol):
    """One running job, as the executor gives it back from `JobExecutor.start`."""

    state: str  # an apache_beam.runners.runner.PipelineState value
    error: BaseException | None  # why the run failed; None unless `state` is FAILED

    def wait(self, timeout: float | None = None) -> bool:
        """Blocks until the run reaches a terminal state or `timeout` passes; True if it did."""
        ...

    def cancel(self) -> None:
        """Asks the run to stop; returns at once. The run ends later in CANCELLED."""
        ...

    def drain(self) -> None:
        """Asks a streaming run to stop reading and fire what its watermark allows; returns at
        once. The run ends later in DRAINED."""
        ...

    def metrics(self) -> Any:
        """An object with `.committed_infos` and `.attempted_infos`, both
        `list[metrics_pb2.MonitoringInfo]` (e.g. `sparkbeam.metrics.SparkMetrics`)."""
        ...


class JobExecutor(Protocol):
    """Runs pipelines for the job service."""

    def describe_options(self) -> list[beam_job_api_pb2.PipelineOptionDescriptor]:
        """The runner's own pipeline options, offered to clients by DescribePipelineOptions."""
        ...

    def prepare(
        self, pipeline: beam_runner_api_pb2.Pipeline, options: struct_pb2.Struct
    ) -> None:
        """Checks that the pipeline can run, before anything is staged.

        Raises `sparkbeam.errors.UnsupportedFeatureError` listing every unsupported feature,
        or another `sparkbeam.errors.SparkBeamError` when the pipeline or options are bad.
        """
        ...

    def start(
        self,
        job_id: str,
        pipeline: beam_runner_api_pb2.Pipeline,
        options: struct_pb2.Struct,
        artifacts: DependencySets,
        on_message: Callable[[str], None],
        on_state: Callable[[str], None],
    ) -> RunHandle:
        """Starts the job and returns without waiting for it to finish.

        `artifacts` maps environment ids to their staged dependencies. `on_message` takes the
        job's user-visible milestones; `on_state` takes PipelineState values as the run moves.
        Both may be called from any thread, also before `start` returns.
        """
        ...


class StagingArea(Protocol):
    """The part of an artifact staging service the job service drives (see staging.py)."""

    def register_job(
        self,
        staging_token: str,
        dependency_sets: Mapping[str, Sequence[beam_runner_api_pb2.ArtifactInformation]],
    ) -> None:
        """Expects the client to stage these dependencies under `staging_token`."""
        ...

    def resolved_deps(
        self, staging_token: str, timeout: float | None = None
    ) -> Mapping[str, Sequence[beam_runner_api_pb2.ArtifactInformation]]:
        """Environment id -> staged dependencies, once staging has finished.

        Raises TimeoutError while staging is still under way after `timeout` seconds, and an
        error naming the root cause when staging failed.
        """
        ...

    def release(self, staging_token: str) -> None:
        """Forgets the token (the job was evicted) and deletes its staged files that no other
        job uses; a no-op for an unknown token."""
        ...
