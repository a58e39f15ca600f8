"""The Prepare-time check lists every unsupported feature in one error."""
from __future__ import annotations

import apache_beam as beam
import pytest
from apache_beam.portability.api import beam_runner_api_pb2

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
