"""The runner side of Beam's Fn API control protocol for one SDK worker, as a pure state machine.

A shell (the embedded worker or the gRPC control service) feeds `Event`s to `BundleProtocol.handle`
and executes the `Instruction`s it returns; the machine does no I/O and reads no clock (time comes
in events), so every rule below is tested without sockets or threads.

The protocol, per bundle::

    BundleStarted -> RUNNING --InputClosed--> INPUT_CLOSED --SplitWanted--> SPLITTING
                        |                     |          <--SplitReturned--     |
                        +---------------------+---------------------------------+
                  BundleFailed -> FAILED     BundleSucceeded -> SUCCEEDED (input closed)

- Descriptors are fetched lazily by id and cached by the SDK, so `RegisterDescriptor` is emitted the
  first time the worker sees a descriptor id, never again until the worker is replaced.
- Runner-initiated splits (`SplitWanted`) go out only once all input was sent, so the element
  counts in the request are exact; one split at a time per bundle; a late split is a no-op. The
  SDK's answer gives residual roots (rescheduled as new work) and channel splits: input elements
  from `first_residual_element` on will not be processed by the SDK, so the runner resends them as
  new work (`ResendInputs`). An empty answer marks the bundle unsplittable.
- Success reschedules the SDK's residual roots (self-checkpointing SDFs, after their requested
  delay), asks for finalization if needed and commits the bundle's metrics, exactly once; a failed
  bundle reports its metrics as attempted only and never commits them.
- `WorkerLost` fails every unfinished bundle and forgets the descriptors; the machine refuses new
  bundles until `reset_after_restart()` (a replacement worker needs every descriptor again). Answers
  still in flight from the lost worker are dropped.

Bundle ids must be unique over the machine's lifetime: a retried attempt gets its own id. The
machine keeps the last `KEEP_FINISHED` finished bundles (a late answer about one still finds it)
and counts older ones only: a worker lives as long as its process, and a machine holding every
bundle it ever ran grew without bound and checked them all on every event (a task of 3,600
one-element bundles took 25 s, the same task run again 92 s).
"""
from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from apache_beam.portability.api import beam_fn_api_pb2, metrics_pb2

from sparkbeam.errors import SparkBeamError

# Beam's DATA_CHANNEL_READ_INDEX: a sum_int64 counter per data input transform holding the index of
# the last element read (-1 before the first); hard-coded to keep this module free of Beam's SDK.
DATA_CHANNEL_READ_INDEX_URN = "beam:metric:data_channel:read_index:v1"
KEEP_FINISHED = 64  # finished bundles the machine remembers (the module doc)


class ProtocolError(SparkBeamError, ValueError):
    """An event impossible in the machine's current state (a bug in the shell or the SDK)."""


class BundleState(enum.Enum):
    RUNNING = "RUNNING"  # input still being sent
    INPUT_CLOSED = "INPUT_CLOSED"
    SPLITTING = "SPLITTING"  # a split request in flight
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"

    @property
    def terminal(self) -> bool:
        return self in (BundleState.SUCCEEDED, BundleState.FAILED)


class WorkerState(enum.Enum):
    READY = "READY"
    LOST = "LOST"


# ---- events -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BundleStarted:
    bundle_id: str
    descriptor_id: str
    now: float

@dataclass(frozen=True)
class DataSent:
    bundle_id: str
    transform_id: str
    elements: int
    nbytes: int

@dataclass(frozen=True)
class InputClosed:
    bundle_id: str

@dataclass(frozen=True)
class SplitWanted:
    bundle_id: str
    fraction_of_remainder: float
    now: float
    # Elements the SDK is told the bundle has (default: the exact count sent). 0 makes it split
    # the element in progress and give away all after it (elements are not equal in size).
    estimated_elements: int | None = None

@dataclass(frozen=True)
class SplitReturned:
    bundle_id: str
    response: beam_fn_api_pb2.ProcessBundleSplitResponse
    now: float = 0.0  # base of the residuals' `not_before`

@dataclass(frozen=True)
class BundleSucceeded:
    bundle_id: str
    response: beam_fn_api_pb2.ProcessBundleResponse
    now: float

@dataclass(frozen=True)
class BundleFailed:
    bundle_id: str
    error: str
    partial_infos: Sequence[metrics_pb2.MonitoringInfo] = ()

@dataclass(frozen=True)
class ProgressReported:
    bundle_id: str
    monitoring_infos: Sequence[metrics_pb2.MonitoringInfo]

@dataclass(frozen=True)
class WorkerLost:
    reason: str
    now: float


Event = (BundleStarted | DataSent | InputClosed | SplitWanted | SplitReturned | BundleSucceeded
         | BundleFailed | ProgressReported | WorkerLost)


# ---- instructions -------------------------------------------------------------------------------
@dataclass(frozen=True)
class RegisterDescriptor:
    descriptor_id: str

@dataclass(frozen=True)
class ProcessBundle:
    bundle_id: str
    descriptor_id: str

@dataclass(frozen=True)
class RequestSplit:
    bundle_id: str
    desired: Mapping[str, tuple[float, int]]  # input transform -> (fraction, estimated elements)

    def to_proto(self) -> beam_fn_api_pb2.ProcessBundleSplitRequest:
        Desired = beam_fn_api_pb2.ProcessBundleSplitRequest.DesiredSplit
        return beam_fn_api_pb2.ProcessBundleSplitRequest(
            instruction_id=self.bundle_id,
            desired_splits={t: Desired(fraction_of_remainder=f, estimated_input_elements=n)
                            for t, (f, n) in self.desired.items()})

@dataclass(frozen=True)
class Reschedule:
    application: beam_fn_api_pb2.BundleApplication
    not_before: float
    origin: str  # "split" | "checkpoint"

@dataclass(frozen=True)
class ResendInputs:
    """Input elements first_element..last_element (inclusive) of the bundle, to run as new work."""

    bundle_id: str
    transform_id: str
    first_element: int
    last_element: int

@dataclass(frozen=True)
class Finalize:
    bundle_id: str

@dataclass(frozen=True)
class CommitMetrics:
    bundle_id: str
    monitoring_infos: tuple[metrics_pb2.MonitoringInfo, ...]

@dataclass(frozen=True)
class AttemptedMetrics:
    bundle_id: str
    monitoring_infos: tuple[metrics_pb2.MonitoringInfo, ...]

@dataclass(frozen=True)
class Fail:
    bundle_id: str
    message: str

@dataclass(frozen=True)
class Progress:
    bundle_id: str
    elements: int
    nbytes: int


Instruction = (RegisterDescriptor | ProcessBundle | RequestSplit | Reschedule | ResendInputs
               | Finalize | CommitMetrics | AttemptedMetrics | Fail | Progress)

@dataclass(frozen=True)
class RecordedSplit:
    """An effective split, kept so that a retried attempt can replay it."""

    primary_roots: tuple[beam_fn_api_pb2.BundleApplication, ...]
    channel_splits: tuple[beam_fn_api_pb2.ProcessBundleSplitResponse.ChannelSplit, ...]

@dataclass(frozen=True)
class Counters:
    bundles_started: int = 0
    bundles_succeeded: int = 0
    bundles_failed: int = 0
    descriptors_registered: int = 0
    splits_requested: int = 0
    splits_effective: int = 0


@dataclass
class _Bundle:
    descriptor_id: str
    state: BundleState = BundleState.RUNNING
    sent: dict[str, int] = field(default_factory=dict)  # elements sent per input transform
    sent_bytes: dict[str, int] = field(default_factory=dict)
    end: dict[str, int] = field(default_factory=dict)  # elements the SDK still has to process
    unsplittable: bool = False
    splits: list[RecordedSplit] = field(default_factory=list)
    metrics_commits: int = 0


def _delay_seconds(delayed: beam_fn_api_pb2.DelayedBundleApplication) -> float:
    if not delayed.HasField("requested_time_delay"):
        return 0.0
    return float(delayed.requested_time_delay.ToNanoseconds()) / 1e9


def _read_index(info: metrics_pb2.MonitoringInfo) -> int:
    """Decodes the sum_int64 payload (Beam's VarIntCoder: a 64-bit two's complement varint)."""
    value, shift = 0, 0
    for byte in info.payload:
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            break
    return value - (1 << 64) if value >= 1 << 63 else value


class BundleProtocol:
    """Runner-side control protocol of one SDK worker: `handle(event) -> instructions`."""

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self.worker_state = WorkerState.READY
        self._bundles: dict[str, _Bundle] = {}  # in the order they started
        self._descriptors: list[str] = []  # registered since the last restart, in order
        self._counters = Counters()
        self._forgotten = {BundleState.SUCCEEDED: 0, BundleState.FAILED: 0}

    # ---- read-only views ----
    @property
    def counters(self) -> Counters:
        return self._counters

    @property
    def registered_descriptors(self) -> frozenset[str]:
        return frozenset(self._descriptors)

    @property
    def bundle_states(self) -> Mapping[str, BundleState]:
        return {bid: b.state for bid, b in self._bundles.items()}

    def state_of(self, bundle_id: str) -> BundleState:
        return self._get(bundle_id, "state_of").state

    def splits_of(self, bundle_id: str) -> tuple[RecordedSplit, ...]:
        return tuple(self._get(bundle_id, "splits_of").splits)

    def is_unsplittable(self, bundle_id: str) -> bool:
        return self._get(bundle_id, "is_unsplittable").unsplittable

    def elements_sent(self, bundle_id: str) -> Mapping[str, int]:
        return dict(self._get(bundle_id, "elements_sent").sent)

    # ---- transitions ----
    def handle(self, event: Event) -> list[Instruction]:
        """Applies one event; returns the instructions the shell must execute, in order."""
        out = self._handle(event)
        if len(self._bundles) > 2 * KEEP_FINISHED:
            self._forget_finished()
        return out

    def _forget_finished(self) -> None:
        """Drops the oldest finished bundles until `KEEP_FINISHED` are left (counted still)."""
        finished = [bid for bid, b in self._bundles.items() if b.state.terminal]
        for bid in finished[:max(0, len(finished) - KEEP_FINISHED)]:
            self._forgotten[self._bundles.pop(bid).state] += 1

    def _handle(self, event: Event) -> list[Instruction]:
        if isinstance(event, BundleStarted):
            return self._started(event)
        if isinstance(event, WorkerLost):
            return self._lost(event)
        b = self._get(event.bundle_id, type(event).__name__)
        if self.worker_state is WorkerState.LOST:
            return []  # a late answer from the lost worker: its bundles were failed already
        match event:
            case DataSent():
                if b.state is BundleState.FAILED:
                    return []  # the SDK may fail a bundle while its input is still flowing
                self._expect(event, b, BundleState.RUNNING)
                b.sent[event.transform_id] = b.sent.get(event.transform_id, 0) + event.elements
                b.end[event.transform_id] = b.sent[event.transform_id]
                b.sent_bytes[event.transform_id] = (
                    b.sent_bytes.get(event.transform_id, 0) + event.nbytes)
                return []
            case InputClosed():
                if b.state is BundleState.FAILED:
                    return []
                self._expect(event, b, BundleState.RUNNING)
                b.state = BundleState.INPUT_CLOSED
                return []
            case SplitWanted():
                return self._split_wanted(event, b)
            case SplitReturned():
                return self._split_returned(event, b)
            case BundleSucceeded():
                return self._succeeded(event, b)
            case BundleFailed():
                self._expect(event, b, BundleState.RUNNING, BundleState.INPUT_CLOSED,
                             BundleState.SPLITTING)
                b.state = BundleState.FAILED
                self._bump(bundles_failed=1)
                return [AttemptedMetrics(event.bundle_id, tuple(event.partial_infos)),
                        Fail(event.bundle_id, f"bundle {event.bundle_id} failed on SDK worker "
                                              f"{self.worker_id}: {event.error}")]
            case ProgressReported():
                return [] if b.state.terminal else [self._progress(event, b)]
        raise TypeError(f"not a bundle protocol event: {event!r}")

    def reset_after_restart(self) -> None:
        """Makes the machine serve a replacement worker: READY, no descriptor registered."""
        running = [bid for bid, b in self._bundles.items() if not b.state.terminal]
        if running:
            raise ProtocolError(f"cannot reset SDK worker {self.worker_id} (state "
                                f"{self.worker_state.value}): bundles {running} are unfinished")
        self.worker_state = WorkerState.READY
        self._descriptors = []

    def _started(self, event: BundleStarted) -> list[Instruction]:
        if self.worker_state is WorkerState.LOST:
            raise ProtocolError(f"cannot start bundle {event.bundle_id}: SDK worker "
                                f"{self.worker_id} was lost (state LOST); reset it after restart")
        if event.bundle_id in self._bundles:
            raise ProtocolError(f"bundle {event.bundle_id} started twice (state "
                                f"{self._bundles[event.bundle_id].state.value})")
        self._bundles[event.bundle_id] = _Bundle(event.descriptor_id)
        self._bump(bundles_started=1)
        out: list[Instruction] = []
        if event.descriptor_id not in self._descriptors:
            self._descriptors.append(event.descriptor_id)
            self._bump(descriptors_registered=1)
            out.append(RegisterDescriptor(event.descriptor_id))
        out.append(ProcessBundle(event.bundle_id, event.descriptor_id))
        return out

    def _split_wanted(self, event: SplitWanted, b: _Bundle) -> list[Instruction]:
        # 0 is a checkpoint: the SDK stops the element in progress where it is.
        if not 0.0 <= event.fraction_of_remainder <= 1.0:
            raise ProtocolError(f"split of bundle {event.bundle_id} (state {b.state.value}): "
                                f"fraction_of_remainder must be in [0, 1], got "
                                f"{event.fraction_of_remainder}")
        estimate = event.estimated_elements
        desired = {t: (event.fraction_of_remainder, n if estimate is None else estimate)
                   for t, n in b.end.items() if n > 0}
        if b.state is not BundleState.INPUT_CLOSED or b.unsplittable or not desired:
            return []
        b.state = BundleState.SPLITTING
        self._bump(splits_requested=1)
        return [RequestSplit(event.bundle_id, desired)]

    def _split_returned(self, event: SplitReturned, b: _Bundle) -> list[Instruction]:
        response = event.response
        empty = not (response.residual_roots or response.channel_splits
                     or response.primary_roots)
        if b.state.terminal:
            if empty:
                return []
            raise ProtocolError(f"non-empty split response for bundle {event.bundle_id} in "
                                f"state {b.state.value}: its work would be duplicated")
        self._expect(event, b, BundleState.SPLITTING)
        b.state = BundleState.INPUT_CLOSED
        if empty:
            b.unsplittable = True
            return []
        self._bump(splits_effective=1)
        b.splits.append(RecordedSplit(tuple(response.primary_roots),
                                      tuple(response.channel_splits)))
        out: list[Instruction] = [
            Reschedule(r.application, event.now + _delay_seconds(r), "split")
            for r in response.residual_roots]
        for split in response.channel_splits:
            end = b.end.get(split.transform_id, 0)
            if split.first_residual_element < end:
                # Elements first_residual..end-1 are no longer the SDK's; earlier splits already
                # handed out everything from the old end on, so nothing is resent twice.
                out.append(ResendInputs(event.bundle_id, split.transform_id,
                                        split.first_residual_element, end - 1))
                b.end[split.transform_id] = split.first_residual_element
        return out

    def _succeeded(self, event: BundleSucceeded, b: _Bundle) -> list[Instruction]:
        self._expect(event, b, BundleState.INPUT_CLOSED, BundleState.SPLITTING)
        b.state = BundleState.SUCCEEDED  # a split in flight counts as answered empty
        b.metrics_commits += 1
        self._bump(bundles_succeeded=1)
        response = event.response
        out: list[Instruction] = [
            Reschedule(r.application, event.now + _delay_seconds(r), "checkpoint")
            for r in response.residual_roots]
        if response.requires_finalization:
            out.append(Finalize(event.bundle_id))
        out.append(CommitMetrics(event.bundle_id, tuple(response.monitoring_infos)))
        return out

    def _progress(self, event: ProgressReported, b: _Bundle) -> Progress:
        read = {i.labels.get("PTRANSFORM", ""): _read_index(i) + 1
                for i in event.monitoring_infos if i.urn == DATA_CHANNEL_READ_INDEX_URN}
        if not read:
            return Progress(event.bundle_id, sum(b.sent.values()), sum(b.sent_bytes.values()))
        # Bytes are not reported by the SDK: estimated from the bytes sent, pro rata.
        nbytes = sum(b.sent_bytes.get(t, 0) * min(n, b.sent.get(t, 0)) // max(b.sent.get(t, 0), 1)
                     for t, n in read.items())
        return Progress(event.bundle_id, sum(read.values()), nbytes)

    def _lost(self, event: WorkerLost) -> list[Instruction]:
        out: list[Instruction] = []
        for bid, b in self._bundles.items():
            if not b.state.terminal:
                b.state = BundleState.FAILED
                self._bump(bundles_failed=1)
                out.append(Fail(bid, f"SDK worker {self.worker_id} was lost while running "
                                     f"bundle {bid}: {event.reason}"))
        self.worker_state = WorkerState.LOST
        self._descriptors = []
        return out

    # ---- helpers ----
    def _get(self, bundle_id: str, what: str) -> _Bundle:
        try:
            return self._bundles[bundle_id]
        except KeyError:
            raise ProtocolError(f"{what} for unknown bundle {bundle_id} on SDK worker "
                                f"{self.worker_id} (state {self.worker_state.value})") from None

    def _expect(self, event: Event, b: _Bundle, *states: BundleState) -> None:
        if b.state not in states:
            wanted = " or ".join(s.value for s in states)
            raise ProtocolError(f"{type(event).__name__} for bundle "
                                f"{getattr(event, 'bundle_id', '?')} in state {b.state.value}, "
                                f"expected {wanted}")

    def _bump(self, **deltas: int) -> None:
        c = self._counters
        self._counters = Counters(**{k: getattr(c, k) + deltas.get(k, 0)
                                     for k in Counters.__dataclass_fields__})

    def validate(self) -> None:
        """Asserts every invariant of the machine; raises AssertionError naming the broken one."""
        c, w = self._counters, self.worker_id
        by_state = {s: [bid for bid, b in self._bundles.items() if b.state is s]
                    for s in BundleState}
        for bid, b in self._bundles.items():
            assert isinstance(b.state, BundleState), f"{w}: bundle {bid} has no state"
            assert b.metrics_commits <= 1, f"{w}: metrics of bundle {bid} committed twice"
            assert (b.metrics_commits == 1) == (b.state is BundleState.SUCCEEDED), (
                f"{w}: bundle {bid} in state {b.state.value} has {b.metrics_commits} commits")
            assert all(0 <= b.end[t] <= b.sent[t] for t in b.end), (
                f"{w}: bundle {bid} split beyond its input: end {b.end}, sent {b.sent}")
        # One split in flight at most is structural (SPLITTING is one state; terminal ones are
        # others); the split counters must agree with it.
        in_flight = len(by_state[BundleState.SPLITTING])
        answered = c.splits_requested - in_flight
        assert c.splits_effective <= answered, f"{w}: more effective splits than answered: {c}"
        assert len(self._descriptors) == len(set(self._descriptors)), (
            f"{w}: a descriptor registered twice since restart: {self._descriptors}")
        assert c.descriptors_registered >= len(self._descriptors), f"{w}: counters {c}"
        forgotten = sum(self._forgotten.values())
        running = c.bundles_started - c.bundles_succeeded - c.bundles_failed
        assert c.bundles_started == len(self._bundles) + forgotten, (
            f"{w}: counters {c} vs {self._bundles} and {forgotten} forgotten")
        assert c.bundles_succeeded == (len(by_state[BundleState.SUCCEEDED])
                                       + self._forgotten[BundleState.SUCCEEDED]), (
            f"{w}: counters {c}")
        assert c.bundles_failed == (len(by_state[BundleState.FAILED])
                                    + self._forgotten[BundleState.FAILED]), f"{w}: counters {c}"
        assert running == sum(len(by_state[s]) for s in BundleState if not s.terminal), (
            f"{w}: succeeded + failed + running != started: {c}")
        if self.worker_state is WorkerState.LOST:
            assert running == 0, f"{w}: lost worker still has {running} unfinished bundles"
            assert not self._descriptors, f"{w}: lost worker still has descriptors"
