"""Beam's own FnApiRunnerTest suite, run on SparkRunner.

Every test that does not pass is a strict xfail with its reason (listed in CONFORMANCE.md).
"""
from __future__ import annotations

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.fn_api_runner import fn_runner_test as beam_suite

from tests.conformance.gaps import REBATCH_WARNING, mark_known_gaps
from sparkbeam import SparkRunner

# test name -> why it does not pass on SparkRunner.
KNOWN_GAPS: dict[str, str] = {
    "test_batch_rebatch_pardos": REBATCH_WARNING,
}


class TestSparkRunnerOnFnApiSuite(beam_suite.FnApiRunnerTest):
    def create_pipeline(self, is_drain=False):
        return beam.Pipeline(
            runner=SparkRunner(is_drain=is_drain), options=PipelineOptions(["--parallelism=2"])
        )


mark_known_gaps(TestSparkRunnerOnFnApiSuite, KNOWN_GAPS)
