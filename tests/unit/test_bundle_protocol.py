"""The bundle protocol state machine: event lists in, instruction lists out, invariants after each
step (`run`) and at teardown (the `machine` fixture)."""
from __future__ import annotations

import datetime
from collections.abc import Iterator, Sequence

import pytest
from apache_beam.metrics import monitoring_infos
from apache_beam.portability.api import beam_fn_api_pb2, metrics_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkbeam.control.bundle_protocol import (
    DATA_CHANNEL_READ_INDEX_URN,
    KEEP_FINISHED,
    AttemptedMetrics,
    BundleFailed,
    BundleProtocol,
    BundleStarted,
    BundleState,
    BundleSucceeded,
    CommitMetrics,
    DataSent,
    Event,
    Fail,
    Finalize,
    InputClosed,
    Instruction,
    ProcessBundle,
    Progress,
    ProgressReported,
    ProtocolError,
    RecordedSplit,
    RegisterDescriptor,
    RequestSplit,
    Reschedule,
    ResendInputs,
    SplitReturned,
    SplitWanted,
    WorkerLost,
    WorkerState,
)

Split = beam_fn_api_pb2.ProcessBundleSplitResponse
T = "read-0"  # the input (data channel) transform of every bundle here


def run(machine: BundleProtocol, events: Sequence[Event]) -> list[list[Instruction]]:
    """Handles the events one by one, checking the invariants after each."""
    out = []
    for event in events:
        out.append(machine.handle(event))
        machine.validate()
    return out


@pytest.fixture
def machine() -> Iterator[BundleProtocol]:
    m = BundleProtocol("worker-1")
    yield m
    m.validate()


def app(element: bytes) -> beam_fn_api_pb2.BundleApplication:
    return beam_fn_api_pb2.BundleApplication(transform_id="sdf-1", input_id="in", element=element)


def delayed(element: bytes,
            seconds: float | None = None) -> beam_fn_api_pb2.DelayedBundleApplication:
    d = beam_fn_api_pb2.DelayedBundleApplication(application=app(element))
    if seconds is not None:
        d.requested_time_delay.FromTimedelta(datetime.timedelta(seconds=seconds))
    return d


def counter(value: int) -> metrics_pb2.MonitoringInfo:
    return monitoring_infos.int64_counter(monitoring_infos.USER_COUNTER_URN, value, ptransform="p")


def ok(*residuals: beam_fn_api_pb2.DelayedBundleApplication, finalize: bool = False,
       infos: Sequence[metrics_pb2.MonitoringInfo] = ()) -> beam_fn_api_pb2.ProcessBundleResponse:
    return beam_fn_api_pb2.ProcessBundleResponse(
        residual_roots=residuals, requires_finalization=finalize, monitoring_infos=infos)


def fed(bundle: str, elements: int = 10, descriptor: str = "desc-1") -> list[Event]:
    """A started bundle whose input (`elements` on T, 10 bytes each) is all sent."""
    return [BundleStarted(bundle, descriptor, now=0.0),
            DataSent(bundle, T, elements, 10 * elements), InputClosed(bundle)]


# ---- descriptors --------------------------------------------------------------------------------
def test_descriptor_registered_once_across_many_bundles_and_again_after_restart(
        machine: BundleProtocol) -> None:
    first = run(machine, [BundleStarted(f"bundle-{i:04d}", "desc-1", now=i) for i in range(100)])
    assert first[0] == [RegisterDescriptor("desc-1"), ProcessBundle("bundle-0000", "desc-1")]
    assert all(out == [ProcessBundle(f"bundle-{i:04d}", "desc-1")]
               for i, out in enumerate(first) if i > 0)
    assert run(machine, [BundleStarted("other", "desc-2", now=1)]) == [
        [RegisterDescriptor("desc-2"), ProcessBundle("other", "desc-2")]]
    assert machine.counters.descriptors_registered == 2

    lost = run(machine, [WorkerLost("exit code 137", now=5)])[0]
    assert len(lost) == 101 and machine.registered_descriptors == frozenset()
    machine.reset_after_restart()
    machine.validate()
    assert run(machine, [BundleStarted("again-1", "desc-1", now=6),
                         BundleStarted("again-2", "desc-1", now=6)]) == [
        [RegisterDescriptor("desc-1"), ProcessBundle("again-1", "desc-1")],
        [ProcessBundle("again-2", "desc-1")]]
    assert machine.counters.descriptors_registered == 3


def test_only_the_last_finished_bundles_are_kept_and_every_one_is_counted(
        machine: BundleProtocol) -> None:
    # A worker lives as long as its process: thousands of bundles must not pile up.
    for i in range(1000):
        events = fed(f"b-{i:04d}", 1)
        events.append(BundleSucceeded(f"b-{i:04d}", ok(), now=i) if i % 7
                      else BundleFailed(f"b-{i:04d}", "boom"))
        run(machine, events)
    run(machine, fed("running", 1))
    kept = machine.bundle_states
    assert len(kept) <= 2 * KEEP_FINISHED + 1 and kept["running"] is BundleState.INPUT_CLOSED
    assert "b-0999" in kept and "b-0000" not in kept
    c = machine.counters
    assert (c.bundles_started, c.bundles_succeeded, c.bundles_failed) == (1001, 857, 143)
    # A late answer about a forgotten bundle is refused as unknown, never applied.
    with pytest.raises(ProtocolError, match="unknown bundle b-0001"):
        machine.handle(ProgressReported("b-0001", ()))


# ---- success: checkpoints, finalization, metrics ------------------------------------------------
def test_success_reschedules_checkpoint_residuals_after_their_delay(
        machine: BundleProtocol) -> None:
    infos = [counter(7)]
    out = run(machine, [*fed("b1"),
                        BundleSucceeded("b1", ok(delayed(b"r1", 2.5), delayed(b"r2"), infos=infos),
                                        now=100.0)])
    assert out[-1] == [Reschedule(app(b"r1"), not_before=102.5, origin="checkpoint"),
                       Reschedule(app(b"r2"), not_before=100.0, origin="checkpoint"),
                       CommitMetrics("b1", tuple(infos))]
    assert machine.state_of("b1") is BundleState.SUCCEEDED
    assert machine.counters.bundles_succeeded == 1


def test_finalization_requested_before_metrics_commit(machine: BundleProtocol) -> None:
    out = run(machine, [*fed("b1"), BundleSucceeded("b1", ok(finalize=True), now=1.0)])
    assert out[-1] == [Finalize("b1"), CommitMetrics("b1", ())]


def test_failure_reports_attempted_metrics_and_never_commits(machine: BundleProtocol) -> None:
    infos = [counter(3)]
    out = run(machine, [*fed("b1"), BundleFailed("b1", "ZeroDivisionError: boom", infos)])
    assert out[-1][0] == AttemptedMetrics("b1", tuple(infos))
    assert isinstance(out[-1][1], Fail) and out[-1][1].bundle_id == "b1"
    assert "b1" in out[-1][1].message and "ZeroDivisionError: boom" in out[-1][1].message
    assert not any(isinstance(i, CommitMetrics) for step in out for i in step)
    with pytest.raises(ProtocolError, match="BundleSucceeded for bundle b1 in state FAILED"):
        machine.handle(BundleSucceeded("b1", ok(), now=2.0))
    # input still in flight when the SDK failed the bundle is not an error
    assert run(machine, [DataSent("b1", T, 1, 1), InputClosed("b1")]) == [[], []]


# ---- splits -------------------------------------------------------------------------------------
def test_split_wanted_before_input_closed_is_a_no_op(machine: BundleProtocol) -> None:
    out = run(machine, [BundleStarted("b1", "desc-1", now=0), DataSent("b1", T, 5, 50),
                        SplitWanted("b1", 0.5, now=1)])
    assert out[-1] == [] and machine.state_of("b1") is BundleState.RUNNING
    assert machine.counters.splits_requested == 0


def test_channel_split_resends_the_inputs_the_sdk_gave_up(machine: BundleProtocol) -> None:
    channel = Split.ChannelSplit(transform_id=T, last_primary_element=3, first_residual_element=4)
    primary = app(b"primary")
    out = run(machine, [*fed("b1", elements=10), SplitWanted("b1", 0.5, now=1.0)])
    assert out[-1] == [RequestSplit("b1", {T: (0.5, 10)})]
    request = beam_fn_api_pb2.ProcessBundleSplitRequest
    assert isinstance(out[-1][0], RequestSplit) and out[-1][0].to_proto() == request(
        instruction_id="b1", desired_splits={T: request.DesiredSplit(
            fraction_of_remainder=0.5, estimated_input_elements=10)})
    assert machine.state_of("b1") is BundleState.SPLITTING
    response = Split(primary_roots=[primary], channel_splits=[channel])
    out = run(machine, [SplitReturned("b1", response, now=1.5)])
    assert out[-1] == [ResendInputs("b1", T, first_element=4, last_element=9)]
    assert machine.state_of("b1") is BundleState.INPUT_CLOSED
    assert machine.splits_of("b1") == (RecordedSplit((primary,), (channel,)),)

    # A second split asks about what is left and resends only what was not resent yet.
    channel2 = Split.ChannelSplit(transform_id=T, last_primary_element=1, first_residual_element=2)
    out = run(machine, [SplitWanted("b1", 0.5, now=2.0),
                        SplitReturned("b1", Split(channel_splits=[channel2]), now=2.0)])
    assert out == [[RequestSplit("b1", {T: (0.5, 4)})], [ResendInputs("b1", T, 2, 3)]]
    assert machine.counters.splits_requested == 2 and machine.counters.splits_effective == 2


def test_split_residual_roots_are_rescheduled(machine: BundleProtocol) -> None:
    response = Split(primary_roots=[app(b"p")], residual_roots=[delayed(b"r", 1.0)],
                     channel_splits=[Split.ChannelSplit(transform_id=T, last_primary_element=9,
                                                        first_residual_element=10)])
    out = run(machine, [*fed("b1"), SplitWanted("b1", 0.25, now=3.0),
                        SplitReturned("b1", response, now=4.0)])
    # first_residual_element == elements sent: nothing to resend
    assert out[-1] == [Reschedule(app(b"r"), not_before=5.0, origin="split")]


def test_empty_split_marks_the_bundle_unsplittable(machine: BundleProtocol) -> None:
    out = run(machine, [*fed("b1"), SplitWanted("b1", 0.5, now=1),
                        SplitWanted("b1", 0.5, now=1),  # one split in flight at most
                        SplitReturned("b1", Split(), now=2), SplitWanted("b1", 0.1, now=3)])
    assert out[-4:] == [[RequestSplit("b1", {T: (0.5, 10)})], [], [], []]
    assert machine.is_unsplittable("b1") and machine.splits_of("b1") == ()
    assert machine.counters.splits_requested == 1 and machine.counters.splits_effective == 0


def test_empty_split_after_an_effective_one_keeps_the_recorded_split(
        machine: BundleProtocol) -> None:
    channel = Split.ChannelSplit(transform_id=T, last_primary_element=5, first_residual_element=6)
    out = run(machine, [*fed("b1"), SplitWanted("b1", 0.5, now=1),
                        SplitReturned("b1", Split(channel_splits=[channel]), now=1),
                        SplitWanted("b1", 0.5, now=2), SplitReturned("b1", Split(), now=2),
                        SplitWanted("b1", 0.5, now=3)])
    assert out[-5:] == [[RequestSplit("b1", {T: (0.5, 10)})], [ResendInputs("b1", T, 6, 9)],
                        [RequestSplit("b1", {T: (0.5, 6)})], [], []]
    assert machine.is_unsplittable("b1")
    assert machine.splits_of("b1") == (RecordedSplit((), (channel,)),)


def test_late_split_after_success(machine: BundleProtocol) -> None:
    out = run(machine, [*fed("b1"), SplitWanted("b1", 0.5, now=1),
                        BundleSucceeded("b1", ok(), now=2),  # the split counts as answered empty
                        SplitReturned("b1", Split(), now=3), SplitWanted("b1", 0.5, now=4)])
    assert out[-2:] == [[], []]
    late = Split(residual_roots=[delayed(b"r")])
    with pytest.raises(ProtocolError, match="non-empty split response for bundle b1 in state "
                                            "SUCCEEDED"):
        machine.handle(SplitReturned("b1", late, now=5))


def test_split_fraction_must_be_in_range(machine: BundleProtocol) -> None:
    run(machine, fed("b1"))
    for fraction in (-0.01, -0.5, 1.5):
        with pytest.raises(ProtocolError, match=r"bundle b1 .*must be in \[0, 1\]"):
            machine.handle(SplitWanted("b1", fraction, now=1))
    # 0 is a checkpoint (stop the element in progress where it is), as Beam's protocol allows.
    checkpoint = machine.handle(SplitWanted("b1", 0.0, now=1))
    assert [type(i) for i in checkpoint] == [RequestSplit]
    assert checkpoint[0].to_proto().desired_splits[T].fraction_of_remainder == 0.0


# ---- progress -----------------------------------------------------------------------------------
def test_progress_from_read_index_or_sent_counts(machine: BundleProtocol) -> None:
    assert monitoring_infos.DATA_CHANNEL_READ_INDEX == DATA_CHANNEL_READ_INDEX_URN
    read = monitoring_infos.int64_counter(monitoring_infos.DATA_CHANNEL_READ_INDEX, 3, ptransform=T)
    before = monitoring_infos.int64_counter(monitoring_infos.DATA_CHANNEL_READ_INDEX, -1,
                                            ptransform=T)
    out = run(machine, [*fed("b1", elements=10), ProgressReported("b1", [read]),
                        ProgressReported("b1", [before]), ProgressReported("b1", [counter(1)]),
                        BundleSucceeded("b1", ok(), now=1), ProgressReported("b1", [read])])
    assert out[3:] == [[Progress("b1", 4, 40)], [Progress("b1", 0, 0)], [Progress("b1", 10, 100)],
                       out[6], []]


# ---- worker loss --------------------------------------------------------------------------------
def test_worker_lost_fails_unfinished_bundles(machine: BundleProtocol) -> None:
    out = run(machine, [*fed("b1"), BundleSucceeded("b1", ok(), now=1), *fed("b2"),
                        BundleStarted("b3", "desc-1", now=2), SplitWanted("b2", 0.5, now=2),
                        WorkerLost("connection reset", now=3)])
    assert out[-1] == [
        Fail("b2", "SDK worker worker-1 was lost while running bundle b2: connection reset"),
        Fail("b3", "SDK worker worker-1 was lost while running bundle b3: connection reset")]
    assert machine.worker_state is WorkerState.LOST
    assert machine.bundle_states == {"b1": BundleState.SUCCEEDED, "b2": BundleState.FAILED,
                                     "b3": BundleState.FAILED}
    # answers still in flight from the dead worker are dropped
    assert run(machine, [SplitReturned("b2", Split(residual_roots=[delayed(b"r")])),
                         BundleSucceeded("b3", ok(), now=4)]) == [[], []]
    with pytest.raises(ProtocolError, match="cannot start bundle b4: SDK worker worker-1 was lost"):
        machine.handle(BundleStarted("b4", "desc-1", now=5))


# ---- illegal transitions ------------------------------------------------------------------------
@pytest.mark.parametrize("events, bad, message", [
    (fed("b1"), BundleStarted("b1", "desc-1", now=1), "bundle b1 started twice"),
    ([], DataSent("nope", T, 1, 1), "DataSent for unknown bundle nope"),
    (fed("b1"), DataSent("b1", T, 1, 1), "DataSent for bundle b1 in state INPUT_CLOSED"),
    (fed("b1"), InputClosed("b1"), "InputClosed for bundle b1 in state INPUT_CLOSED"),
    (fed("b1")[:2], BundleSucceeded("b1", ok(), now=1),
     "BundleSucceeded for bundle b1 in state RUNNING"),
    (fed("b1"), SplitReturned("b1", Split()), "SplitReturned for bundle b1 in state INPUT_CLOSED"),
    ([*fed("b1"), BundleSucceeded("b1", ok(), now=1)], BundleSucceeded("b1", ok(), now=1),
     "BundleSucceeded for bundle b1 in state SUCCEEDED"),
    ([*fed("b1"), BundleSucceeded("b1", ok(), now=1)], BundleFailed("b1", "x"),
     "BundleFailed for bundle b1 in state SUCCEEDED"),
])
def test_illegal_transitions(machine: BundleProtocol, events: list[Event], bad: Event,
                             message: str) -> None:
    run(machine, events)
    with pytest.raises(ProtocolError, match=message):
        machine.handle(bad)
    assert isinstance(ProtocolError("x"), ValueError)


def test_reset_refused_with_unfinished_bundles(machine: BundleProtocol) -> None:
    run(machine, [BundleStarted("b1", "desc-1", now=0)])
    with pytest.raises(ProtocolError, match=r"cannot reset SDK worker worker-1.*\['b1'\]"):
        machine.reset_after_restart()


# ---- random sequences ---------------------------------------------------------------------------
channel_splits = st.builds(lambda n: Split.ChannelSplit(transform_id=T, last_primary_element=n - 1,
                                                        first_residual_element=n),
                           st.integers(0, 12))
split_responses = st.builds(
    lambda ch, res: Split(channel_splits=ch, residual_roots=res),
    st.lists(channel_splits, max_size=1), st.lists(st.just(delayed(b"s", 1.0)), max_size=1))
responses = st.builds(
    lambda res, fin: ok(*res, finalize=fin, infos=[counter(1)]),
    st.lists(st.just(delayed(b"c", 2.0)), max_size=2), st.booleans())


@st.composite
def lifecycle(draw: st.DrawFn, bid: str) -> list[Event]:
    """A plausible life of one bundle: start, input, splits, an end (which may arrive early)."""
    out: list[Event] = [BundleStarted(bid, draw(st.sampled_from(["d1", "d2"])), 0.0)]
    for n in draw(st.lists(st.integers(1, 5), max_size=3)):
        out.append(DataSent(bid, T, n, 10 * n))
    out.append(InputClosed(bid))
    for _ in range(draw(st.integers(0, 2))):
        out += [SplitWanted(bid, draw(st.floats(0.05, 1.0)), 1.0),
                SplitReturned(bid, draw(split_responses), 1.0)]
    out.append(ProgressReported(bid, []))
    end = draw(st.sampled_from([BundleSucceeded(bid, draw(responses), 2.0)] * 3
                               + [BundleFailed(bid, "boom", [counter(1)])]))
    out.insert(draw(st.integers(1, len(out))), end)
    return out


bundle_ids = st.sampled_from(["b0", "b1", "b2", "b3", "nope"])
noise = st.one_of(
    st.builds(BundleStarted, bundle_ids, st.sampled_from(["d1", "d2"]), st.floats(0, 10)),
    st.builds(DataSent, bundle_ids, st.just(T), st.integers(0, 5), st.integers(0, 50)),
    st.builds(InputClosed, bundle_ids),
    st.builds(SplitWanted, bundle_ids, st.floats(-0.5, 1.5), st.floats(0, 10)),
    st.builds(SplitReturned, bundle_ids, split_responses, st.floats(0, 10)),
    st.builds(BundleSucceeded, bundle_ids, responses, st.floats(0, 10)),
    st.builds(BundleFailed, bundle_ids, st.just("boom"), st.just([counter(1)])),
    st.builds(WorkerLost, st.just("gone"), st.floats(0, 10)),
    st.just("restart"),
)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_random_event_sequences_keep_the_invariants(data: st.DataObject) -> None:
    """Interleaved bundle lives plus random noise; ProtocolErrors are skipped."""
    queues: list[list[Event | str]] = [
        list(data.draw(lifecycle(f"b{i}"))) for i in range(data.draw(st.integers(1, 4)))]
    queues.append(data.draw(st.lists(noise, max_size=6)))
    m = BundleProtocol("worker-h")
    committed: list[str] = []
    finished: list[str] = []
    registered: list[str] = []
    resent: dict[str, set[int]] = {}  # bundle -> input elements handed out as new work
    while any(queues):
        event = data.draw(st.sampled_from([q for q in queues if q])).pop(0)
        try:
            if event == "restart":
                m.reset_after_restart()
                registered.clear()
                out: list[Instruction] = []
            else:
                assert not isinstance(event, str)
                out = m.handle(event)
        except ProtocolError:
            m.validate()
            continue
        m.validate()
        for i in out:
            if isinstance(i, RegisterDescriptor):
                assert i.descriptor_id not in registered, "descriptor made available twice"
                registered.append(i.descriptor_id)
            elif isinstance(i, CommitMetrics):
                assert m.state_of(i.bundle_id) is BundleState.SUCCEEDED
                committed.append(i.bundle_id)
            elif isinstance(i, ResendInputs):  # in range, and no element handed out twice
                assert 0 <= i.first_element <= i.last_element < m.elements_sent(i.bundle_id)[T]
                elements = set(range(i.first_element, i.last_element + 1))
                assert not elements & resent.setdefault(i.bundle_id, set())
                resent[i.bundle_id] |= elements
            if isinstance(i, CommitMetrics | Fail):
                finished.append(i.bundle_id)
        if isinstance(event, WorkerLost):
            assert all(s.terminal for s in m.bundle_states.values())
    # every bundle ends once (committed or failed), metrics are committed at most once per bundle
    assert len(finished) == len(set(finished))
    assert len(committed) == len(set(committed))
    assert set(finished) == {b for b, s in m.bundle_states.items() if s.terminal}
