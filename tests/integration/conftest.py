from __future__ import annotations

import os
from collections.abc import Callable

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.fn_api_runner import FnApiRunner

from sparkbeam import SparkRunner
from tests.conftest import shared_spark
from tests.integration.pipelines import _tmp


@pytest.fixture(autouse=True, scope="session")
def _spark_session():
    return shared_spark()


def run_and_collect(build: Callable, runner, args: list[str] | None = None) -> list[str]:
    """Runs build(p) on `runner`; returns the repr of every output element, sorted."""
    return run_and_collect_with_result(build, runner, args)[0]


def run_and_collect_with_result(build: Callable, runner, args: list[str] | None = None):
    """run_and_collect, and the finished run's PipelineResult."""
    # A directory of its own: Beam's WriteToText finds its files at finalisation by walking
    # the output's directory (recursively, each file's size and time), so in a directory
    # shared by every run each write cost as much as all the files written before it.
    out = os.path.join(_tmp("out"), "out")
    os.makedirs(os.path.dirname(out))
    p = beam.Pipeline(runner=runner, options=PipelineOptions(args or []))
    (build(p) | "ToText" >> beam.Map(repr)
     | "WriteOut" >> beam.io.WriteToText(out, shard_name_template="-SS-of-NN"))
    result = p.run()
    result.wait_until_finish()
    lines: list[str] = []
    directory = os.path.dirname(out)
    for name in os.listdir(directory):
        if name.startswith(os.path.basename(out)):
            with open(os.path.join(directory, name)) as f:
                lines.extend(line.rstrip("\n") for line in f)
    return sorted(lines), result


_EXPECTED: dict[str, list[str]] = {}


def expected_from_fnapi(name: str, build: Callable) -> list[str]:
    if name not in _EXPECTED:
        _EXPECTED[name] = run_and_collect(build, FnApiRunner())
    return _EXPECTED[name]


def spark_runner() -> SparkRunner:
    return SparkRunner()


@pytest.fixture(scope="module")
def kafka():  # type: ignore[no-untyped-def]
    """A real Kafka broker on 127.0.0.1 for the module's tests (`tests/support/kafka.py`)."""
    from tests.support.kafka import KafkaBroker

    broker = KafkaBroker().start()
    yield broker
    broker.stop()
