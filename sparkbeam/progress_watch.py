"""A running job's progress for the person waiting for it: lines in the log, or a live view.

`ProgressWatch` reads the attempts' live reports every `interval` seconds (`control.progress`
turns them into numbers per stage). Without a terminal it logs the lines of the stages whose
numbers moved (they also reach the job's message stream); on a terminal it shows one live bar
per stage instead (`rich`): tasks done of all, elements read, their estimated size. Either way,
one line per stage is logged when the job ends.
"""
from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from sparkbeam.control.metrics_channel import AttemptKey, AttemptReport, decode_attempt_key
from sparkbeam.control.progress import (
    ProgressTracker,
    StageProgress,
    committed_tasks,
    format_bytes,
    unreported,
)

_LOG = logging.getLogger(__name__)

# How often the live view redraws (the log lines keep their own --progress_interval).
REFRESH_S = 0.5


class Reports(Protocol):
    """The driver's collector of attempt reports, as the watch reads it."""

    def attempt_reports(self, job: str) -> Mapping[AttemptKey, AttemptReport]: ...


def terminal_attached() -> bool:
    """Whether a person watches stderr (a terminal, not a file or a pipe)."""
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stderr
        return False


class LiveView:
    """One rich progress bar per stage on stderr, for the life of a job."""

    def __init__(self, console: Any = None) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn

        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed:.0f}/{task.total:.0f} tasks"),
            TextColumn("{task.fields[elements]} elements, {task.fields[size]}"),
            console=console or Console(stderr=True),
            transient=False,
        )
        self._tasks: dict[str, Any] = {}

    def __enter__(self) -> LiveView:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def show(self, stages: list[StageProgress]) -> None:
        for stage in stages:
            size = "? B" if stage.bytes is None else format_bytes(stage.bytes)
            elements = f"{stage.elements:,}"
            total = max(stage.tasks, 1)
            if stage.label not in self._tasks:
                self._tasks[stage.label] = self._progress.add_task(
                    _short(stage.display), total=total, elements=elements, size=size)
            self._progress.update(self._tasks[stage.label], total=total,
                                  completed=stage.done_tasks, elements=elements, size=size)


def _short(text: str, limit: int = 48) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


class ProgressWatch:
    """The thread that reports a running job's progress (see the module doc)."""

    # How long the end waits for committed attempts' final reports still on the wire.
    FINAL_REPORTS_TIMEOUT_S = 5.0

    def __init__(
        self,
        job_id: str,
        tracker: ProgressTracker,
        collector: Reports,
        partitions: Mapping[str, int],
        interval: float,
        log: Callable[[str], None],
        *,
        terminal: bool = False,
        view: Callable[[], LiveView] = LiveView,
    ) -> None:
        self._job_id = job_id
        self._tracker = tracker
        self._collector = collector
        self._partitions = partitions  # the executor's, filled as stages are declared
        self._interval = interval
        self._log = log
        self._view = view() if terminal and interval > 0 else None
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, name=f"sparkbeam-{job_id}-progress", daemon=True
        )

    def start(self) -> None:
        if self._interval > 0:
            self._thread.start()

    def _loop(self) -> None:
        if self._view is None:
            while not self._stop.wait(self._interval):
                self._emit(final=False)
            return
        with self._view:
            while not self._stop.wait(REFRESH_S):
                self._draw()
            self._draw()

    def _draw(self) -> None:
        assert self._view is not None
        try:
            reports = self._collector.attempt_reports(self._job_id)
            partitions = dict(self._partitions)
            self._view.show([p for p in self._tracker.progress(reports, partitions)
                             if p.label in partitions])
        except Exception:  # noqa: BLE001 - the view is cosmetic: never fail the job
            _LOG.warning("%s: cannot draw progress", self._job_id, exc_info=True)

    def _emit(self, *, final: bool) -> None:
        reports = self._collector.attempt_reports(self._job_id)
        lines_of = self._tracker.final if final else self._tracker.changed
        try:
            lines = lines_of(reports, dict(self._partitions))
        except Exception:  # noqa: BLE001 - progress lines are cosmetic: never fail the job
            _LOG.warning("%s: cannot compute progress", self._job_id, exc_info=True)
            return
        for line in lines:
            self._log(line)

    def finish(self, committed: set[bytes]) -> None:
        """Stops the thread and logs each stage's last line, once the final reports of the
        committed attempts have arrived (or a few seconds have passed)."""
        if self._interval <= 0:
            return
        if self._view is None:  # no "changed" lines while the final reports arrive
            self._stop.set()
            self._thread.join()
        keys = [decode_attempt_key(k) for k in committed]
        deadline = time.monotonic() + self.FINAL_REPORTS_TIMEOUT_S
        while (unreported(keys, self._collector.attempt_reports(self._job_id))
               and time.monotonic() < deadline):
            time.sleep(0.05)
        # The tasks each stage really had: the live view's last frame and the final lines.
        self._partitions = committed_tasks(self._partitions, keys)
        self._stop.set()  # the live view draws the final numbers before it stops
        self._thread.join()
        self._emit(final=True)
