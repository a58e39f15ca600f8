"""Work budget of a streaming worker: how much each backend endpoint may hand us right now.

A worker may hold at most a total budget of work (items, bytes) at a time. The budget is split
evenly over the endpoints it reads from (`distribute_evenly`); `BudgetDistributor` then tracks,
per endpoint, what it may still read (remaining) and what it has read but not yet processed
(in flight). `batch_limit` is the stateless admission for one Spark micro-batch.

Invariants:

- Budgets are SET on each distribution, never adjusted by a delta: an endpoint's remaining
  budget is always ``share - in_flight`` (floored at zero), so admissions never lift in-flight
  work above the share, and the sum of shares is a function of (total, n) alone (a budget that
  is a closed loop cannot drift upwards). Work admitted before a redistribution shrank a share
  is not recalled; it drains first.
- Ceil-rounded shares may exceed the total by n-1 per dimension; where that matters (one Spark
  batch) `batch_limit` splits the cap exactly, so a batch never admits more than the total.
- An endpoint is topped up when its in-flight work falls to half its share or below in both
  dimensions, so the binding dimension decides (the other one alone never triggers a refill).
- Per-endpoint top-ups log at DEBUG only (one line per endpoint per batch would drown the log).
- No locks: the distributor belongs to the one consumer thread; `endpoints.EndpointSetTracker`
  is the only thread-safe seam.
- An endpoint must have a budget before it is used (`distribute` first), or it is an error.
- Throttle time (an endpoint with pending work held at zero budget) is accumulated per endpoint
  and kept when the endpoint goes away, to be reported as a metric.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sparkbeam.errors import SparkBeamError

_LOG = logging.getLogger(__name__)

# Throttle time is reported as this user counter of the transform whose endpoint was held back.
THROTTLE_NAMESPACE = "sparkbeam.streaming"
THROTTLE_COUNTER = "throttling-msecs"


@dataclass(frozen=True, order=False)
class WorkBudget:
    """An amount of work: a number of items and their encoded size in bytes. Never negative."""

    items: int
    bytes: int

    def __post_init__(self) -> None:
        if self.items < 0 or self.bytes < 0:
            raise ValueError(f"a WorkBudget is never negative, got {self}")

    @staticmethod
    def zero() -> WorkBudget:
        """No work at all."""
        return _ZERO

    @property
    def is_empty(self) -> bool:
        """True when this budget admits no work: every item counts one item and some bytes."""
        return self.items == 0 or self.bytes == 0

    def __add__(self, other: WorkBudget) -> WorkBudget:
        return WorkBudget(self.items + other.items, self.bytes + other.bytes)

    def subtract(self, other: WorkBudget) -> WorkBudget:
        """This minus `other` per dimension, never below zero."""
        return WorkBudget(max(0, self.items - other.items), max(0, self.bytes - other.bytes))

    def __sub__(self, other: WorkBudget) -> WorkBudget:
        return self.subtract(other)

    def min(self, other: WorkBudget) -> WorkBudget:
        """The smaller of the two in each dimension."""
        return WorkBudget(min(self.items, other.items), min(self.bytes, other.bytes))

    def fits_in(self, other: WorkBudget) -> bool:
        """True when this is at most `other` in both dimensions."""
        return self.items <= other.items and self.bytes <= other.bytes

    def __str__(self) -> str:
        return f"({self.items} items, {self.bytes} bytes)"


_ZERO = WorkBudget(0, 0)


def _ceil_div(total: int, n: int) -> int:
    return -(-total // n)


def distribute_evenly(total: WorkBudget, endpoints: Sequence[str]) -> dict[str, WorkBudget]:
    """Each endpoint's share of `total`: ceil(total / n) per dimension.

    Every share is at least the floor share, so no endpoint starves, and the shares cover the
    total, exceeding it by at most n-1 per dimension. No endpoints -> {}; zero total -> zeros.
    """
    unique = list(dict.fromkeys(endpoints))
    if not unique:
        return {}
    n = len(unique)
    share = WorkBudget(_ceil_div(total.items, n), _ceil_div(total.bytes, n))
    return {endpoint: share for endpoint in unique}


def _fill_fairly(wanted: list[tuple[str, int]], cap: int) -> dict[str, int]:
    """Max-min fair split of `cap` over `wanted`, summing to at most `cap` exactly.

    Endpoints wanting less than an even share get what they want; the rest split what is left,
    the remainder going one unit each in name order, so the result depends on the inputs only.
    """
    granted: dict[str, int] = {}
    left = cap
    pending = sorted(wanted, key=lambda kv: (kv[1], kv[0]))
    while pending:
        fair = left // len(pending)
        name, want = pending[0]
        if want <= fair:
            granted[name] = want
            left -= want
            pending.pop(0)
            continue
        # Everyone still pending wants more than the fair share: split `left` exactly.
        extra = left - fair * len(pending)
        for i, (name, _) in enumerate(sorted(pending)):
            granted[name] = fair + (1 if i < extra else 0)
        break
    return granted


def batch_limit(wanted: Mapping[str, WorkBudget], cap: WorkBudget) -> dict[str, WorkBudget]:
    """How much of each endpoint's backlog one micro-batch admits (for ``latestOffset(start,
    limit)``).

    The sum over endpoints never exceeds `cap` in either dimension: unlike `distribute_evenly`,
    the split is exact (floor share plus one unit of the remainder), and capacity an endpoint
    does not want goes to the others (max-min fairness). Pure and deterministic: a replayed
    batch with the same inputs admits exactly the same amounts.
    """
    names = sorted(wanted)
    items = _fill_fairly([(n, wanted[n].items) for n in names], cap.items)
    sizes = _fill_fairly([(n, wanted[n].bytes) for n in names], cap.bytes)
    return {n: WorkBudget(items[n], sizes[n]) for n in names}


@dataclass
class _EndpointBudget:
    share: WorkBudget
    remaining: WorkBudget
    in_flight: WorkBudget = _ZERO
    throttled_since: float | None = None
    throttled_seconds: float = 0.0


class BudgetDistributor:
    """Per-endpoint budgets (share, remaining, in flight) under one total budget.

    Not thread-safe by design: the consumer thread that applies endpoint sets also admits and
    reports processed work. Invariant after every call, per endpoint:
    ``remaining <= max(0, share - in_flight)`` in each dimension.
    """

    def __init__(self, total: WorkBudget) -> None:
        self.total = total
        self._budgets: dict[str, _EndpointBudget] = {}
        self._closed_throttle_seconds = 0.0  # of endpoints no longer distributed to

    # -- distribution -------------------------------------------------------------------------
    def distribute(self, endpoints: Sequence[str], now: float) -> None:
        """Set (replace) every endpoint's share to an even part of the total.

        Surviving endpoints keep their in-flight work and throttle time; their remaining budget
        is recomputed, not adjusted, so repeated distributions cannot drift upwards. Removed
        endpoints are forgotten, their throttle time kept for `total_throttle_seconds`.
        """
        shares = distribute_evenly(self.total, endpoints)
        for name in [n for n in self._budgets if n not in shares]:
            gone = self._budgets.pop(name)
            self._closed_throttle_seconds += gone.throttled_seconds + _stop_throttle(gone, now)
        for name, share in shares.items():
            state = self._budgets.get(name)
            if state is None:
                state = self._budgets[name] = _EndpointBudget(share=share, remaining=_ZERO)
            state.share = share
            self._refill(name, state, now)
        _LOG.debug("budget %s distributed over %d endpoint(s)", self.total, len(shares))

    def _refill(self, name: str, state: _EndpointBudget, now: float) -> None:
        state.remaining = state.share.subtract(state.in_flight)
        if not state.remaining.is_empty:
            state.throttled_seconds += _stop_throttle(state, now)
        _LOG.debug("endpoint %s budget set to %s (in flight %s)", name, state.remaining,
                   state.in_flight)

    # -- admission ----------------------------------------------------------------------------
    def admit(self, endpoint: str, wanted: WorkBudget, now: float) -> WorkBudget:
        """How much `endpoint` may read now: at most `wanted` and its remaining budget.

        The admitted amount becomes in-flight work until reported through `processed` (report
        admitted-but-unread work there too). An endpoint that wants work but gets none is
        throttled from `now` until its budget is refilled or an admission succeeds.
        """
        state = self._state(endpoint)
        granted = wanted.min(state.remaining)
        if granted.is_empty:
            if not wanted.is_empty and state.throttled_since is None:
                state.throttled_since = now
            if wanted.is_empty:
                state.throttled_seconds += _stop_throttle(state, now)
            return _ZERO
        state.throttled_seconds += _stop_throttle(state, now)
        state.remaining = state.remaining.subtract(granted)
        state.in_flight = state.in_flight + granted
        return granted

    def hold_back(self, endpoint: str, now: float) -> None:
        """`endpoint` has work the budget did not admit: it is throttled from `now` until its
        budget is refilled (a micro-batch source cuts admissions below what is available)."""
        state = self._state(endpoint)
        if state.throttled_since is None:
            state.throttled_since = now

    def processed(self, endpoint: str, done: WorkBudget, now: float) -> None:
        """`done` work of `endpoint` is finished; refill its budget once in-flight work is at
        half its share or below. Work of an endpoint no longer distributed to is ignored."""
        state = self._budgets.get(endpoint)
        if state is None:
            _LOG.debug("processed %s for endpoint %s that is no longer current", done, endpoint)
            return
        state.in_flight = state.in_flight.subtract(done)
        half_items, half_bytes = state.share.items / 2, state.share.bytes / 2
        if state.in_flight.items <= half_items and state.in_flight.bytes <= half_bytes:
            self._refill(endpoint, state, now)

    def _state(self, endpoint: str) -> _EndpointBudget:
        state = self._budgets.get(endpoint)
        if state is None:
            raise SparkBeamError(
                f"work budget: endpoint {endpoint!r} has no budget; expected one of "
                f"{sorted(self._budgets)} (call distribute() with the endpoint set first)"
            )
        return state

    # -- inspection ---------------------------------------------------------------------------
    @property
    def endpoints(self) -> list[str]:
        """Endpoints that currently hold a share, sorted."""
        return sorted(self._budgets)

    def share(self, endpoint: str) -> WorkBudget:
        """The share last set for `endpoint`."""
        return self._state(endpoint).share

    def remaining(self, endpoint: str) -> WorkBudget:
        """What `endpoint` may still read before its next refill."""
        return self._state(endpoint).remaining

    def in_flight(self, endpoint: str) -> WorkBudget:
        """What `endpoint` has handed us that is not processed yet."""
        return self._state(endpoint).in_flight

    def shares(self) -> dict[str, WorkBudget]:
        """Every current endpoint's share."""
        return {name: state.share for name, state in self._budgets.items()}

    def throttle_seconds(self, endpoint: str, now: float | None = None) -> float:
        """Seconds `endpoint` was held back at zero budget; with `now`, including the current
        stretch if it is held back right now."""
        state = self._state(endpoint)
        open_stretch = 0.0
        if now is not None and state.throttled_since is not None:
            open_stretch = max(0.0, now - state.throttled_since)
        return state.throttled_seconds + open_stretch

    def total_throttle_seconds(self, now: float | None = None) -> float:
        """Throttle seconds of all endpoints, including ones no longer distributed to."""
        return self._closed_throttle_seconds + sum(
            self.throttle_seconds(name, now) for name in self._budgets
        )

    def take_throttle_seconds_of(self, endpoint: str, now: float) -> float:
        """`endpoint`'s throttle seconds up to `now`, then reset to zero (a per-endpoint
        metric delta)."""
        seconds = self.throttle_seconds(endpoint, now)
        state = self._state(endpoint)
        state.throttled_seconds = 0.0
        if state.throttled_since is not None:
            state.throttled_since = now
        return seconds

    def take_throttle_seconds(self, now: float) -> float:
        """Total throttle seconds up to `now`, then reset to zero (for a metric delta)."""
        total = self.total_throttle_seconds(now)
        self._closed_throttle_seconds = 0.0
        for state in self._budgets.values():
            state.throttled_seconds = 0.0
            if state.throttled_since is not None:
                state.throttled_since = now
        return total


def _stop_throttle(state: _EndpointBudget, now: float) -> float:
    """End the endpoint's current throttled stretch, if any; return its length."""
    if state.throttled_since is None:
        return 0.0
    seconds = max(0.0, now - state.throttled_since)
    state.throttled_since = None
    return seconds
