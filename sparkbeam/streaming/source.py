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

from sparkbeam.streaming.admission import BatchAdmission
from sparkbeam.streaming.budget import WorkBudget
from sparkbeam.streaming.endpoints import EndpointSet

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


class BudgetedStreamReader(DataSourceStreamReader):  # type: ignore[misc]
    def __init__(self, backlog: Backlog, total: WorkBudget) -> None:
        self.backlog = backlog
        self.total = total
        self.admission = BatchAdmission(total)
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
        endpoint_set = self.backlog.endpoint_set(self.batches)
        self.batches += 1
        wanted: dict[str, WorkBudget] = {}
        for endpoint in sorted(endpoint_set.endpoints):
            items = self.backlog.available(endpoint, int(start.get(endpoint, 0)))
            wanted[endpoint] = WorkBudget(items, items * self.backlog.item_bytes(endpoint))
        cap = None
        if isinstance(limit, ReadMaxRows):
            cap = WorkBudget(limit.max_rows, self.total.bytes)
        grant = self.admission.grant(wanted, now, cap, endpoint_set)
        end = dict(start)
        for endpoint, granted in grant.budgets.items():
            size = max(1, self.backlog.item_bytes(endpoint))
            items = min(granted.items, granted.bytes // size)
            self.admission.taken(endpoint, WorkBudget(items, items * size), wanted[endpoint],
                                 now)
            if items:
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
        pass  # what was admitted is processed: the next `latestOffset` tops the budgets up

    def stop(self) -> None:
        self.admission.close()


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
