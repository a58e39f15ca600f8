"""Beam's `StatefulDoFnOnDirectRunnerTest` (`apache_beam/transforms/userstate_test.py`) on
SparkRunner, streaming where the pipeline has a TestStream.

The suite records outputs into a list on its TestCase class from inside a DoFn, which only works
when the DoFn runs in the test's process. Here the recording DoFn appends each record, with the
time it was made, to files that the pipeline reads back into that list once the job has finished
(in the order they were made). Every test that does not pass is a strict xfail with its reason
(CONFORMANCE.md)."""
from __future__ import annotations

import pytest

import glob
import os
import pickle
import tempfile
import time
from typing import Any

import apache_beam as beam
from apache_beam.transforms import userstate_test as beam_suite

from tests.conformance.gaps import mark_known_gaps
from tests.conformance.test_test_stream_suite import SparkTestPipeline, on_spark

_RECORDS: list[str] = []  # the directory records go to while a test runs


class _RecordToFiles(beam.DoFn):
    def __init__(self, directory: str) -> None:
        self.directory = directory

    def process(self, element: Any) -> None:
        data = pickle.dumps((time.time_ns(), element))
        with open(os.path.join(self.directory, f"{os.getpid()}.rec"), "ab") as f:
            f.write(len(data).to_bytes(4, "big") + data)


def _read_records(directory: str) -> list[Any]:
    records = []
    for path in glob.glob(os.path.join(directory, "*.rec")):
        with open(path, "rb") as f:
            blob = f.read()
        at = 0
        while at < len(blob):
            n = int.from_bytes(blob[at:at + 4], "big")
            records.append(pickle.loads(blob[at + 4:at + 4 + n]))
            at += 4 + n
    return [element for _, element in sorted(records, key=lambda r: r[0])]


class _RecordingPipeline(SparkTestPipeline):
    def run(self, test_runner_api="AUTO"):  # type: ignore[no-untyped-def]
        result = super().run(test_runner_api)
        if _RECORDS:
            beam_suite.StatefulDoFnOnDirectRunnerTest.all_records[:] = _read_records(_RECORDS[0])
        return result


@pytest.mark.streaming_full
class TestSparkRunnerOnUserStateSuite(on_spark(beam_suite, _RecordingPipeline),  # type: ignore[misc]
                                      beam_suite.StatefulDoFnOnDirectRunnerTest):
    def setUp(self) -> None:  # noqa: N802
        super().setUp()
        _RECORDS[:] = [tempfile.mkdtemp(prefix="sparkbeam-records-")]
        self.addCleanup(_RECORDS.clear)

    def record_dofn(self) -> beam.DoFn:
        return _RecordToFiles(_RECORDS[0])


KNOWN_GAPS: dict[str, str] = {
    "test_generate_sequence_with_realtime_timer": (
        "not a SparkRunner test: it builds beam.Pipeline(argv=['--runner=DirectRunner']) itself, "
        "so it runs on the DirectRunner and the records it asserts on are never read back"
    ),
}
mark_known_gaps(TestSparkRunnerOnUserStateSuite, KNOWN_GAPS)
