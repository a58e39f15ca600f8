"""The runner side of Beam's Fn API for SDK workers of PROCESS and EXTERNAL environments.

One gRPC server on one port (127.0.0.1 by default, never all interfaces) serves Control, Data,
State, Logging, Provision and artifact retrieval. Beam's own `GrpcServer` binds `[::]` and keeps
one global state store, so we assemble our own from Beam's servicers where they fit
(`BeamFnDataServicer`, `ArtifactRetrievalService`) and write the rest:

- Control keeps one `ControlConnection` per worker id; when the worker's response stream ends or
  fails, the connection is marked lost and every pending future fails with `WorkerLostError`
  naming the worker and its environment, so no caller waits for an answer that cannot come.
- Descriptors are served by id from a registry and each fetch is counted
  (`descriptor_fetches`): workers fetch lazily and cache, which the counts prove.
- State requests are routed by instruction id to the state handler of the bundle that made them.
- Log entries are re-emitted on the `sparkbeam.sdk` logger with the worker and transform.
"""
from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

import grpc
from apache_beam.portability.api import (
    beam_artifact_api_pb2_grpc,
    beam_fn_api_pb2,
    beam_fn_api_pb2_grpc,
    beam_provision_api_pb2,
    beam_provision_api_pb2_grpc,
    beam_runner_api_pb2,
    endpoints_pb2,
)
from apache_beam.runners.portability import artifact_service
from apache_beam.runners.worker import data_plane
from apache_beam.runners.worker.log_handler import LOGENTRY_TO_LOG_LEVEL_MAP
from apache_beam.utils import thread_pool_executor
from google.protobuf import struct_pb2

from sparkbeam.control.embedded import CAPABILITIES

_LOG = logging.getLogger(__name__)
SDK_LOG = logging.getLogger("sparkbeam.sdk")

_OPTIONS = [
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.http2.max_ping_strikes", 0),
    ("grpc.http2.min_ping_interval_without_data_ms", 20_000),
]
_DONE = beam_fn_api_pb2.InstructionRequest()  # end-of-stream marker for a control queue


class WorkerLostError(RuntimeError):
    """The SDK worker's control stream ended: nothing pending on it will be answered."""


class StateHandler(Protocol):
    """What serves one bundle's state requests (see `embedded.TaskStateHandler`)."""

    def get_raw(
        self, state_key: beam_fn_api_pb2.StateKey, continuation_token: bytes | None = None
    ) -> tuple[bytes, bytes | None]: ...

    def append_raw(self, state_key: beam_fn_api_pb2.StateKey, data: bytes) -> Any: ...

    def clear(self, state_key: beam_fn_api_pb2.StateKey) -> Any: ...


class ControlConnection:
    """The control stream of one worker: requests to send, futures of their responses."""

    def __init__(self, worker_id: str, environment: str) -> None:
        self.worker_id = worker_id
        self.environment = environment
        self.connected = threading.Event()
        self.connected_at: float | None = None
        self.lost: WorkerLostError | None = None
        self._requests: queue.Queue[beam_fn_api_pb2.InstructionRequest] = queue.Queue()
        self._futures: dict[str, concurrent.futures.Future[Any]] = {}
        self._lock = threading.Lock()

    def push(self, request: beam_fn_api_pb2.InstructionRequest) -> concurrent.futures.Future[Any]:
        """Queues `request`; the future resolves to its InstructionResponse."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._lock:
            if self.lost is not None:
                future.set_exception(self.lost)
                return future
            self._futures[request.instruction_id] = future
        self._requests.put(request)
        return future

    def requests(self) -> Iterator[beam_fn_api_pb2.InstructionRequest]:
        while (request := self._requests.get()) is not _DONE:
            yield request

    def read(self, responses: Iterable[beam_fn_api_pb2.InstructionResponse]) -> None:
        """Resolves futures from the worker's responses until its stream ends."""
        reason = "closed its control stream"
        try:
            for response in responses:
                with self._lock:
                    future = self._futures.pop(response.instruction_id, None)
                if future is not None:
                    future.set_result(response)
        except Exception as exc:  # noqa: BLE001 - any stream failure means the worker is gone
            reason = f"lost its control stream ({type(exc).__name__})"
        self.lose(reason)

    def lose(self, reason: str) -> None:
        """Marks the worker lost and fails everything still pending on it."""
        error = WorkerLostError(
            f"SDK worker {self.worker_id} for environment '{self.environment}' {reason}"
        )
        with self._lock:
            if self.lost is None:
                self.lost = error
            pending, self._futures = list(self._futures.values()), {}
        for future in pending:
            if not future.done():
                future.set_exception(error)
        self._requests.put(_DONE)


class DataServicer(data_plane.BeamFnDataServicer):
    """Beam's data servicer, plus `release`: a worker's data channels end with the worker.

    Beam's servicer keeps one channel per worker for its own life, and each keeps two threads
    waiting for output to send (the Data call's and a forwarder); a Spark Python worker that
    serves many jobs' SDK workers would keep two threads per worker ever started.
    """

    def worker_ids(self) -> list[str]:
        with self._lock:
            return sorted({k[0] for k in self._connections_by_worker_id})

    def release(self, worker_id: str) -> None:
        """Closes and forgets the data channels of `worker_id` (its Data calls end)."""
        # The base class keeps its channels in `_connections_by_worker_id`, keyed by
        # (worker id, data stream id), under `_lock`.
        with self._lock:
            keys = [k for k in self._connections_by_worker_id if k[0] == worker_id]
            channels = [self._connections_by_worker_id.pop(k) for k in keys]
        for channel in channels:
            # close() joins a forwarder thread that could wait on a full send queue of a
            # worker that is gone: never on the caller's thread.
            threading.Thread(target=_close_quietly, args=(channel,), daemon=True,
                             name=f"close-data-{worker_id}").start()


def _close_quietly(channel: Any) -> None:
    with contextlib.suppress(Exception):
        channel.close()


class ControlServicer(beam_fn_api_pb2_grpc.BeamFnControlServicer):
    """Control and GetProcessBundleDescriptor; decode, delegate to a connection, encode."""

    def __init__(self) -> None:
        self._connections: dict[str, ControlConnection] = {}
        self._descriptors: dict[str, beam_fn_api_pb2.ProcessBundleDescriptor] = {}
        self.descriptor_fetches: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()

    def expect(self, worker_id: str, environment: str) -> ControlConnection:
        """Creates the connection a worker about to start will use."""
        with self._lock:
            conn = self._connections[worker_id] = ControlConnection(worker_id, environment)
            return conn

    def register(self, descriptor: beam_fn_api_pb2.ProcessBundleDescriptor) -> None:
        with self._lock:
            self._descriptors.setdefault(descriptor.id, descriptor)

    def Control(
        self, request_iterator: Iterable[beam_fn_api_pb2.InstructionResponse], context: Any
    ) -> Iterator[beam_fn_api_pb2.InstructionRequest]:
        worker_id = dict(context.invocation_metadata()).get("worker_id", "")
        with self._lock:
            conn = self._connections.get(worker_id)
        if conn is None or conn.connected.is_set():
            context.abort(grpc.StatusCode.NOT_FOUND, f"no SDK worker {worker_id!r} expected")
            return
        conn.connected_at = time.time()
        conn.connected.set()
        threading.Thread(
            target=conn.read, args=(request_iterator,), name=f"control-{worker_id}", daemon=True
        ).start()
        yield from conn.requests()

    def GetProcessBundleDescriptor(
        self, request: beam_fn_api_pb2.GetProcessBundleDescriptorRequest, context: Any
    ) -> beam_fn_api_pb2.ProcessBundleDescriptor:
        with self._lock:
            descriptor = self._descriptors.get(request.process_bundle_descriptor_id)
            if descriptor is not None:
                self.descriptor_fetches[descriptor.id] += 1
        if descriptor is None:
            context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"unknown process bundle descriptor {request.process_bundle_descriptor_id!r}",
            )
            raise AssertionError("unreachable: context.abort raises")
        return descriptor

    def close(self) -> None:
        with self._lock:
            conns = list(self._connections.values())
        for conn in conns:
            conn.lose("was shut down")


class StateServicer(beam_fn_api_pb2_grpc.BeamFnStateServicer):
    """Answers state requests with the handler bound to the request's instruction."""

    def __init__(self) -> None:
        self._handlers: dict[str, StateHandler] = {}

    def bind(self, instruction_id: str, handler: StateHandler) -> None:
        self._handlers[instruction_id] = handler

    def unbind(self, instruction_id: str) -> None:
        self._handlers.pop(instruction_id, None)

    def State(
        self, request_iterator: Iterable[beam_fn_api_pb2.StateRequest], context: Any
    ) -> Iterator[beam_fn_api_pb2.StateResponse]:
        for request in request_iterator:
            response = beam_fn_api_pb2.StateResponse(id=request.id)
            try:
                handler = self._handlers.get(request.instruction_id)
                if handler is None:
                    raise KeyError(f"no bundle {request.instruction_id!r} is running")
                kind = request.WhichOneof("request")
                if kind == "get":
                    data, token = handler.get_raw(
                        request.state_key, request.get.continuation_token
                    )
                    response.get.data = data
                    response.get.continuation_token = token or b""
                elif kind == "append":
                    handler.append_raw(request.state_key, request.append.data)
                    response.append.SetInParent()
                elif kind == "clear":
                    handler.clear(request.state_key)
                    response.clear.SetInParent()
                else:
                    raise NotImplementedError(f"state request {kind!r} is not supported")
            except Exception as exc:  # noqa: BLE001 - reported to the SDK, which fails the bundle
                response = beam_fn_api_pb2.StateResponse(id=request.id, error=str(exc))
            yield response


class LoggingServicer(beam_fn_api_pb2_grpc.BeamFnLoggingServicer):
    """Re-emits SDK log entries on `sparkbeam.sdk`, prefixed with worker and transform."""

    def Logging(
        self, request_iterator: Iterable[beam_fn_api_pb2.LogEntry.List], context: Any
    ) -> Iterator[beam_fn_api_pb2.LogControl]:
        worker_id = dict(context.invocation_metadata()).get("worker_id", "?")
        yield beam_fn_api_pb2.LogControl()
        for batch in request_iterator:
            for entry in batch.log_entries:
                level = LOGENTRY_TO_LOG_LEVEL_MAP.get(entry.severity, logging.INFO)
                text = entry.message + (f"\n{entry.trace}" if entry.trace else "")
                SDK_LOG.log(
                    level or logging.INFO, "[worker %s transform %s] %s",
                    worker_id, entry.transform_id or "-", text,
                )


class ProvisionServicer(beam_provision_api_pb2_grpc.ProvisionServiceServicer):
    """Hands every worker of the server's environment the same ProvisionInfo."""

    def __init__(self, info: beam_provision_api_pb2.ProvisionInfo) -> None:
        self._info = info

    def GetProvisionInfo(
        self, request: beam_provision_api_pb2.GetProvisionInfoRequest, context: Any
    ) -> beam_provision_api_pb2.GetProvisionInfoResponse:
        return beam_provision_api_pb2.GetProvisionInfoResponse(info=self._info)


def options_struct(pipeline_options: dict[str, Any]) -> struct_pb2.Struct:
    """Pipeline options as the SDK harness reads them from PIPELINE_OPTIONS."""
    struct = struct_pb2.Struct()
    if any(key.startswith("beam:option:") for key in pipeline_options):
        struct.update(pipeline_options)
    else:
        struct.update({f"beam:option:{k}:v1": v for k, v in pipeline_options.items()})
    return struct


class FnApiServer:
    """Every Fn API service for the workers of one environment, on one local port."""

    def __init__(
        self,
        environment: beam_runner_api_pb2.Environment,
        pipeline_options: dict[str, Any],
        host: str = "127.0.0.1",
    ) -> None:
        self.control = ControlServicer()
        self.data = DataServicer()
        self.state = StateServicer()
        pool = thread_pool_executor.shared_unbounded_instance()
        self._server = grpc.server(pool, options=_OPTIONS)
        port = self._server.add_insecure_port(f"{host}:0")
        if not port:
            raise OSError(f"could not bind the Fn API server to {host}")
        self.address = f"{host}:{port}"
        endpoint = endpoints_pb2.ApiServiceDescriptor(url=self.address)
        info = beam_provision_api_pb2.ProvisionInfo(
            pipeline_options=options_struct(pipeline_options),
            logging_endpoint=endpoint,
            artifact_endpoint=endpoint,
            control_endpoint=endpoint,
            dependencies=list(environment.dependencies),
            runner_capabilities=list(CAPABILITIES),
        )
        beam_fn_api_pb2_grpc.add_BeamFnControlServicer_to_server(self.control, self._server)
        beam_fn_api_pb2_grpc.add_BeamFnDataServicer_to_server(self.data, self._server)
        beam_fn_api_pb2_grpc.add_BeamFnStateServicer_to_server(self.state, self._server)
        beam_fn_api_pb2_grpc.add_BeamFnLoggingServicer_to_server(LoggingServicer(), self._server)
        beam_provision_api_pb2_grpc.add_ProvisionServiceServicer_to_server(
            ProvisionServicer(info), self._server
        )
        beam_artifact_api_pb2_grpc.add_ArtifactRetrievalServiceServicer_to_server(
            artifact_service.ArtifactRetrievalService(file_reader=_open_local), self._server
        )
        self._server.start()
        _LOG.info("Fn API server for SDK workers listening on %s", self.address)

    @property
    def descriptor_fetches(self) -> collections.Counter[str]:
        return self.control.descriptor_fetches

    def endpoint(self) -> endpoints_pb2.ApiServiceDescriptor:
        return endpoints_pb2.ApiServiceDescriptor(url=self.address)

    def close(self, grace_s: float = 1.0) -> None:
        self.control.close()
        with contextlib.suppress(Exception):
            self._server.stop(grace_s).wait(grace_s + 1)
        for worker_id in self.data.worker_ids():
            self.data.release(worker_id)


def _open_local(path: str) -> Any:
    return open(path, "rb")  # noqa: SIM115 - ArtifactRetrievalService closes it
