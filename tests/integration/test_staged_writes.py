"""`flush_staged` on the shared session, with a sink that records its calls in files (tasks
run in Spark's Python workers): every staged partition goes to the sink, its batches in
order, only those before the given batch, and what was written is removed."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from apache_beam.coders import coders
from apache_beam.internal import pickler
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.runners import pipeline_context
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.windowed_value import WindowedValue

from sparkbeam.streaming.checkpoint import write_side_file
from sparkbeam.streaming.staged_writes import StagedWrite, flush_staged


@dataclass(frozen=True)
class _RecordingSink:
    log_dir: str

    def describe(self) -> str:
        return "recording"

    def write_partition(self, query_id: str, batch: int, partition: int,
                        elements: list[Any]) -> int:
        path = os.path.join(self.log_dir, f"{partition}-{batch}-{os.getpid()}")
        with open(path, "w") as f:
            json.dump({"query": query_id, "elements": [e.decode() for e in elements]}, f)
        return len(elements)


def test_staged_partitions_go_to_the_sink_in_batch_order_then_are_removed(spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    ctx = pipeline_context.PipelineContext(beam_runner_api_pb2.Components())
    coder = coders.WindowedValueCoder(coders.BytesCoder(), coders.GlobalWindowCoder())
    coder_id = ctx.coders.get_id(coder)
    components = ctx.to_runner_api().SerializeToString()
    impl = coder.get_impl()
    staged = tmp_path / "staged"
    for batch, partition, values in [(4, 0, ["a", "b"]), (5, 0, ["c"]), (5, 1, ["d"]),
                                     (6, 1, ["not yet"])]:
        write_side_file(str(staged), batch, partition, [
            impl.encode_nested(WindowedValue(v.encode(), 0, [GlobalWindow()])) for v in values])
    log_dir = tmp_path / "log"
    log_dir.mkdir()
    write = StagedWrite("Out", str(staged), pickler.dumps(_RecordingSink(str(log_dir))),
                        components, coder_id)
    assert flush_staged(spark, (write,), "q-1", before_batch=6) == 3
    calls = {}
    for name in os.listdir(log_dir):
        partition, batch, pid = name.split("-")
        with open(log_dir / name) as f:
            calls[(int(partition), int(batch))] = (json.load(f), os.path.getmtime(log_dir / name))
    assert {k: v[0]["elements"] for k, v in calls.items()} == {
        (0, 4): ["a", "b"], (0, 5): ["c"], (1, 5): ["d"]}
    assert {v[0]["query"] for v in calls.values()} == {"q-1"}
    assert calls[(0, 4)][1] <= calls[(0, 5)][1]  # a partition's batches in order
    assert sorted(os.listdir(staged)) == ["batch-0000000006-part-00001"]
    assert flush_staged(spark, (write,), "q-1", before_batch=6) == 0  # nothing left
