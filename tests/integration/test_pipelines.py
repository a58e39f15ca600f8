"""Every pipeline of the catalogue gives on Spark exactly what FnApiRunner gives.

Run in two execution shapes: default bundles over 2 partitions, and one element per bundle over
one partition (the shape that exposes bundle-boundary bugs).
"""
from __future__ import annotations

import pytest

from tests.integration.conftest import (
    expected_from_fnapi,
    run_and_collect_with_result,
    spark_runner,
)
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
    actual, result = run_and_collect_with_result(build, spark_runner(), SHAPES[shape])
    assert actual == expected
    # Each pipeline (ending in WriteToText) runs as one Spark job, plus one per side input the
    # driver collects; WriteToText's initialisation and finalisation run in the driver.
    assert result.spark_jobs <= SPARK_JOBS.get(name, 1), result.spark_jobs


# The pipelines whose side inputs come from Spark stages: their bound is 2 Spark jobs.
SPARK_JOBS = {
    "combine_globally_empty": 2,  # CombineGlobally's default value is a side input
    "combine_globally_mean": 2,
    "side_inputs_all_kinds": 2,
    "windowed_side_inputs": 2,
}


# Pipelines with keyed stages (GroupByKey, CoGroupByKey, combining, windows merged per key,
# state and timers), run with no bits of the shuffle's sort hash: every key of a partition
# shares it, so `engine/key_runs.py` must keep all of them apart; and once with Arrow batches
# of one row, so runs cross batch boundaries.
KEYED = ["group_by_key", "co_group_by_key", "combine_per_key", "session_windows",
         "sliding_windows", "triggered_windows", "stateful_bag_combining_timers",
         "stateful_ordered_list_state"]
COLLIDING = {**SHAPES, "one-row-batches": ["--parallelism=2", "--arrow_batch_bytes=1"]}


@pytest.mark.parametrize("shape", list(COLLIDING))
@pytest.mark.parametrize("name", KEYED)
def test_keys_that_share_a_sort_hash_give_fnapi_runners_output(
        name: str, shape: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from sparkbeam.execute import dataset

    monkeypatch.setattr(dataset, "ORDER_HASH_MASK", 0)
    build = PIPELINES[name]
    actual, _ = run_and_collect_with_result(build, spark_runner(), COLLIDING[shape])
    assert actual == expected_from_fnapi(name, build)


def test_a_stage_with_more_inputs_than_the_sort_holds_is_sorted_by_key_and_input(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The (key, input) sort of stages with 65,535 inputs or more, without building one: the
    # bound lowered to one input, so every keyed stage takes that path.
    from sparkbeam.execute import dataset

    monkeypatch.setattr(dataset, "MAX_ORDERED_INPUTS", 1)
    for name in ("co_group_by_key", "stateful_bag_combining_timers"):
        actual, _ = run_and_collect_with_result(PIPELINES[name], spark_runner(),
                                                SHAPES["greedy-p2"])
        assert actual == expected_from_fnapi(name, PIPELINES[name])
