"""The seam between the runner and an SDK worker: what a stage's work drives, and how to lease it.

Two workers satisfy `Worker`: the embedded one (`embedded.EmbeddedWorker`, Beam's
BundleProcessor in this process, the default) and the gRPC one (`grpc_worker.GrpcWorker`, an
SDK harness of a PROCESS or EXTERNAL environment over the Fn API); `lease.py` hands them out and
makes mypy check both against the protocol. Callers see bundles (`process`),
splits of the bundle running now (`try_split`, `split`), a cap on what the next bundle may
output (`set_output_cap`), the state the bundles read (`state`), and nothing of the transport.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from apache_beam.portability.api import beam_fn_api_pb2, metrics_pb2

from sparkbeam.control.bundle_protocol import Reschedule
from sparkbeam.control.shell import SplitOutcome


@dataclass
class BundleResult:
    """What one bundle produced."""

    outputs: list[tuple[str, bytes]]  # (DATA_OUTPUT transform id, one encoded element)
    timers: dict[tuple[str, str], list[bytes]]  # (transform, family) -> encoded timer chunks
    reschedules: list[Reschedule]  # residual roots the SDK handed back (work shedding)
    monitoring_infos: list[metrics_pb2.MonitoringInfo]  # committed once the task succeeds
    elements_in: int = 0


@dataclass
class OutputCap:
    """A budget on what one bundle outputs: when its elements reach `items` or `bytes`,
    `on_reached` runs once, in the thread that receives the outputs, between two elements (no
    SDK lock is held there, so it may ask the SDK to checkpoint the element in progress)."""

    items: int
    bytes: int
    on_reached: Callable[[], None]
    taken_items: int = 0
    taken_bytes: int = 0
    reached: bool = field(default=False)

    def count(self, size: int) -> None:
        self.taken_items += 1
        self.taken_bytes += size
        if not self.reached and (self.taken_items >= self.items or self.taken_bytes >= self.bytes):
            self.reached = True
            self.on_reached()


class BundleState(Protocol):
    """The state a worker's bundles read: side inputs shipped with the task, user state."""

    def bind_side_inputs(self, side: Mapping[bytes, list[bytes]]) -> None: ...

    def swap_user_state(self, servicer: Any) -> Any: ...

    def drop_user_state(self) -> None: ...


class Worker(Protocol):
    """One leased SDK worker running bundles of one ProcessBundleDescriptor."""

    @property
    def descriptor(self) -> beam_fn_api_pb2.ProcessBundleDescriptor: ...

    @property
    def state(self) -> BundleState: ...

    @property
    def failed_bundle_infos(self) -> list[metrics_pb2.MonitoringInfo]:
        """What the last failed bundle did: counted as attempted, never committed."""
        ...

    def process(
        self,
        inputs: Iterable[Any],
        bundle_label: str = "",
        counts: Mapping[str, int] | None = None,
    ) -> BundleResult:
        """Runs one bundle over `inputs` (Elements.Data / Elements.Timers); `counts`
        (elements per input transform) lets it be split while it runs."""
        ...

    def try_split(
        self, request: beam_fn_api_pb2.ProcessBundleSplitRequest
    ) -> beam_fn_api_pb2.ProcessBundleSplitResponse:
        """The SDK's answer to a split request for the running bundle."""
        ...

    def split(self, fraction: float) -> SplitOutcome | None:
        """Splits the running bundle keeping `fraction` of the element in progress (from any
        thread, or from an `OutputCap` callback); None when nothing could be split."""
        ...

    def set_output_cap(self, cap: OutputCap | None) -> None:
        """Counts what the next bundles output against `cap` (None: no cap)."""
        ...

    def shutdown(self) -> None: ...
