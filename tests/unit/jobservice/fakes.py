"""A fake executor for the job service: runs "jobs" on a thread in milliseconds.

What a fake run does is read from the pipeline's transform labels, so one test can run
several jobs that behave differently:
  "Unsupported..."  prepare() raises UnsupportedFeatureError listing every such transform
  "BadInput"        prepare() raises a plain SparkBeamError (bad pipeline)
  "CrashOnStart"    start() raises
  "Fail"            the run fails with a UserCodeError carrying a user traceback
  "Block"           the run stays RUNNING until cancelled or released
  "BrokenWait"      the handle's wait() raises (an executor bug)
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from apache_beam.metrics import monitoring_infos
from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_job_api_pb2, beam_runner_api_pb2, metrics_pb2
from google.protobuf import struct_pb2

from sparkbeam.errors import (
    SparkBeamError,
    Unsupported,
    UnsupportedFeatureError,
    UserCodeError,
)

USER_TRACEBACK = (
    'Traceback (most recent call last):\n  File "my_pipeline.py", line 7, in explode\n'
    "    raise ValueError('boom at element 3')\nValueError: boom at element 3\n"
)
# Bounds a blocked run even if a test forgets it: no thread outlives the test run for long.
BLOCK_LIMIT_SECONDS = 20.0


def artifact(path: str) -> beam_runner_api_pb2.ArtifactInformation:
    """A FILE artifact, as a client lists it before staging."""
    return beam_runner_api_pb2.ArtifactInformation(
        type_urn=common_urns.artifact_types.FILE.urn,
        type_payload=beam_runner_api_pb2.ArtifactFilePayload(path=path).SerializeToString(),
        role_urn=common_urns.artifact_roles.STAGING_TO.urn,
        role_payload=beam_runner_api_pb2.ArtifactStagingToRolePayload(
            staged_name=path.rsplit("/", 1)[-1]
        ).SerializeToString(),
    )


def pipeline_proto(*labels: str, deps: Sequence[str] = ()) -> beam_runner_api_pb2.Pipeline:
    """A pipeline proto with transforms of these labels and one environment with these
    FILE dependencies: enough for the job service, which never looks further."""
    proto = beam_runner_api_pb2.Pipeline()
    for i, label in enumerate(labels or ("Create",)):
        proto.components.transforms[f"t{i}"].unique_name = label
        proto.root_transform_ids.append(f"t{i}")
    proto.components.environments["env"].dependencies.extend(artifact(p) for p in deps)
    return proto


def labels(pipeline: beam_runner_api_pb2.Pipeline) -> list[str]:
    return [t.unique_name for t in pipeline.components.transforms.values()]


def counter(value: int) -> metrics_pb2.MonitoringInfo:
    return monitoring_infos.int64_user_counter("fake", "elements", value, ptransform="Create")


class FakeMetrics:
    def __init__(self, committed: list, attempted: list) -> None:
        self.committed_infos = committed
        self.attempted_infos = attempted


class FakeHandle:
    """A run on a thread: RUNNING, a few steps that count elements, then DONE or FAILED."""

    def __init__(
        self,
        job_id: str,
        names: list[str],
        on_message: Callable[[str], None],
        on_state: Callable[[str], None],
        steps: int,
    ) -> None:
        self.job_id = job_id
        self.state = "STARTING"
        self.error: BaseException | None = None
        self.cancel_calls = 0
        self.drain_calls = 0
        self.release = threading.Event()
        self.artifacts: dict = {}
        self._names = names
        self._on_message = on_message
        self._on_state = on_state
        self._steps = steps
        self._count = 0
        self._lock = threading.Lock()
        self._cancelled = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"fake-{job_id}", daemon=True)

    def begin(self) -> None:
        self._thread.start()

    def wait(self, timeout: float | None = None) -> bool:
        if "BrokenWait" in self._names:
            raise RuntimeError("lost contact with the Spark driver")
        return self._done.wait(timeout)

    def cancel(self) -> None:
        self.cancel_calls += 1
        self._cancelled.set()

    def drain(self) -> None:
        """As a streaming run drains: it says DRAINING, stops, and ends DRAINED."""
        self.drain_calls += 1
        self._set("DRAINING")
        self._drained = True
        self._cancelled.set()

    def metrics(self) -> FakeMetrics:
        with self._lock:
            attempted = [counter(self._count)] if self._count else []
            committed = list(attempted) if self.state == "DONE" else []
        return FakeMetrics(committed, attempted)

    def _set(self, state: str) -> None:
        self.state = state
        self._on_state(state)

    def _run(self) -> None:
        try:
            self._set("RUNNING")
            self._on_message(f"{self.job_id}: stage-001 started")
            for _ in range(self._steps):
                with self._lock:
                    self._count += 1
                if self._cancelled.wait(0.005):
                    break
            if "Block" in self._names:
                self._on_message(f"{self.job_id}: blocked until cancelled or released")
                deadline = time.monotonic() + BLOCK_LIMIT_SECONDS
                while not self.release.is_set() and time.monotonic() < deadline:
                    if self._cancelled.wait(0.01):
                        break
            if self._cancelled.is_set():
                self._set("DRAINED" if getattr(self, "_drained", False) else "CANCELLED")
            elif "Fail" in self._names:
                self.error = UserCodeError(
                    stage="stage-001", transform="Fail", exc_type="ValueError",
                    exc_message="boom at element 3", user_traceback=USER_TRACEBACK,
                )
                self._set("FAILED")
            else:
                self._on_message(f"{self.job_id}: stage-001 finished")
                self._set("DONE")
        finally:
            self._done.set()


class FakeExecutor:
    """Satisfies sparkbeam.jobservice.protocol.JobExecutor without Spark."""

    def __init__(self, steps: int = 3) -> None:
        self.steps = steps
        self.handles: dict[str, FakeHandle] = {}
        self.prepared = 0

    def describe_options(self) -> list[beam_job_api_pb2.PipelineOptionDescriptor]:
        return [
            beam_job_api_pb2.PipelineOptionDescriptor(
                name="fake_bundle_size",
                type=beam_job_api_pb2.PipelineOptionType.INTEGER,
                description="elements per bundle (fake)",
                default_value="100",
                group="sparkbeam",
            )
        ]

    def prepare(
        self, pipeline: beam_runner_api_pb2.Pipeline, options: struct_pb2.Struct
    ) -> None:
        names = labels(pipeline)
        if "BadInput" in names:
            raise SparkBeamError("the pipeline has a transform called BadInput: expected none")
        unsupported = [
            Unsupported(f"transform {name}", f"transform '{name}'", "fake executor")
            for name in sorted(names)
            if name.startswith("Unsupported")
        ]
        if unsupported:
            raise UnsupportedFeatureError(unsupported)
        self.prepared += 1

    def start(
        self,
        job_id: str,
        pipeline: beam_runner_api_pb2.Pipeline,
        options: struct_pb2.Struct,
        artifacts: dict,
        on_message: Callable[[str], None],
        on_state: Callable[[str], None],
    ) -> FakeHandle:
        names = labels(pipeline)
        if "CrashOnStart" in names:
            raise SparkBeamError(f"{job_id}: the fake executor cannot start this job")
        handle = FakeHandle(job_id, names, on_message, on_state, self.steps)
        handle.artifacts = artifacts
        self.handles[job_id] = handle
        handle.begin()
        return handle
