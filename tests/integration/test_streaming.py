"""Streaming pipelines on Spark give the panes Beam's DirectRunner gives, pane for pane."""
from __future__ import annotations

import math
import os
import tempfile
import time

import apache_beam as beam
import pytest
from apache_beam.metrics import Metrics, MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.runner import PipelineState
from apache_beam.testing.test_stream import TestStream
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.coders import VarIntCoder
from apache_beam.transforms import trigger, userstate
from apache_beam.transforms import window
from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker
from apache_beam.io.unbounded_source import ReadFromUnboundedSource, UnboundedCountingSource
from apache_beam.transforms.core import RestrictionProvider
from apache_beam.transforms.periodicsequence import PeriodicImpulse

from sparkbeam import SparkRunner
from sparkbeam.errors import UnsupportedFeatureError, UserCodeError
from tests.integration.streaming_pipelines import (
    STREAMING_PIPELINES,
    BufferWithTimers,
    Describe,
    WriteLines,
    events,
    plain_with_side_input,
    processing_timer_hold,
    read_lines,
    splittable_with_side_input,
)

_EXPECTED: dict[str, list[str]] = {}


def run_streaming(build, runner, args: list[str]) -> list[str]:
    directory = tempfile.mkdtemp(prefix="sparkbeam-stream-out-")
    options = PipelineOptions(["--streaming", "--allow_unsafe_triggers", *args])
    with beam.Pipeline(runner=runner, options=options) as p:
        build(p) | "Write" >> beam.ParDo(WriteLines(directory))
    return read_lines(directory)


def expected_from_direct_runner(name: str) -> list[str]:
    if name not in _EXPECTED:
        _EXPECTED[name] = run_streaming(STREAMING_PIPELINES[name], "BundleBasedDirectRunner", [])
    return _EXPECTED[name]


@pytest.mark.parametrize(
    "name", sorted(set(STREAMING_PIPELINES) - {"side_input_from_grouping"}))  # tested below
def test_same_panes_as_direct_runner(name: str, tmp_path) -> None:
    expected = expected_from_direct_runner(name)
    assert expected, f"{name} produced nothing on the DirectRunner; the test would prove nothing"
    actual = run_streaming(STREAMING_PIPELINES[name], SparkRunner(),
                           [f"--checkpoint_dir={tmp_path / 'ckpt'}", "--parallelism=2"])
    assert actual == expected


def test_streaming_on_a_cluster_needs_a_checkpoint_dir_and_reports_every_gap_at_once() -> None:
    class CountWithSide(beam.DoFn):
        COUNT = userstate.CombiningValueStateSpec("n", VarIntCoder(), sum)

        def process(self, kv, side, count=beam.DoFn.StateParam(COUNT)):
            count.add(1)
            yield kv[0], count.read() + len(side)

    class CountTo(beam.DoFn, RestrictionProvider):
        def initial_restriction(self, n):
            return OffsetRange(0, n)

        def create_tracker(self, restriction):
            return OffsetRestrictionTracker(restriction)

        def restriction_size(self, n, restriction):
            return restriction.size()

        def process(self, n, side, tracker=beam.DoFn.RestrictionParam()):
            position = tracker.current_restriction().start
            while tracker.try_claim(position):
                yield position + len(side)
                position += 1

    def build(p):
        # Key/value side elements: Beam's translation may take the side input for the main one.
        side = p | "Side" >> beam.Create([("x", 1)])
        _ = (p | "Sizes" >> beam.Create([3])
             | "ReadWithSide" >> beam.ParDo(CountTo(), beam.pvalue.AsList(side)))
        return (p | events(("add", [("a", 1, 1)]))
                | "WithSide" >> beam.ParDo(CountWithSide(), beam.pvalue.AsList(side)))

    with pytest.raises(UnsupportedFeatureError) as info:
        run_streaming(build, SparkRunner(), ["--spark_master=spark://cluster.invalid:7077"])
    text = str(info.value)
    assert ("streaming without --checkpoint_dir in the pipeline options (master "
            "spark://cluster.invalid:7077) (on a cluster the checkpoint directory must be one "
            "the driver and every executor share") in text
    # Side inputs of a stateful DoFn (`stateful_with_side_input`) and of a splittable DoFn
    # (`test_a_splittable_dofn_reads_side_inputs_as_a_plain_dofn_does`) are no gaps any more.
    assert "WithSide" not in text, text
    assert len(info.value.features) == 1


def test_a_splittable_dofn_reads_side_inputs_as_a_plain_dofn_does(tmp_path) -> None:
    """Each new element waits in its spread key's state for its window's sums; its residuals
    (one per later position) read them again in later micro-batches. Beam's DirectRunner
    cannot run the splittable DoFn, so the expected records are its plain equivalent's there."""
    expected = run_streaming(plain_with_side_input, "BundleBasedDirectRunner", [])
    assert len(expected) == 9 and all(not line.endswith("None)") for line in expected), expected
    actual = run_streaming(splittable_with_side_input, SparkRunner(),
                           [f"--checkpoint_dir={tmp_path / 'ckpt'}", "--parallelism=2"])
    assert actual == expected


def test_user_error_in_a_streaming_stage_names_the_transform(tmp_path) -> None:
    def explode(kv):
        if kv[1] == 3:
            raise ValueError("three is not allowed")
        return kv

    def build(p):
        return (p | events(("add", [("a", 1, 1), ("b", 2, 2)]), ("wm", 5), ("add", [("a", 3, 7)]))
                | "Explode" >> beam.Map(explode))

    with pytest.raises(UserCodeError, match="three is not allowed") as info:
        run_streaming(build, SparkRunner(), [f"--checkpoint_dir={tmp_path / 'ckpt'}"])
    assert info.value.transform == "Explode"
    assert info.value.exc_type == "ValueError"


class _CountInState(beam.DoFn):
    SEEN = userstate.BagStateSpec("seen", VarIntCoder())

    def process(self, kv, seen=beam.DoFn.StateParam(SEEN)):
        Metrics.counter("stream", "stateful").inc()
        seen.add(kv[1])
        yield kv


def _read_three_ways(tmp_path, count):
    """A streaming pipeline whose `count` stage is read by three consumers: a Map fused beside
    it, a windowed GroupByKey and a stateful DoFn (run per key, one report per task, counting
    "stateful"). Returns the pipeline and the counted PCollection."""
    options = PipelineOptions(["--streaming", f"--checkpoint_dir={tmp_path / 'ckpt'}",
                               "--parallelism=2"])
    p = beam.Pipeline(runner=SparkRunner(), options=options)
    counted = (p | events(("add", [("a", 1, 1), ("b", 2, 2)]), ("wm", 5),
                          ("add", [("a", 3, 7), ("c", 4, 8)]), ("wm", 20))
               | "Count" >> beam.Map(count))
    _ = counted | "First" >> beam.Map(lambda kv: kv)
    _ = counted | beam.WindowInto(window.FixedWindows(10)) | beam.GroupByKey()
    _ = counted | "Stateful" >> beam.ParDo(_CountInState())
    return p, counted


def test_counters_of_a_streaming_job_are_committed_once(tmp_path) -> None:
    def count(kv):
        Metrics.counter("stream", "seen").inc()
        return kv

    p, _ = _read_three_ways(tmp_path, count)
    result = p.run()
    result.wait_until_finish()
    assert (committed(result, "seen"), committed(result, "stateful")) == (4, 4)


def test_a_stage_read_by_several_consumers_runs_once_per_micro_batch(tmp_path) -> None:
    # Three consumers and a side input read the counted stage's outputs; its function runs
    # once per element, not once per consumer (each call leaves a line in its process's file).
    calls = tmp_path / "calls"
    calls.mkdir()

    def count(kv):
        with open(calls / str(os.getpid()), "a") as f:
            f.write(f"{kv}\n")
        return kv

    p, counted = _read_three_ways(tmp_path, count)
    _ = (p | "Main" >> events(("add", [("m", 0, 1)]), ("wm", 20))
         | "Read" >> beam.Map(lambda kv, side: (kv, len(side)), beam.pvalue.AsList(counted)))
    result = p.run()
    result.wait_until_finish()
    lines = [line for f in calls.iterdir() for line in f.read_text().splitlines()]
    assert sorted(lines) == sorted(str(kv) for kv in [("a", 1), ("b", 2), ("a", 3), ("c", 4)])
    assert committed(result, "stateful") == 4


def test_work_budget_bounds_every_micro_batch_and_reports_throttle_time(tmp_path) -> None:
    """The issue's budget case on Spark: 4 TestStreams (the source's endpoints) of 600 elements
    each under --max_items_per_batch=1000: no micro-batch reads more than 1,000, the panes are
    those of an unbudgeted run, and the endpoints the budget held back report throttle time."""
    options = PipelineOptions(["--streaming", f"--checkpoint_dir={tmp_path / 'ckpt'}",
                               "--parallelism=2", "--max_items_per_batch=1000"])
    p = beam.Pipeline(runner=SparkRunner(), options=options)
    streams = [
        p | f"Stream{s}" >> TestStream().add_elements(
            [window.TimestampedValue((f"k{i % 7}", 1), i % 30) for i in range(600)]
        ).advance_watermark_to_infinity()
        for s in range(4)
    ]
    counts = (streams | beam.Flatten() | beam.WindowInto(window.FixedWindows(10))
              | beam.CombinePerKey(sum)
              | beam.Map(lambda kv, w=beam.DoFn.WindowParam: (kv[0], w.start.micros, kv[1])))
    expected = {}
    for i in range(600):
        key = (f"k{i % 7}", (i % 30) // 10 * 10_000_000)
        expected[key] = expected.get(key, 0) + 4
    assert_that(counts, equal_to([(k, start, n) for (k, start), n in expected.items()]))
    result = p.run()
    result.wait_until_finish()
    # Spark's numInputRows counts a row once per consumer of the source: use what was admitted.
    admitted = [b["admitted"]["items"] for b in result.streaming_batches]
    assert max(admitted) <= 1000 and sum(admitted) == 2401, admitted  # and assert_that's Impulse
    assert len([n for n in admitted if n]) >= 3, admitted
    throttled = result.metrics().query(MetricsFilter().with_name("throttling-msecs"))["counters"]
    assert {c.key.step for c in throttled} == {f"Stream{s}" for s in range(4)}
    assert sum(c.committed for c in throttled) > 0


def _tick_in_batch(tick: float, start: int) -> tuple[float, int]:
    """(seconds since start, the micro-batch the tick was output in)."""
    from pyspark import TaskContext

    return float(tick) - start, int(TaskContext.get().getLocalProperty("streaming.sql.batchId"))


def test_work_budget_checkpoints_splittable_reads(tmp_path) -> None:
    """A PeriodicImpulse 200 s behind (400 ticks due at once) under --max_items_per_batch=50:
    the budget's shares go to the splittable stage's spread keys, whose bundles are
    checkpointed (a runner-initiated split) when their output reaches the share. No micro-batch
    outputs more than 50 ticks, every tick is output once and in order, and the time the
    budget held the read back is its throttle counter."""
    start = math.floor(time.time()) - 200
    directory = tempfile.mkdtemp(prefix="sparkbeam-stream-out-")
    options = PipelineOptions(["--streaming", f"--checkpoint_dir={tmp_path / 'ckpt'}",
                               "--parallelism=2", "--max_items_per_batch=50"])
    p = beam.Pipeline(runner=SparkRunner(), options=options)
    _ = (p | "Ticks" >> PeriodicImpulse(start_timestamp=start, stop_timestamp=start + 200,
                                        fire_interval=0.5)
         | beam.Map(_tick_in_batch, start) | beam.ParDo(WriteLines(directory)))
    result = p.run()
    assert result.wait_until_finish(240_000) == PipelineState.DONE
    outputs = [eval(line) for line in read_lines(directory)]  # noqa: S307 - ours
    ticks = sorted(tick for tick, _ in outputs)
    assert ticks == [i / 2 for i in range(400)]
    per_batch: dict[int, list[float]] = {}
    for tick, batch in outputs:
        per_batch.setdefault(batch, []).append(tick)
    assert max(len(t) for t in per_batch.values()) <= 50, {b: len(t) for b, t in per_batch.items()}
    assert len(per_batch) >= 8
    batches = sorted(per_batch)
    for earlier, later in zip(batches, batches[1:], strict=False):
        assert max(per_batch[earlier]) < min(per_batch[later])  # a checkpoint resumes in order
    throttled = result.metrics().query(MetricsFilter().with_name("throttling-msecs"))["counters"]
    assert [c.key.step for c in throttled if c.committed] == ["Ticks/GenSequence"], throttled
    assert sum(c.committed for c in throttled) > 0


def test_processing_time_timer_holds_the_windows_downstream(tmp_path) -> None:
    """Timers' output timestamps hold the watermark of the stages downstream: the sums a
    processing-time timer releases after the watermark passed their window are on time."""
    actual = run_streaming(processing_timer_hold, SparkRunner(),
                           [f"--checkpoint_dir={tmp_path / 'ckpt'}", "--parallelism=2"])
    assert actual == [
        "('a', [13], '[10.0,20.0)', 19.999, 1, True, False, 0)",
        "('b', [2], '[10.0,20.0)', 19.999, 1, True, False, 0)",
    ]


def committed(result, name: str) -> int:
    counters = result.metrics().query(MetricsFilter().with_name(name))["counters"]
    return sum(c.committed for c in counters)


def test_side_input_from_a_grouping_matches_direct_runner_and_counts_once(tmp_path) -> None:
    """Elements wait for their window's side input (per-key sums of a GroupByKey), hold the
    watermark of the GroupByKey downstream, and the waiting stage's counters commit once."""
    expected = expected_from_direct_runner("side_input_from_grouping")
    assert expected
    directory = tempfile.mkdtemp(prefix="sparkbeam-stream-out-")
    options = PipelineOptions(["--streaming", f"--checkpoint_dir={tmp_path / 'ckpt'}",
                               "--parallelism=2"])
    p = beam.Pipeline(runner=SparkRunner(), options=options)
    STREAMING_PIPELINES["side_input_from_grouping"](p) | beam.ParDo(WriteLines(directory))
    result = p.run()
    result.wait_until_finish()
    assert read_lines(directory) == expected
    assert committed(result, "with_sums") == 5


def test_cancel_stops_a_running_streaming_job(tmp_path) -> None:
    script = [("add", [("k", i, i)]) for i in range(200)]  # ~200 micro-batches: minutes
    options = PipelineOptions(["--streaming", f"--checkpoint_dir={tmp_path / 'ckpt'}",
                               "--parallelism=1"])
    p = beam.Pipeline(runner=SparkRunner(), options=options)
    _ = p | events(*script) | beam.Map(lambda kv: kv)
    result = p.run()
    offsets = tmp_path / "ckpt" / "offsets"
    deadline = time.time() + 120
    while time.time() < deadline and not (offsets / "3").exists():
        time.sleep(0.2)
    assert (offsets / "3").exists(), "the query never got going"
    started = time.time()
    assert result.cancel() == PipelineState.CANCELLED
    assert result.state == PipelineState.CANCELLED
    assert time.time() - started < 30
    assert len(list(offsets.iterdir())) < 150  # it did not run to the end


def test_drain_stops_reading_and_fires_what_was_read(tmp_path) -> None:
    """Drain: no more input, the watermark goes to its end, so the window's only pane fires
    with exactly the elements read so far (a prefix of the stream), and a stateful
    DoFn's end-of-window timer fires for them too."""
    script = [("add", [("k", i, i)]) for i in range(200)]  # ~200 micro-batches: minutes
    directory = tempfile.mkdtemp(prefix="sparkbeam-stream-out-")
    options = PipelineOptions(["--streaming", f"--checkpoint_dir={tmp_path / 'ckpt'}",
                               "--parallelism=1"])
    p = beam.Pipeline(runner=SparkRunner(), options=options)
    read = p | events(*script)
    _ = (read | beam.WindowInto(window.FixedWindows(1000)) | beam.GroupByKey()
         | beam.ParDo(Describe())
         | "WritePanes" >> beam.ParDo(WriteLines(directory)))
    _ = read | beam.ParDo(BufferWithTimers()) | "WriteFired" >> beam.ParDo(WriteLines(directory))
    result = p.run()
    offsets = tmp_path / "ckpt" / "offsets"
    deadline = time.time() + 120
    while time.time() < deadline and not (offsets / "4").exists():
        time.sleep(0.2)
    assert (offsets / "4").exists(), "the query never got going"
    assert result.drain() == PipelineState.DRAINING
    assert result.wait_until_finish(180_000) == PipelineState.DRAINED
    lines = read_lines(directory)
    panes = [eval(line) for line in lines if line.startswith("('k', [")]  # noqa: S307 - ours
    assert len(panes) == 1, lines
    key, values, where, _, timing, first, _, _ = panes[0]
    assert (key, where, timing, first) == ("k", "[0.0,1000.0)", 1, True)  # the ON_TIME pane
    assert 4 <= len(values) < 150 and values == list(range(len(values)))  # a prefix, once
    fired = [eval(line) for line in lines if line.startswith("('k', 'et'")]  # noqa: S307
    assert [f[3] for f in fired] == [values], lines


def test_periodic_impulse_runs_until_drained_and_holds_the_watermark(tmp_path) -> None:
    """An unbounded splittable read: PeriodicImpulse ticks every 0.5 s for an hour. Its
    residuals wait in state and its watermark estimator's watermark holds the GroupByKey, so
    each 1 s window fires once, on time, with both of its ticks; drained, the restriction is
    truncated and the job ends DRAINED."""
    start = math.floor(time.time())
    directory = tempfile.mkdtemp(prefix="sparkbeam-stream-out-")
    options = PipelineOptions(["--streaming", f"--checkpoint_dir={tmp_path / 'ckpt'}",
                               "--parallelism=2"])
    p = beam.Pipeline(runner=SparkRunner(), options=options)
    _ = (p | PeriodicImpulse(start_timestamp=start, stop_timestamp=start + 3600,
                             fire_interval=0.5)
         | beam.WindowInto(window.FixedWindows(1)) | beam.Map(lambda t: ("k", float(t) - start))
         | beam.GroupByKey() | beam.ParDo(Describe()) | beam.ParDo(WriteLines(directory)))
    result = p.run()
    deadline = time.time() + 120
    while time.time() < deadline and len(read_lines(directory)) < 3:
        time.sleep(0.2)
    assert result.drain() == PipelineState.DRAINING
    assert result.wait_until_finish(180_000) == PipelineState.DRAINED
    panes = sorted(eval(line) for line in read_lines(directory))  # noqa: S307 - ours
    assert len(panes) >= 3, panes
    ticks = [t for pane in panes for t in pane[1]]
    assert ticks == [i / 2 for i in range(len(ticks))]  # every tick once, none skipped
    for _, values, where, _, timing, first, _, _ in panes[:-1]:  # the last may be cut short
        second = int(values[0])
        assert (values, where, timing, first) == (
            [second, second + 0.5], f"[{float(start + second)},{float(start + second + 1)})",
            1, True)


class _SetUpIn(beam.DoFn):
    """Writes the micro-batch its setup ran in (a bundle processor built), and tags each element
    with the micro-batch that output it."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def setup(self) -> None:
        path = os.path.join(self.directory, f"setup-{os.getpid()}-{time.time_ns()}")
        with open(path, "w") as f:
            f.write(_batch_id())

    def process(self, tick: float):
        yield float(tick), int(_batch_id())


def _batch_id() -> str:
    from pyspark import TaskContext

    return TaskContext.get().getLocalProperty("streaming.sql.batchId")


def test_a_job_ends_with_the_batch_that_reaches_the_final_watermark_when_nothing_waits(
        tmp_path) -> None:
    """Two TestStream events with elements (the second followed by the watermark's end) into a
    windowed GroupByKey, nothing holding: the job runs two micro-batches, no trailing one,
    lists both, and outputs every window."""
    directory = tempfile.mkdtemp(prefix="sparkbeam-stream-out-")
    options = PipelineOptions(["--streaming", f"--checkpoint_dir={tmp_path / 'ckpt'}",
                               "--parallelism=2"])
    p = beam.Pipeline(runner=SparkRunner(), options=options)
    _ = (p | TestStream().add_elements([window.TimestampedValue(("a", 1), 1),
                                        window.TimestampedValue(("b", 2), 2)])
         .advance_watermark_to(10).add_elements([window.TimestampedValue(("a", 3), 11)])
         .advance_watermark_to_infinity()
         | beam.WindowInto(window.FixedWindows(10)) | beam.GroupByKey()
         | beam.MapTuple(lambda k, vs: (k, sorted(vs))) | beam.ParDo(WriteLines(directory)))
    result = p.run()
    assert result.wait_until_finish(120_000) == PipelineState.DONE
    assert [b["batch"] for b in result.streaming_batches] == [0, 1], result.streaming_batches
    assert sorted(read_lines(directory)) == ["('a', [1])", "('a', [3])", "('b', [2])"]


def test_a_live_read_starts_after_a_batch_that_warms_the_workers(tmp_path) -> None:
    """A job on the wall clock (a PeriodicImpulse, three ticks already due) runs its first
    micro-batch with nothing admitted: that batch starts the Python workers and builds the
    stages' bundle processors (the user's DoFn.setup runs in it), and every tick is read and
    output in a later batch, once."""
    start = math.floor(time.time()) - 3
    setups = tempfile.mkdtemp(prefix="sparkbeam-setup-")
    directory = tempfile.mkdtemp(prefix="sparkbeam-stream-out-")
    options = PipelineOptions(["--streaming", f"--checkpoint_dir={tmp_path / 'ckpt'}",
                               "--parallelism=2"])
    p = beam.Pipeline(runner=SparkRunner(), options=options)
    _ = (p | PeriodicImpulse(start_timestamp=start, stop_timestamp=start + 3, fire_interval=1)
         | beam.ParDo(_SetUpIn(setups)) | beam.ParDo(WriteLines(directory)))
    result = p.run()
    assert result.wait_until_finish(120_000) == PipelineState.DONE
    assert result.streaming_batches[0]["rows"] == 0, result.streaming_batches
    set_up_in = []
    for name in os.listdir(setups):
        with open(os.path.join(setups, name)) as f:
            set_up_in.append(int(f.read()))
    assert 0 in set_up_in, set_up_in
    outputs = sorted(eval(line) for line in read_lines(directory))  # noqa: S307 - ours
    assert [tick - start for tick, _ in outputs] == [0.0, 1.0, 2.0], outputs
    assert min(batch for _, batch in outputs) >= 1, outputs


def test_updating_side_input_shows_its_latest_pane_from_the_batch_after_it(tmp_path) -> None:
    """The slowly-updating side input: a PeriodicImpulse in the global window with a repeated
    trigger, discarding, read as a list by another PeriodicImpulse. The main input does not
    wait for the end of the global window, and each tick sees the side input's latest pane
    (Beam's programming guide: "the value from the latest trigger firing"), here what the
    latest micro-batch that wrote it wrote: a run of consecutive ticks that moves on, never
    back, and does not grow with the job."""
    start = math.floor(time.time())
    directory = tempfile.mkdtemp(prefix="sparkbeam-stream-out-")
    options = PipelineOptions(["--streaming", f"--checkpoint_dir={tmp_path / 'ckpt'}",
                               "--parallelism=2"])
    p = beam.Pipeline(runner=SparkRunner(), options=options)
    side = (p | "Side" >> PeriodicImpulse(start_timestamp=start, stop_timestamp=start + 3600,
                                          fire_interval=0.5)
            | "Updating" >> beam.WindowInto(
                window.GlobalWindows(), trigger=trigger.Repeatedly(trigger.AfterCount(1)),
                accumulation_mode=trigger.AccumulationMode.DISCARDING)
            | "Since" >> beam.Map(lambda t: float(t) - start))
    _ = (p | "Main" >> PeriodicImpulse(start_timestamp=start, stop_timestamp=start + 3600,
                                       fire_interval=1.0)
         # Look starts a stage of its own (a read's consumers are not fused into it in
         # streaming), so it may read the side input.
         | "Look" >> beam.Map(lambda t, seen: (float(t) - start, sorted(seen)),
                              seen=beam.pvalue.AsList(side))
         | beam.ParDo(WriteLines(directory)))
    result = p.run()

    def latest_seen() -> set[float]:
        return {max(eval(line)[1]) for line in read_lines(directory)}  # noqa: S307 - ours

    deadline = time.time() + 120
    while time.time() < deadline and len(latest_seen()) < 3:
        time.sleep(0.2)
    assert result.drain() == PipelineState.DRAINING
    assert result.wait_until_finish(180_000) == PipelineState.DRAINED
    looks = sorted(eval(line) for line in read_lines(directory))  # noqa: S307 - ours
    assert len({max(seen) for _, seen in looks}) >= 3, looks
    for _, seen in looks:
        assert seen == [seen[0] + i / 2 for i in range(len(seen))], looks  # one batch's run
    latest = [max(seen) for _, seen in looks]
    assert latest == sorted(latest), looks
    assert min(seen[0] for _, seen in looks[-2:]) > 0, looks  # earlier panes are gone


def test_unbounded_source_read_in_checkpointed_bundles_ends_at_its_end(tmp_path) -> None:
    """An UnboundedSource (Beam's counting source: 0..49 at event times base + i) read 10
    records per bundle: each bundle self-checkpoints, its residual resumes the next
    micro-batch, the reader's watermark holds the GroupByKey, and the job ends by itself at
    the source's end, every window fired once, on time, with all its elements."""
    base = 1729987200  # the counting source's event-time base (a multiple of 10 s)

    def build(p):
        return (p | ReadFromUnboundedSource(UnboundedCountingSource(50),
                                            max_records_per_bundle=10)
                | beam.WindowInto(window.FixedWindows(10)) | beam.Map(lambda i: (i % 2, i))
                | beam.GroupByKey() | beam.ParDo(Describe()))

    lines = run_streaming(build, SparkRunner(),
                          [f"--checkpoint_dir={tmp_path / 'ckpt'}", "--parallelism=2"])
    panes = sorted(eval(line) for line in lines)  # noqa: S307 - ours
    expected = sorted(
        (parity, [i for i in range(10 * w, 10 * w + 10) if i % 2 == parity],
         f"[{float(base + 10 * w)},{float(base + 10 * w + 10)})", 1, True)
        for w in range(5) for parity in (0, 1)
    )
    assert [(k, v, where, timing, first) for k, v, where, _, timing, first, _, _ in panes] == (
        expected)
    assert len(list((tmp_path / "ckpt" / "offsets").iterdir())) >= 5  # read over 5+ batches


def test_a_test_stream_larger_than_spark_broadcasts_commands(tmp_path) -> None:
    # Over 1 MB of events: were they left in the components every operator carries, Spark
    # would broadcast transformWithState's command, which its driver-side runner cannot load.
    # Few elements of 512 bytes each: the size matters here, not the count.
    n = 2_500
    elements = [window.TimestampedValue((f"key-{i % 50:02d}", f"{i:08d}".ljust(512, "v")), 1)
                for i in range(n)]
    options = PipelineOptions(["--streaming", f"--checkpoint_dir={tmp_path / 'ckpt'}",
                               "--parallelism=2"])
    with beam.Pipeline(runner=SparkRunner(), options=options) as p:
        counts = (p | TestStream().add_elements(elements).advance_watermark_to_infinity()
                  | beam.WindowInto(window.FixedWindows(10)) | beam.combiners.Count.PerKey())
        assert_that(counts, equal_to([(f"key-{k:02d}", n // 50) for k in range(50)]))


# Twelve side panes: more than the driver's compaction interval (8) and than the test's file
# bound (10), so the bound fails unless the side files were compacted.
PANES = 12


def _split_stream(p):  # type: ignore[no-untyped-def]
    """Side and main elements of one TestStream, alternating, one event a micro-batch: side
    value i, then main value 100 + i, for i < PANES."""
    script = []
    for i in range(PANES):
        script += [("add", [("side", i, i)]), ("add", [("main", 100 + i, i)])]
    stream = p | events(*script)
    side = (stream | "Sides" >> beam.Filter(lambda kv: kv[0] == "side")
            | "Latest" >> beam.WindowInto(
                window.GlobalWindows(), trigger=trigger.Repeatedly(trigger.AfterCount(1)),
                accumulation_mode=trigger.AccumulationMode.DISCARDING)
            | "Value" >> beam.Map(lambda kv: kv[1]))
    main = stream | "Mains" >> beam.Filter(lambda kv: kv[0] == "main")
    return main, side


def test_a_slowly_updating_side_input_shows_its_latest_pane_and_its_files_stay_few(
        tmp_path) -> None:
    """The slowly-updating side input pattern (a global window, a repeated trigger,
    discarding panes, read with AsSingleton): each main element sees the side input's latest
    pane (Beam's DirectRunner shows every pane, so AsSingleton fails there after the second);
    its checkpoint files are compacted, so 12 panes leave at most 10 files."""
    ckpt = tmp_path / "ckpt"

    def build(p):  # type: ignore[no-untyped-def]
        main, side = _split_stream(p)
        return main | beam.Map(lambda kv, latest: (kv[1], latest),
                               latest=beam.pvalue.AsSingleton(side))

    actual = run_streaming(build, SparkRunner(), [f"--checkpoint_dir={ckpt}",
                                                  "--parallelism=1"])
    pairs = sorted(eval(line) for line in actual)  # noqa: S307 - ours
    # Main value 100 + i comes one micro-batch after side value i, the latest pane then.
    assert pairs == [(100 + i, i) for i in range(PANES)]
    (directory,) = [os.path.join(ckpt, "sides", d) for d in os.listdir(ckpt / "sides")]
    files = os.listdir(directory)
    assert len(files) <= 10 and any(f.endswith("-compact") for f in files), files


_PANE_BYTES = 256 * 1024  # each side pane's payload: 200 panes kept would be 50 MB


def _probe(kv, latest, sides: str):  # type: ignore[no-untyped-def]
    """(main value, the side value it saw, this worker's pid and resident KiB, the side
    buffers' files and bytes in the checkpoint now): the reader reports what it holds."""
    with open("/proc/self/statm") as f:
        rss_kib = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
    paths = [os.path.join(d, f) for d in (os.path.join(sides, s) for s in os.listdir(sides))
             for f in os.listdir(d)]
    return (kv[1], latest[0], len(latest[1]), os.getpid(), rss_kib, len(paths),
            sum(os.path.getsize(path) for path in paths if os.path.exists(path)))


@pytest.mark.slow  # 200 micro-batches, ~3 min: `make test-slow`, not in `make test`
def test_a_slowly_updating_side_input_over_200_micro_batches_keeps_files_and_memory_flat(
        tmp_path) -> None:
    """200 micro-batches, each with a new 256 KiB pane of a discarding side input (the
    slowly-updating pattern) and a main element reading it with AsSingleton: every main
    element sees a recent pane whole; the checkpoint's side files stay few and small (what no
    reader can see is compacted away), and the reading worker's memory stays flat (it holds
    the latest pane, not all of them)."""
    n = 200
    ckpt = tmp_path / "ckpt"
    sides = str(ckpt / "sides")

    def build(p):  # type: ignore[no-untyped-def]
        stream = p | events(*[("add", [("side", i, i), ("main", 1000 + i, i)])
                              for i in range(n)])
        side = (stream | "Sides" >> beam.Filter(lambda kv: kv[0] == "side")
                | "Latest" >> beam.WindowInto(
                    window.GlobalWindows(), trigger=trigger.Repeatedly(trigger.AfterCount(1)),
                    accumulation_mode=trigger.AccumulationMode.DISCARDING)
                | "Pane" >> beam.Map(lambda kv: (kv[1], "x" * _PANE_BYTES)))
        return (stream | "Mains" >> beam.Filter(lambda kv: kv[0] == "main")
                | "Probe" >> beam.Map(_probe, latest=beam.pvalue.AsSingleton(side),
                                      sides=sides))

    rows = sorted(eval(line) for line in run_streaming(  # noqa: S307 - ours
        build, SparkRunner(), [f"--checkpoint_dir={ckpt}", "--parallelism=1"]))
    assert [main for main, *_ in rows] == [1000 + i for i in range(n)]
    # The first main element waits for the side input's first pane; each later one sees the
    # pane of the micro-batch before its own (side files are read from earlier batches).
    lags = [main - 1000 - seen for main, seen, *_ in rows]
    assert lags == [0] + [1] * (n - 1), lags
    assert all(length == _PANE_BYTES for _, _, length, *_ in rows)
    # Files: the driver compacts every 8; bytes: a handful of panes, not the 200 written.
    assert max(files for *_, files, _ in rows) <= 10, [r[5] for r in rows]
    assert max(size for *_, size in rows[n // 4:]) <= 12 * _PANE_BYTES, [r[6] for r in rows]
    # Memory, per reading worker: what it holds after 150 more panes is what it held at 50.
    early: dict[int, int] = {}
    late: dict[int, int] = {}
    for main, _, _, pid, rss, *_ in rows:
        i = main - 1000
        if n // 8 <= i < n * 3 // 8:
            early[pid] = max(early.get(pid, 0), rss)
        elif i >= n * 3 // 4:
            late[pid] = max(late.get(pid, 0), rss)
    both = set(early) & set(late)
    assert both, (early, late)
    growth_kib = {pid: late[pid] - early[pid] for pid in both}
    assert max(growth_kib.values()) <= 16 * 1024, (growth_kib, early)

