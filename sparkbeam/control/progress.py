"""Job progress from the task attempts' live metric reports: pure, no sockets, no Spark.

Each task attempt reports its cumulative monitoring infos to the driver's collector (see
`metrics_channel`). From the latest report of each attempt and what the driver knows of each
stage (its input PCollections and how many tasks it has), this module computes per stage the
elements read so far, their estimated size and the tasks finished, and formats one line each:

    stage-003 [ParDo(Read)]: 12,345 elements, 3.4 MB, 40% (2/5 tasks)

The percentage is that of the stage's tasks that finished successfully: the number of
elements a stage will read is not known before its upstream stages end.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from apache_beam.metrics import monitoring_infos
from apache_beam.portability.api import beam_fn_api_pb2

from sparkbeam.control.metrics_channel import AttemptKey, AttemptReport
from sparkbeam.plan.model import Stage

DATA_INPUT_URN = "beam:runner:source:v1"
_UNITS = ("B", "KB", "MB", "GB", "TB", "PB")


@dataclass(frozen=True)
class StageInfo:
    """What the driver knows of a stage: its names, input PCollections and task count."""

    label: str  # "stage-003"
    display: str  # "stage-003 [ParDo(Read)]"
    inputs: frozenset[str]  # PCollections the stage's DATA_INPUT transforms output
    tasks: int  # Spark tasks of the stage (0: not declared yet)


def stage_info(stage: Stage, tasks: int = 0) -> StageInfo:
    """A StageInfo of `stage`, its input PCollections taken from its descriptor."""
    descriptor = beam_fn_api_pb2.ProcessBundleDescriptor.FromString(stage.descriptor)
    inputs = frozenset(
        pcoll
        for transform in descriptor.transforms.values()
        if transform.spec.urn == DATA_INPUT_URN
        for pcoll in transform.outputs.values()
    )
    return StageInfo(stage.label, stage.display, inputs, tasks)


@dataclass(frozen=True)
class StageProgress:
    """Where one stage is: elements read, their estimated bytes, tasks done out of all."""

    label: str
    display: str
    elements: int
    bytes: int | None  # None: no attempt reported sampled sizes
    done_tasks: int  # tasks finished successfully
    tasks: int  # tasks of the stage: the driver's count, or more if more reported

    @property
    def percent(self) -> int:
        """Tasks finished successfully, in percent (rounded down: 100 means all done)."""
        if self.tasks <= 0:
            return 0
        return min(100, self.done_tasks * 100 // self.tasks)

    def line(self) -> str:
        """`stage-003 [ParDo(Read)]: 12,345 elements, 3.4 MB, 40% (2/5 tasks)`."""
        if self.bytes is None:
            size = "0 B" if self.elements == 0 else "? B"
        else:
            size = format_bytes(self.bytes)
        return (
            f"{self.display}: {self.elements:,} elements, {size}, {self.percent}% "
            f"({self.done_tasks}/{self.tasks} tasks)"
        )


def format_bytes(n: int) -> str:
    """`999 B`, `1.2 KB`, `3.4 MB` ... (powers of 1000)."""
    value = float(n)
    for unit in _UNITS:
        if abs(value) < 1000 or unit == _UNITS[-1]:
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


def counted_attempts(reports: Iterable[AttemptReport]) -> dict[tuple[str, int], AttemptReport]:
    """The one report that counts for each (stage, partition).

    A successful attempt wins (the latest, should a partition be recomputed); else the latest
    attempt still running. A failed attempt counts for nothing: its partition is read again
    by a retry, and counting both would count its elements twice.
    """
    best: dict[tuple[str, int], AttemptReport] = {}
    for report in reports:
        if report.failed:
            continue
        where = (report.key.stage, report.key.partition)
        current = best.get(where)
        if current is None or _rank(report) > _rank(current):
            best[where] = report
    return best


def _rank(report: AttemptReport) -> tuple[bool, int, int]:
    return report.succeeded, report.key.spark_stage, report.key.attempt


def stage_progress(
    stages: Iterable[StageInfo], reports: Iterable[AttemptReport]
) -> list[StageProgress]:
    """The progress of each of `stages` (in their order) from the attempts' latest reports."""
    by_stage: dict[str, list[AttemptReport]] = {}
    for (stage, _), report in counted_attempts(reports).items():
        by_stage.setdefault(stage, []).append(report)
    out = []
    for info in stages:
        counted = by_stage.get(info.label, [])
        elements, size = _read(info.inputs, counted)
        done = sum(1 for r in counted if r.succeeded)
        # A partition that reported exists, whatever the driver's estimate of the tasks said.
        out.append(StageProgress(
            info.label, info.display, elements, size, done, max(info.tasks, len(counted)),
        ))
    return out


def _read(inputs: frozenset[str], reports: list[AttemptReport]) -> tuple[int, int | None]:
    """Elements of the `inputs` PCollections in `reports`, and their estimated bytes.

    Beam samples element sizes (`sampled_byte_size`: count and sum of the sampled sizes), so
    each attempt's bytes are its elements times its mean sampled size, per PCollection.
    """
    elements = 0
    size: float | None = None
    for report in reports:
        counts: dict[str, int] = {}
        samples: dict[str, tuple[int, int]] = {}
        for info in report.infos:
            pcoll = info.labels.get(monitoring_infos.PCOLLECTION_LABEL)
            if pcoll not in inputs:
                continue
            if info.urn == monitoring_infos.ELEMENT_COUNT_URN:
                counts[pcoll] = counts.get(pcoll, 0) + monitoring_infos.extract_counter_value(info)
            elif info.urn == monitoring_infos.SAMPLED_BYTE_SIZE_URN:
                count, total = monitoring_infos.extract_distribution(info)[:2]
                seen = samples.get(pcoll, (0, 0))
                samples[pcoll] = (seen[0] + count, seen[1] + total)
        elements += sum(counts.values())
        for pcoll, (count, total) in samples.items():
            estimate = total * counts.get(pcoll, count) / count if count else float(total)
            size = (size or 0.0) + estimate
    return elements, None if size is None else round(size)


class ProgressTracker:
    """Turns successive snapshots of a job's reports into the lines worth emitting.

    `changed` gives the lines of the stages whose numbers moved since they were last emitted
    (stages nothing reported for yet stay silent); `final` gives one line per declared stage.
    """

    def __init__(self, stages: Iterable[Stage]) -> None:
        self._stages = [stage_info(stage) for stage in stages]
        self._emitted: dict[str, StageProgress] = {}

    def progress(
        self, reports: Mapping[AttemptKey, AttemptReport], partitions: Mapping[str, int]
    ) -> list[StageProgress]:
        """The progress of every stage; `partitions`: tasks per stage label declared so far."""
        infos = [
            StageInfo(s.label, s.display, s.inputs, partitions.get(s.label, 0))
            for s in self._stages
        ]
        return stage_progress(infos, reports.values())

    def changed(
        self, reports: Mapping[AttemptKey, AttemptReport], partitions: Mapping[str, int]
    ) -> list[str]:
        """Lines of the active stages whose numbers changed since their last emission."""
        lines = []
        for now in self.progress(reports, partitions):
            before = self._emitted.get(now.label)
            active = now.elements or now.done_tasks or before is not None
            if active and now != before and now.label in partitions:
                self._emitted[now.label] = now
                lines.append(now.line())
        return lines

    def final(
        self, reports: Mapping[AttemptKey, AttemptReport], partitions: Mapping[str, int]
    ) -> list[str]:
        """One line per stage declared, for the end of the job."""
        return [p.line() for p in self.progress(reports, partitions) if p.label in partitions]


def committed_tasks(partitions: Mapping[str, int], committed: Iterable[AttemptKey]
                    ) -> dict[str, int]:
    """Tasks per declared stage once the job has ended: a stage whose attempts were committed
    had as many tasks as it committed partitions. The driver's count is a guess where Spark
    decides (a file or table read): a finished stage read "50% (1/2 tasks)" when Spark made
    one task of a file it had guessed two for. Stages with nothing committed (a failed job)
    keep the driver's count."""
    done: dict[str, set[int]] = {}
    for key in committed:
        done.setdefault(key.stage, set()).add(key.partition)
    return {label: len(done[label]) if label in done else n for label, n in partitions.items()}


def unreported(committed: Iterable[AttemptKey], reports: Mapping[AttemptKey, AttemptReport]
               ) -> list[AttemptKey]:
    """Committed attempts whose final report has not reached the collector yet."""
    return [key for key in committed if not (key in reports and reports[key].final)]
