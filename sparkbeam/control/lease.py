"""Which worker runs a stage's bundles, leased for the duration of one task or key.

The bundle processor embedded in this process by default; an SDK worker over the gRPC Fn API
for PROCESS and EXTERNAL environments (and LOOPBACK clients of the job server, which are
EXTERNAL). Both are `Worker`s; the two functions at the end make mypy prove it.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager, ExitStack
from typing import Any

from apache_beam.portability.api import beam_fn_api_pb2, beam_runner_api_pb2, metrics_pb2

from sparkbeam.control.embedded import WORKERS, EmbeddedWorker
from sparkbeam.control.shell import SplitOutcome
from sparkbeam.control.worker import BundleResult, BundleState, OutputCap, Worker
from sparkbeam.plan.model import runs_embedded


def lease_worker(
    descriptor: bytes,
    environment: bytes = b"",
    pipeline_options: dict[str, Any] | None = None,
    connect_timeout_s: float = 60.0,
    fresh: bool = False,
    scope: str = "",
) -> AbstractContextManager[Worker]:
    """A worker for the serialized descriptor in the serialized environment. `fresh`: a new
    embedded worker, torn down after use (its DoFns read side inputs that change). `scope`:
    the side inputs' extent (a job id); workers are not shared across scopes, because Beam's
    DoFn runner keeps a global-window side input's view for the bundle processor's life."""
    if not runs_embedded(environment):
        from sparkbeam.control.grpc_worker import WORKERS as GRPC_WORKERS

        env = beam_runner_api_pb2.Environment.FromString(environment)
        return GRPC_WORKERS.lease(descriptor, env, pipeline_options or {}, connect_timeout_s,
                                  scope=scope)
    return WORKERS.lease(descriptor, fresh=fresh, scope=scope)


class LeasedOnUse:
    """A worker leased the first time a bundle needs it (or `lease` is called), then held until
    `stack` closes, its side inputs bound then. Tasks whose functions run without Beam's
    bundle processor (`engine/direct.py`, `engine/direct_stateful.py`) need one only if they
    hand over, and building one costs a task ~10-15 ms (its descriptor differs per job). A
    failure to lease is raised where it is leased, as the task's error."""

    def __init__(self, stack: ExitStack, lease: Callable[[], AbstractContextManager[Worker]],
                 side_inputs: Mapping[bytes, list[bytes]]) -> None:
        self._stack = stack
        self._lease = lease
        self._side_inputs = side_inputs
        self._worker: Worker | None = None

    def lease(self) -> Worker:
        """The worker, leased now if it is not yet."""
        if self._worker is None:
            worker = self._stack.enter_context(self._lease())
            worker.state.bind_side_inputs(self._side_inputs)
            self._worker = worker
        return self._worker

    @property
    def descriptor(self) -> beam_fn_api_pb2.ProcessBundleDescriptor:
        return self.lease().descriptor

    @property
    def state(self) -> BundleState:
        return self.lease().state

    @property
    def failed_bundle_infos(self) -> list[metrics_pb2.MonitoringInfo]:
        return self._worker.failed_bundle_infos if self._worker is not None else []

    def process(self, inputs: Iterable[Any], bundle_label: str = "",
                counts: Mapping[str, int] | None = None) -> BundleResult:
        return self.lease().process(inputs, bundle_label, counts)

    def try_split(self, request: beam_fn_api_pb2.ProcessBundleSplitRequest
                  ) -> beam_fn_api_pb2.ProcessBundleSplitResponse:
        if self._worker is None:  # no bundle has run: nothing to split
            return beam_fn_api_pb2.ProcessBundleSplitResponse()
        return self._worker.try_split(request)

    def split(self, fraction: float) -> SplitOutcome | None:
        return self._worker.split(fraction) if self._worker is not None else None

    def set_output_cap(self, cap: OutputCap | None) -> None:
        if cap is not None or self._worker is not None:
            self.lease().set_output_cap(cap)

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.shutdown()


def _on_use_is_a_worker(worker: LeasedOnUse) -> Worker:
    return worker


def _embedded_is_a_worker(worker: EmbeddedWorker) -> Worker:
    return worker


def _grpc_is_a_worker(worker: Any) -> Worker:
    from sparkbeam.control.grpc_worker import GrpcWorker

    checked: GrpcWorker = worker
    return checked
