"""The embedded worker: Beam's BundleProcessor driven in-process, inside a Spark Python worker.

No sockets: the data plane is `EmbeddedChannel` (inputs pulled from the task's iterator, outputs
collected element by element, already split, so the runner never decodes just to find element
boundaries) and the state plane is `TaskStateHandler` (side inputs shipped with the task, user
state kept per task and dropped once a key is finished).

Bundle processors are cached per descriptor in the worker process (Spark reuses Python workers),
so a descriptor is parsed and its DoFns are set up once per process, not once per bundle; per
descriptor and job for a stage that reads side inputs, whose views Beam's DoFn runner keeps.
"""
from __future__ import annotations

import atexit
import collections
import contextlib
import hashlib
import itertools
import logging
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from apache_beam.portability.api import beam_fn_api_pb2, metrics_pb2
from apache_beam.runners.portability.fn_api_runner import worker_handlers
from apache_beam.runners.worker import bundle_processor, data_plane, sdk_worker, statesampler
from apache_beam.runners.worker.statecache import StateCache

from sparkbeam.control.shell import BundleShell, SplitsRunningBundle
# Imported for its registration with Beam's transform factory: the operations this worker
# runs beyond Beam's, before any BundleProcessor here is built (`control/window_into.py`).
from sparkbeam.control import window_into  # noqa: F401
from sparkbeam.control.worker import BundleResult, OutputCap

_LOG = logging.getLogger(__name__)

# Runner capabilities we declare to the SDK (the same set FnApiRunner declares).
CAPABILITIES = worker_handlers.FNAPI_RUNNER_CAPABILITIES

_SIDE_INPUT_KINDS = frozenset(
    ["iterable_side_input", "multimap_side_input", "multimap_keys_side_input",
     "multimap_keys_values_side_input"]
)


class ElementStream(data_plane.ClosableOutputStream):
    """An output stream that hands over each element's bytes as soon as it is written.

    The SDK's DataOutputOperation encodes one element (nested context) then calls maybe_flush,
    so every flush here is exactly one element.
    """

    def __init__(self, sink: list[tuple[str, bytes]], transform_id: str) -> None:
        super().__init__()
        self._sink = sink
        self._transform_id = transform_id

    def maybe_flush(self) -> None:
        if self.size():
            self._sink.append((self._transform_id, self.get()))
            self._clear()

    def close(self) -> None:
        self.maybe_flush()


class CappedElementStream(ElementStream):
    """An `ElementStream` that counts each element against an `OutputCap`."""

    def __init__(self, sink: list[tuple[str, bytes]], transform_id: str, cap: OutputCap) -> None:
        super().__init__(sink, transform_id)
        self._cap = cap

    def maybe_flush(self) -> None:
        if self.size():
            data = self.get()
            self._sink.append((self._transform_id, data))
            self._clear()
            self._cap.count(len(data))


class EmbeddedChannel(data_plane.DataChannel):
    """The data plane between a task and its bundle processor, one bundle at a time."""

    def __init__(self) -> None:
        self._inputs: Iterable[Any] = ()
        self.outputs: list[tuple[str, bytes]] = []
        self.timers: dict[tuple[str, str], list[bytes]] = collections.defaultdict(list)
        self.cap: OutputCap | None = None  # set for one bundle by the caller, if it budgets it

    def start_bundle(self, inputs: Iterable[Any]) -> None:
        self._inputs = inputs
        self.outputs = []
        self.timers = collections.defaultdict(list)

    def input_elements(  # type: ignore[override]
        self, instruction_id: str, expected_inputs: Any, abort_callback: Any = None
    ) -> Iterator[Any]:
        yield from self._inputs
        self._inputs = ()

    def output_stream(self, instruction_id: str, transform_id: str) -> ElementStream:
        if self.cap is not None:
            return CappedElementStream(self.outputs, transform_id, self.cap)
        return ElementStream(self.outputs, transform_id)

    def output_timer_stream(
        self, instruction_id: str, transform_id: str, timer_family_id: str
    ) -> data_plane.ClosableOutputStream:
        sink = self.timers[(transform_id, timer_family_id)]
        return data_plane.ClosableOutputStream(
            close_callback=lambda data: sink.append(data) if data else None
        )

    def close(self) -> None:
        pass


class EmbeddedChannelFactory(data_plane.DataChannelFactory):
    """Gives every data and timer port of a descriptor the same channel."""

    def __init__(self, channel: EmbeddedChannel) -> None:
        self.channel = channel

    def create_data_channel(
        self, remote_grpc_port: Any, *args: Any, **kwargs: Any
    ) -> EmbeddedChannel:
        return self.channel

    def create_data_channel_from_url(
        self, url: str, data_stream_id: str | None = None
    ) -> EmbeddedChannel:
        return self.channel

    def close(self) -> None:
        pass


class TaskStateHandler(sdk_worker.StateHandler):
    """Serves side inputs (shipped with the task) and user state (kept in the task)."""

    def __init__(self) -> None:
        self._side: Mapping[bytes, list[bytes]] = {}
        self._user = worker_handlers.StateServicer()
        self._lock = threading.Lock()

    def bind_side_inputs(self, side: Mapping[bytes, list[bytes]]) -> None:
        self._side = side

    def swap_user_state(self, servicer: Any) -> Any:
        """Serves user state from `servicer` (one key's, in streaming); returns the previous."""
        previous, self._user = self._user, servicer
        return previous

    def drop_user_state(self) -> None:
        """Forgets all user state: the keys it belonged to are finished."""
        self._user = worker_handlers.StateServicer()

    @contextlib.contextmanager
    def process_instruction_id(self, bundle_id: str) -> Iterator[None]:
        yield

    def get_raw(
        self, state_key: beam_fn_api_pb2.StateKey, continuation_token: bytes | None = None
    ) -> tuple[bytes, bytes | None]:
        if state_key.WhichOneof("type") in _SIDE_INPUT_KINDS:
            return b"".join(self._side.get(state_key.SerializeToString(), ())), None
        return self._user.get_raw(state_key, continuation_token)

    def append_raw(self, state_key: beam_fn_api_pb2.StateKey, data: bytes) -> Any:
        return self._user.append_raw(state_key, data)

    def clear(self, state_key: beam_fn_api_pb2.StateKey) -> Any:
        return self._user.clear(state_key)

    def done(self) -> None:
        pass


@dataclass
class EmbeddedWorker(SplitsRunningBundle):
    """One BundleProcessor with its channel and state handler: a thin shell that feeds the
    bundle protocol (`control/shell.py`) and does what it says."""

    descriptor: beam_fn_api_pb2.ProcessBundleDescriptor
    channel: EmbeddedChannel = field(default_factory=EmbeddedChannel)
    state: TaskStateHandler = field(default_factory=TaskStateHandler)
    processor: bundle_processor.BundleProcessor | None = None
    failed_bundle_infos: list[metrics_pb2.MonitoringInfo] = field(default_factory=list)
    current_instruction: str | None = None  # the bundle running now, if any
    _ids: Iterator[int] = field(default_factory=itertools.count)

    def __post_init__(self) -> None:
        caching = sdk_worker.GlobalCachingStateHandler(StateCache(0), self.state)
        self.processor = bundle_processor.BundleProcessor(
            CAPABILITIES, self.descriptor, caching, EmbeddedChannelFactory(self.channel)
        )
        _without_sampling_thread(self.processor.state_sampler)
        self.shell = BundleShell(f"embedded-{self.descriptor.id}-{id(self):x}")

    def process(
        self,
        inputs: Iterable[Any],
        bundle_label: str = "",
        counts: Mapping[str, int] | None = None,
    ) -> BundleResult:
        """Runs one bundle over `inputs` (Elements.Data / Elements.Timers messages);
        `counts` (elements per input transform) lets the bundle be split while it runs."""
        assert self.processor is not None
        processor = self.processor
        inputs = list(inputs)
        instruction_id = f"{bundle_label or self.descriptor.id}-{next(self._ids):06d}"
        # The processor was built from the descriptor: nothing to register when asked to.
        self.shell.begin(instruction_id, self.descriptor.id, inputs, counts)
        self.channel.start_bundle(inputs)
        with processor.state_handler.process_instruction_id(instruction_id, []):
            self.current_instruction = instruction_id
            try:
                residuals, needs_finalization = processor.process_bundle(instruction_id)
            except BaseException as exc:
                partial: list[metrics_pb2.MonitoringInfo] = []
                with contextlib.suppress(Exception):
                    partial = list(processor.monitoring_infos())
                # What the failed bundle did counts as attempted, never as committed.
                _, self.failed_bundle_infos = self.shell.failed(instruction_id, repr(exc), partial)
                raise
            finally:
                self.current_instruction = None
            infos = list(processor.monitoring_infos())
        outcome = self.shell.succeeded(instruction_id, beam_fn_api_pb2.ProcessBundleResponse(
            residual_roots=residuals, monitoring_infos=infos,
            requires_finalization=needs_finalization))
        if outcome.finalize:
            processor.finalize_bundle()
        result = BundleResult(
            outputs=self.channel.outputs,
            timers=dict(self.channel.timers),
            reschedules=outcome.reschedules,
            monitoring_infos=outcome.monitoring_infos,
        )
        processor.reset()
        self.channel.start_bundle(())
        return result

    def set_output_cap(self, cap: OutputCap | None) -> None:
        self.channel.cap = cap

    def try_split(
        self, request: beam_fn_api_pb2.ProcessBundleSplitRequest
    ) -> beam_fn_api_pb2.ProcessBundleSplitResponse:
        """The SDK's answer to a split request for the running bundle (empty when it ended)."""
        processor = self.processor
        if processor is None or request.instruction_id != self.current_instruction:
            return beam_fn_api_pb2.ProcessBundleSplitResponse()
        return processor.try_split(request)

    def shutdown(self) -> None:
        if self.processor is not None:
            self.processor.shutdown()
            self.processor = None


class WorkerCache:
    """Idle embedded workers of this Python process, by descriptor digest.

    Holds the workers of at most `max_descriptors` descriptors, least recently used first out
    (their DoFns are torn down), so a long-lived Python worker serving many jobs stays bounded.
    """

    def __init__(self, max_descriptors: int = 64) -> None:
        self._idle: collections.OrderedDict[str, list[EmbeddedWorker]] = (
            collections.OrderedDict()
        )
        self._lock = threading.Lock()
        self._max = max_descriptors
        self.created = 0  # descriptors parsed and set up in this process

    @contextlib.contextmanager
    def lease(self, descriptor_bytes: bytes, fresh: bool = False, scope: str = ""
              ) -> Iterator[EmbeddedWorker]:
        """An idle worker for the descriptor, or a new one; `fresh`: always a new one, torn
        down after use (its DoFns have read side inputs that change, e.g. in streaming: Beam's
        DoFn runner keeps global-window side input values for its lifetime). `scope`: what
        the side inputs are good for (a batch job: the next job's differ), part of the key."""
        digest = hashlib.sha1(descriptor_bytes + scope.encode()).hexdigest()
        worker = None
        if not fresh:
            with self._lock:
                idle = self._idle.get(digest)
                worker = idle.pop() if idle else None
        if worker is None:
            worker = EmbeddedWorker(
                beam_fn_api_pb2.ProcessBundleDescriptor.FromString(descriptor_bytes)
            )
            self.created += 1
        ok = False
        try:
            yield worker
            ok = True
        finally:
            if ok and not fresh:
                worker.state.drop_user_state()
                worker.state.bind_side_inputs({})
                with self._lock:
                    self._idle.setdefault(digest, []).append(worker)
                    self._idle.move_to_end(digest)
                    evicted = []
                    while len(self._idle) > self._max:
                        evicted.extend(self._idle.popitem(last=False)[1])
                for old in evicted:
                    with contextlib.suppress(Exception):
                        old.shutdown()
            else:
                # A failed bundle leaves the processor in an unknown state: do not reuse it.
                with contextlib.suppress(Exception):
                    worker.shutdown()

    def shutdown(self) -> None:
        """Tears down every cached DoFn (runs at process exit)."""
        with self._lock:
            workers = [w for ws in self._idle.values() for w in ws]
            self._idle.clear()
        for w in workers:
            with contextlib.suppress(Exception):
                w.shutdown()


WORKERS = WorkerCache()
atexit.register(WORKERS.shutdown)


def _without_sampling_thread(sampler: statesampler.StateSampler) -> None:
    """Beam's state sampler starts a thread per bundle to time each step, and stopping it
    waits for that thread's next wake-up (2 ms at first): ~3 ms a bundle, measured on
    one-element bundles, and nothing here reads the sampled times (the SDK harness's
    lull logging, their only reader, is not embedded). The sampler still tracks the
    current step, which is how a DoFn's metrics find their container."""

    def start() -> None:
        sampler.tracked_thread = threading.current_thread()
        statesampler.set_current_tracker(sampler)
        sampler.started = True

    def stop() -> None:
        statesampler.set_current_tracker(None)
        sampler.finished = True

    sampler.start = start  # type: ignore[method-assign]
    sampler.stop = stop  # type: ignore[method-assign]
