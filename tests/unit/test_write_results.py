"""Which bounded writes' file names skip Beam's regroup before finalising (plan only, no Spark):
Beam's own WriteImpl with a runner-chosen shard count does; a fixed shard count, a look-alike
composite and `--spark_native=off` keep the expansion as it is."""
from __future__ import annotations

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from sparkbeam.plan.batch import plan_batch
from sparkbeam.plan.write_results import without_write_regroups


def _names(proto) -> set[str]:  # type: ignore[no-untyped-def]
    return {t.unique_name for t in proto.components.transforms.values()}


def test_beams_write_reads_its_names_straight_from_write_bundles(tmp_path) -> None:  # type: ignore[no-untyped-def]
    p = beam.Pipeline()
    _ = p | beam.Create(["a", "b"]) | "Out" >> beam.io.WriteToText(str(tmp_path / "out"))
    proto = p.to_runner_api()
    out, lines = without_write_regroups(proto)
    assert lines == ["Out/Write/WriteImpl: its file names go straight to finalising (Beam's Pair, "
                     "GroupByKey and Extract of them left out)"]
    gone = {f"Out/Write/WriteImpl/{n}" for n in ("Pair", "GroupByKey", "Extract")}
    assert gone <= _names(proto) and not gone & _names(out)
    comps = out.components
    written = next(iter(next(t for t in comps.transforms.values() if t.unique_name
                             == "Out/Write/WriteImpl/WriteBundles").outputs.values()))
    for step in ("PreFinalize", "FinalizeWrite"):
        reader = next(t for t in comps.transforms.values()
                      if t.unique_name == f"Out/Write/WriteImpl/{step}")
        assert written in reader.inputs.values()
    # Nothing points at what left: every input and subtransform still exists.
    for t in comps.transforms.values():
        assert all(pcoll in comps.pcollections for pcoll in t.inputs.values())
        assert all(sub in comps.transforms for sub in t.subtransforms)
    decisions = plan_batch(proto).decisions
    assert lines[0] in decisions


def test_a_fixed_shard_count_has_no_regroup_to_skip(tmp_path) -> None:  # type: ignore[no-untyped-def]
    p = beam.Pipeline()
    _ = p | beam.Create(["a"]) | "Out" >> beam.io.WriteToText(str(tmp_path / "o"), num_shards=3)
    out, lines = without_write_regroups(p.to_runner_api())
    assert lines == ["Out/Write/WriteImpl: Beam's expansion as it is (a fixed shard count: no "
                     "regroup of its file names)"]
    assert out == p.to_runner_api()


class _LookAlike(beam.PTransform):
    """Named as Beam's expansion is, with other functions in it."""

    def expand(self, pcoll):  # type: ignore[no-untyped-def]
        class WriteBundles(beam.DoFn):
            def process(self, x):  # type: ignore[no-untyped-def]
                yield x

        names = (pcoll | "WriteBundles" >> beam.ParDo(WriteBundles())
                 | "Pair" >> beam.Map(lambda x: (None, x)) | "GroupByKey" >> beam.GroupByKey()
                 | "Extract" >> beam.FlatMap(lambda x: x[1]))
        return pcoll | "Finalize" >> beam.Map(lambda x, n: x, beam.pvalue.AsIter(names))


def test_a_look_alike_keeps_its_regroup() -> None:
    p = beam.Pipeline()
    _ = p | beam.Create([1]) | "WriteImpl" >> _LookAlike()
    out, lines = without_write_regroups(p.to_runner_api())
    assert lines == ["WriteImpl: Beam's expansion as it is (its WriteBundles is not Beam's)"]
    assert "WriteImpl/GroupByKey" in _names(out)


def test_spark_native_off_keeps_beams_expansion(tmp_path) -> None:  # type: ignore[no-untyped-def]
    p = beam.Pipeline(options=PipelineOptions([]))
    _ = p | beam.Create(["a"]) | "Out" >> beam.io.WriteToText(str(tmp_path / "o"))
    plan = plan_batch(p.to_runner_api(), native=False)
    assert not any("WriteImpl:" in d for d in plan.decisions)
    assert any("WriteImpl/Extract" in s.description for s in plan.stages)
