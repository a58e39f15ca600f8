"""The roots of a streaming job as one Python streaming source: partitions are endpoints.

`latestOffset` plans the next micro-batch from the script (`script.py`): each endpoint's next
items, and the runner's watermark and processing time before and after them, all in the offset
Spark logs. Once the job's drain marker exists, offsets stop advancing and carry the final
watermark (`script.offset_for`). Every call returns a new offset (its `tick` grows), so batches
keep coming while the query runs: keys holding Beam timers are woken each batch even when no
data arrives.
"""
from __future__ import annotations

import base64
import os
import pickle
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit
from pyspark.sql.types import StructType

from sparkbeam.streaming.script import Script, offset_for

SCHEMA = "tag int, key binary, value binary"


@dataclass(frozen=True)
class EndpointItems(InputPartition):  # type: ignore[misc]
    """Items [start, end) of one endpoint: one Spark task of the batch."""

    endpoint: str
    start: int
    end: int


class BeamStreamReader(DataSourceStreamReader):  # type: ignore[misc]
    def __init__(self, script: Script, drain_marker: str = "") -> None:
        self.script = script
        self.drain_marker = drain_marker  # once this file exists, the job drains

    def initialOffset(self) -> dict:  # noqa: N802 - Spark's name
        return offset_for(self.script, {}, {}, _now_micros(), 0) | {"done": False}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:  # noqa: N802
        positions = self.script.next_positions(start.get("pos", {}))
        drained = bool(self.drain_marker) and os.path.exists(self.drain_marker)
        return offset_for(self.script, positions, start, _now_micros(), int(start["tick"]) + 1,
                          drained=drained)

    def partitions(self, start: dict, end: dict) -> list[EndpointItems]:
        begin = start.get("pos", {})
        parts = [
            EndpointItems(name, int(begin.get(name, 0)), int(stop))
            for name, stop in sorted(end["pos"].items())
            if int(stop) > int(begin.get(name, 0))
        ]
        return parts or [EndpointItems("", 0, 0)]

    def read(self, partition: InputPartition) -> Iterator[tuple[int, Any, bytes]]:
        assert isinstance(partition, EndpointItems)
        if partition.endpoint:
            yield from self.script.rows(partition.endpoint, partition.start, partition.end)

    def commit(self, end: dict) -> None:
        pass


class BeamSource(DataSource):  # type: ignore[misc]
    """`spark.readStream.format("sparkbeam_beam").option("script", encode(script))`."""

    @classmethod
    def name(cls) -> str:
        return "sparkbeam_beam"

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: StructType) -> BeamStreamReader:  # noqa: N802
        return BeamStreamReader(pickle.loads(base64.b64decode(self.options["script"])),
                                self.options.get("drain_marker", ""))


def encode(script: Script) -> str:
    return base64.b64encode(pickle.dumps(script)).decode()


def _now_micros() -> int:
    return int(time.time() * 1_000_000)
