"""One job: the I/O shell around its state machine.

The shell feeds events to `JobStateMachine`, carries out the instructions it returns (publish a
state, add a message, start or cancel the run) and keeps two append-only logs that the Job API
streams replay: state events, and messages interleaved with state events. A subscriber reads a
log from its start (so a late subscriber gets the history) and then follows it live, until it
has passed a terminal state. The executor's run is started and awaited on a thread of its own,
so Run returns at once and a slow or failing job never blocks another.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from apache_beam.portability.api import beam_job_api_pb2, beam_runner_api_pb2, metrics_pb2
from google.protobuf import struct_pb2, timestamp_pb2

from sparkbeam.errors import JobStateError
from sparkbeam.jobservice import state as st
from sparkbeam.jobservice.protocol import DependencySets, JobExecutor, RunHandle
from sparkbeam.jobservice.status import describe_failure
from sparkbeam.mode import inferred_streaming

_LOGGER = logging.getLogger(__name__)

# How often a stream waiting for news checks that its client is still there.
POLL_SECONDS = 0.5

MonitoringInfos = list[metrics_pb2.MonitoringInfo]
_Item = TypeVar("_Item")


class Job:
    """A prepared (and maybe running or finished) job of the job service."""

    def __init__(
        self,
        job_id: str,
        job_name: str,
        pipeline: beam_runner_api_pb2.Pipeline,
        options: struct_pb2.Struct,
        on_end: Callable[[Job], None] = lambda job: None,
    ) -> None:
        self.job_id = job_id
        self.job_name = job_name
        # Kept serialized: a parsed pipeline takes several times the memory, and a server keeps
        # up to --job-retention-count ended jobs.
        self._pipeline = pipeline.SerializeToString()
        self.options = options
        self.run_lock = threading.Lock()  # one Run request at a time gets past staging
        self._machine = st.JobStateMachine(job_id, streaming=_is_streaming(pipeline, options))
        self._cond = threading.Condition()
        self._states: list[beam_job_api_pb2.JobStateEvent] = []
        self._messages: list[beam_job_api_pb2.JobMessagesResponse] = []
        self._next_message = 0
        self._handle: RunHandle | None = None
        self._final_metrics: tuple[MonitoringInfos, MonitoringInfos] | None = None
        self._closed = False
        self._on_end = on_end
        self.prepared_at = time.monotonic()
        self.ended_at: float | None = None  # when it entered a terminal state (monotonic)
        self.never_ran = True  # Run has not been accepted
        with self._cond:
            self._record_state(st.STOPPED)

    # -- queries -------------------------------------------------------------------------------

    @property
    def pipeline(self) -> beam_runner_api_pb2.Pipeline:
        """The pipeline as the client submitted it (a new copy on each call)."""
        return beam_runner_api_pb2.Pipeline.FromString(self._pipeline)

    @property
    def state(self) -> int:
        """The current JobState value."""
        with self._cond:
            return self._machine.state

    @property
    def state_name(self) -> str:
        """The current state's name, e.g. 'RUNNING'."""
        return st.state_name(self.state)

    def state_event(self) -> beam_job_api_pb2.JobStateEvent:
        """The latest state with the time it was entered."""
        with self._cond:
            return self._states[-1]

    def check_can_run(self) -> None:
        """Raises JobStateError unless Run may be called now."""
        with self._cond:
            self._machine.check_can_run()

    def metrics(self) -> tuple[MonitoringInfos, MonitoringInfos]:
        """(committed, attempted) monitoring infos: attempted live while the job runs,
        committed once it has ended."""
        with self._cond:
            if self._final_metrics is not None:
                return self._final_metrics
            handle = self._handle
        if handle is None:
            return [], []
        return [], list(handle.metrics().attempted_infos)

    def follow_states(
        self, is_active: Callable[[], bool]
    ) -> Iterator[beam_job_api_pb2.JobStateEvent]:
        """Every state so far, then each new one, ending after a terminal state."""
        return self._follow(self._states, lambda e: st.is_terminal(e.state), is_active)

    def follow_messages(
        self, is_active: Callable[[], bool]
    ) -> Iterator[beam_job_api_pb2.JobMessagesResponse]:
        """Every message and state so far, then live ones, ending after a terminal state."""
        return self._follow(
            self._messages,
            lambda m: m.HasField("state_response") and st.is_terminal(m.state_response.state),
            is_active,
        )

    # -- requests ------------------------------------------------------------------------------

    def start(self, executor: JobExecutor, artifacts: DependencySets) -> None:
        """Moves the job to STARTING and starts the run on a thread of its own."""
        if any(isinstance(i, st.StartRun) for i in self._apply(st.RunRequested())):
            self.never_ran = False
            threading.Thread(
                target=self._run, args=(executor, artifacts), name=f"{self.job_id}-run",
                daemon=True,
            ).start()

    def cancel(self) -> int:
        """Asks the job to stop; returns the state it is in afterwards."""
        self._carry_out(self._apply(st.CancelRequested()))
        return self.state

    def drain(self) -> int:
        """Asks a streaming job to stop reading and finish what its watermark allows (refused
        for batch jobs); returns the state it is in afterwards."""
        self._carry_out(self._apply(st.DrainRequested()))
        return self.state

    def fail_staging(self, error: str) -> None:
        """Ends a job whose artifacts could not be staged in FAILED."""
        self._apply(st.StagingFailed(error))

    def wait_ended(self, timeout: float) -> bool:
        """Waits up to `timeout` seconds for a terminal state; True if the job is in one."""
        with self._cond:
            return self._cond.wait_for(lambda: st.is_terminal(self._machine.state), timeout)

    def close(self) -> None:
        """Ends every stream of this job, wherever the job is (the server is shutting down)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # -- the run -------------------------------------------------------------------------------

    def _run(self, executor: JobExecutor, artifacts: DependencySets) -> None:
        started = time.monotonic()
        _LOGGER.info("%s: starting on the executor", self.job_id)
        try:
            handle = executor.start(
                self.job_id, self.pipeline, self.options, artifacts,
                self.note, self._on_state,
            )
        except Exception as exc:  # noqa: BLE001 - the failure is the job's, reported to it
            _LOGGER.warning("%s: the executor could not start the job: %r", self.job_id, exc)
            self._apply_from_executor(st.StartFailed(describe_failure(self.job_id, exc)))
            return
        with self._cond:
            self._handle = handle
        self._carry_out(self._apply_from_executor(st.RunStarted()))
        error: BaseException | None
        try:
            handle.wait()
            final, error = handle.state, handle.error
        except Exception as exc:  # noqa: BLE001 - a broken handle fails its job, nothing else
            final, error = "FAILED", exc
        self._snapshot_metrics(handle)
        with self._cond:
            self._handle = None  # what the run held is the executor's to free now
        failed = error is not None or final == "FAILED"
        text = describe_failure(self.job_id, error) if failed else None
        self._apply_from_executor(st.RunEnded(final, text))
        _LOGGER.info(
            "%s: ended in %s after %.1f s", self.job_id, st.state_name(self.state),
            time.monotonic() - started,
        )

    def _snapshot_metrics(self, handle: RunHandle) -> None:
        try:
            results = handle.metrics()
            final = (list(results.committed_infos), list(results.attempted_infos))
        except Exception:  # a job without metrics still ends
            _LOGGER.exception("%s: could not read the final metrics", self.job_id)
            final = ([], [])
        with self._cond:
            self._final_metrics = final

    def _on_state(self, value: str) -> None:
        self._apply_from_executor(st.ExecutorReported(value))

    def note(self, text: str) -> None:
        """Adds a milestone to the job's message stream (the executor's `on_message`)."""
        with self._cond:
            self._record_message(st.BASIC, text)

    # -- carrying out instructions -------------------------------------------------------------

    def _apply(self, event: st.Event) -> list[st.Instruction]:
        """Feeds one event to the machine and records what it publishes and reports; calls
        `on_end` (outside the lock) when the job enters its terminal state."""
        ended = False
        with self._cond:
            instructions = self._machine.handle(event)
            for instruction in instructions:
                if isinstance(instruction, st.Publish):
                    _LOGGER.info(
                        "%s: %s -> %s", self.job_id, st.state_name(instruction.old),
                        st.state_name(instruction.new),
                    )
                    self._record_state(instruction.new)
                    if st.is_terminal(instruction.new) and self.ended_at is None:
                        self.ended_at = time.monotonic()
                        ended = True
                elif isinstance(instruction, st.Report):
                    self._record_message(instruction.importance, instruction.text)
        if ended:
            self._on_end(self)
        return instructions

    def _apply_from_executor(self, event: st.Event) -> list[st.Instruction]:
        """Like _apply, but a report that does not fit is logged: it must not hit the executor."""
        try:
            return self._apply(event)
        except JobStateError as exc:
            _LOGGER.warning("%s: ignored %r: %s", self.job_id, event, exc)
            return []

    def _carry_out(self, instructions: Sequence[st.Instruction]) -> None:
        """Carries out the instructions that call the executor (outside the lock)."""
        for instruction in instructions:
            if isinstance(instruction, st.CancelRun | st.DrainRun):
                what = "cancel" if isinstance(instruction, st.CancelRun) else "drain"
                with self._cond:
                    handle = self._handle
                if handle is None:
                    continue
                try:
                    handle.cancel() if what == "cancel" else handle.drain()
                except Exception as exc:  # noqa: BLE001 - reported to the job, the RPC succeeds
                    _LOGGER.warning("%s: %s failed: %r", self.job_id, what, exc)
                    with self._cond:
                        self._record_message(st.WARNING, f"{self.job_id}: {what} failed: {exc}")

    def _record_state(self, new: int) -> None:
        stamp = timestamp_pb2.Timestamp()
        stamp.FromNanoseconds(time.time_ns())
        event = beam_job_api_pb2.JobStateEvent(state=new, timestamp=stamp)  # type: ignore[arg-type]
        self._states.append(event)
        self._messages.append(beam_job_api_pb2.JobMessagesResponse(state_response=event))
        self._cond.notify_all()

    def _record_message(self, importance: Any, text: str) -> None:
        self._next_message += 1
        message = beam_job_api_pb2.JobMessage(
            message_id=str(self._next_message),
            time=datetime.now(UTC).isoformat(timespec="milliseconds"),
            importance=importance,
            message_text=text,
        )
        self._messages.append(beam_job_api_pb2.JobMessagesResponse(message_response=message))
        self._cond.notify_all()

    def _follow(
        self, log: list[_Item], is_end: Callable[[_Item], bool], is_active: Callable[[], bool]
    ) -> Iterator[_Item]:
        seen = 0
        while True:
            with self._cond:
                while seen == len(log) and not self._closed:
                    if not is_active():
                        return
                    self._cond.wait(POLL_SECONDS)
                batch, closed = log[seen:], self._closed
                seen += len(batch)
            for item in batch:
                yield item
                if is_end(item):
                    return
            if closed and not batch:
                return


def _is_streaming(pipeline: beam_runner_api_pb2.Pipeline, options: struct_pb2.Struct) -> bool:
    """Whether the job runs as a stream: its options ask for it (as the portable client or a
    plain dictionary of options names it) or its graph does (`sparkbeam.mode`)."""
    flag = False
    for name in ("beam:option:streaming:v1", "streaming"):
        if name in options.fields:
            flag = bool(options.fields[name].bool_value)
            break
    experiments: list[str] = []
    for name in ("beam:option:experiments:v1", "experiments"):
        if name in options.fields and options.fields[name].HasField("list_value"):
            experiments = [v.string_value for v in options.fields[name].list_value.values]
            break
    return flag or inferred_streaming(pipeline, streaming=flag,
                                      experiments=experiments) is not None
