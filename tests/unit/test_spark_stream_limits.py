"""The work budget as the limits of Spark's own stream sources (`streaming/spark_streams.
spark_limits`): which option each source takes, and when the user's options win."""
from __future__ import annotations

import pytest

from sparkbeam.io.spark import SparkQuery
from sparkbeam.streaming.spark_streams import spark_limits


def _query(fmt: str | None = None, table: str | None = None, **options: str) -> SparkQuery:
    return SparkQuery(table=table, format=fmt, path="/landing" if fmt in ("json", "parquet")
                      else None, options=tuple(options.items()), stream=True)


@pytest.mark.parametrize(("fmt", "items", "size", "expected"), [
    ("kafka", 500, None, {"maxOffsetsPerTrigger": "500"}),
    ("json", None, 4096, {"maxBytesPerTrigger": "4096"}),
    ("parquet", 10, 4096, {"maxBytesPerTrigger": "4096"}),
    ("delta", None, 4096, {"maxBytesPerTrigger": "4096"}),
    ("rate", 10, 4096, {}),
    ("kafka", None, None, {}),
])
def test_each_source_takes_the_limit_that_counts_what_the_budget_counts(
        fmt: str, items: int | None, size: int | None, expected: dict[str, str]) -> None:
    limits, _ = spark_limits(_query(fmt), items, size)
    assert limits == expected


def test_a_dimension_a_source_cannot_limit_is_said() -> None:
    limits, unset = spark_limits(_query("kafka"), 500, 4096)
    assert limits == {"maxOffsetsPerTrigger": "500"}
    assert unset == ["--max_bytes_per_batch: Spark's kafka source has no limit counting bytes"]
    _, unset = spark_limits(_query(table="events"), 10, None)
    assert unset == ["--max_items_per_batch: a table's stream has no limit counting items"]


def test_the_users_own_limits_win_ignoring_case() -> None:
    limits, unset = spark_limits(_query("kafka", maxoffsetspertrigger="7"), 500, None)
    assert limits == {} and unset == ["--max_items_per_batch: maxOffsetsPerTrigger is set in "
                                      "options="]
    # Spark's file source refuses maxBytesPerTrigger beside maxFilesPerTrigger; Delta does not.
    limits, unset = spark_limits(_query("json", maxFilesPerTrigger="1"), None, 4096)
    assert limits == {} and "takes no maxBytesPerTrigger beside maxFilesPerTrigger" in unset[0]
    limits, _ = spark_limits(_query("delta", maxFilesPerTrigger="1"), None, 4096)
    assert limits == {"maxBytesPerTrigger": "4096"}
