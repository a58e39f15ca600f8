"""The roots of a streaming job as one Python streaming source: partitions are endpoints.

`latestOffset` plans the next micro-batch from the script (`script.py`): each endpoint's next
items, and the runner's watermark and processing time before and after them, all in the offset
Spark logs. Under a work budget the endpoints are the script's and the splittable stages'
spread keys (`splittable.py`): those run in `transformWithState`, so their share of the batch
(what their bundles may output) is recorded in the offset for them to read. Once the job's
drain marker exists, offsets stop advancing and carry the final watermark
(`script.offset_for`). Every call returns a new offset (its `tick` grows), so batches
keep coming while the query runs: keys holding Beam timers are woken each batch even when no
data arrives.

A job that follows the wall clock (it reads a live source: a splittable reader, a Spark stream)
admits nothing from the script in its first micro-batch: Spark starts that batch's Python
workers, our stages unpack their plans and the state stores open with no event waiting on them,
so the first event read meets warm workers. (A Spark stream's own rows are Spark's source's to
admit: they are not held.) A scripted job (TestStream, Impulse) has no arrival times to
protect and admits its first event at once.
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

from sparkbeam.streaming.admission import BatchAdmission
from sparkbeam.streaming.budget import WorkBudget
from sparkbeam.streaming.script import Script, offset_for
from sparkbeam.streaming.spark_streams import StreamClock, stream_watermark

SCHEMA = "tag int, key binary, value binary"
_UNLIMITED = 1 << 62  # a budget dimension that is not set


@dataclass(frozen=True)
class EndpointItems(InputPartition):  # type: ignore[misc]
    """Items [start, end) of one endpoint: one Spark task of the batch."""

    endpoint: str
    start: int
    end: int


class BeamStreamReader(DataSourceStreamReader):  # type: ignore[misc]
    def __init__(self, script: Script, drain_marker: str = "",
                 budget: WorkBudget | None = None, splittable: tuple[str, ...] = (),
                 streams: tuple[StreamClock, ...] = ()) -> None:
        self.script = script
        self.drain_marker = drain_marker  # once this file exists, the job drains
        self.budget = budget
        self.splittable = splittable  # endpoints of splittable stages: one per spread key
        self.admission = BatchAdmission(budget) if budget is not None else None
        self.streams = streams  # Spark streams read beside the script (`spark_streams.py`)
        # The planning process's first batch warms the query (module docstring); a restarted
        # query starts cold again, so it warms again.
        self._warming = not script.test_clock

    def __getstate__(self) -> dict[str, Any]:
        # Spark pickles the reader to run `read` on executors: they need the script only.
        return {"script": self.script, "drain_marker": self.drain_marker, "budget": self.budget,
                "splittable": self.splittable, "streams": self.streams}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["script"], state["drain_marker"], state["budget"],  # type: ignore[misc]
                      state["splittable"], state["streams"])

    def _streams(self, previous: dict, processing: int) -> tuple[int, dict]:
        return stream_watermark(self.streams, previous, processing)

    def initialOffset(self) -> dict:  # noqa: N802 - Spark's name
        return offset_for(self.script, {}, {}, _now_micros(), 0,
                          streams=self._streams if self.streams else None) | {"done": False}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:  # noqa: N802
        begin = start.get("pos", {})
        drained = bool(self.drain_marker) and os.path.exists(self.drain_marker)
        if self._warming and not drained:
            self._warming = False
            return self._warm_up(start)
        positions = self.script.next_positions(begin)
        budgeted = None
        if self.admission is not None:
            positions, budgeted = self._budgeted(begin, positions, start.get("throttle", {}))
        offset = offset_for(self.script, positions, start, _now_micros(),
                            int(start["tick"]) + 1, drained=drained,
                            streams=self._streams if self.streams else None)
        if budgeted is not None:
            offset.update(budgeted)
        return offset

    def _warm_up(self, start: dict) -> dict:
        """A batch that reads nothing: the script's positions stay, splittable readers get no
        share of a budget (a restarted job's residuals wait one batch), the clock moves."""
        positions = {name: int(at) for name, at in start.get("pos", {}).items()}
        offset = offset_for(self.script, positions, start, _now_micros(), int(start["tick"]) + 1,
                            streams=self._streams if self.streams else None)
        if self.admission is not None:
            offset.update({"sdf": {name: [0, 0] for name in sorted(self.splittable)},
                           "admitted": {"items": 0, "bytes": 0},
                           "throttle": dict(start.get("throttle", {}))})
        return offset

    def _budgeted(self, begin: dict, ends: dict[str, int], throttle: dict[str, int]
                  ) -> tuple[dict[str, int], dict[str, Any]]:
        """Cuts each endpoint's next items to what the work budget admits (`admission.py`):
        a row costs one item and its key and value bytes; an item without rows (a watermark or
        processing-time event) costs nothing, so it is read as soon as the rows before it are.
        A splittable endpoint's backlog is not known here: it asks for the whole budget and
        gets what the script's endpoints leave of a fair split (`batch_limit`); it is in
        flight until the next batch is planned, like the rest.
        Returns the positions and what the offset records: the items and bytes admitted, each
        endpoint's throttle milliseconds so far, and the splittable endpoints' shares."""
        assert self.admission is not None and self.budget is not None
        now = time.monotonic()
        costs = {
            name: self.script.endpoint(name).costs(int(begin.get(name, 0)), end)
            for name, end in ends.items()
        }
        wanted = {
            name: WorkBudget(sum(1 for c in unit_costs if c is not None),
                             sum(c for c in unit_costs if c is not None))
            for name, unit_costs in costs.items()
        }
        wanted.update((name, self.budget) for name in self.splittable)
        grant = self.admission.grant(wanted, now)
        shares = {name: grant.budgets.get(name, WorkBudget.zero()) for name in self.splittable}
        positions = {name: int(begin.get(name, 0)) for name in ends}
        taken: dict[str, WorkBudget] = {}
        for name, unit_costs in costs.items():
            granted = grant.budgets.get(name, WorkBudget.zero())
            items = size = 0
            for cost in unit_costs:
                if cost is not None:
                    if items + 1 > granted.items or size + cost > granted.bytes:
                        break
                    items, size = items + 1, size + cost
                positions[name] += 1
            taken[name] = WorkBudget(items, size)
        if not any(t.items for t in taken.values()):
            # Progress: a row larger than any share is read alone.
            for name in sorted(costs):
                first = next((c for c in costs[name][positions[name] - int(begin.get(name, 0)):]
                              if c is not None), None)
                if first is not None:
                    positions[name] += 1
                    taken[name] = WorkBudget(1, first)
                    shares = dict.fromkeys(shares, WorkBudget.zero())
                    break
        for name, share in shares.items():
            # What a spread key does not use of its share is not known here; it is not throttled
            # here either (it counts its own throttle time, `splittable.py`).
            self.admission.taken(name, share, share, now)
        for name, amount in taken.items():
            self.admission.taken(name, amount, wanted[name], now)
        return positions, {
            "sdf": {name: [share.items, share.bytes] for name, share in sorted(shares.items())},
            "admitted": {"items": sum(t.items for t in taken.values()),
                         "bytes": sum(t.bytes for t in taken.values())},
            "throttle": {
                name: int(throttle.get(name, 0)) + round(grant.throttled.get(name, 0.0) * 1000)
                for name in sorted(set(throttle) | set(grant.throttled))
            },
        }

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
        items, size = self.options.get("max_items_per_batch"), self.options.get(
            "max_bytes_per_batch")
        budget = None
        if items or size:
            budget = WorkBudget(int(items) if items else _UNLIMITED,
                                int(size) if size else _UNLIMITED)
        splittable = self.options.get("splittable_endpoints", "")
        streams = self.options.get("spark_streams", "")
        return BeamStreamReader(pickle.loads(base64.b64decode(self.options["script"])),
                                self.options.get("drain_marker", ""), budget,
                                tuple(splittable.split(",")) if splittable else (),
                                tuple(StreamClock.from_text(t) for t in streams.split("\n"))
                                if streams else ())


def encode(script: Script) -> str:
    return base64.b64encode(pickle.dumps(script)).decode()


def _now_micros() -> int:
    return int(time.time() * 1_000_000)
