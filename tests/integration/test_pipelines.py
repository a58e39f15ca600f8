"""Every pipeline of the catalogue gives on Spark exactly what FnApiRunner gives.

Run in two execution shapes: default bundles over 2 partitions, and one element per bundle over
one partition (the shape that exposes bundle-boundary bugs).
"""
from __future__ import annotations

import pytest

from tests.integration.conftest import expected_from_fnapi, run_and_collect, spark_runner
from tests.integration.pipelines import PIPELINES

SHAPES = {
    "greedy-p2": ["--parallelism=2"],
    "one-per-bundle-p1": ["--parallelism=1", "--bundle_size=1"],
}


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_same_output_as_fnapi_runner(name: str, shape: str) -> None:
    build = PIPELINES[name]
    expected = expected_from_fnapi(name, build)
    assert expected, f"{name} produced no output on FnApiRunner; the test would prove nothing"
    actual = run_and_collect(build, spark_runner(), SHAPES[shape])
    assert actual == expected
