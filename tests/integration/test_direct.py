"""Plain stages of Map/FlatMap/Filter functions called without Beam's bundle processor
(`engine/direct.py`): differential tests against FnApiRunner on the same pipeline, with generated
lines, in both bundle shapes; results Beam treats otherwise (timestamped values, tagged outputs)
and errors hand over to the bundle processor; functions taking Beam's parameters never start
directly, and each stage's path is said at Prepare."""
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
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkbeam import SparkRunner
from sparkbeam.runner import prepare
from tests.integration.conftest import run_and_collect, run_and_collect_with_result

SHAPES = {"default": [], "one-per-bundle": ["--bundle_size=1", "--parallelism=1"]}
DIRECT = "functions called directly"


def _write(lines: list[str], files: int = 2) -> str:
    folder = tempfile.mkdtemp(prefix="direct-")
    for n in range(files):
        with open(os.path.join(folder, f"part-{n}.txt"), "w", encoding="utf-8",
                  newline="") as f:
            f.write("".join(f"{line}\n" for line in lines[n::files]))
    return os.path.join(folder, "part-*.txt")


def _decisions(build, args: list[str] | None = None) -> list[str]:  # type: ignore[no-untyped-def]
    p = beam.Pipeline(options=PipelineOptions(args or []))
    build(p)
    return [d for d in prepare(p.to_runner_api(), p.options).decisions
            if DIRECT in d or "Beam's bundle processor" in d]


def _counted(pattern: str, combine: bool):  # type: ignore[no-untyped-def]
    def build(p):  # type: ignore[no-untyped-def]
        words = (p | beam.io.ReadFromText(pattern)
                 | "Split" >> beam.FlatMap(str.split)
                 | "Long" >> beam.Filter(lambda w: len(w) > 1)
                 | "Pair" >> beam.Map(lambda w: (w, len(w))))
        if combine:
            return words | "Sum" >> beam.CombinePerKey(sum)
        return (words | "Group" >> beam.GroupByKey()
                | "Sorted" >> beam.MapTuple(lambda k, vs: (k, sorted(vs))))
    return build


_WORD = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"),
                max_size=6)
_LINES = st.lists(st.lists(_WORD, max_size=5).map(" ".join), max_size=40)


@pytest.mark.parametrize("shape", SHAPES)
@settings(max_examples=5, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(lines=_LINES, combine=st.booleans())
def test_direct_functions_equal_fnapi(shape: str, lines: list[str], combine: bool) -> None:
    build = _counted(_write(lines), combine)
    assert _decisions(build)[0] == (
        "Split, Long, Pair" + (", Sum/Precombine" if combine else "")
        + ": functions called directly, without Beam's bundle processor (Map/FlatMap/Filter"
        + (", lifted combiner)" if combine else ")"))
    assert run_and_collect(build, SparkRunner(), SHAPES[shape]) == run_and_collect(
        build, FnApiRunner())


def test_long_lines_unicode_and_many_keys_equal_fnapi() -> None:
    # Lines of every varint width, and more keys than the lifted combiner holds at once.
    lines = [f"k{i} é☃ " + "x" * (i % 3 * 9000) for i in range(300)]
    lines += [" ".join(f"w{j}" for j in range(i, i + 400)) for i in range(0, 120_000, 400)]
    build = _counted(_write(lines, files=3), combine=True)
    assert DIRECT in _decisions(build)[0]
    assert run_and_collect(build, SparkRunner()) == run_and_collect(build, FnApiRunner())


def _stamped(pattern: str):  # type: ignore[no-untyped-def]
    def build(p):  # type: ignore[no-untyped-def]
        def stamp(line: str):  # type: ignore[no-untyped-def]
            # Only some lines: the first batches run directly, then the bundle processor.
            if line.startswith("t"):
                return window.TimestampedValue(line, int(line[1:]))
            return line
        stamped = p | "ReadA" >> beam.io.ReadFromText(pattern) | "Stamp" >> beam.Map(stamp)
        plain = p | "ReadB" >> beam.io.ReadFromText(pattern)
        # The next stage reads each element's timestamp.
        return ((stamped, plain) | beam.Flatten()
                | "When" >> beam.Map(lambda x, t=beam.DoFn.TimestampParam: (x, t.micros)))
    return build


def test_timestamped_results_hand_over_to_the_bundle_processor() -> None:
    # Past the first Arrow batch (8,192 lines) in the default shape; small in the other, which
    # runs a bundle per element.
    lines = [f"a{i}" for i in range(20_000)] + [f"t{i}" for i in range(40)]
    build = _stamped(_write(lines, files=1))
    decisions = _decisions(build)
    assert "Stamp: functions called directly, without Beam's bundle processor " \
        "(Map/FlatMap/Filter)" in decisions, decisions
    assert any(d.startswith("When: Beam's bundle processor") for d in decisions), decisions
    assert run_and_collect(build, SparkRunner()) == run_and_collect(build, FnApiRunner())
    small = _stamped(_write(lines[-60:], files=1))
    assert run_and_collect(small, SparkRunner(), SHAPES["one-per-bundle"]) == run_and_collect(
        small, FnApiRunner())


def test_tagged_outputs_keep_the_bundle_processor() -> None:
    pattern = _write([f"{i} x" for i in range(50)])

    def build(p):  # type: ignore[no-untyped-def]
        tagged = (p | beam.io.ReadFromText(pattern) | "Tag" >> beam.FlatMap(
            lambda x: [beam.pvalue.TaggedOutput("odd", x)] if int(x.split()[0]) % 2 else [x])
            .with_outputs("odd", main="even"))
        return ((tagged.even | "E" >> beam.Map(lambda x: ("even", x)),
                 tagged.odd | "O" >> beam.Map(lambda x: ("odd", x)))
                | beam.Flatten() | beam.GroupByKey() | beam.MapTuple(lambda k, v: (k, sorted(v))))

    decisions = _decisions(build)
    assert any(d.startswith("Tag") and "Beam's bundle processor" in d for d in decisions), decisions
    assert run_and_collect(build, SparkRunner()) == run_and_collect(build, FnApiRunner())


def test_a_function_taking_beams_parameters_keeps_the_bundle_processor() -> None:
    pattern = _write([f"{i} x" for i in range(50)])

    def build(p):  # type: ignore[no-untyped-def]
        return (p | beam.io.ReadFromText(pattern)
                | "WithTime" >> beam.Map(lambda x, t=beam.DoFn.TimestampParam: (x, t.micros))
                | beam.CombinePerKey(sum))

    assert _decisions(build)[0] == (
        "WithTime, CombinePerKey(sum)/Precombine: Beam's bundle processor ('WithTime' has a "
        "function taking Beam's DoFn parameters (window, timestamp...))")
    assert run_and_collect(build, SparkRunner()) == run_and_collect(build, FnApiRunner())


def test_an_error_is_beams_and_names_the_transform() -> None:
    pattern = _write([str(i) for i in range(100)] + ["0"])

    def build(p):  # type: ignore[no-untyped-def]
        return (p | beam.io.ReadFromText(pattern) | "Invert" >> beam.Map(lambda x: 1 / int(x))
                | beam.Map(lambda v: (v, 1)) | beam.CombinePerKey(sum))

    assert DIRECT in _decisions(build)[0]
    with pytest.raises(Exception, match=r"(?s)ZeroDivisionError.*Invert"):
        run_and_collect(build, SparkRunner())


def test_user_metrics_count_once_even_when_a_batch_hands_over() -> None:
    lines = [str(i) for i in range(30_000)] + ["t5"]
    pattern = _write(lines, files=1)
    seen = Metrics.counter("direct-test", "seen")

    def build(p):  # type: ignore[no-untyped-def]
        def count(line: str):  # type: ignore[no-untyped-def]
            seen.inc()
            return window.TimestampedValue(line, 5) if line.startswith("t") else line
        return (p | beam.io.ReadFromText(pattern) | "Count" >> beam.Map(count)
                | beam.Map(lambda x: (x[:1], 1)) | beam.CombinePerKey(sum))

    _, result = run_and_collect_with_result(build, SparkRunner())
    counters = result.metrics().query(MetricsFilter().with_name("seen"))["counters"]
    assert [c.committed for c in counters] == [len(lines)]


def test_spark_native_off_keeps_the_bundle_processor() -> None:
    build = _counted(_write(["a bb ccc"]), combine=True)
    assert not any(DIRECT in d for d in _decisions(build, ["--spark_native=off"]))


def _joined(pattern: str, table: str, windowed: bool):  # type: ignore[no-untyped-def]
    def build(p):  # type: ignore[no-untyped-def]
        rows = (p | "ReadTable" >> beam.io.ReadFromText(table)
                | "ParseTable" >> beam.Map(lambda s: (s.split()[0], len(s))))
        words = p | beam.io.ReadFromText(pattern) | "Split" >> beam.FlatMap(str.split)
        if windowed:  # each word's and each table row's window: a view per window
            rows = rows | "WT" >> beam.WindowInto(window.FixedWindows(10))
            extra = p | "Extra" >> beam.Create(["zz"])
            # The Flatten's buffer: the Lookup's stage starts after it.
            words = ((words | "WW" >> beam.WindowInto(window.FixedWindows(10)),
                      extra | "WE" >> beam.WindowInto(window.FixedWindows(10)))
                     | "Both" >> beam.Flatten())
        return (words
                | "Lookup" >> beam.Map(lambda w, d, n: (w, d.get(w, n)), beam.pvalue.AsDict(rows),
                                       n=beam.pvalue.AsSingleton(
                                           rows | beam.combiners.Count.Globally()
                                           .without_defaults() if windowed
                                           else rows | beam.combiners.Count.Globally()))
                | "Sum" >> beam.CombinePerKey(sum))
    return build


@pytest.mark.parametrize("shape", SHAPES)
@settings(max_examples=3, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(lines=_LINES, table=st.lists(st.tuples(_WORD.filter(lambda w: w.strip() == w and w),
                                              st.integers(0, 5)), max_size=8))
def test_global_side_inputs_run_directly_and_equal_fnapi(
        shape: str, lines: list[str], table: list[tuple[str, int]]) -> None:
    # The side-input join of the bench: an AsDict and an AsSingleton in the global window.
    build = _joined(_write(lines), _write([f"{w} {'x' * n}" for w, n in table]),
                    windowed=False)
    decisions = _decisions(build)
    assert "Split, Lookup, Sum/Precombine: " + DIRECT + ", without Beam's bundle processor " \
        "(Map/FlatMap/Filter, global side inputs, lifted combiner)" in decisions, decisions
    assert run_and_collect(build, SparkRunner(), SHAPES[shape]) == run_and_collect(
        build, FnApiRunner())


def test_windowed_side_inputs_keep_the_bundle_processor() -> None:
    build = _joined(_write(["a b", "b c"]), _write(["a x", "c xx"]), windowed=True)
    assert any(d.startswith("Lookup, Sum/Precombine: Beam's bundle processor ('Lookup' reads "
                            "side input") and d.endswith("per window)")
               for d in _decisions(build)), _decisions(build)
    assert run_and_collect(build, SparkRunner()) == run_and_collect(build, FnApiRunner())


@pytest.mark.parametrize("args", [[], ["--spark_native=off"]], ids=["direct", "beam"])
def test_a_second_job_of_the_same_shape_reads_its_own_side_inputs(args: list[str]) -> None:
    # Beam's DoFn runner keeps a global-window side input's view for its bundle processor's
    # life, and the same stage in two jobs has the same descriptor: a cached bundle processor
    # of the first job gave the second one the first job's view (the count 1, not 2).
    words = _write(["a b"])
    for table in (["a x"], ["a x", "zz xx"]):
        build = _joined(words, _write(table), windowed=False)
        assert run_and_collect(build, SparkRunner(), args) == run_and_collect(
            build, FnApiRunner())
