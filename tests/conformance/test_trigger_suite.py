"""The TestStream cases of Beam's `apache_beam/transforms/trigger_test.py` on SparkRunner:
`TriggerPipelineTest` and the TestStream transcript suite, with --streaming where the test asks
for it. Every test that does not pass is a strict xfail with its reason (CONFORMANCE.md)."""
from __future__ import annotations

from apache_beam.transforms import trigger_test as beam_suite

from tests.conformance.gaps import mark_known_gaps
from tests.conformance.test_test_stream_suite import on_spark


class TestSparkRunnerOnTriggerPipelineSuite(on_spark(beam_suite),  # type: ignore[misc]
                                            beam_suite.TriggerPipelineTest):
    pass


class TestSparkRunnerOnTestStreamTranscripts(on_spark(beam_suite),  # type: ignore[misc]
                                             beam_suite.TestStreamTranscriptTest):
    pass


KNOWN_GAPS: dict[str, str] = {}
mark_known_gaps(TestSparkRunnerOnTriggerPipelineSuite, KNOWN_GAPS)
