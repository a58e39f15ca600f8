"""Streaming inferred from the graph (`sparkbeam.mode`) and the pipeline fingerprint a
checkpoint directory records (`plan.fingerprint`, `streaming.pipeline_record`)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import typing

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_stream import TestStream as Events
from apache_beam.transforms import trigger, window
from apache_beam.transforms.periodicsequence import PeriodicImpulse
from google.protobuf import struct_pb2

from sparkbeam.jobservice.job import _is_streaming
from sparkbeam.mode import BATCH_EXPERIMENT, inferred_streaming
from sparkbeam.plan.fingerprint import dumps, fingerprint_differences, pipeline_fingerprint
from sparkbeam.runner import prepare
from sparkbeam.streaming.pipeline_record import checkpoint_problem, record_pipeline


def _proto(build):  # type: ignore[no-untyped-def]
    p = beam.Pipeline()
    build(p)
    return p.to_runner_api()


def _batch(p):  # type: ignore[no-untyped-def]
    return p | beam.Create([1, 2]) | beam.Map(lambda x: (x % 2, x)) | beam.GroupByKey()


def _test_stream(p):  # type: ignore[no-untyped-def]
    return (p | "Events" >> Events().add_elements([("a", 1)]).advance_watermark_to_infinity()
            | beam.WindowInto(window.FixedWindows(10)) | beam.GroupByKey())


def _periodic(p):  # type: ignore[no-untyped-def]
    return p | PeriodicImpulse(start_timestamp=0, stop_timestamp=2, fire_interval=1)


def test_streaming_is_inferred_from_a_test_stream_or_an_unbounded_pcollection() -> None:
    assert inferred_streaming(_proto(_batch), streaming=False, experiments=[]) is None
    assert inferred_streaming(_proto(_test_stream), streaming=False, experiments=[]) == (
        "it reads the TestStream 'Events'")
    reason = inferred_streaming(_proto(_periodic), streaming=False, experiments=[])
    assert reason is not None and reason.startswith("its PCollection '") and (
        reason.endswith("' is unbounded"))
    # The flag given, or Dataflow's experiment keeping batch: nothing to infer.
    assert inferred_streaming(_proto(_test_stream), streaming=True, experiments=[]) is None
    assert inferred_streaming(_proto(_periodic), streaming=False,
                              experiments=[BATCH_EXPERIMENT]) is None


def test_prepare_switches_the_options_to_streaming_as_dataflow_does() -> None:
    options = PipelineOptions(["--checkpoint_dir=/nonexistent/sparkbeam-ckpt"])
    plan = prepare(_proto(_test_stream), options)
    assert options.view_as(beam.options.pipeline_options.StandardOptions).streaming
    assert plan.streaming_reason == "it reads the TestStream 'Events'"
    assert json.loads(plan.fingerprint)["transforms"]
    batch = prepare(_proto(_batch), PipelineOptions())
    assert (batch.streaming_reason, batch.fingerprint) == ("", "")


def test_the_job_server_lets_an_inferred_stream_drain() -> None:
    flag = struct_pb2.Struct()
    assert _is_streaming(_proto(_test_stream), flag)
    assert not _is_streaming(_proto(_batch), flag)
    flag.update({"beam:option:streaming:v1": True})
    assert _is_streaming(_proto(_batch), flag)
    kept = struct_pb2.Struct()
    kept.update({"beam:option:experiments:v1": [BATCH_EXPERIMENT]})
    assert not _is_streaming(_proto(_test_stream), kept)


def _fingerprint(build):  # type: ignore[no-untyped-def]
    proto = _proto(build)
    options = PipelineOptions(["--streaming", "--checkpoint_dir=/nonexistent/sparkbeam-ckpt"])
    return pipeline_fingerprint(proto, prepare(proto, options))


def _windowed(size, accumulating=False):  # type: ignore[no-untyped-def]
    def build(p):  # type: ignore[no-untyped-def]
        mode = (trigger.AccumulationMode.ACCUMULATING if accumulating
                else trigger.AccumulationMode.DISCARDING)
        return (p | "Events" >> Events().add_elements([("a", 1)])
                .advance_watermark_to_infinity()
                | "Window" >> beam.WindowInto(window.FixedWindows(size),
                                              trigger=trigger.AfterWatermark(),
                                              accumulation_mode=mode)
                | "Group" >> beam.GroupByKey() | "Format" >> beam.Map(lambda kv: str(kv)))
    return build


def test_the_same_pipeline_has_the_same_fingerprint_in_another_process() -> None:
    here = _fingerprint(_windowed(10))
    code = (
        "import json\n"
        "from tests.unit.test_streaming_mode import _fingerprint, _windowed\n"
        "print(json.dumps(_fingerprint(_windowed(10))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == json.loads(json.dumps(here))
    assert fingerprint_differences(here, _fingerprint(_windowed(10))) == []


@pytest.mark.parametrize("other, difference", [
    (_windowed(20), r"PCollection '\d*Window.None' has another windowing"),
    (_windowed(10, accumulating=True), r"PCollection '\d*Window.None' has another windowing"),
    (_test_stream, r"transform 'Group' is gone"),
])
def test_a_changed_pipeline_is_told_apart_naming_what_changed(other, difference) -> None:  # type: ignore[no-untyped-def]
    found = fingerprint_differences(_fingerprint(_windowed(10)), _fingerprint(other))
    assert any(re.fullmatch(difference, f) for f in found), found


def test_a_checkpoint_directory_keeps_its_first_pipeline(tmp_path) -> None:
    first, second = _fingerprint(_windowed(10)), _fingerprint(_windowed(20))
    directory = str(tmp_path / "ckpt")
    assert checkpoint_problem(directory, first) is None  # new
    record_pipeline(directory, dumps(first))
    record_pipeline(directory, dumps(second))  # a restart never rewrites the record
    assert checkpoint_problem(directory, first) is None
    problem = checkpoint_problem(directory, second)
    assert problem is not None and re.match(
        rf"checkpoint directory {re.escape(directory)} belongs to another pipeline \(.*"
        r"PCollection '\d*Window.None' has another windowing", problem), problem


Pair = typing.NamedTuple("Pair", [("key", str), ("value", int)])  # noqa: UP014
beam.coders.registry.register_coder(Pair, beam.coders.RowCoder)


def test_a_schemas_random_id_is_not_part_of_the_fingerprint() -> None:
    """Beam gives a Python type's schema a fresh random id in each process: a restart of the
    same code must still match its checkpoint's record."""
    from apache_beam.portability import common_urns
    from apache_beam.portability.api import schema_pb2

    def build(p):  # type: ignore[no-untyped-def]
        return _test_stream(p) | beam.Map(lambda kv: Pair(kv[0], len(kv[1]))).with_output_types(
            Pair)

    proto = _proto(build)
    plan = prepare(proto, PipelineOptions(["--checkpoint_dir=/nonexistent/sparkbeam-ckpt"]))
    again = type(proto).FromString(proto.SerializeToString())
    rows = [c for c in again.components.coders.values()
            if c.spec.urn == common_urns.coders.ROW.urn]
    assert rows
    for coder in rows:
        schema = schema_pb2.Schema.FromString(coder.spec.payload)
        schema.id = "another-process"
        coder.spec.payload = schema.SerializeToString()
    assert fingerprint_differences(pipeline_fingerprint(proto, plan),
                                   pipeline_fingerprint(again, plan)) == []
    for coder in rows:
        schema = schema_pb2.Schema.FromString(coder.spec.payload)
        schema.fields[1].name = "count"
        coder.spec.payload = schema.SerializeToString()
    assert fingerprint_differences(pipeline_fingerprint(proto, plan),
                                   pipeline_fingerprint(again, plan))
