"""Job progress from attempt reports: elements, bytes and tasks per stage, and the lines."""
from __future__ import annotations

import re

from apache_beam.metrics import monitoring_infos
from apache_beam.metrics.cells import DistributionData
from apache_beam.portability.api import beam_fn_api_pb2, beam_runner_api_pb2, metrics_pb2

from sparkbeam.control.metrics_channel import AttemptKey, AttemptReport
from sparkbeam.control.progress import (
    DATA_INPUT_URN,
    ProgressTracker,
    StageInfo,
    StageProgress,
    committed_tasks,
    format_bytes,
    stage_info,
    stage_progress,
    unreported,
)
from sparkbeam.plan.model import Stage

LINE = re.compile(r"stage-\d+ \[.*\]: [\d,]+ elements, .* \d+% \(\d+/\d+ tasks\)")


def _stage(label: str, inputs: list[str], description: str = "ParDo(Read)") -> Stage:
    descriptor = beam_fn_api_pb2.ProcessBundleDescriptor(id=label)
    for n, pcoll in enumerate(inputs):
        descriptor.transforms[f"in{n}"].CopyFrom(beam_runner_api_pb2.PTransform(
            spec=beam_runner_api_pb2.FunctionSpec(urn=DATA_INPUT_URN),
            outputs={"out": pcoll},
        ))
    # A transform downstream of the input: its PCollection is not the stage's input.
    descriptor.transforms["map"].CopyFrom(beam_runner_api_pb2.PTransform(
        spec=beam_runner_api_pb2.FunctionSpec(urn="beam:transform:pardo:v1"),
        inputs={"in": inputs[0]}, outputs={"out": f"{label}-mapped"},
    ))
    return Stage(
        index=int(label.split("-")[1]), name=label, label=label, description=description,
        transforms=tuple(descriptor.transforms), descriptor=descriptor.SerializeToString(),
        inputs=(),
        outputs=(),
    )


def _elements(pcoll: str, n: int) -> metrics_pb2.MonitoringInfo:
    return monitoring_infos.int64_counter(monitoring_infos.ELEMENT_COUNT_URN, n, pcollection=pcoll)


def _sizes(pcoll: str, sampled: int, total: int) -> metrics_pb2.MonitoringInfo:
    return monitoring_infos.int64_distribution(
        monitoring_infos.SAMPLED_BYTE_SIZE_URN, DistributionData(total, sampled, 1, 100),
        pcollection=pcoll,
    )


def _report(
    stage: str, partition: int, infos: list[metrics_pb2.MonitoringInfo], *,
    attempt: int = 0, final: bool = False, ok: bool = True, spark_stage: int = 1,
) -> AttemptReport:
    key = AttemptKey("job-001", stage, spark_stage, partition, attempt)
    return AttemptReport(key, infos, final=final, ok=ok)


def _by_key(*reports: AttemptReport) -> dict[AttemptKey, AttemptReport]:
    return {r.key: r for r in reports}


def test_stage_inputs_are_the_outputs_of_its_data_input_transforms() -> None:
    info = stage_info(_stage("stage-003", ["pc-a", "pc-b"]), tasks=4)
    assert info == StageInfo("stage-003", "stage-003 [ParDo(Read)]",
                             frozenset({"pc-a", "pc-b"}), 4)


def test_elements_of_input_pcollections_are_summed_over_attempts() -> None:
    info = stage_info(_stage("stage-001", ["in", "in2"]), tasks=3)
    reports = [
        _report("stage-001", 0, [_elements("in", 10), _elements("in2", 5),
                                 _elements("stage-001-mapped", 99)], final=True),
        _report("stage-001", 1, [_elements("in", 7)]),
        _report("stage-002", 0, [_elements("in", 1000)]),  # another stage's attempt
    ]
    (got,) = stage_progress([info], reports)
    assert (got.elements, got.done_tasks, got.tasks, got.percent) == (22, 1, 3, 33)


def test_a_failed_attempt_is_not_counted_next_to_its_retry() -> None:
    info = stage_info(_stage("stage-001", ["in"]), tasks=2)
    failed = _report("stage-001", 0, [_elements("in", 40)], final=True, ok=False)
    retry_running = _report("stage-001", 0, [_elements("in", 15)], attempt=1)
    other = _report("stage-001", 1, [_elements("in", 50)], final=True)
    (got,) = stage_progress([info], [failed, retry_running, other])
    assert (got.elements, got.done_tasks) == (65, 1)
    retry_done = _report("stage-001", 0, [_elements("in", 50)], attempt=1, final=True)
    (got,) = stage_progress([info], [failed, retry_done, other])
    assert (got.elements, got.done_tasks, got.percent) == (100, 2, 100)


def test_a_successful_attempt_wins_over_a_later_one_still_running() -> None:
    # Speculative execution or a recomputed partition: the committed attempt counts.
    info = stage_info(_stage("stage-001", ["in"]), tasks=1)
    done = _report("stage-001", 0, [_elements("in", 30)], final=True)
    again = _report("stage-001", 0, [_elements("in", 3)], attempt=1)
    (got,) = stage_progress([info], [again, done])
    assert (got.elements, got.done_tasks) == (30, 1)


def test_bytes_scale_the_mean_sampled_size_to_all_elements() -> None:
    info = stage_info(_stage("stage-001", ["in"]), tasks=2)
    reports = [
        # 1,000 elements, 20 sampled of 50 bytes on average: 50,000 bytes.
        _report("stage-001", 0, [_elements("in", 1000), _sizes("in", 20, 1000)]),
        # Every element sampled: the sum is exact.
        _report("stage-001", 1, [_elements("in", 8), _sizes("in", 8, 800)]),
    ]
    (got,) = stage_progress([info], reports)
    assert got.bytes == 50_800


def test_bytes_are_unknown_without_sampled_sizes() -> None:
    info = stage_info(_stage("stage-001", ["in"]), tasks=1)
    (got,) = stage_progress([info], [_report("stage-001", 0, [_elements("in", 3)])])
    assert got.bytes is None
    assert got.line() == "stage-001 [ParDo(Read)]: 3 elements, ? B, 0% (0/1 tasks)"


def test_line_format() -> None:
    progress = StageProgress("stage-003", "stage-003 [ParDo(Read)]", 12345, 3_400_000, 2, 5)
    assert progress.line() == "stage-003 [ParDo(Read)]: 12,345 elements, 3.4 MB, 40% (2/5 tasks)"
    assert LINE.fullmatch(progress.line())


def test_format_bytes() -> None:
    assert [format_bytes(n) for n in (0, 999, 1000, 1_250_000, 7 * 10**9)] == [
        "0 B", "999 B", "1.0 KB", "1.2 MB", "7.0 GB"]


def test_percent_is_rounded_down() -> None:
    assert StageProgress("s", "s", 0, 0, 2, 3).percent == 66
    assert StageProgress("s", "s", 0, 0, 0, 0).percent == 0


def test_partitions_that_reported_count_as_tasks_when_the_driver_expected_fewer() -> None:
    info = StageInfo("stage-001", "stage-001 [X]", frozenset({"in"}), 1)
    reports = [_report("stage-001", 0, [_elements("in", 1)], final=True),
               _report("stage-001", 1, [_elements("in", 1)])]
    (got,) = stage_progress([info], reports)
    assert (got.done_tasks, got.tasks, got.percent) == (1, 2, 50)
    reports[1] = _report("stage-001", 1, [_elements("in", 1)], final=True)
    (got,) = stage_progress([info], reports)
    assert (got.done_tasks, got.tasks, got.percent) == (2, 2, 100)


def test_tracker_emits_only_active_stages_whose_numbers_changed() -> None:
    tracker = ProgressTracker([_stage("stage-001", ["a"]), _stage("stage-002", ["b"], "GBK")])
    partitions = {"stage-001": 2, "stage-002": 4}
    first = _report("stage-001", 0, [_elements("a", 5)])
    assert tracker.changed(_by_key(first), partitions) == [
        "stage-001 [ParDo(Read)]: 5 elements, ? B, 0% (0/2 tasks)"]
    assert tracker.changed(_by_key(first), partitions) == []  # nothing moved
    more = _report("stage-001", 0, [_elements("a", 9)], final=True)
    second = _report("stage-002", 1, [_elements("b", 2)])
    assert tracker.changed(_by_key(more, second), partitions) == [
        "stage-001 [ParDo(Read)]: 9 elements, ? B, 50% (1/2 tasks)",
        "stage-002 [GBK]: 2 elements, ? B, 0% (0/4 tasks)",
    ]
    assert all(LINE.fullmatch(line) for line in tracker.final(_by_key(more, second), partitions))


def test_tracker_is_silent_for_stages_not_declared_yet() -> None:
    tracker = ProgressTracker([_stage("stage-001", ["a"])])
    reports = _by_key(_report("stage-001", 0, [_elements("a", 5)]))
    assert tracker.changed(reports, {}) == []
    assert tracker.final(reports, {}) == []


def test_final_lines_cover_every_declared_stage() -> None:
    tracker = ProgressTracker([_stage("stage-001", ["a"]), _stage("stage-002", ["b"])])
    reports = _by_key(_report("stage-001", 0, [_elements("a", 5)], final=True))
    assert tracker.final(reports, {"stage-001": 1, "stage-002": 1}) == [
        "stage-001 [ParDo(Read)]: 5 elements, ? B, 100% (1/1 tasks)",
        "stage-002 [ParDo(Read)]: 0 elements, 0 B, 0% (0/1 tasks)",
    ]


def test_a_committed_stage_had_as_many_tasks_as_it_committed_partitions() -> None:
    """Spark made one task of a file read the driver guessed two for: done, not "50%"."""
    tracker = ProgressTracker([_stage("stage-001", ["a"]), _stage("stage-002", ["b"])])
    read = _report("stage-001", 0, [_elements("a", 5)], final=True)
    reports = _by_key(read)
    partitions = {"stage-001": 2, "stage-002": 1}
    assert tracker.final(reports, committed_tasks(partitions, [read.key])) == [
        "stage-001 [ParDo(Read)]: 5 elements, ? B, 100% (1/1 tasks)",
        "stage-002 [ParDo(Read)]: 0 elements, 0 B, 0% (0/1 tasks)",  # nothing committed
    ]
    assert tracker.final(reports, committed_tasks(partitions, []))[0].endswith(
        "50% (1/2 tasks)")  # a failed job commits nothing: the guess stays


def test_unreported_lists_committed_attempts_without_a_final_report() -> None:
    running = _report("stage-001", 0, [])
    done = _report("stage-001", 1, [], final=True)
    missing = AttemptKey("job-001", "stage-001", 1, 2, 0)
    assert unreported([running.key, done.key, missing], _by_key(running, done)) == [
        running.key, missing]


class _Collector:
    """The reports a collector would hold, as the test sets them."""

    def __init__(self) -> None:
        self.reports: dict[AttemptKey, AttemptReport] = {}

    def attempt_reports(self, job: str) -> dict[AttemptKey, AttemptReport]:
        return dict(self.reports)


def test_on_a_terminal_a_live_bar_per_stage_then_the_final_lines() -> None:
    import io
    import time

    from rich.console import Console

    from sparkbeam.progress_watch import LiveView, ProgressWatch

    screen = io.StringIO()
    collector = _Collector()
    logged: list[str] = []
    watch = ProgressWatch(
        "job-001", ProgressTracker([_stage("stage-001", ["in"])]), collector,
        {"stage-001": 2}, interval=5.0, log=logged.append, terminal=True,
        view=lambda: LiveView(Console(file=screen, force_terminal=True, width=120)),
    )
    watch.start()
    report = _report("stage-001", 0, [_elements("in", 1234), _sizes("in", 2, 200)], final=True)
    collector.reports = {report.key: report}
    time.sleep(0.8)  # the view redraws every 0.5 s
    watch.finish(set())
    drawn = screen.getvalue()
    assert "stage-001 [ParDo(Read)]" in drawn
    assert "1/2 tasks" in drawn and "1,234 elements, 123.4 KB" in drawn
    # No lines while the view shows the numbers; one line per stage at the end.
    assert logged == ["stage-001 [ParDo(Read)]: 1,234 elements, 123.4 KB, 50% (1/2 tasks)"]


def test_without_a_terminal_only_lines() -> None:
    from sparkbeam.progress_watch import ProgressWatch

    collector = _Collector()
    logged: list[str] = []
    watch = ProgressWatch(
        "job-001", ProgressTracker([_stage("stage-001", ["in"])]), collector,
        {"stage-001": 1}, interval=0.05, log=logged.append, terminal=False,
        view=lambda: (_ for _ in ()).throw(AssertionError("no view without a terminal")),
    )
    watch.start()
    report = _report("stage-001", 0, [_elements("in", 3)], final=True)
    collector.reports = {report.key: report}
    watch.finish(set())
    assert logged[-1] == "stage-001 [ParDo(Read)]: 3 elements, ? B, 100% (1/1 tasks)"
