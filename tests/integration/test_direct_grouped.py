"""Grouped stages called without Beam's bundle processor (`engine/direct.py` over grouped
bundles): combine phases, DoFns taking their window and file writes' bundles, differential
against FnApiRunner on generated events in both bundle shapes; what Beam treats otherwise hands
over to the bundle processor with the same output, errors are Beam's, and each stage's path is
said at Prepare."""
from __future__ import annotations

import os
import tempfile

import apache_beam as beam
import pytest
from apache_beam.metrics import Metrics
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.transforms import window
from apache_beam.typehints import typecheck
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkbeam import SparkRunner
from sparkbeam.runner import prepare
from tests.integration.conftest import run_and_collect, run_and_collect_with_result

SHAPES = {"default": [], "one-per-bundle": ["--bundle_size=1", "--parallelism=1"]}
GROUPED = "functions called directly, without Beam's bundle processor (grouped values"


def _events(events: list[tuple[str, int, int]]) -> str:
    folder = tempfile.mkdtemp(prefix="grouped-")
    with open(os.path.join(folder, "events.txt"), "w", encoding="utf-8", newline="") as f:
        f.write("".join(f"{k},{t},{v}\n" for k, t, v in events))
    return os.path.join(folder, "events.txt")


def _decisions(build, args: list[str] | None = None) -> list[str]:  # type: ignore[no-untyped-def]
    """The plan's lines for `build` ending as `run_and_collect` ends it."""
    p = beam.Pipeline(options=PipelineOptions(args or []))
    _ = (build(p) | "ToText" >> beam.Map(repr)
         | "WriteOut" >> beam.io.WriteToText(os.path.join(tempfile.mkdtemp(), "out")))
    if "--performance_runtime_type_check" in (args or []):
        p.visit(typecheck.PerformanceTypeCheckVisitor())  # what Pipeline.run does with it
    return list(prepare(p.to_runner_api(), p.options).decisions)


class CountSum(beam.CombineFn):
    """A CombineFn of the user's: (count, sum), never lifted under merging windows."""

    def create_accumulator(self):  # type: ignore[no-untyped-def]
        return (0, 0)

    def add_input(self, acc, value):  # type: ignore[no-untyped-def]
        return (acc[0] + 1, acc[1] + value)

    def merge_accumulators(self, accs):  # type: ignore[no-untyped-def]
        accs = list(accs)
        return (sum(a[0] for a in accs), sum(a[1] for a in accs))

    def extract_output(self, acc):  # type: ignore[no-untyped-def]
        return acc


class WithWindow(beam.DoFn):
    """Takes its window, as the sessions workload's formatting does."""

    def process(self, kv, win=beam.DoFn.WindowParam):  # type: ignore[no-untyped-def]
        yield (kv[0], kv[1], win.start.micros, win.end.micros)


def _parse(line: str) -> window.TimestampedValue:
    key, ts, value = line.split(",")
    return window.TimestampedValue((key, int(value)), int(ts))


def _sessions(pattern: str, windowing: str):  # type: ignore[no-untyped-def]
    fns = {"sessions": window.Sessions(10), "fixed": window.FixedWindows(7),
           "sliding": window.SlidingWindows(10, 5)}

    def build(p):  # type: ignore[no-untyped-def]
        return (p | beam.io.ReadFromText(pattern) | "Stamp" >> beam.Map(_parse)
                | "Window" >> beam.WindowInto(fns[windowing])
                | "CountSum" >> beam.CombinePerKey(CountSum())
                | "WithWindow" >> beam.ParDo(WithWindow()))
    return build


_KEY = st.sampled_from(["a", "b", "é", "☃", ""])
_EVENTS = st.lists(st.tuples(_KEY, st.integers(-30, 60), st.integers(-2**40, 2**40)),
                   max_size=40)


@pytest.mark.parametrize("shape", SHAPES)
@settings(max_examples=3, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(events=_EVENTS, windowing=st.sampled_from(["sessions", "fixed", "sliding"]))
def test_grouped_stages_run_directly_and_equal_fnapi(
        shape: str, events: list[tuple[str, int, int]], windowing: str) -> None:
    build = _sessions(_events(events), windowing)
    # Lifted under non-merging windows (a merge and an extract), CombineValues under sessions.
    assert any(d.startswith("CountSum/") and "WithWindow" in d and GROUPED in d
               and "CombineFn phases, DoFns taking their window" in d
               for d in _decisions(build)), _decisions(build)
    assert run_and_collect(build, SparkRunner(), SHAPES[shape]) == run_and_collect(
        build, FnApiRunner())


@pytest.mark.parametrize("shape", SHAPES)
def test_lifted_combine_phases_and_writes_equal_fnapi(shape: str) -> None:
    lines = [f"w{i % 97} w{i % 13} é{i % 5}" for i in range(3000)] + ["", "  "]
    pattern = _events([])
    with open(pattern, "w", encoding="utf-8") as f:
        f.write("".join(f"{line}\n" for line in lines))

    def build(p):  # type: ignore[no-untyped-def]
        return (p | beam.io.ReadFromText(pattern) | "Split" >> beam.FlatMap(str.split)
                | "Count" >> beam.combiners.Count.PerElement()
                | "Mean" >> beam.Map(lambda kv: (kv[0][:1], kv[1]))
                | "PerFirst" >> beam.combiners.Mean.PerKey())

    decisions = _decisions(build)
    assert any(GROUPED in d and "CombineFn phases" in d for d in decisions), decisions
    # The tests' own write (`run_and_collect`) ends a direct stage: its bundles written there.
    assert any("file writes)" in d for d in decisions), decisions
    assert run_and_collect(build, SparkRunner(), SHAPES[shape]) == run_and_collect(
        build, FnApiRunner())


def test_write_to_text_with_shards_header_and_footer_equals_fnapi() -> None:
    pattern = _events([(f"k{i % 7}", i, i) for i in range(500)])

    def pipeline(runner, out: str) -> list[str]:  # type: ignore[no-untyped-def]
        p = beam.Pipeline(runner=runner)
        _ = (p | beam.io.ReadFromText(pattern) | beam.Map(lambda x: (x.split(",")[0], 1))
             | beam.CombinePerKey(sum) | beam.MapTuple(lambda k, v: f"{k}={v}")
             | beam.io.WriteToText(out, header="H", footer="F"))
        p.run().wait_until_finish()
        folder, prefix = os.path.split(out)
        found = []
        for name in sorted(os.listdir(folder)):
            if name.startswith(prefix):
                with open(os.path.join(folder, name), encoding="utf-8") as f:
                    lines = f.read().splitlines()
                assert lines[0] == "H" and lines[-1] == "F", (name, lines)
                found.extend(lines[1:-1])
        return sorted(found)

    folder = tempfile.mkdtemp(prefix="grouped-out-")
    assert pipeline(SparkRunner(), os.path.join(folder, "spark", "out")) == pipeline(
        FnApiRunner(), os.path.join(folder, "fnapi", "out"))


@pytest.mark.parametrize("args, files", [([], 1), (["--bundle_size=1000"], 3)])
def test_a_grouped_stages_write_ends_its_files_at_bundle_size_records(
        args: list[str], files: int) -> None:
    # 2,500 keys into one task: Beam leaves the shard count to the runner, and a direct
    # write's file holds up to --bundle_size records (by default a plain stage's bundle, not
    # a grouped stage's 1,000 keys).
    pattern = _events([(f"k{i}", i, i) for i in range(2500)])
    out = os.path.join(tempfile.mkdtemp(prefix="grouped-files-"), "out")
    p = beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(["--parallelism=1", *args]))
    _ = (p | beam.io.ReadFromText(pattern) | beam.Map(lambda x: (x.split(",")[0], 1))
         | beam.CombinePerKey(sum) | beam.MapTuple(lambda k, v: f"{k}={v}")
         | beam.io.WriteToText(out))
    p.run().wait_until_finish()
    names = sorted(n for n in os.listdir(os.path.dirname(out)) if n.startswith("out"))
    assert len(names) == files, names
    lines = []
    for name in names:
        with open(os.path.join(os.path.dirname(out), name), encoding="utf-8") as f:
            lines.extend(f.read().splitlines())
    assert sorted(lines) == sorted(f"k{i}=1" for i in range(2500))


class Bundled(beam.DoFn):
    """Has a bundle method of its own: Beam calls it around bundles."""

    def start_bundle(self) -> None:
        self.seen = 0

    def process(self, kv, win=beam.DoFn.WindowParam):  # type: ignore[no-untyped-def]
        self.seen += 1
        yield (kv[0], self.seen > 0)


def test_a_dofn_with_bundle_methods_keeps_the_bundle_processor() -> None:
    pattern = _events([("a", 1, 1), ("b", 2, 2)])

    def build(p):  # type: ignore[no-untyped-def]
        return (p | beam.io.ReadFromText(pattern) | beam.Map(_parse)
                | beam.GroupByKey() | "Bundled" >> beam.ParDo(Bundled()))

    assert any(d.startswith("Bundled") and "whose start_bundle Beam would call around bundles"
               in d for d in _decisions(build)), _decisions(build)
    assert run_and_collect(build, SparkRunner()) == run_and_collect(build, FnApiRunner())


def test_timestamped_results_hand_over_with_the_same_output() -> None:
    # The last keys' groups give results Beam treats otherwise (`TimestampedValue`s): from
    # that bundle on, the bundle processor runs the stage.
    pattern = _events([(f"k{i:04d}", i % 50, i) for i in range(3000)])
    seen = Metrics.counter("grouped-test", "seen")

    def odd(kv, win=beam.DoFn.WindowParam):  # type: ignore[no-untyped-def]
        seen.inc()
        key, values = kv
        if key >= "k2990":
            yield window.TimestampedValue((key, sorted(values)), 3)
        else:
            yield (key, len(values), win.end.micros)

    def build(p):  # type: ignore[no-untyped-def]
        return (p | beam.io.ReadFromText(pattern) | beam.Map(_parse)
                | beam.WindowInto(window.FixedWindows(1000)) | beam.GroupByKey()
                | "Odd" >> beam.FlatMap(odd) | "Key" >> beam.Map(lambda x: (x[0], x[1:]))
                # The timestamps decide the windows the next grouping sees.
                | "Rewindow" >> beam.WindowInto(window.FixedWindows(1))
                | "Again" >> beam.GroupByKey() | "Where" >> beam.ParDo(WithWindow()))

    decisions = _decisions(build)
    assert any(d.startswith("Odd,") and GROUPED in d and "DoFns taking their window" in d
               for d in decisions), decisions
    expected = run_and_collect(build, FnApiRunner())
    for args in ([], ["--bundle_size=500"]):
        got, result = run_and_collect_with_result(build, SparkRunner(), args)
        assert got == expected
        counters = result.metrics().query(MetricsFilter().with_name("seen"))["counters"]
        assert [c.committed for c in counters] == [3000]


def test_an_error_in_a_grouped_stage_is_beams_and_names_the_transform() -> None:
    pattern = _events([("a", 1, 1), ("b", 2, 0)])

    def build(p):  # type: ignore[no-untyped-def]
        return (p | beam.io.ReadFromText(pattern) | beam.Map(_parse) | beam.GroupByKey()
                | "Invert" >> beam.MapTuple(lambda k, vs: 1 / sum(vs)))

    assert any(d.startswith("Invert,") and GROUPED in d for d in _decisions(build))
    with pytest.raises(Exception, match=r"(?s)ZeroDivisionError.*Invert"):
        run_and_collect(build, SparkRunner())


def test_spark_native_off_keeps_the_bundle_processor_for_grouped_stages() -> None:
    build = _sessions(_events([("a", 1, 1), ("a", 3, 2), ("b", 40, 3)]), "sessions")
    args = ["--spark_native=off"]
    assert not any(GROUPED in d for d in _decisions(build, args))
    assert run_and_collect(build, SparkRunner(), args) == run_and_collect(build, FnApiRunner())


class ReturnsText(beam.DoFn):
    """Returns a str, which Beam's output handler refuses from a user's DoFn."""

    def process(self, kv, win=beam.DoFn.WindowParam):  # type: ignore[no-untyped-def]
        return str(kv[0])


def test_a_str_returned_by_a_users_dofn_is_beams_error() -> None:
    pattern = _events([("a", 1, 1), ("bc", 2, 2)])

    def build(p):  # type: ignore[no-untyped-def]
        return (p | beam.io.ReadFromText(pattern) | beam.Map(_parse) | beam.GroupByKey()
                | "Text" >> beam.ParDo(ReturnsText()))

    assert any(d.startswith("Text,") and GROUPED in d for d in _decisions(build))
    with pytest.raises(Exception, match=r"(?s)Returning a str from a ParDo.*Text"):
        run_and_collect(build, SparkRunner())


class Batches(beam.DoFn):
    @beam.DoFn.yields_batches
    def process(self, kv, win=beam.DoFn.WindowParam):  # type: ignore[no-untyped-def]
        yield [len(kv[1])]

    def infer_output_type(self, input_type):  # type: ignore[no-untyped-def]
        return int


def test_batch_yielding_and_runtime_checked_dofns_keep_the_bundle_processor() -> None:
    pattern = _events([("a", 1, 1)])

    def batches(p):  # type: ignore[no-untyped-def]
        return (p | beam.io.ReadFromText(pattern) | beam.Map(_parse) | beam.GroupByKey()
                | "Batches" >> beam.ParDo(Batches()))

    assert any(d.startswith("Batches,") and "yields batches" in d
               for d in _decisions(batches)), _decisions(batches)

    def checked(p):  # type: ignore[no-untyped-def]
        return (p | beam.io.ReadFromText(pattern) | beam.Map(_parse) | beam.GroupByKey()
                | "Checked" >> beam.ParDo(WithWindow()).with_output_types(
                    beam.typehints.Tuple[str, int]))

    decisions = _decisions(checked, ["--performance_runtime_type_check"])
    assert any(d.startswith("Checked,") and "type-checked at run time" in d
               for d in decisions), decisions
