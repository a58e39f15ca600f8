"""What both workers (embedded and gRPC) do with the bundle protocol, in one place.

`BundleShell` owns one `BundleProtocol` (one per SDK worker: an embedded BundleProcessor or an
SDK harness process) behind a lock, since the task thread runs bundles while the split monitor
asks for splits. The workers feed it events and act on the instructions; nothing here does I/O
except through the callables the workers pass in.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from apache_beam.portability.api import beam_fn_api_pb2, metrics_pb2

from sparkbeam.control import bundle_protocol as bp


@dataclass(frozen=True)
class Outcome:
    """What the protocol made of a successful bundle."""

    reschedules: list[bp.Reschedule]
    finalize: bool
    monitoring_infos: list[metrics_pb2.MonitoringInfo]


@dataclass(frozen=True)
class SplitOutcome:
    """An effective split of a running bundle."""

    primary_roots: tuple[beam_fn_api_pb2.BundleApplication, ...]
    channel_splits: tuple[beam_fn_api_pb2.ProcessBundleSplitResponse.ChannelSplit, ...]
    reschedules: list[bp.Reschedule] = field(default_factory=list)
    resends: list[bp.ResendInputs] = field(default_factory=list)


class SplitsRunningBundle:
    """`split` for a worker that records its running bundle in `current_instruction` and
    answers split requests with `try_split` (the embedded and the gRPC worker)."""

    shell: BundleShell
    current_instruction: str | None

    def try_split(
        self, request: beam_fn_api_pb2.ProcessBundleSplitRequest
    ) -> beam_fn_api_pb2.ProcessBundleSplitResponse:
        raise NotImplementedError

    def split(self, fraction: float) -> SplitOutcome | None:
        """Splits the running bundle, keeping `fraction` of the element in progress (called
        from another thread while the bundle runs); None when nothing could be split."""
        bundle = self.current_instruction
        if bundle is None:
            return None
        return self.shell.split(bundle, fraction, self.try_split)


class BundleShell:
    def __init__(self, worker_id: str) -> None:
        self.protocol = bp.BundleProtocol(worker_id)
        self._lock = threading.Lock()
        # Held from a split request until its answer is recorded, and taken before a bundle's
        # end is: an answer the SDK gave while the bundle ran always lands first.
        self._splitting = threading.Lock()

    def _handle(self, event: bp.Event) -> list[bp.Instruction]:
        with self._lock:
            out = self.protocol.handle(event)
            self.protocol.validate()
            return out

    def begin(
        self,
        bundle_id: str,
        descriptor_id: str,
        inputs: Iterable[Any],
        counts: Mapping[str, int] | None = None,
    ) -> bool:
        """Starts a bundle whose input is all in `inputs`; True when the worker has not seen
        the descriptor yet (register it so the SDK can fetch it)."""
        instructions = self._handle(bp.BundleStarted(bundle_id, descriptor_id, time.time()))
        for item in inputs:
            if isinstance(item, beam_fn_api_pb2.Elements.Data):
                n = (counts or {}).get(item.transform_id, 0)
                self._handle(bp.DataSent(bundle_id, item.transform_id, n, len(item.data)))
        self._handle(bp.InputClosed(bundle_id))
        return any(isinstance(i, bp.RegisterDescriptor) for i in instructions)

    def succeeded(
        self, bundle_id: str, response: beam_fn_api_pb2.ProcessBundleResponse
    ) -> Outcome:
        with self._splitting:
            instructions = self._handle(bp.BundleSucceeded(bundle_id, response, time.time()))
        infos: list[metrics_pb2.MonitoringInfo] = []
        for i in instructions:
            if isinstance(i, bp.CommitMetrics):
                infos.extend(i.monitoring_infos)
        return Outcome(
            reschedules=[i for i in instructions if isinstance(i, bp.Reschedule)],
            finalize=any(isinstance(i, bp.Finalize) for i in instructions),
            monitoring_infos=infos,
        )

    def failed(
        self, bundle_id: str, error: str, partial: Iterable[metrics_pb2.MonitoringInfo] = ()
    ) -> tuple[str, list[metrics_pb2.MonitoringInfo]]:
        """The failure message and the infos that count as attempted only."""
        message = f"bundle {bundle_id} failed: {error}"
        infos: list[metrics_pb2.MonitoringInfo] = []
        with self._splitting:
            instructions = self._handle(bp.BundleFailed(bundle_id, error, tuple(partial)))
        for i in instructions:
            if isinstance(i, bp.Fail):
                message = i.message
            elif isinstance(i, bp.AttemptedMetrics):
                infos.extend(i.monitoring_infos)
        return message, infos

    def lost(self, reason: str) -> list[str]:
        """The worker is gone: the failure messages of its unfinished bundles."""
        return [i.message for i in self._handle(bp.WorkerLost(reason, time.time()))
                if isinstance(i, bp.Fail)]

    def split(
        self,
        bundle_id: str,
        fraction: float,
        send: Callable[[beam_fn_api_pb2.ProcessBundleSplitRequest],
                       beam_fn_api_pb2.ProcessBundleSplitResponse],
        estimated_elements: int | None = 0,
    ) -> SplitOutcome | None:
        """Asks the SDK to split the running bundle; None when nothing was split."""
        with self._splitting:
            requests = [i for i in self._handle(
                bp.SplitWanted(bundle_id, fraction, time.time(), estimated_elements))
                if isinstance(i, bp.RequestSplit)]
            if not requests:
                return None
            try:
                response = send(requests[0].to_proto())
            except Exception:
                empty = beam_fn_api_pb2.ProcessBundleSplitResponse()
                self._handle(bp.SplitReturned(bundle_id, empty, time.time()))
                raise
            instructions = self._handle(bp.SplitReturned(bundle_id, response, time.time()))
        if not (response.primary_roots or response.residual_roots or response.channel_splits):
            return None
        return SplitOutcome(
            primary_roots=tuple(response.primary_roots),
            channel_splits=tuple(response.channel_splits),
            reschedules=[i for i in instructions if isinstance(i, bp.Reschedule)],
            resends=[i for i in instructions if isinstance(i, bp.ResendInputs)],
        )
