"""Which worker runs a stage's bundles, leased for the duration of one task or key.

The bundle processor embedded in this process by default; an SDK worker over the gRPC Fn API
for PROCESS and EXTERNAL environments (and LOOPBACK clients of the job server, which are
EXTERNAL). Both are `Worker`s; the two functions at the end make mypy prove it.
"""
from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from apache_beam.portability.api import beam_runner_api_pb2

from sparkbeam.control.embedded import WORKERS, EmbeddedWorker
from sparkbeam.control.worker import Worker
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


def _embedded_is_a_worker(worker: EmbeddedWorker) -> Worker:
    return worker


def _grpc_is_a_worker(worker: Any) -> Worker:
    from sparkbeam.control.grpc_worker import GrpcWorker

    checked: GrpcWorker = worker
    return checked
