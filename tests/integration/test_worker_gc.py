"""The Python workers sparkbeam's daemon forks collect their youngest generation every 10,000
allocations (`execute/daemon.py`'s GEN0_THRESHOLD), not Python's 700."""
from __future__ import annotations

import gc

import apache_beam as beam

from sparkbeam import SparkRunner
from tests.integration.conftest import run_and_collect


def _threshold(_: object) -> int:
    return gc.get_threshold()[0]


def test_python_workers_collect_their_youngest_generation_less_often() -> None:
    def build(p):  # type: ignore[no-untyped-def]
        # After a GroupByKey: a Spark task's worker runs it, not the driver.
        return (p | beam.Create([(1, 1), (2, 2)]) | beam.GroupByKey()
                | "Threshold" >> beam.Map(_threshold))

    assert run_and_collect(build, SparkRunner()) == ["10000", "10000"]
    assert gc.get_threshold()[0] != 10_000  # the driver (this process) keeps its own
