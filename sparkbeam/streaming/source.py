"""The Spark binding of the work budget: a Python streaming source whose partitions are endpoints.

A `Backlog` says which endpoints exist (versioned sets, e.g. one per Beam restriction) and what
each holds at deterministic offsets; the source admits work per micro-batch with the budget:
`latestOffset(start, limit)` gives every current endpoint at most its remaining share
(`BudgetDistributor`: set, not adjusted; topped up once its in-flight work is committed) and the
batch as a whole at most the total (`batch_limit`, exact), so no batch reads more than
`--max_items_per_batch` / `--max_bytes_per_batch`. Offsets are {endpoint: next offset}: a
replayed batch reads exactly the same items. Endpoint sets are applied through
`EndpointSetTracker` (newest wins, survivors keep their readers, stale ones closed without
blocking).

Spark runs the reader's planning methods in a Python process of its own, so the backlog travels
pickled with the data source (options carry no objects).
"""
from __future__ import annotations

import base64
import pickle
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows
from pyspark.sql.types import StructType

from sparkbeam.streaming.budget import BudgetDistributor, WorkBudget, batch_limit
from sparkbeam.streaming.endpoints import EndpointSet, EndpointSetTracker

SCHEMA = "endpoint string, offset long, payload binary"


class Backlog(Protocol):
    """Deterministic, replayable work behind the endpoints (picklable: read runs on executors)."""

    def endpoint_set(self, batch: int) -> EndpointSet: ...

    def available(self, endpoint: str, start: int) -> int: ...

    def item_bytes(self, endpoint: str) -> int: ...

    def read(self, endpoint: str, start: int, end: int) -> Iterator[tuple[str, int, bytes]]: ...


@dataclass(frozen=True)
class EndpointRange(InputPartition):  # type: ignore[misc]
    """One endpoint's items [start, end) of a micro-batch: one Spark task."""

    endpoint: str
    start: int
    end: int


class _Reader:
    """A survivor keeps its reader across endpoint sets; nothing to release for a backlog."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.closed = False

    def close(self) -> None:
        self.closed = True


class BudgetedStreamReader(DataSourceStreamReader):  # type: ignore[misc]
    def __init__(self, backlog: Backlog, total: WorkBudget) -> None:
        self.backlog = backlog
        self.total = total
        self.tracker = EndpointSetTracker(_Reader, BudgetDistributor(total),
                                          close_later=lambda reader: reader.close())
        self.batches = 0

    def __getstate__(self) -> dict[str, Any]:
        # Spark pickles the reader to run `read` on executors: they need the backlog only.
        return {"backlog": self.backlog, "total": self.total}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["backlog"], state["total"])  # type: ignore[misc]

    def initialOffset(self) -> dict:  # noqa: N802 - Spark's name
        return {}

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        return ReadMaxRows(self.total.items)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:  # noqa: N802
        now = time.monotonic()
        # Spark plans a micro-batch only once the previous one ran, though it commits the
        # previous one to the source afterwards: what was admitted then is processed now.
        self._drain(now)
        self.tracker.publish(self.backlog.endpoint_set(self.batches))
        self.tracker.consume()
        self.batches += 1
        current = self.tracker.current
        if current is None:
            return dict(start)
        distributor = self.tracker.distributor
        wanted: dict[str, WorkBudget] = {}
        for endpoint in sorted(current.endpoints):
            offset = int(start.get(endpoint, 0))
            items = self.backlog.available(endpoint, offset)
            size = self.backlog.item_bytes(endpoint)
            wanted[endpoint] = WorkBudget(items, items * size).min(
                distributor.remaining(endpoint))
        cap = self.total
        if isinstance(limit, ReadMaxRows):
            cap = WorkBudget(min(cap.items, limit.max_rows), cap.bytes)
        end = dict(start)
        for endpoint, granted in batch_limit(wanted, cap).items():
            size = max(1, self.backlog.item_bytes(endpoint))
            items = min(granted.items, granted.bytes // size)
            if items:
                distributor.admit(endpoint, WorkBudget(items, items * size), now)
                end[endpoint] = int(start.get(endpoint, 0)) + items
        return end

    def partitions(self, start: dict, end: dict) -> list[EndpointRange]:
        return [
            EndpointRange(endpoint, int(start.get(endpoint, 0)), int(stop))
            for endpoint, stop in sorted(end.items())
            if int(stop) > int(start.get(endpoint, 0))
        ]

    def read(self, partition: InputPartition) -> Iterator[tuple[str, int, bytes]]:
        assert isinstance(partition, EndpointRange)
        yield from self.backlog.read(partition.endpoint, partition.start, partition.end)

    def commit(self, end: dict) -> None:
        """Work up to `end` is processed: the in-flight budget drains, endpoints top up."""
        self._drain(time.monotonic())

    def _drain(self, now: float) -> None:
        distributor = self.tracker.distributor
        for endpoint in distributor.endpoints:
            done = distributor.in_flight(endpoint)
            if not done.is_empty:
                distributor.processed(endpoint, done, now)

    def stop(self) -> None:
        self.tracker.close()


class BudgetedSource(DataSource):  # type: ignore[misc]
    """`spark.readStream.format("sparkbeam_budgeted").option("backlog", encode(backlog))`."""

    @classmethod
    def name(cls) -> str:
        return "sparkbeam_budgeted"

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: StructType) -> BudgetedStreamReader:  # noqa: N802
        backlog = pickle.loads(base64.b64decode(self.options["backlog"]))
        total = WorkBudget(int(self.options.get("max_items_per_batch", 10_000)),
                           int(self.options.get("max_bytes_per_batch", 64 << 20)))
        return BudgetedStreamReader(backlog, total)


def encode(backlog: Any) -> str:
    """A backlog as a source option."""
    return base64.b64encode(pickle.dumps(backlog)).decode()
