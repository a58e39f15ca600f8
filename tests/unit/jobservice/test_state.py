"""The job state machine, as lists of events plus an invariant check (Dask style)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from sparkbeam.errors import JobStateError
from sparkbeam.jobservice import state as st

pytestmark = pytest.mark.timeout(60)


def drive(*events: st.Event, streaming: bool = False
          ) -> tuple[st.JobStateMachine, list[st.Instruction]]:
    """Feeds events to a fresh machine, checking its invariants after each one."""
    machine = st.JobStateMachine("job-001", streaming=streaming)
    out: list[st.Instruction] = []
    for event in events:
        out += machine.handle(event)
        machine.validate()
    return machine, out


def names(machine: st.JobStateMachine) -> list[str]:
    return [st.state_name(s) for s in machine.history]


def test_a_successful_run() -> None:
    machine, out = drive(
        st.RunRequested(), st.RunStarted(), st.ExecutorReported("RUNNING"),
        st.ExecutorReported("RUNNING"), st.RunEnded("DONE"),
    )
    assert names(machine) == ["STOPPED", "STARTING", "RUNNING", "DONE"]
    assert out == [
        st.Publish(st.STOPPED, st.STARTING), st.StartRun(),
        st.Publish(st.STARTING, st.RUNNING), st.Publish(st.RUNNING, st.DONE),
    ]


def test_a_failure_reports_the_error_before_publishing_failed() -> None:
    machine, out = drive(
        st.RunRequested(), st.RunStarted(), st.ExecutorReported("RUNNING"),
        st.RunEnded("FAILED", "job-001 failed: ValueError: boom"),
    )
    assert out[-2:] == [
        st.Report(st.ERROR, "job-001 failed: ValueError: boom"),
        st.Publish(st.RUNNING, st.FAILED),
    ]


def test_failed_is_sticky() -> None:
    machine, _ = drive(st.RunRequested(), st.RunStarted(), st.RunEnded("FAILED", "boom"))
    assert machine.handle(st.ExecutorReported("DONE")) == []  # terminal reports are advisory
    assert machine.handle(st.CancelRequested()) == []
    assert machine.handle(st.RunEnded("FAILED", "again")) == []
    with pytest.raises(JobStateError, match="invalid transition FAILED -> RUNNING"):
        machine.handle(st.ExecutorReported("RUNNING"))
    with pytest.raises(JobStateError, match="invalid transition FAILED -> DONE"):
        machine.handle(st.RunEnded("DONE"))
    with pytest.raises(JobStateError, match="cannot Run: it is FAILED"):
        machine.handle(st.RunRequested())
    assert names(machine) == ["STOPPED", "STARTING", "FAILED"]


def test_executor_terminal_reports_wait_for_the_run_to_end() -> None:
    # The final state comes with RunEnded, which carries the error text.
    machine, out = drive(st.RunRequested(), st.RunStarted(), st.ExecutorReported("FAILED"))
    assert machine.state == st.STARTING
    assert out == [st.Publish(st.STOPPED, st.STARTING), st.StartRun()]


def test_run_twice_is_refused() -> None:
    machine, _ = drive(st.RunRequested())
    with pytest.raises(JobStateError, match="job-001 cannot Run: it is STARTING, expected STOP"):
        machine.handle(st.RunRequested())
    machine.validate()


def test_cancel_before_run_ends_the_job_without_an_executor() -> None:
    machine, out = drive(st.CancelRequested())
    assert out == [st.Publish(st.STOPPED, st.CANCELLED)]
    with pytest.raises(JobStateError, match="cannot Run: it is CANCELLED"):
        machine.handle(st.RunRequested())


def test_cancel_while_the_executor_starts_is_delivered_once_it_has_started() -> None:
    machine, out = drive(st.RunRequested(), st.CancelRequested())
    assert out[-1] == st.Publish(st.STARTING, st.CANCELLING)
    assert machine.handle(st.RunStarted()) == [st.CancelRun()]
    assert machine.handle(st.ExecutorReported("RUNNING")) == []  # stale: from before the cancel
    assert machine.handle(st.RunEnded("CANCELLED")) == [st.Publish(st.CANCELLING, st.CANCELLED)]
    machine.validate()


def test_cancel_while_running_cancels_the_run_once() -> None:
    machine, out = drive(
        st.RunRequested(), st.RunStarted(), st.ExecutorReported("RUNNING"),
        st.CancelRequested(), st.CancelRequested(), st.RunEnded("CANCELLED"),
    )
    assert out.count(st.CancelRun()) == 1
    assert names(machine)[-2:] == ["CANCELLING", "CANCELLED"]


def test_a_job_that_finishes_while_cancelling_is_done() -> None:
    machine, _ = drive(
        st.RunRequested(), st.RunStarted(), st.CancelRequested(), st.RunEnded("DONE")
    )
    assert names(machine)[-2:] == ["CANCELLING", "DONE"]


@pytest.mark.parametrize("before", [[], [st.RunRequested(), st.RunStarted()]])
def test_drain_is_refused_for_batch_jobs(before: list[st.Event]) -> None:
    machine, _ = drive(*before)
    with pytest.raises(JobStateError, match="batch job.*use Cancel"):
        machine.handle(st.DrainRequested())
    machine.validate()


def test_drain_of_a_finished_job_says_so() -> None:
    machine, _ = drive(st.RunRequested(), st.RunStarted(), st.RunEnded("DONE"))
    with pytest.raises(JobStateError, match="already ended in DONE"):
        machine.handle(st.DrainRequested())


def test_a_streaming_job_drains_once_and_ends_drained() -> None:
    machine, out = drive(st.RunRequested(), st.RunStarted(), st.ExecutorReported("RUNNING"),
                         st.DrainRequested(), st.DrainRequested(),
                         st.ExecutorReported("RUNNING"),  # sent before the drain arrived
                         st.RunEnded("DRAINED"), streaming=True)
    assert out.count(st.DrainRun()) == 1
    assert names(machine)[-3:] == ["RUNNING", "DRAINING", "DRAINED"]


def test_a_drain_while_starting_reaches_the_run_once_it_started() -> None:
    machine, out = drive(st.RunRequested(), st.DrainRequested(), streaming=True)
    assert st.DrainRun() not in out and machine.state == st.DRAINING
    assert machine.handle(st.RunStarted()) == [st.DrainRun()]


def test_a_draining_job_can_still_be_cancelled_but_not_drained_before_it_runs() -> None:
    machine, out = drive(st.RunRequested(), st.RunStarted(), st.DrainRequested(),
                         st.CancelRequested(), st.RunEnded("CANCELLED"), streaming=True)
    assert names(machine)[-3:] == ["DRAINING", "CANCELLING", "CANCELLED"]
    machine, _ = drive(streaming=True)
    with pytest.raises(JobStateError, match="cannot Drain: it is STOPPED"):
        machine.handle(st.DrainRequested())


def test_start_and_staging_failures_fail_the_job_with_their_text() -> None:
    machine, out = drive(st.RunRequested(), st.StartFailed("no Spark here"))
    assert out[-2:] == [st.Report(st.ERROR, "no Spark here"), st.Publish(st.STARTING, st.FAILED)]
    machine, out = drive(st.StagingFailed("disk full"))
    assert out == [st.Report(st.ERROR, "disk full"), st.Publish(st.STOPPED, st.FAILED)]
    with pytest.raises(JobStateError, match="unexpected staging failure in state STARTING"):
        drive(st.RunRequested(), st.StagingFailed("late"))


def test_a_run_that_ends_in_a_non_terminal_state_has_failed() -> None:
    machine, out = drive(st.RunRequested(), st.RunStarted(), st.RunEnded("RUNNING"))
    assert machine.state == st.FAILED
    assert out[-2] == st.Report(st.ERROR, "job-001: the run ended in non-terminal state RUNNING")


def test_a_failure_without_error_text_still_says_it_failed() -> None:
    _, out = drive(st.RunRequested(), st.RunStarted(), st.RunEnded("FAILED", None))
    assert out[-2] == st.Report(st.ERROR, "job-001 failed (the executor gave no error)")


def test_unknown_executor_states_are_rejected() -> None:
    machine, _ = drive(st.RunRequested())
    with pytest.raises(JobStateError, match="unknown executor state 'EXPLODED'"):
        machine.handle(st.ExecutorReported("EXPLODED"))
    assert st.from_pipeline_state("PENDING") == st.STARTING


def test_events_out_of_order_are_rejected() -> None:
    with pytest.raises(JobStateError, match="started a run that was not requested"):
        drive(st.RunStarted())
    with pytest.raises(JobStateError, match="unexpected run end in state STOPPED"):
        drive(st.RunEnded("FAILED", "x"))
    with pytest.raises(JobStateError, match="reported RUNNING for a job that was not run"):
        drive(st.ExecutorReported("RUNNING"))
    with pytest.raises(JobStateError, match="invalid transition RUNNING -> STARTING"):
        drive(st.RunRequested(), st.ExecutorReported("RUNNING"), st.ExecutorReported("STARTING"))


# --- any sequence of events keeps the invariants ----------------------------------------------

EVENTS = hs.one_of(
    hs.just(st.RunRequested()),
    hs.just(st.RunStarted()),
    hs.just(st.CancelRequested()),
    hs.just(st.DrainRequested()),
    hs.builds(st.StartFailed, hs.just("start failed")),
    hs.builds(st.StagingFailed, hs.just("staging failed")),
    hs.builds(
        st.ExecutorReported,
        hs.sampled_from(["STARTING", "PENDING", "RUNNING", "CANCELLING", "DRAINING", "DONE",
                         "FAILED", "CANCELLED", "UPDATED", "UNKNOWN"]),
    ),
    hs.builds(
        st.RunEnded,
        hs.sampled_from(["DONE", "FAILED", "CANCELLED", "RUNNING", "DRAINED"]),
        hs.sampled_from([None, "user error"]),
    ),
)


@settings(max_examples=300, deadline=None)
@given(hs.lists(EVENTS, max_size=12), hs.booleans())
def test_any_event_sequence_keeps_the_invariants(events: list[st.Event], streaming: bool) -> None:
    machine = st.JobStateMachine("job-001", streaming=streaming)
    published: list[st.Publish] = []
    starts = cancels = drains = 0
    for event in events:
        before = (machine.state, list(machine.history), machine.run_requested,
                  machine.run_started, machine.cancel_requested)
        try:
            out = machine.handle(event)
        except JobStateError:
            after = (machine.state, list(machine.history), machine.run_requested,
                     machine.run_started, machine.cancel_requested)
            assert after == before, "a rejected event changed the machine"
            continue
        machine.validate()
        for i, instruction in enumerate(out):
            if isinstance(instruction, st.Publish):
                published.append(instruction)
                if instruction.new == st.FAILED:  # the error text comes first
                    assert i > 0 and isinstance(out[i - 1], st.Report)
                    assert out[i - 1].importance == st.ERROR  # type: ignore[union-attr]
            starts += isinstance(instruction, st.StartRun)
            cancels += isinstance(instruction, st.CancelRun)
            drains += isinstance(instruction, st.DrainRun)
            if isinstance(instruction, st.CancelRun):
                assert machine.run_started and machine.cancel_requested
            if isinstance(instruction, st.DrainRun):
                assert machine.run_started and machine.drain_requested and streaming
    # Every transition was published, in order, and nothing after a terminal state.
    assert [p.new for p in published] == machine.history[1:]
    assert [p.old for p in published] == machine.history[:-1]
    assert starts <= 1 and cancels <= 1 and drains <= 1
    assert starts == int(machine.run_requested)
