"""The life of one job as a pure state machine: events in, instructions out, no I/O.

States are the Job API's `JobState` values. A prepared job is STOPPED; Run moves it to
STARTING, the executor to RUNNING, and the end of the run to a terminal state. Terminal states
are sticky: nothing leaves DONE, FAILED, CANCELLED, DRAINED or UPDATED. Every state change is
returned as a `Publish` instruction, which the shell (job.py) stamps and sends to subscribers;
a failure's error text is returned as a `Report` *before* the FAILED `Publish`, so a client
reading the message stream sees the error before the stream ends.

Requests that do not fit the current state raise `JobStateError` and change nothing.
"""
from __future__ import annotations

from dataclasses import dataclass

from apache_beam.portability.api import beam_job_api_pb2

from sparkbeam.errors import JobStateError

JobState = beam_job_api_pb2.JobState

STOPPED = JobState.STOPPED
STARTING = JobState.STARTING
RUNNING = JobState.RUNNING
CANCELLING = JobState.CANCELLING
DRAINING = JobState.DRAINING
DONE = JobState.DONE
FAILED = JobState.FAILED
CANCELLED = JobState.CANCELLED
DRAINED = JobState.DRAINED
UPDATED = JobState.UPDATED

TERMINAL: frozenset[int] = frozenset({DONE, FAILED, CANCELLED, DRAINED, UPDATED})

# Every state change the machine may make. Terminal states have no way out.
ALLOWED: dict[int, frozenset[int]] = {
    STOPPED: frozenset({STARTING, CANCELLED, FAILED}),
    STARTING: frozenset({RUNNING, CANCELLING, DRAINING, DONE, FAILED, CANCELLED}),
    RUNNING: frozenset({CANCELLING, DRAINING, DONE, FAILED, CANCELLED}),
    DRAINING: frozenset({DRAINED, CANCELLING, DONE, FAILED, CANCELLED}),
    CANCELLING: frozenset({CANCELLED, DONE, FAILED}),
    **{state: frozenset() for state in TERMINAL},
}

ERROR = beam_job_api_pb2.JobMessage.JOB_MESSAGE_ERROR
WARNING = beam_job_api_pb2.JobMessage.JOB_MESSAGE_WARNING
BASIC = beam_job_api_pb2.JobMessage.JOB_MESSAGE_BASIC


def state_name(state: int) -> str:
    """'RUNNING' for JobState.RUNNING."""
    return str(JobState.Enum.Name(state))  # type: ignore[arg-type]


def is_terminal(state: int) -> bool:
    return state in TERMINAL


def from_pipeline_state(value: str) -> int:
    """The JobState for an `apache_beam.runners.runner.PipelineState` value."""
    if value == "PENDING":
        return STARTING
    try:
        state = int(JobState.Enum.Value(value))
    except ValueError:
        state = -1
    if state not in ALLOWED:
        raise JobStateError(
            f"unknown executor state {value!r}: expected one of "
            f"{sorted(state_name(s) for s in ALLOWED)} or PENDING"
        )
    return state


# --- events (stimuli) -------------------------------------------------------------------------


@dataclass(frozen=True)
class RunRequested:
    """A client called Run (after staging was found complete)."""


@dataclass(frozen=True)
class RunStarted:
    """`executor.start` returned a handle."""


@dataclass(frozen=True)
class StartFailed:
    """`executor.start` raised."""

    error: str


@dataclass(frozen=True)
class StagingFailed:
    """The job's artifacts could not be staged, so it can never run."""

    error: str


@dataclass(frozen=True)
class ExecutorReported:
    """The executor's `on_state` callback: a PipelineState value while the run goes on."""

    state: str


@dataclass(frozen=True)
class RunEnded:
    """The run's handle finished waiting: its final PipelineState and error text."""

    state: str
    error: str | None = None


@dataclass(frozen=True)
class CancelRequested:
    """A client called Cancel."""


@dataclass(frozen=True)
class DrainRequested:
    """A client called Drain."""


Event = (
    RunRequested | RunStarted | StartFailed | StagingFailed | ExecutorReported | RunEnded
    | CancelRequested | DrainRequested
)

# --- instructions (what the shell must do) ----------------------------------------------------


@dataclass(frozen=True)
class Publish:
    """The job moved from `old` to `new`: record it and tell every subscriber."""

    old: int
    new: int


@dataclass(frozen=True)
class Report:
    """Add a message to the job's message stream."""

    importance: int
    text: str


@dataclass(frozen=True)
class StartRun:
    """Call `executor.start` for this job."""


@dataclass(frozen=True)
class CancelRun:
    """Call `handle.cancel()` on the job's run."""


@dataclass(frozen=True)
class DrainRun:
    """Call `handle.drain()` on the job's run (a streaming job)."""


Instruction = Publish | Report | StartRun | CancelRun | DrainRun


class JobStateMachine:
    """The state of one job. `handle(event)` returns what the shell must do, in order."""

    def __init__(self, job_id: str, streaming: bool = False) -> None:
        self.job_id = job_id
        self.streaming = streaming  # only a streaming job can be drained
        self.drain_requested = False
        self.state: int = STOPPED
        self.history: list[int] = [STOPPED]
        self.run_requested = False
        self.run_started = False
        self.cancel_requested = False

    def handle(self, event: Event) -> list[Instruction]:
        """Applies one event; raises JobStateError (changing nothing) if it does not fit."""
        match event:
            case RunRequested():
                return self._run_requested()
            case RunStarted():
                return self._run_started()
            case StartFailed(error=error):
                return self._fail(error, expected=(STARTING, CANCELLING), what="start failure")
            case StagingFailed(error=error):
                return self._fail(error, expected=(STOPPED,), what="staging failure")
            case ExecutorReported(state=value):
                return self._executor_reported(from_pipeline_state(value), value)
            case RunEnded(state=value, error=error):
                return self._run_ended(value, error)
            case CancelRequested():
                return self._cancel_requested()
            case DrainRequested():
                return self._drain_requested()
        raise TypeError(f"{self.job_id}: not a job event: {event!r}")

    # -- one method per event ------------------------------------------------------------------

    def check_can_run(self) -> None:
        """Raises JobStateError unless a RunRequested would be accepted now (a pure query)."""
        if self.state != STOPPED or self.run_requested:
            raise JobStateError(
                f"{self.job_id} cannot Run: it is {state_name(self.state)}, expected STOPPED "
                "(a job runs once; prepare it again to rerun it)"
            )

    def _run_requested(self) -> list[Instruction]:
        self.check_can_run()
        self.run_requested = True
        return [self._move(STARTING), StartRun()]

    def _run_started(self) -> list[Instruction]:
        if not self.run_requested or self.run_started:
            raise JobStateError(
                f"{self.job_id}: the executor started a run that was not requested "
                f"(state {state_name(self.state)})"
            )
        self.run_started = True
        # A Cancel or Drain that came while the executor was still starting is delivered now.
        if is_terminal(self.state):
            return []
        if self.cancel_requested:
            return [CancelRun()]
        return [DrainRun()] if self.drain_requested else []

    def _executor_reported(self, new: int, value: str) -> list[Instruction]:
        if not self.run_requested:
            raise JobStateError(
                f"{self.job_id}: the executor reported {value} for a job that was not run "
                f"(state {state_name(self.state)})"
            )
        if new in TERMINAL:
            return []  # the end of a run is taken from RunEnded, which carries the error
        if new == self.state:
            return []
        if self.state in (CANCELLING, DRAINING) and new in (STARTING, RUNNING):
            return []  # a report from before the cancel or drain reached the executor
        if self.state == CANCELLING and new == DRAINING:
            return []
        self._check(new, f"executor reported {value}")
        return [self._move(new)]

    def _run_ended(self, value: str, error: str | None) -> list[Instruction]:
        try:
            new = from_pipeline_state(value)
        except JobStateError as exc:
            new, error = FAILED, f"{self.job_id}: the run ended in an unknown state: {exc}"
        if new not in TERMINAL:
            new = FAILED
            error = f"{self.job_id}: the run ended in non-terminal state {value}"
        if new == FAILED:
            return self._fail(
                error or f"{self.job_id} failed (the executor gave no error)",
                expected=(STARTING, RUNNING, DRAINING, CANCELLING),
                what="run end",
            )
        if new == self.state:
            return []
        self._check(new, f"run ended in {value}")
        return [self._move(new)]

    def _cancel_requested(self) -> list[Instruction]:
        if self.state in TERMINAL or self.state == CANCELLING:
            return []  # Cancel is idempotent and cannot undo an ending
        if self.state == STOPPED:
            return [self._move(CANCELLED)]  # never ran: nothing to stop
        self.cancel_requested = True
        moved: list[Instruction] = [self._move(CANCELLING)]
        return moved + [CancelRun()] if self.run_started else moved

    def _drain_requested(self) -> list[Instruction]:
        if self.state in TERMINAL:
            raise JobStateError(
                f"{self.job_id} cannot Drain: it already ended in {state_name(self.state)}"
            )
        if not self.streaming:
            raise JobStateError(
                f"{self.job_id} cannot Drain: it is a batch job (state {state_name(self.state)}); "
                "Drain applies to streaming jobs only, use Cancel to stop it"
            )
        if self.state == DRAINING:
            return []  # Drain is idempotent
        if self.state in (STOPPED, CANCELLING):
            raise JobStateError(
                f"{self.job_id} cannot Drain: it is {state_name(self.state)} (a job drains "
                "once it runs and before it is cancelled)"
            )
        self.drain_requested = True
        moved: list[Instruction] = [self._move(DRAINING)]
        return moved + [DrainRun()] if self.run_started else moved

    # -- helpers -------------------------------------------------------------------------------

    def _fail(self, error: str, *, expected: tuple[int, ...], what: str) -> list[Instruction]:
        if self.state == FAILED:
            return []
        if self.state not in expected:
            raise JobStateError(
                f"{self.job_id}: unexpected {what} in state {state_name(self.state)} "
                f"(expected {'/'.join(state_name(s) for s in expected)})"
            )
        return [Report(ERROR, error), self._move(FAILED)]

    def _check(self, new: int, why: str) -> None:
        if new not in ALLOWED[self.state]:
            raise JobStateError(
                f"{self.job_id}: invalid transition {state_name(self.state)} -> "
                f"{state_name(new)} ({why})"
            )

    def _move(self, new: int) -> Publish:
        self._check(new, "internal")
        old, self.state = self.state, new
        self.history.append(new)
        return Publish(old, new)

    def validate(self) -> None:
        """Asserts the machine's invariants (used by tests after every event)."""
        assert self.history[0] == STOPPED, self.history
        assert self.history[-1] == self.state, (self.history, self.state)
        for old, new in zip(self.history, self.history[1:], strict=False):
            assert new in ALLOWED[old], f"{state_name(old)} -> {state_name(new)}"
        assert not any(s in TERMINAL for s in self.history[:-1]), self.history
        assert not self.run_started or self.run_requested
        assert self.run_requested == (STARTING in self.history)
