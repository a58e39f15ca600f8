"""Malformed pipeline protos are refused at Prepare with every problem named (no Spark)."""
from __future__ import annotations

import contextlib
from typing import Any

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.portability.api import beam_runner_api_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from sparkbeam.errors import InvalidPipelineError, SparkBeamError
from sparkbeam.plan.validate import MAX_COMPOSITE_DEPTH, check_structure
from sparkbeam.runner import prepare

pytestmark = pytest.mark.timeout(120)


def _word_count() -> beam_runner_api_pb2.Pipeline:
    p = beam.Pipeline()
    _ = (p | beam.Create(["a b", "b"]) | beam.FlatMap(str.split)
         | beam.combiners.Count.PerElement() | beam.Map(str))
    return p.to_runner_api()


GOOD = _word_count()


def copy() -> beam_runner_api_pb2.Pipeline:
    proto = beam_runner_api_pb2.Pipeline()
    proto.CopyFrom(GOOD)
    return proto


def test_a_pipeline_beam_builds_is_well_formed() -> None:
    check_structure(GOOD)


def test_every_dangling_reference_is_named_in_one_error() -> None:
    proto = copy()
    pcoll_id = next(iter(proto.components.pcollections))
    coder_id = proto.components.pcollections[pcoll_id].coder_id
    del proto.components.pcollections[pcoll_id]
    proto.components.coders["kv"].spec.urn = "beam:coder:kv:v1"
    proto.components.coders["kv"].component_coder_ids.extend(["nowhere", coder_id])
    proto.root_transform_ids.append("ghost")
    with pytest.raises(InvalidPipelineError, match="the pipeline proto is malformed") as info:
        check_structure(proto)
    text = str(info.value)
    assert f"names PCollection {pcoll_id!r}, which is not defined" in text
    assert "coder 'kv': component coder 'nowhere' is not defined" in text
    assert "the pipeline's roots name transform 'ghost', which is not defined" in text


def test_no_transforms_is_refused() -> None:
    with pytest.raises(InvalidPipelineError, match="has no root transforms"):
        check_structure(beam_runner_api_pb2.Pipeline())


def nest(proto: beam_runner_api_pb2.Pipeline, levels: int) -> beam_runner_api_pb2.Pipeline:
    """`proto` with its roots wrapped in `levels` composites, one inside the other."""
    below = list(proto.root_transform_ids)
    for level in range(levels):
        composite = proto.components.transforms[f"nest{level}"]
        composite.unique_name = f"nest{level}"
        composite.subtransforms.extend(below)
        below = [f"nest{level}"]
    del proto.root_transform_ids[:]
    proto.root_transform_ids.extend(below)
    return proto


def test_composites_nested_ten_thousand_deep_are_refused_without_recursion() -> None:
    proto = nest(copy(), 10_000)
    with pytest.raises(InvalidPipelineError,
                       match=f"nest deeper than {MAX_COMPOSITE_DEPTH} levels"):
        prepare(proto, PipelineOptions())


def test_cycles_in_the_transform_tree_and_in_coders_are_refused() -> None:
    proto = copy()
    root = proto.root_transform_ids[0]
    proto.components.transforms[root].subtransforms.append(root)
    a, b = proto.components.coders["a"], proto.components.coders["b"]
    a.spec.urn = b.spec.urn = "beam:coder:kv:v1"
    a.component_coder_ids.append("b")
    b.component_coder_ids.append("a")
    with pytest.raises(InvalidPipelineError) as info:
        check_structure(proto)
    assert f"transform {root!r} appears twice in the transform tree" in str(info.value)
    assert "coders form a cycle: 'a' -> 'b' -> 'a'" in str(info.value) or (
        "coders form a cycle: 'b' -> 'a' -> 'b'" in str(info.value))


_URNS = ["", "beam:coder:kv:v1", "beam:coder:bytes:v1", "beam:coder:windowed_value:v1",
         "beam:transform:pardo:v1", "beam:transform:group_by_key:v1", "beam:transform:flatten:v1"]


def _mangle(proto: beam_runner_api_pb2.Pipeline, data: hs.DataObject) -> None:
    """One structural change a broken client could make: a component deleted, a reference
    pointed elsewhere, a URN or payload replaced, a composite emptied."""
    comps = proto.components

    def pick(mapping: Any) -> Any:
        if not mapping:  # an earlier change deleted the last of them: nothing to change
            raise _NothingLeft
        return data.draw(hs.sampled_from(sorted(mapping)))

    with contextlib.suppress(_NothingLeft):
        _mangle_one(comps, data, pick)


class _NothingLeft(Exception):
    pass


def _mangle_one(comps: Any, data: hs.DataObject, pick: Any) -> None:
    how = data.draw(hs.sampled_from(["delete", "payload", "urn", "port", "coder", "window",
                                     "hollow"]))
    if how == "delete":
        kind = data.draw(hs.sampled_from(["transforms", "pcollections", "coders",
                                          "windowing_strategies", "environments"]))
        mapping = getattr(comps, kind)
        if mapping:
            del mapping[pick(mapping)]
    elif how in ("payload", "urn"):
        mapping = data.draw(hs.sampled_from([comps.transforms, comps.coders]))
        spec = mapping[pick(mapping)].spec
        if how == "payload":
            spec.payload = data.draw(hs.binary(max_size=32))
        else:
            spec.urn = data.draw(hs.sampled_from(_URNS))
    elif how == "port":
        transform = comps.transforms[pick(comps.transforms)]
        ports = transform.inputs if data.draw(hs.booleans()) else transform.outputs
        ports[data.draw(hs.sampled_from(["x", "None", "out"]))] = pick(comps.pcollections)
    elif how == "coder":
        comps.pcollections[pick(comps.pcollections)].coder_id = pick(comps.coders)
    elif how == "window":
        strategy = comps.windowing_strategies[pick(comps.windowing_strategies)]
        strategy.window_coder_id = pick(comps.coders)
    else:
        del comps.transforms[pick(comps.transforms)].subtransforms[:]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hs.data())
def test_any_mangled_proto_is_refused_with_our_error_or_prepared(data: hs.DataObject) -> None:
    """A real pipeline proto with up to three structural changes: Prepare either plans it or
    raises a SparkBeamError saying why; no other exception escapes (a job server turns
    those into INTERNAL errors)."""
    proto = copy()
    for _ in range(data.draw(hs.integers(1, 3))):
        _mangle(proto, data)
    with contextlib.suppress(SparkBeamError):
        prepare(proto, PipelineOptions())
