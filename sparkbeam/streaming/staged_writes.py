"""Exactly-once writes of a streaming job (an exactly-once WriteToKafka, `io/kafka_write.py`).

The elements a micro-batch gives a write are staged in the checkpoint directory by the tasks
that compute them, one file per (micro-batch, partition), replacing what an earlier attempt
staged (`checkpoint.write_side_file`). A micro-batch writes out what earlier, committed
micro-batches staged (`flush_staged`, called from the query's sink): one Spark task per
(write, staged partition), which hands that partition's elements, batch after batch, to the
write's sink (`PartitionSink`: one transaction each, skipped if already committed). Then the
staged files go. Staging first is what makes a replay safe: a replayed micro-batch may compute
different elements (a read that stops on the wall clock reads a different number of records),
but only the elements of a committed micro-batch are ever written.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa
from apache_beam.internal import pickler

from sparkbeam.engine.context import pipeline_context
from sparkbeam.plan.native_spark import RunnerWrite
from sparkbeam.streaming.checkpoint import CheckpointLayout, read_side_file


class PartitionSink(Protocol):
    """What a runner-executed exactly-once write does with one staged partition."""

    def describe(self) -> str: ...

    def write_partition(self, query_id: str, batch: int, partition: int,
                        elements: list[Any]) -> int: ...


@dataclass(frozen=True)
class StagedWrite:
    transform: str
    directory: str  # `CheckpointLayout.staged_dir`
    payload: bytes  # the pickled PartitionSink
    components: bytes
    coder_id: str  # the windowed coder of the staged elements


def staged_writes(layout: CheckpointLayout, writes: tuple[RunnerWrite, ...], components: bytes
                  ) -> tuple[StagedWrite, ...]:
    """The plan's runner writes (`Plan.kafka_writes`) with their staging directories."""
    return tuple(StagedWrite(w.transform, layout.staged_dir(n), w.payload, components,
                             w.coder_id) for n, w in enumerate(writes))


def _staged(directory: str, before_batch: int) -> dict[int, list[tuple[int, str]]]:
    """partition -> [(batch, file name)] in batch order, of the batches before `before_batch`."""
    try:
        names = sorted(n for n in os.listdir(directory) if n.startswith("batch-"))
    except FileNotFoundError:
        return {}
    out: dict[int, list[tuple[int, str]]] = {}
    for name in names:
        _, batch, _, partition = name.split("-")
        if int(batch) < before_batch:
            out.setdefault(int(partition), []).append((int(batch), name))
    return out


@dataclass(frozen=True)
class _PartitionWriter:
    """A Spark task per (write, staged partition): row i of `spark.range` is `work[i]`."""

    writes: tuple[StagedWrite, ...]
    work: tuple[tuple[int, int, tuple[tuple[int, str], ...]], ...]  # write, partition, files
    query_id: str

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for index in batch.column(0).to_pylist():
                self._write(*self.work[index])
        yield from ()

    def _write(self, n: int, partition: int, files: tuple[tuple[int, str], ...]) -> None:
        write = self.writes[n]
        sink: PartitionSink = pickler.loads(write.payload)
        impl = pipeline_context(write.components).coders[write.coder_id].get_impl()
        for batch, name in files:
            values = read_side_file(os.path.join(write.directory, name))
            elements = [impl.decode_nested(v).value for v in values]
            sink.write_partition(self.query_id, batch, partition, elements)


def query_id(layout: CheckpointLayout) -> str:
    """The query's id, which Spark keeps in the checkpoint across restarts."""
    with open(os.path.join(layout.root, "metadata")) as f:
        return str(json.load(f)["id"])


def flush_staged(spark: Any, writes: tuple[StagedWrite, ...], query: str,
                 before_batch: int) -> int:
    """Writes out what the micro-batches before `before_batch` staged, then
    removes it; returns the number of staged files written."""
    work = [(n, partition, tuple(files)) for n, write in enumerate(writes)
            for partition, files in sorted(_staged(write.directory, before_batch).items())]
    if not work:
        return 0
    writer = _PartitionWriter(writes, tuple(work), query)
    from pyspark.sql import types as T  # the driver's only use of pyspark in this module

    ids = T.StructType([T.StructField("id", T.LongType())])
    (spark.range(len(work), numPartitions=len(work))
     .mapInArrow(writer, ids).write.format("noop").mode("overwrite").save())
    for n, _, files in work:
        for _, name in files:
            os.remove(os.path.join(writes[n].directory, name))
    return sum(len(files) for _, _, files in work)
