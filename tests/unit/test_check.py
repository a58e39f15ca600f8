"""The Prepare-time check lists every unsupported feature in one error."""
from __future__ import annotations

import re

import apache_beam as beam
import pytest
from apache_beam.coders import VarIntCoder
from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.transforms import userstate
from apache_beam.transforms.core import RestrictionProvider

from sparkbeam.errors import UnsupportedFeatureError
from sparkbeam.plan.check import check_pipeline, find_unsupported, supported_transform_urns


def _proto() -> beam_runner_api_pb2.Pipeline:
    p = beam.Pipeline()
    _ = p | beam.Create([1, 2]) | "Double" >> beam.Map(lambda x: x * 2)
    return p.to_runner_api()


def test_a_plain_pipeline_passes() -> None:
    assert find_unsupported(_proto()) == []
    check_pipeline(_proto())


def test_all_problems_are_reported_together() -> None:
    proto = _proto()
    comps = proto.components
    leaf = next(t for t in comps.transforms.values() if t.unique_name == "Double")
    leaf.spec.urn = "beam:transform:made_up:v1"
    coder_id = next(iter(comps.coders))
    comps.coders[coder_id].spec.urn = "beam:coder:made_up:v1"
    proto.requirements.append("beam:requirement:made_up:v1")
    env = comps.environments[leaf.environment_id]
    env.urn = "beam:env:docker:v1"
    env.payload = beam_runner_api_pb2.DockerPayload(
        container_image="apache/beam_java11_sdk:2.77.0").SerializeToString()

    with pytest.raises(UnsupportedFeatureError) as info:
        check_pipeline(proto, streaming=True)
    text = str(info.value)
    for expected in [
        "transform URN beam:transform:made_up:v1 in transform 'Double'",
        "coder beam:coder:made_up:v1",
        "pipeline requirement beam:requirement:made_up:v1",
        "non-Python SDK environment (container image apache/beam_java11_sdk:2.77.0)",
    ]:
        assert expected in text
    assert len(info.value.features) >= 4
    assert text.startswith("sparkbeam cannot run this pipeline:")


def test_support_table_covers_the_primitives() -> None:
    table = supported_transform_urns()
    for urn in ["beam:transform:impulse:v1", "beam:transform:group_by_key:v1",
                "beam:transform:flatten:v1", "beam:transform:pardo:v1"]:
        assert urn in table
    assert not any("java" in urn for urn in table)


class _Stateful(beam.DoFn):
    COUNT = userstate.CombiningValueStateSpec("n", sum)

    def process(self, kv, side, count=beam.DoFn.StateParam(COUNT)):  # type: ignore[no-untyped-def]
        count.add(1)
        yield kv


def test_streaming_refusals_come_from_the_stage_kind_table_all_at_once() -> None:
    """Every problem at once: the options' (a budget below 1, streaming over Connect, no
    checkpoint directory there); a stateful DoFn reading a side input has a streaming row now
    and is not among them. Every (kind, side inputs) pair has a row or a reason."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from sparkbeam.plan.check import STREAMING_STAGES
    from sparkbeam.plan.model import StageKind
    from sparkbeam.runner import prepare

    p = beam.Pipeline()
    # Key-value side elements too: Beam's ParDo picks the input whose type it checks for
    # keys from a set of both (apache_beam/transforms/core.py, _get_key_and_window_coder).
    side = p | "Side" >> beam.Create([("s", 0)])
    _ = (p | beam.Create([("k", 1)]).with_output_types(tuple[str, int]) | "UsesSide" >> beam.ParDo(
        _Stateful(), beam.pvalue.AsList(side)))
    proto = p.to_runner_api()
    with pytest.raises(UnsupportedFeatureError) as info:
        prepare(proto, PipelineOptions(["--streaming", "--max_items_per_batch=0",
                                        "--spark_remote=sc://cluster.invalid:15002"]))
    text = str(info.value)
    assert "3 unsupported feature(s)" in text
    assert "UsesSide" not in text  # a stateful DoFn's side inputs wait in its key's state
    assert ("a streaming pipeline in the pipeline options (Spark Connect sc://cluster.invalid:"
            "15002) (sparkbeam's streaming engine needs a classic Spark session") in text
    assert "--max_items_per_batch=0" in text
    assert "streaming without --checkpoint_dir in the pipeline options (Spark Connect" in text
    # Batch has no such refusal; every (kind, side inputs) pair Beam's SDK can run has an
    # operator (a stateful splittable DoFn it cannot: the test below).
    assert any(s.kind is StageKind.STATEFUL for s in prepare(proto, PipelineOptions()).stages)
    rows = {(kind, sides) for kind in StageKind for sides in (False, True)
            if kind is not StageKind.STATEFUL_SPLITTABLE}
    assert rows == set(STREAMING_STAGES)


class _StatefulCountUp(beam.DoFn, RestrictionProvider):
    """A splittable DoFn with user state: each claimed position counted in state."""

    SEEN = userstate.ReadModifyWriteStateSpec("seen", VarIntCoder())

    def initial_restriction(self, kv):  # type: ignore[no-untyped-def]
        return OffsetRange(0, kv[1])

    def create_tracker(self, restriction):  # type: ignore[no-untyped-def]
        return OffsetRestrictionTracker(restriction)

    def restriction_size(self, kv, restriction):  # type: ignore[no-untyped-def]
        return restriction.size()

    def process(self, kv, tracker=beam.DoFn.RestrictionParam(),  # type: ignore[no-untyped-def]
                seen=beam.DoFn.StateParam(SEEN)):
        position = tracker.current_restriction().start
        while tracker.try_claim(position):
            seen.write((seen.read() or 0) + 1)
            yield kv[0], position
            position += 1


def _stateful_splittable(p: beam.Pipeline) -> None:
    _ = p | beam.Create([("a", 2), ("b", 1)]) | "CountUp" >> beam.ParDo(_StatefulCountUp())


def test_a_splittable_dofn_with_user_state_is_refused_at_prepare_in_batch_and_streaming() -> None:
    """Beam's own runner fails on it at run time (the SDK keys its state with the wrong coder);
    sparkbeam names it at Prepare, in batch and streaming, once. When a Beam release runs it,
    the first assertion fails and the refusal should go."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from sparkbeam.runner import prepare

    with pytest.raises(Exception, match="Number of components does not match number of coders"):
        with beam.Pipeline(runner="FnApiRunner") as p:
            _stateful_splittable(p)
    p = beam.Pipeline()
    _stateful_splittable(p)
    proto = p.to_runner_api()
    for args in ([], ["--streaming"]):
        with pytest.raises(UnsupportedFeatureError) as info:
            prepare(proto, PipelineOptions([*args, "--checkpoint_dir=/tmp/unused"]))
        assert len(info.value.features) == 1, args
        assert re.search(r"a splittable DoFn with user state or timers in stage-\d+ "
                         r"\[CountUp/Process\] \(Beam's Python SDK cannot", str(info.value)), args
