"""Admission of one micro-batch under the work budget (pure: no pyspark).

The streaming source plans a batch in `latestOffset(start, limit)` (`beam_source.py`): the batch
before it has run by then (Spark plans the next batch only once the previous one is done), so
its in-flight work is processed and every endpoint's budget is topped up (`BudgetDistributor`:
shares are *set*, never adjusted); the endpoints that have work form the current endpoint set,
published as a new version when it changes (`EndpointSetTracker`: newest wins; the budget is
set for the new set); each endpoint may then take at most its
remaining share, and the batch as a whole at most the total, split exactly (`batch_limit`). An
endpoint left with work it could not take is held back, and the time until its budget is
topped up again is its throttle time.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sparkbeam.streaming.budget import BudgetDistributor, WorkBudget, batch_limit
from sparkbeam.streaming.endpoints import EndpointSet, EndpointSetTracker


@dataclass(frozen=True)
class Grant:
    """What one batch may take per endpoint, and each endpoint's throttle seconds since the
    previous batch was planned."""

    budgets: dict[str, WorkBudget]
    throttled: dict[str, float]


class BatchAdmission:
    """The budget's state across the micro-batches of one source (lives in the source's planning
    process; a restart starts from fresh shares, which are a function of the total alone)."""

    def __init__(self, total: WorkBudget) -> None:
        self.total = total
        self.tracker = EndpointSetTracker(None, BudgetDistributor(total))
        self._version = 0

    @property
    def distributor(self) -> BudgetDistributor:
        return self.tracker.distributor

    def grant(self, wanted: Mapping[str, WorkBudget], now: float,
              cap: WorkBudget | None = None,
              endpoint_set: EndpointSet | None = None) -> Grant:
        """Plans a batch: `wanted` is each endpoint's available work (endpoints with none may be
        left out); `endpoint_set` the backend's set, if it names one (else the endpoints that
        want work); `cap` a limit below the total (Spark's read limit)."""
        self._processed(now)
        throttled = {e: self.distributor.take_throttle_seconds_of(e, now)
                     for e in self.distributor.endpoints}
        if endpoint_set is None:
            names = frozenset(e for e, w in wanted.items() if not w.is_empty)
            current = self.tracker.current
            if current is None or current.endpoints != names:
                self._version += 1
                endpoint_set = EndpointSet(self._version, names)
        if endpoint_set is not None:
            self.tracker.publish(endpoint_set)
            self.tracker.consume()
        current = self.tracker.current
        endpoints = current.endpoints if current is not None else frozenset()
        capped = {e: wanted[e].min(self.distributor.remaining(e))
                  for e in sorted(endpoints) if e in wanted}
        limit = self.total if cap is None else cap.min(self.total)
        return Grant(batch_limit(capped, limit), throttled)

    def taken(self, endpoint: str, taken: WorkBudget, wanted: WorkBudget, now: float) -> None:
        """`endpoint` took `taken` of the `wanted` work this batch: in flight until the next
        batch is planned; held back (throttled) if that was not all it had."""
        if endpoint not in self.distributor.endpoints:
            return
        if not taken.is_empty:
            self.distributor.admit(endpoint, taken, now)
        if taken.items < wanted.items:
            self.distributor.hold_back(endpoint, now)

    def _processed(self, now: float) -> None:
        for endpoint in self.distributor.endpoints:
            done = self.distributor.in_flight(endpoint)
            if not done.is_empty:
                self.distributor.processed(endpoint, done, now)

    def close(self) -> None:
        self.tracker.close()
