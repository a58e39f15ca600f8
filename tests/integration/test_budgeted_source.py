"""The work budget on a real Structured Streaming query: no micro-batch reads more than the
budget, every endpoint gets its share, and an endpoint-set change redistributes it."""
from __future__ import annotations

import collections
import time
from collections.abc import Iterator
from typing import Any

import pytest

from sparkbeam.streaming.endpoints import EndpointSet
from sparkbeam.streaming.source import BudgetedSource, encode


class ScriptedBacklog:
    """Endpoints with an endless backlog of 10-byte items; the set changes at batch 3."""

    def endpoint_set(self, batch: int) -> EndpointSet:
        if batch < 3:
            return EndpointSet(1, frozenset(["a", "b", "c", "d"]), frozenset())
        return EndpointSet(2, frozenset(["a", "b", "c", "e", "f"]), frozenset())

    def available(self, endpoint: str, start: int) -> int:
        return 1_000_000

    def item_bytes(self, endpoint: str) -> int:
        return 10

    def read(self, endpoint: str, start: int, end: int) -> Iterator[tuple[str, int, bytes]]:
        for offset in range(start, end):
            yield endpoint, offset, f"{endpoint}{offset:08d}"[:10].encode()


@pytest.mark.timeout(180)
def test_no_batch_reads_more_than_the_budget_and_shares_follow_the_endpoints(
    spark: Any, tmp_path: Any
) -> None:
    spark.dataSource.register(BudgetedSource)
    batches: dict[int, collections.Counter[str]] = {}
    offsets: dict[str, list[int]] = collections.defaultdict(list)

    def record(df: Any, batch_id: int) -> None:
        rows = df.collect()
        batches[batch_id] = collections.Counter(r.endpoint for r in rows)
        for r in rows:
            offsets[r.endpoint].append(r.offset)

    query = (
        spark.readStream.format("sparkbeam_budgeted")
        .option("backlog", encode(ScriptedBacklog()))
        .option("max_items_per_batch", "1000")
        .load()
        .writeStream.foreachBatch(record)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        deadline = time.monotonic() + 120
        while len([b for b in batches.values() if b]) < 6 and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        query.stop()
    full = [batches[i] for i in sorted(batches) if batches[i]]
    assert len(full) >= 6, batches
    for counts in full:
        assert sum(counts.values()) <= 1000, counts
    assert full[0] == {"a": 250, "b": 250, "c": 250, "d": 250}
    after = [c for c in full if "e" in c]
    assert after, full
    for counts in after:
        assert set(counts) == {"a", "b", "c", "e", "f"}  # d is gone, e and f joined
        assert sum(counts.values()) == 1000
        assert max(counts.values()) - min(counts.values()) <= 1  # shares stay even
    for endpoint, seen in offsets.items():  # contiguous, never read twice
        assert sorted(seen) == list(range(len(seen))), endpoint
