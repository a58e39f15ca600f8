"""The streaming query builds each stage from the same (kind, side inputs) rows Prepare checks."""
from __future__ import annotations

from sparkbeam.plan.check import STREAMING_STAGES
from sparkbeam.streaming import query


def test_every_checked_row_has_an_operator_and_no_other() -> None:
    assert set(query._OPERATORS) == set(STREAMING_STAGES)
