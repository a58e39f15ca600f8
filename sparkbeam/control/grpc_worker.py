"""The gRPC worker: bundles run on a real SDK harness process over Beam's Fn API.

`GrpcWorker` has the interface of `embedded.EmbeddedWorker` (`process`, `shutdown`, `state`,
`failed_bundle_infos`) plus `try_split`, so the stage driver does not care which one it holds.
`GrpcWorkers` keeps one `FnApiServer` and one SDK worker per environment in this Python process,
reused across leases; a worker found dead or lost is replaced on the next lease. Descriptors are
registered under an id derived from their content, so the SDK's own cache by id holds across tasks
and each worker process fetches a descriptor once.
"""
from __future__ import annotations

import atexit
import collections
import concurrent.futures
import contextlib
import hashlib
import itertools
import logging
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from apache_beam.coders.coder_impl import create_InputStream
from apache_beam.portability import common_urns
from apache_beam.portability.api import (
    beam_fn_api_pb2,
    beam_runner_api_pb2,
    metrics_pb2,
)
from apache_beam.runners import pipeline_context
from apache_beam.utils import proto_utils

from sparkbeam.control.boot import SdkWorkerProcess
from sparkbeam.control.embedded import TaskStateHandler
from sparkbeam.control.grpc_server import FnApiServer, WorkerLostError
from sparkbeam.control.shell import BundleShell, SplitsRunningBundle
from sparkbeam.control.worker import BundleResult, OutputCap
from sparkbeam.errors import SdkWorkerError

_LOG = logging.getLogger(__name__)
_DATA_INPUT = "beam:runner:source:v1"
_DATA_OUTPUT = "beam:runner:sink:v1"
_BUNDLE_IDS = itertools.count()
_POLL_S = 0.5  # how often waits re-check that the worker is alive


@dataclass(frozen=True)
class _Descriptor:
    """A descriptor rewritten for the gRPC data plane, and how to split what it outputs."""

    proto: beam_fn_api_pb2.ProcessBundleDescriptor
    inputs: tuple[str, ...]
    outputs: dict[str, Any]  # DATA_OUTPUT transform id -> element coder impl
    timer_families: tuple[tuple[str, str], ...]

    @classmethod
    def for_server(cls, descriptor_bytes: bytes, server: FnApiServer, scope: str = ""
                   ) -> _Descriptor:
        proto = beam_fn_api_pb2.ProcessBundleDescriptor.FromString(descriptor_bytes)
        digest = _digest(descriptor_bytes, scope)[:16]
        proto.id = f"{proto.id or 'descriptor'}-{digest}"
        ctx = pipeline_context.PipelineContext(proto)
        inputs: list[str] = []
        outputs: dict[str, Any] = {}
        timers: list[tuple[str, str]] = []
        for tid, transform in proto.transforms.items():
            if transform.spec.urn in (_DATA_INPUT, _DATA_OUTPUT):
                port = beam_fn_api_pb2.RemoteGrpcPort.FromString(transform.spec.payload)
                port.api_service_descriptor.url = server.address
                transform.spec.payload = port.SerializeToString()
                if transform.spec.urn == _DATA_INPUT:
                    inputs.append(tid)
                else:
                    outputs[tid] = ctx.coders[port.coder_id].get_impl()
            elif transform.spec.urn == common_urns.primitives.PAR_DO.urn:
                payload = proto_utils.parse_Bytes(
                    transform.spec.payload, beam_runner_api_pb2.ParDoPayload
                )
                timers.extend((tid, family) for family in sorted(payload.timer_family_specs))
        proto.state_api_service_descriptor.url = server.address
        proto.timer_api_service_descriptor.url = server.address
        return cls(proto, tuple(inputs), outputs, tuple(timers))

    def split(self, transform_id: str, data: bytes) -> Iterator[bytes]:
        """Cuts a data chunk into single encoded elements."""
        impl, stream, start = self.outputs[transform_id], create_InputStream(data), 0
        while stream.size() > 0:
            impl.decode_from_stream(stream, True)
            end = len(data) - stream.size()
            yield data[start:end]
            start = end


@dataclass
class GrpcWorker(SplitsRunningBundle):
    """Runs bundles of one descriptor on a leased SDK worker process."""

    sdk: SdkWorkerProcess
    spec: _Descriptor
    shell: BundleShell  # the bundle protocol of this SDK worker (shared by its leases)
    state: TaskStateHandler = field(default_factory=TaskStateHandler)
    failed_bundle_infos: list[metrics_pb2.MonitoringInfo] = field(default_factory=list)
    current_instruction: str | None = None  # the bundle running now, if any
    cap: OutputCap | None = None  # what the next bundles may output, if capped

    @property
    def descriptor(self) -> beam_fn_api_pb2.ProcessBundleDescriptor:
        return self.spec.proto

    def set_output_cap(self, cap: OutputCap | None) -> None:
        self.cap = cap

    def _died(self, bundle_id: str, why: str | None) -> SdkWorkerError:
        return SdkWorkerError(
            f"SDK worker {self.sdk.worker_id} for environment '{self.sdk.environment}' died "
            f"while running bundle {bundle_id} of {self.descriptor.id}: {why}"
        )

    def _death_within(self, timeout_s: float) -> str | None:
        deadline = time.monotonic() + timeout_s
        while (death := self.sdk.death()) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        return death

    def _await(self, future: concurrent.futures.Future[Any], bundle_id: str) -> Any:
        """The InstructionResponse of `future`, failing promptly if the worker dies."""
        while True:
            try:
                return future.result(timeout=_POLL_S)
            except concurrent.futures.TimeoutError:
                death = self.sdk.death()
                if death is not None:
                    raise self._died(bundle_id, death) from None
            except WorkerLostError as exc:
                raise self._died(bundle_id, str(exc)) from exc

    def process(
        self,
        inputs: Iterable[Any],
        bundle_label: str = "",
        counts: Mapping[str, int] | None = None,
    ) -> BundleResult:
        """Runs one bundle over `inputs` (Elements.Data / Elements.Timers messages);
        `counts` (elements per input transform) lets the bundle be split while it runs."""
        bundle_id = f"{bundle_label or self.descriptor.id}-{next(_BUNDLE_IDS):06d}"
        server, spec = self.sdk.server, self.spec
        inputs = list(inputs)
        if self.shell.begin(bundle_id, spec.proto.id, inputs, counts):
            server.control.register(spec.proto)  # the SDK fetches it by id when it needs it
        server.state.bind(bundle_id, self.state)
        self.current_instruction = bundle_id
        try:
            return self._process(bundle_id, inputs, server, spec)
        except SdkWorkerError as exc:
            self.shell.lost(str(exc))
            raise
        except Exception as exc:
            if self.shell.protocol.state_of(bundle_id).terminal:
                raise
            _, self.failed_bundle_infos = self.shell.failed(bundle_id, str(exc))
            raise
        finally:
            self.current_instruction = None
            server.state.unbind(bundle_id)

    def _process(
        self, bundle_id: str, inputs: list[Any], server: FnApiServer, spec: _Descriptor
    ) -> BundleResult:
        future = self.sdk.conn.push(beam_fn_api_pb2.InstructionRequest(
            instruction_id=bundle_id,
            process_bundle=beam_fn_api_pb2.ProcessBundleRequest(
                process_bundle_descriptor_id=spec.proto.id),
        ))
        data_conn = server.data.get_conn_by_worker_id(self.sdk.worker_id)
        data: dict[str, list[bytes]] = collections.defaultdict(list)
        timers: dict[tuple[str, str], list[bytes]] = collections.defaultdict(list)
        elements_in = 0
        for item in inputs:
            if isinstance(item, beam_fn_api_pb2.Elements.Timers):
                timers[(item.transform_id, item.timer_family_id)].append(item.timers)
            else:
                data[item.transform_id].append(item.data)
                elements_in += 1
        for tid in spec.inputs:
            stream = data_conn.output_stream(bundle_id, tid)
            for chunk in data.get(tid, ()):
                stream.write(chunk)
            stream.close()
        for tid, family in spec.timer_families:
            stream = data_conn.output_timer_stream(bundle_id, tid, family)
            for chunk in timers.get((tid, family), ()):
                stream.write(chunk)
            stream.close()

        def abort() -> bool:
            if self.sdk.death() is not None:
                return True
            return future.done() and (
                future.exception() is not None or bool(future.result().error)
            )

        outputs: list[tuple[str, bytes]] = []
        out_timers: dict[tuple[str, str], list[bytes]] = collections.defaultdict(list)
        expected: list[Any] = [*spec.outputs, *spec.timer_families]
        try:
            for element in data_conn.input_elements(bundle_id, expected, abort_callback=abort):
                if isinstance(element, beam_fn_api_pb2.Elements.Timers):
                    out_timers[(element.transform_id, element.timer_family_id)].append(
                        element.timers)
                else:
                    for one in spec.split(element.transform_id, element.data):
                        outputs.append((element.transform_id, one))
                        if self.cap is not None:
                            # Between two elements, on the receiving thread: a checkpoint
                            # asked for here goes over the control stream while data flows.
                            self.cap.count(len(one))
        except Exception as exc:
            # A data stream that breaks usually means the worker died: say so if it did.
            death = self._death_within(2.0)
            if death is not None:
                raise self._died(bundle_id, death) from exc
            raise
        response = self._await(future, bundle_id)
        if response.error:
            message, self.failed_bundle_infos = self.shell.failed(
                bundle_id, f"(descriptor {spec.proto.id}) {response.error}",
                response.process_bundle.monitoring_infos)
            raise RuntimeError(message)
        result = response.process_bundle
        outcome = self.shell.succeeded(bundle_id, result)
        if outcome.finalize:
            done = self._await(self.sdk.conn.push(beam_fn_api_pb2.InstructionRequest(
                instruction_id=f"{bundle_id}-finalize",
                finalize_bundle=beam_fn_api_pb2.FinalizeBundleRequest(instruction_id=bundle_id),
            )), bundle_id)
            if done.error:
                raise RuntimeError(f"finalizing bundle {bundle_id} failed: {done.error}")
        return BundleResult(
            outputs=outputs,
            timers=dict(out_timers),
            reschedules=outcome.reschedules,
            monitoring_infos=outcome.monitoring_infos,
            elements_in=elements_in,
        )

    def try_split(
        self, request: beam_fn_api_pb2.ProcessBundleSplitRequest
    ) -> beam_fn_api_pb2.ProcessBundleSplitResponse:
        """Asks the SDK to split the running bundle (callable while `process` runs)."""
        bundle_id = request.instruction_id or self.current_instruction
        if not bundle_id:
            raise RuntimeError(f"no bundle of {self.descriptor.id} is running to split")
        split = beam_fn_api_pb2.ProcessBundleSplitRequest()
        split.CopyFrom(request)
        split.instruction_id = bundle_id
        response = self._await(self.sdk.conn.push(beam_fn_api_pb2.InstructionRequest(
            instruction_id=f"{bundle_id}-split-{next(_BUNDLE_IDS):06d}",
            process_bundle_split=split,
        )), bundle_id)
        if response.error:
            raise RuntimeError(f"splitting bundle {bundle_id} failed: {response.error}")
        return response.process_bundle_split

    def shutdown(self) -> None:
        """Nothing to tear down per lease: the SDK worker is shared and kept by `GrpcWorkers`."""


@dataclass
class _Slot:
    """The server and current SDK worker of one environment."""

    server: FnApiServer
    sdk: SdkWorkerProcess | None = None
    shell: BundleShell | None = None
    descriptors: dict[str, _Descriptor] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    leases: int = 0  # workers handed out and not yet returned (guarded by GrpcWorkers._lock)

    def close(self) -> None:
        if self.sdk is not None:
            self.sdk.stop()
        self.server.close()


class GrpcWorkers:
    """The SDK workers of this Python process: one server and one worker per environment.

    Spark reuses its Python workers across jobs, and every LOOPBACK job brings an environment
    of its own (its client's worker pool), so only the `max_idle` environments used last keep
    their server and SDK worker once no lease holds them; older ones are closed.
    """

    def __init__(self, host: str = "127.0.0.1", max_idle: int = 4) -> None:
        self._host = host
        self._max_idle = max_idle
        self._slots: collections.OrderedDict[bytes, _Slot] = collections.OrderedDict()
        self._lock = threading.Lock()

    def _slot(self, env: beam_runner_api_pb2.Environment, options: dict[str, Any]) -> _Slot:
        """The environment's slot, leased: `_return` it when done."""
        key = env.SerializeToString(deterministic=True)
        with self._lock:
            slot = self._slots.get(key)
            if slot is None:
                slot = self._slots[key] = _Slot(FnApiServer(env, options, self._host))
            self._slots.move_to_end(key)
            slot.leases += 1
            return slot

    def _return(self, slot: _Slot) -> None:
        with self._lock:
            slot.leases -= 1
            idle = [k for k, s in self._slots.items() if s.leases == 0]  # oldest first
            surplus = set(idle[: max(0, len(idle) - self._max_idle)])
            # A slot whose worker is gone (a LOOPBACK client that ended) is of no more use.
            surplus |= {k for k in idle if (s := self._slots[k]).sdk is not None
                        and s.sdk.death() is not None}
            closing = [self._slots.pop(k) for k in idle if k in surplus]
        for old in closing:
            with contextlib.suppress(Exception):
                old.close()

    def server(self, environment: beam_runner_api_pb2.Environment) -> FnApiServer | None:
        """The server of `environment`, if one was started (for its fetch counts)."""
        slot = self._slots.get(environment.SerializeToString(deterministic=True))
        return slot.server if slot else None

    @contextlib.contextmanager
    def lease(
        self,
        descriptor_bytes: bytes,
        environment: beam_runner_api_pb2.Environment,
        pipeline_options: dict[str, Any],
        connect_timeout_s: float = 60.0,
        scope: str = "",
    ) -> Iterator[GrpcWorker]:
        """A worker for `descriptor_bytes` on the (possibly new) SDK worker of `environment`;
        `scope` as in `embedded.WorkerCache.lease`."""
        slot = self._slot(environment, pipeline_options)
        try:
            with self._leased(slot, descriptor_bytes, environment, connect_timeout_s,
                              scope) as worker:
                yield worker
        finally:
            self._return(slot)

    @contextlib.contextmanager
    def _leased(
        self,
        slot: _Slot,
        descriptor_bytes: bytes,
        environment: beam_runner_api_pb2.Environment,
        connect_timeout_s: float,
        scope: str = "",
    ) -> Iterator[GrpcWorker]:
        with slot.lock:
            lost = slot.shell is not None and slot.shell.protocol.worker_state.value == "LOST"
            if slot.sdk is not None and (lost or slot.sdk.death() is not None):
                _LOG.warning("replacing SDK worker %s: %s", slot.sdk.worker_id, slot.sdk.death())
                slot.sdk.stop()
                slot.sdk = None
            if slot.sdk is None:
                sdk = SdkWorkerProcess(slot.server, environment)
                sdk.wait_connected(connect_timeout_s)
                slot.sdk, slot.shell = sdk, BundleShell(sdk.worker_id)
            sdk, shell = slot.sdk, slot.shell
            assert shell is not None
            digest = _digest(descriptor_bytes, scope)
            spec = slot.descriptors.get(digest)
            if spec is None:
                spec = slot.descriptors[digest] = _Descriptor.for_server(
                    descriptor_bytes, slot.server, scope)
        worker = GrpcWorker(sdk, spec, shell)
        try:
            yield worker
        finally:
            worker.shutdown()

    def shutdown(self) -> None:
        """Stops every SDK worker and server (runs at process exit)."""
        with self._lock:
            slots = list(self._slots.values())
            self._slots.clear()
        for slot in slots:
            slot.close()


WORKERS = GrpcWorkers()
atexit.register(WORKERS.shutdown)


def _digest(descriptor_bytes: bytes, scope: str) -> str:
    """The descriptor's registered identity: its content, and the scope its DoFns' side-input
    views are good for (the SDK caches bundle processors by descriptor id)."""
    return hashlib.sha256(descriptor_bytes + scope.encode()).hexdigest()
