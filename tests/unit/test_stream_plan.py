"""An exactly-once WriteToKafka is lifted out of a streaming plan as a write the engine does
itself; in batch it stays Beam's expansion (a transaction per bundle). The staged files of
such a write are grouped per partition, in batch order."""
from __future__ import annotations

import os

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing import test_stream

from sparkbeam.errors import UnsupportedFeatureError
from sparkbeam.io.kafka_write import TransactionalSink, WriteToKafka
from sparkbeam.runner import prepare
from sparkbeam.streaming.staged_writes import _staged


def _proto(streaming: bool, groups: tuple[str, ...] = ("job-1",)):  # type: ignore[no-untyped-def]
    p = beam.Pipeline()
    source = (p | test_stream.TestStream().add_elements([b"a", b"b"]) if streaming
              else p | beam.Create([b"a", b"b"]))
    pairs = source | "Pair" >> beam.Map(lambda v: (None, v))
    for n, group in enumerate(groups):
        _ = pairs | ("Out" if n == 0 else f"Out{n}") >> WriteToKafka(
            {"bootstrap.servers": "127.0.0.1:9"}, "out", exactly_once=True,
            sink_group_id=group)
    return p.to_runner_api()


def test_in_streaming_the_write_leaves_the_stages_for_the_engine(tmp_path) -> None:  # type: ignore[no-untyped-def]
    plan = prepare(_proto(True), PipelineOptions([f"--checkpoint_dir={tmp_path}"]))
    (write,) = plan.kafka_writes
    assert write.transform == "Out"
    assert not any("Out" in name for s in plan.stages for name in s.transforms)
    producer = next(s for s in plan.stages if any(o.buffer_id == write.buffer_id
                                                  for o in s.outputs))
    assert "Pair" in producer.transforms
    sink = WriteToKafka.from_runner_api_parameter(None, write.payload, None)
    assert (sink.topic, sink.sink_group_id, sink.exactly_once) == ("out", "job-1", True)
    assert plan.decisions == ("Out: written exactly once, in Kafka transactions per committed "
                              "micro-batch",)


def test_two_writes_sharing_a_sink_group_are_refused_at_prepare(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(UnsupportedFeatureError,
                       match=r"exactly-once writes sharing sink_group_id 'job-1' in transform "
                             r"'Out', transform 'Out2' \(give each WriteToKafka"):
        prepare(_proto(True, ("job-1", "job-2", "job-1")),
                PipelineOptions([f"--checkpoint_dir={tmp_path}"]))


def test_in_batch_the_write_runs_its_expansion() -> None:
    plan = prepare(_proto(False), PipelineOptions([]))
    assert plan.kafka_writes == ()
    assert any("Out/Produce" in name for s in plan.stages for name in s.transforms)


def test_staged_files_are_grouped_per_partition_in_batch_order(tmp_path) -> None:  # type: ignore[no-untyped-def]
    for name in ["batch-0000000010-part-00001", "batch-0000000009-part-00001",
                 "batch-0000000009-part-00000", "batch-0000000011-part-00000", ".tmp-x"]:
        (tmp_path / name).write_bytes(b"")
    assert _staged(str(tmp_path), 11) == {
        0: [(9, "batch-0000000009-part-00000")],
        1: [(9, "batch-0000000009-part-00001"), (10, "batch-0000000010-part-00001")]}
    assert sorted(_staged(str(tmp_path), 1 << 40)) == [0, 1]
    assert _staged(os.path.join(str(tmp_path), "missing"), 1 << 40) == {}


def test_the_sink_says_where_it_writes() -> None:
    sink = TransactionalSink({"bootstrap.servers": "h:1"}, "out", "job-1", 5.0)
    assert sink.describe() == "sink group 'job-1', topic 'out' at bootstrap.servers=h:1"
