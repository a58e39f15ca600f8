"""A Spark stage whose outputs only the driver reads (side inputs, a write's file names, or
nothing) is not persisted: the next action reads it once, its metric rows and every side
input among its outputs together (`engine/placement.gathered_once`)."""
from __future__ import annotations

import os
import tempfile

import apache_beam as beam
import pytest
from apache_beam.metrics import Metrics, MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.fn_api_runner import FnApiRunner

from sparkbeam import SparkRunner
from sparkbeam.execute.dataset import Datasets

SHAPES = {"default": ["--parallelism=2"], "one-per-bundle": ["--bundle_size=1",
                                                             "--parallelism=1"]}


@pytest.fixture
def persisted(monkeypatch):  # type: ignore[no-untyped-def]
    """Each stage's name -> whether its output was persisted (the real map_stage runs)."""
    seen: dict[str, bool] = {}
    real = Datasets.map_stage

    def map_stage(self, df, task, name="", prepare=None, persist=True):  # type: ignore[no-untyped-def]
        seen[name] = persist
        return real(self, df, task, name, prepare, persist=persist)

    monkeypatch.setattr(Datasets, "map_stage", map_stage)
    return seen


def _logged(log: str, x):  # type: ignore[no-untyped-def]
    with open(log, "a") as f:  # one line per time user code sees the element
        f.write(f"{x!r}\n")
    Metrics.counter("test", "seen").inc()
    return x


def _pipeline(runner, log: str, out: str, args: list[str]):  # type: ignore[no-untyped-def]
    """Two side inputs from one stage that only side inputs read (its two outputs, and a
    third nobody reads), one from a stage a Spark stage reads as its input too."""
    p = beam.Pipeline(runner=runner, options=PipelineOptions(args))
    pairs = p | "Pairs" >> beam.Create([(k % 3, k) for k in range(12)])
    grouped = (pairs | "Group" >> beam.GroupByKey()
               | "Split" >> beam.ParDo(_Split(log)).with_outputs("odd", "unread", main="even"))
    shared = p | "Shared" >> beam.Create(["s1", "s2"]) | "Reshuffle" >> beam.Reshuffle()
    _ = shared | "Elsewhere" >> beam.Map(lambda s: (s, 1)) | "Count" >> beam.CombinePerKey(sum)
    (p | "Main" >> beam.Create([100, 200])
     | "Join" >> beam.Map(lambda x, even, odd, shared_: f"{x} {sorted(even)} {sorted(odd)} "
                          f"{sorted(shared_)}",
                          beam.pvalue.AsList(grouped.even), beam.pvalue.AsList(grouped.odd),
                          beam.pvalue.AsList(shared))
     | "Write" >> beam.io.WriteToText(out, shard_name_template=""))
    return p


class _Split(beam.DoFn):
    def __init__(self, log: str) -> None:
        self._log = log

    def process(self, kv):  # type: ignore[no-untyped-def]
        key, values = kv
        total = _logged(self._log, (key, sorted(values)))[1]
        if key % 2:
            yield beam.pvalue.TaggedOutput("odd", (key, sum(total)))
        else:
            yield key, sum(total)  # the main output
        yield beam.pvalue.TaggedOutput("unread", key)


def _run(runner, args: list[str]):  # type: ignore[no-untyped-def]
    directory = tempfile.mkdtemp(prefix="sparkbeam-once-")
    log, out = os.path.join(directory, "seen.log"), os.path.join(directory, "out")
    result = _pipeline(runner, log, out, args).run()
    result.wait_until_finish()
    with open(out) as f, open(log) as seen:
        return sorted(f.read().splitlines()), sorted(seen.read().splitlines()), result


@pytest.mark.parametrize("shape", SHAPES)
def test_a_stage_only_side_inputs_read_runs_once_unpersisted_with_fnapi_runners_output(
        shape, persisted) -> None:  # type: ignore[no-untyped-def]
    ours, our_seen, result = _run(SparkRunner(), SHAPES[shape])
    theirs, their_seen, _ = _run(FnApiRunner(), SHAPES[shape])
    assert ours == theirs and len(ours) == 2
    assert "100 [(0, 18), (2, 26)] [(1, 22)] ['s1', 's2']" in ours
    # Each group went through the user's code once: one read of the unpersisted stage.
    assert our_seen == their_seen and len(our_seen) == 3
    (seen,) = result.metrics().query(MetricsFilter().with_name("seen"))["counters"]
    assert seen.committed == 3
    split = [name for name in persisted if "Split" in name]
    assert len(split) == 1 and persisted[split[0]] is False, persisted
    # A stage whose output another Spark stage reads stays persisted.
    shared = [name for name in persisted if "Reshuffle" in name and "Elsewhere" in name]
    assert shared and all(persisted[name] for name in shared), persisted
