"""Which bounded writes' file names skip Beam's regroup before finalising (plan only, no Spark):
Beam's own WriteImpl with a runner-chosen shard count does; a fixed shard count, look-alikes,
other readers of the regroup's PCollections and `--spark_native=off` keep the expansion."""
from __future__ import annotations

import apache_beam as beam
from apache_beam.io import iobase, textio
from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.options.pipeline_options import PipelineOptions

from sparkbeam.plan.batch import plan_batch
from sparkbeam.plan.write_results import without_write_regroups

_LEFT_OUT = ("Out/Write/WriteImpl: its file names go straight to finalising (Beam's Pair, "
             "GroupByKey and Extract of them left out)")


def _names(proto) -> set[str]:  # type: ignore[no-untyped-def]
    return {t.unique_name for t in proto.components.transforms.values()}


def _write(tmp_path, **kwargs) -> beam_runner_api_pb2.Pipeline:  # type: ignore[no-untyped-def]
    p = beam.Pipeline()
    _ = p | beam.Create(["a", "b"]) | "Out" >> beam.io.WriteToText(str(tmp_path / "out"), **kwargs)
    return p.to_runner_api()


def _by_name(proto, name: str):  # type: ignore[no-untyped-def]
    return next((tid, t) for tid, t in proto.components.transforms.items()
                if t.unique_name == name)


def test_beams_write_reads_its_names_straight_from_write_bundles(tmp_path) -> None:  # type: ignore[no-untyped-def]
    proto = _write(tmp_path)
    out, lines, kept = without_write_regroups(proto)
    assert lines == [_LEFT_OUT]
    assert kept == {"Out/Write/WriteImpl/WriteBundles"}
    gone = {f"Out/Write/WriteImpl/{n}" for n in ("Pair", "GroupByKey", "Extract")}
    assert gone <= _names(proto) and not gone & _names(out)
    written = next(iter(_by_name(out, "Out/Write/WriteImpl/WriteBundles")[1].outputs.values()))
    for step in ("PreFinalize", "FinalizeWrite"):
        assert written in _by_name(out, f"Out/Write/WriteImpl/{step}")[1].inputs.values()
    # Nothing points at what left: every input and subtransform still exists.
    comps = out.components
    for t in comps.transforms.values():
        assert all(pcoll in comps.pcollections for pcoll in t.inputs.values())
        assert all(sub in comps.transforms for sub in t.subtransforms)
    plan = plan_batch(proto)
    assert _LEFT_OUT in plan.decisions and plan.kept_in_spark == kept


def test_a_fixed_shard_count_has_no_regroup_to_skip(tmp_path) -> None:  # type: ignore[no-untyped-def]
    proto = _write(tmp_path, num_shards=3)
    out, lines, kept = without_write_regroups(proto)
    assert lines == ["Out/Write/WriteImpl: Beam's expansion as it is (no regroup of its file "
                     "names to leave out (e.g. a fixed shard count))"]
    assert out == proto and not kept


class _LookAlike(beam.PTransform):
    """Beam's WriteBundles and names, with other functions in Pair and Extract."""

    def expand(self, pcoll):  # type: ignore[no-untyped-def]
        sink = textio._TextSink("/tmp/never-written")  # noqa: SLF001 - Beam's own sink
        init = pcoll.pipeline | "Init" >> beam.Create(["/tmp/never"])
        names = (pcoll
                 | "WriteBundles" >> beam.ParDo(iobase._WriteBundleDoFn(sink),  # noqa: SLF001
                                                beam.pvalue.AsSingleton(init))
                 | "Pair" >> beam.Map(lambda x: (None, x)) | "GroupByKey" >> beam.GroupByKey()
                 | "Extract" >> beam.FlatMap(lambda x: x[1]))
        return init | "Finalize" >> beam.Map(lambda x, n: x, beam.pvalue.AsIter(names))


def test_a_look_alike_keeps_its_regroup() -> None:
    p = beam.Pipeline()
    _ = p | beam.Create(["a"]) | "WriteImpl" >> _LookAlike()
    out, lines, _ = without_write_regroups(p.to_runner_api())
    assert lines == ["WriteImpl: Beam's expansion as it is (its Pair, GroupByKey and Extract "
                     "are not Beam's)"]
    assert "WriteImpl/GroupByKey" in _names(out)


def test_a_composite_named_write_impl_around_a_write_is_not_taken_for_one(tmp_path) -> None:  # type: ignore[no-untyped-def]
    p = beam.Pipeline()
    _ = (p | beam.Create(["a"])
         | "WriteImpl" >> beam.io.WriteToText(str(tmp_path / "o")))
    _, lines, _ = without_write_regroups(p.to_runner_api())
    assert lines == ["WriteImpl/Write/WriteImpl: its file names go straight to finalising "
                     "(Beam's Pair, GroupByKey and Extract of them left out)"]


def _with_reader(proto, of: str, as_side: str | None = None):  # type: ignore[no-untyped-def]
    """`proto` with a copy of FinalizeWrite named Extra reading `of`'s output: as its main
    input, or in place of its side input `as_side` with that side input made a multimap."""
    out = beam_runner_api_pb2.Pipeline()
    out.CopyFrom(proto)
    _, finalize = _by_name(out, "Out/Write/WriteImpl/FinalizeWrite")
    target = next(iter(_by_name(out, of)[1].outputs.values()))
    extra = out.components.transforms["extra"]
    extra.CopyFrom(finalize)
    extra.unique_name = "Extra"
    payload = beam_runner_api_pb2.ParDoPayload.FromString(extra.spec.payload)
    if as_side is None:
        main = next(tag for tag in extra.inputs if tag not in payload.side_inputs)
        extra.inputs[main] = target
    else:
        tag = next(tag for tag, pcoll in extra.inputs.items()
                   if tag in payload.side_inputs and pcoll == target)
        payload.side_inputs[tag].access_pattern.urn = common_urns.side_inputs.MULTIMAP.urn
        extra.spec.payload = payload.SerializeToString()
    out.root_transform_ids.append("extra")
    return out


def test_other_readers_of_the_regroup_keep_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    proto = _write(tmp_path)
    cases = {
        ("Out/Write/WriteImpl/Pair", None): "'Extra' reads what its Pair makes",
        ("Out/Write/WriteImpl/GroupByKey", None): "'Extra' reads what its GroupByKey makes",
        ("Out/Write/WriteImpl/Extract", None):
            "'Extra' reads the names other than as an iterable",
        ("Out/Write/WriteImpl/Extract", "multimap"):
            "'Extra' reads the names other than as an iterable",
    }
    for (of, side), why in cases.items():
        changed = _with_reader(proto, of, side)
        out, lines, kept = without_write_regroups(changed)
        assert lines == [f"Out/Write/WriteImpl: Beam's expansion as it is ({why})"], (of, side)
        assert out == changed and not kept


def test_spark_native_off_keeps_beams_expansion(tmp_path) -> None:  # type: ignore[no-untyped-def]
    p = beam.Pipeline(options=PipelineOptions([]))
    _ = p | beam.Create(["a"]) | "Out" >> beam.io.WriteToText(str(tmp_path / "o"))
    plan = plan_batch(p.to_runner_api(), native=False)
    assert not any("WriteImpl:" in d for d in plan.decisions) and not plan.kept_in_spark
    assert any("WriteImpl/Extract" in s.description for s in plan.stages)
