"""One run of a stage over a leased worker: bundles in, rows out, timers and residuals kept.

A `StageRun` is what a batch task, or one key's micro-batch in streaming, does with a stage: it
runs bundles (`run_chunks`, `run_timers`) through the worker, turns their outputs into rows
(`StageProgram.rows`), collects the timers they set into its `TimerBook`, keeps the residual
roots they hand back (self-checkpoints of splittable DoFns) with the time they may resume, and
gathers their monitoring infos. `fire_timers` fires what the limits allow, round by round, until
no timer is due. The run holds no Spark objects and no rows of its own.
"""
from __future__ import annotations

import contextlib
import heapq
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from apache_beam.portability.api import beam_fn_api_pb2, metrics_pb2

from sparkbeam.control.lease import lease_worker
from sparkbeam.control.metrics_channel import MetricsReporter
from sparkbeam.control.shell import SplitOutcome
from sparkbeam.control.worker import BundleResult, OutputCap, Worker
from sparkbeam.engine.program import Chunks, OutRow, StageProgram
from sparkbeam.engine.timers import Limits, Ordering, TimerBook, timer_rounds
from sparkbeam.metrics import merge_infos

# Infos are merged once this many have piled up (a task may run thousands of bundles).
_MERGE_AT = 2000


class StageRun:
    """Bundles of one stage on one worker, with the timers and residuals they leave."""

    def __init__(
        self,
        program: StageProgram,
        worker: Worker,
        bundle_size: int,
        reporter: MetricsReporter | None = None,
        timers: TimerBook | None = None,
    ) -> None:
        self.program = program
        self.worker = worker
        self.bundle_size = bundle_size
        self.reporter = reporter  # gets the infos so far after every bundle (attempted)
        self.timers = (timers if timers is not None
                       else TimerBook(program.timer_impls, program.timer_domains))
        self.infos: list[metrics_pb2.MonitoringInfo] = []
        # Residual roots: (earliest resume time in seconds, arrival, application).
        self.residuals: list[tuple[float, int, beam_fn_api_pb2.BundleApplication]] = []
        self._arrivals = 0

    @property
    def label(self) -> str:
        return self.program.stage.display

    def run(
        self,
        inputs: list[beam_fn_api_pb2.Elements.Data | beam_fn_api_pb2.Elements.Timers],
        counts: dict[str, int] | None = None,
    ) -> list[OutRow]:
        """Runs one bundle; its output rows."""
        result: BundleResult = self.worker.process(inputs, counts=counts)
        self.infos.extend(result.monitoring_infos)
        if len(self.infos) > _MERGE_AT:
            self.infos = merge_infos(self.infos)
        if self.reporter is not None:
            self.reporter.report(self.infos)
        for reschedule in result.reschedules:
            self._arrivals += 1
            heapq.heappush(self.residuals,
                           (reschedule.not_before, self._arrivals, reschedule.application))
        if result.timers:
            self.timers.collect(result.timers)
        return list(self.program.rows(result.outputs))

    def run_chunks(self, chunks: Chunks, elements: Mapping[int, int] | None = None
                   ) -> list[OutRow]:
        """One bundle of data elements (stage input index -> encoded elements, or runs of
        them when `elements` counts each input's)."""
        return self.run(self.program.data(chunks), self.program.counts(chunks, elements))

    def fire_timers(self, limits: Limits, ordering: Ordering) -> Iterator[OutRow]:
        """Fires every timer the limits allow, earliest first per key, until none is due
        (timers set while firing join in)."""
        for _ in timer_rounds(f"timers of {self.label}"):
            firing = self.timers.take_due(limits, ordering)
            if not firing:
                return
            for batch in self.timers.bundles(firing, self.bundle_size):
                yield from self.run(batch)

    def take_due_residuals(self, now: float, limit: int) -> Chunks:
        """Up to `limit` residuals that may resume at `now`, routed to their stage inputs."""
        chunks: Chunks = {}
        count = 0
        while self.residuals and self.residuals[0][0] <= now and count < limit:
            _, _, app = heapq.heappop(self.residuals)
            chunks.setdefault(self.program.route(app), []).append(app.element)
            count += 1
        return chunks

    def wait_for_residual(self) -> None:
        """Sleeps until the earliest residual may resume (batch honours requested delays)."""
        wait = self.residuals[0][0] - time.time()
        if wait > 0:
            time.sleep(wait)

    def run_capped(self, chunks: Chunks, items: int, size: int,
                   on_reached: Callable[[], None]) -> tuple[list[OutRow], int, int]:
        """One bundle whose output counts against (items, size): when it reaches either,
        `on_reached` runs between two elements (it may `checkpoint`). Returns the rows and the
        (items, bytes) the bundle output."""
        cap = OutputCap(items, size, on_reached)
        self.worker.set_output_cap(cap)
        try:
            rows = self.run_chunks(chunks)
        finally:
            self.worker.set_output_cap(None)
        return rows, cap.taken_items, cap.taken_bytes

    def checkpoint(self) -> SplitOutcome | None:
        """Asks the SDK to stop the running bundle's element after what it has output (a
        split at fraction 0); None when it could not."""
        return self.worker.split(0.0)

    def take_infos(self) -> list[Any]:
        """The monitoring infos gathered so far, merged; the run starts counting afresh."""
        infos, self.infos = merge_infos(self.infos), []
        return infos


@contextlib.contextmanager
def leased_run(program: StageProgram, bundle_size: int,
               timers: TimerBook | None = None) -> Iterator[StageRun]:
    """A run of `program` on the embedded worker of this process, for one key or task."""
    with lease_worker(program.stage.descriptor) as worker:
        yield StageRun(program, worker, bundle_size, timers=timers)


class BatchSideWorker:
    """Runs of a stage whose elements read side inputs that change between micro-batches: one
    new worker per batch, serving that batch's side-input data, shared by the batch's keys
    (Beam's DoFn runner keeps the values of global-window side inputs for its lifetime, so a
    worker is never reused across batches; one per key would start the DoFns anew per key)."""

    def __init__(self) -> None:
        self._current: tuple[int, contextlib.ExitStack, Worker] | None = None

    def run(self, program: StageProgram, bundle_size: int, timers: TimerBook | None, batch: int,
            side_inputs: Mapping[bytes, list[bytes]]) -> StageRun:
        if self._current is None or self._current[0] != batch:
            self.close()
            stack = contextlib.ExitStack()
            worker = stack.enter_context(lease_worker(program.stage.descriptor, fresh=True))
            worker.state.bind_side_inputs(side_inputs)
            self._current = (batch, stack, worker)
        return StageRun(program, self._current[2], bundle_size, timers=timers)

    def run_or_leased(self, program: StageProgram, bundle_size: int, timers: TimerBook | None,
                      sides: tuple[int, Mapping[bytes, list[bytes]]] | None
                      ) -> contextlib.AbstractContextManager[StageRun]:
        """A run on this batch's worker when it reads side inputs (`sides`: the micro-batch and
        their data), else on the process's leased worker (`leased_run`)."""
        if sides is None:
            return leased_run(program, bundle_size, timers)
        return contextlib.nullcontext(self.run(program, bundle_size, timers, *sides))

    def close(self) -> None:
        """Tears the worker down."""
        if self._current is not None:
            self._current[1].close()
            self._current = None
