"""Work budget: even split, per-micro-batch admission, and the distributor's no-drift rules."""
from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkbeam.errors import SparkBeamError
from sparkbeam.streaming.budget import (
    BudgetDistributor,
    WorkBudget,
    batch_limit,
    distribute_evenly,
)

W = WorkBudget
budgets = st.builds(W, st.integers(0, 10**9), st.integers(0, 10**12))


def names(n: int) -> list[str]:
    return [f"endpoint-{i:02d}" for i in range(n)]


def check_invariants(dist: BudgetDistributor) -> None:
    """Per endpoint, what it may still read never takes in-flight work above its share (work
    admitted before a redistribution shrank the share may exceed it, and then nothing more is)."""
    for e in dist.endpoints:
        assert dist.remaining(e).fits_in(dist.share(e).subtract(dist.in_flight(e))), e


# -- WorkBudget ----------------------------------------------------------------------------------
def test_subtract_never_goes_below_zero() -> None:
    assert W(3, 10).subtract(W(5, 4)) == W(0, 6)
    assert W(3, 10) - W(3, 10) == W(0, 0)


def test_is_empty_when_either_dimension_admits_nothing() -> None:
    assert W(0, 0).is_empty and W(0, 5).is_empty and W(5, 0).is_empty
    assert not W(1, 1).is_empty


def test_negative_budget_is_rejected() -> None:
    with pytest.raises(ValueError, match="never negative"):
        W(-1, 0)


def test_work_budget_is_frozen_and_hashable() -> None:
    with pytest.raises(AttributeError):
        W(1, 1).items = 2  # type: ignore[misc]
    assert len({W(1, 2), W(1, 2)}) == 1


# -- distribute_evenly ---------------------------------------------------------------------------
def test_distribute_evenly_rounds_up() -> None:
    assert distribute_evenly(W(10, 100), ["a", "b", "c"]) == {e: W(4, 34) for e in "abc"}


def test_distribute_evenly_over_no_endpoints_is_empty() -> None:
    assert distribute_evenly(W(10, 10), []) == {}


def test_distribute_evenly_of_zero_total_gives_zeros() -> None:
    assert distribute_evenly(W(0, 0), ["a", "b"]) == {"a": W(0, 0), "b": W(0, 0)}


@given(total=budgets, n=st.integers(1, 64))
def test_ceil_shares_cover_total_and_exceed_it_by_at_most_n_minus_1(total: W, n: int) -> None:
    shares = distribute_evenly(total, names(n))
    assert len(shares) == n
    items = sum(s.items for s in shares.values())
    size = sum(s.bytes for s in shares.values())
    assert total.items <= items <= total.items + n - 1
    assert total.bytes <= size <= total.bytes + n - 1
    for s in shares.values():  # every share is at least the floor share
        assert s.items >= total.items // n and s.bytes >= total.bytes // n


# -- batch_limit ---------------------------------------------------------------------------------
def test_batch_limit_gives_unwanted_capacity_to_the_others() -> None:
    got = batch_limit({"a": W(10, 10), "b": W(1000, 1000), "c": W(0, 0)}, W(100, 100))
    assert got == {"a": W(10, 10), "b": W(90, 90), "c": W(0, 0)}


def test_batch_limit_splits_the_remainder_in_name_order() -> None:
    got = batch_limit({e: W(1000, 1000) for e in "cab"}, W(100, 100))
    assert got == {"a": W(34, 34), "b": W(33, 33), "c": W(33, 33)}


@given(wanted=st.lists(budgets, min_size=4, max_size=4))
def test_with_4_endpoints_and_1000_items_no_batch_admits_more_than_1000(wanted: list[W]) -> None:
    cap = W(1000, 10**6)
    got = batch_limit(dict(zip(names(4), wanted, strict=True)), cap)
    assert sum(g.items for g in got.values()) <= 1000
    assert sum(g.bytes for g in got.values()) <= cap.bytes
    for e, want in zip(names(4), wanted, strict=True):
        assert got[e].fits_in(want)


@given(wanted=st.dictionaries(st.text(min_size=1, max_size=4), budgets, max_size=64), cap=budgets)
def test_batch_limit_is_exact_fair_and_deterministic(wanted: dict[str, W], cap: W) -> None:
    got = batch_limit(wanted, cap)
    replay = batch_limit(dict(reversed(list(wanted.items()))), cap)
    assert got == replay  # a replayed batch admits the same, whatever the dict order
    for dim in ("items", "bytes"):
        admitted = sum(getattr(g, dim) for g in got.values())
        asked = sum(getattr(w, dim) for w in wanted.values())
        assert admitted == min(asked, getattr(cap, dim))  # never above cap, no capacity wasted
        if admitted < asked:  # whoever is cut short gets at least everyone else's grant - 1
            top = max(getattr(g, dim) for g in got.values())
            for e, g in got.items():
                assert getattr(g, dim) >= min(getattr(wanted[e], dim), top - 1)


# -- BudgetDistributor ---------------------------------------------------------------------------
def test_admit_grants_at_most_remaining_and_counts_it_in_flight() -> None:
    dist = BudgetDistributor(W(100, 1000))
    dist.distribute(["a", "b"], now=0.0)
    assert dist.admit("a", W(30, 100), now=0.0) == W(30, 100)
    assert dist.admit("a", W(30, 1000), now=0.0) == W(20, 400)
    assert dist.in_flight("a") == W(50, 500) and dist.remaining("a") == W(0, 0)
    check_invariants(dist)


def test_top_up_only_when_in_flight_falls_to_half_the_share() -> None:
    dist = BudgetDistributor(W(100, 1000))
    dist.distribute(["a"], now=0.0)
    dist.admit("a", W(100, 1000), now=0.0)
    dist.processed("a", W(49, 490), now=1.0)  # 51 in flight: still above half
    assert dist.remaining("a") == W(0, 0)
    dist.processed("a", W(1, 10), now=2.0)  # 50 in flight: half, top up to share - in flight
    assert dist.remaining("a") == W(50, 500)
    check_invariants(dist)


def test_top_up_waits_for_the_binding_dimension() -> None:
    dist = BudgetDistributor(W(100, 1000))
    dist.distribute(["a"], now=0.0)
    dist.admit("a", W(10, 1000), now=0.0)  # bytes bind: 10 big items
    dist.processed("a", W(4, 400), now=1.0)  # items well below half, bytes not yet
    assert dist.remaining("a") == W(90, 0)
    dist.processed("a", W(1, 100), now=1.0)
    assert dist.remaining("a") == W(95, 500)


def test_redistribution_sets_budgets_instead_of_adding_to_them() -> None:
    dist = BudgetDistributor(W(100, 1000))
    for _ in range(50):
        dist.distribute(["a", "b", "c"], now=0.0)
    assert dist.shares() == {e: W(34, 334) for e in "abc"}
    assert all(dist.remaining(e) == W(34, 334) for e in "abc")


def test_surviving_endpoint_keeps_in_flight_work_across_redistribution() -> None:
    dist = BudgetDistributor(W(100, 1000))
    dist.distribute(["a", "b"], now=0.0)
    dist.admit("a", W(40, 400), now=0.0)
    dist.distribute(["a", "b", "c", "d"], now=1.0)
    assert dist.share("a") == W(25, 250) and dist.in_flight("a") == W(40, 400)
    assert dist.remaining("a") == W(0, 0)
    check_invariants(dist)


def test_admit_for_unknown_endpoint_names_the_known_ones() -> None:
    dist = BudgetDistributor(W(10, 10))
    dist.distribute(["a"], now=0.0)
    expected = r"endpoint 'zz' has no budget; expected one of \['a'\]"
    with pytest.raises(SparkBeamError, match=expected):
        dist.admit("zz", W(1, 1), now=0.0)


def test_processed_for_removed_endpoint_is_ignored() -> None:
    dist = BudgetDistributor(W(10, 10))
    dist.distribute(["a"], now=0.0)
    dist.admit("a", W(5, 5), now=0.0)
    dist.distribute(["b"], now=0.0)
    dist.processed("a", W(5, 5), now=1.0)
    assert dist.endpoints == ["b"]


def test_throttle_time_counts_while_pending_work_is_held_at_zero_budget() -> None:
    dist = BudgetDistributor(W(10, 100))
    dist.distribute(["a", "b"], now=0.0)
    dist.admit("a", W(5, 50), now=0.0)
    assert dist.admit("a", W(1, 1), now=1.0) == W(0, 0)  # held back from t=1
    assert dist.admit("a", W(1, 1), now=2.0) == W(0, 0)  # still the same stretch
    assert dist.throttle_seconds("a") == 0.0
    assert dist.throttle_seconds("a", now=2.5) == 1.5
    dist.processed("a", W(5, 50), now=4.0)  # refilled: stretch ends
    assert dist.throttle_seconds("a") == 3.0 and dist.throttle_seconds("b") == 0.0
    assert dist.admit("a", W(1, 1), now=5.0) == W(1, 1)
    assert dist.total_throttle_seconds(now=9.0) == 3.0


def test_throttle_time_of_removed_endpoints_is_still_reported_then_reset() -> None:
    dist = BudgetDistributor(W(2, 2))
    dist.distribute(["a", "b"], now=0.0)
    dist.admit("a", W(1, 1), now=0.0)
    dist.admit("a", W(1, 1), now=1.0)  # throttled from 1
    dist.distribute(["b"], now=3.0)  # a removed while throttled: 2 s kept
    assert dist.total_throttle_seconds() == 2.0
    assert dist.take_throttle_seconds(now=3.0) == 2.0
    assert dist.total_throttle_seconds(now=10.0) == 0.0


def test_zero_total_admits_nothing() -> None:
    dist = BudgetDistributor(W(0, 0))
    dist.distribute(["a"], now=0.0)
    assert dist.admit("a", W(1, 1), now=0.0) == W(0, 0)


@settings(max_examples=3, deadline=None)
@given(seed=st.integers(0, 2**32))
def test_10000_random_endpoint_updates_never_drift_budgets_upward(seed: int) -> None:
    rng = random.Random(seed)
    total = W(rng.randint(0, 5000), rng.randint(0, 10**7))
    pool = names(32)
    dist = BudgetDistributor(total)
    now = 0.0
    ceiling = {"items": total.items + len(pool) - 1, "bytes": total.bytes + len(pool) - 1}
    for _ in range(10_000):
        now += 0.01
        endpoints = rng.sample(pool, rng.randint(1, len(pool)))
        dist.distribute(endpoints, now)
        n = len(endpoints)
        shares = dist.shares().values()
        items, size = sum(s.items for s in shares), sum(s.bytes for s in shares)
        assert total.items <= items <= total.items + n - 1
        assert total.bytes <= size <= total.bytes + n - 1
        assert items <= ceiling["items"] and size <= ceiling["bytes"]  # no growth over time
        assert dist.shares() == distribute_evenly(total, endpoints)  # history plays no part
        check_invariants(dist)
        # Close the loop: read and process some work between updates.
        for e in rng.sample(endpoints, min(3, n)):
            got = dist.admit(e, W(rng.randint(0, 500), rng.randint(0, 10**6)), now)
            if not got.is_empty:  # admission never lifts in-flight work above the share
                assert dist.in_flight(e).fits_in(dist.share(e))
            dist.processed(e, W(rng.randint(0, got.items), rng.randint(0, got.bytes)), now)
        check_invariants(dist)


def test_held_back_endpoint_is_throttled_until_refilled_and_taken_per_endpoint() -> None:
    d = BudgetDistributor(WorkBudget(10, 100))
    d.distribute(["a", "b"], now=0.0)
    d.admit("a", WorkBudget(5, 5), now=0.0)
    d.hold_back("a", now=1.0)
    assert d.throttle_seconds("a", now=3.0) == 2.0
    d.processed("a", WorkBudget(5, 5), now=4.0)  # refilled: the stretch ends
    assert d.throttle_seconds("a", now=9.0) == 3.0
    assert d.take_throttle_seconds_of("a", now=9.0) == 3.0
    assert d.take_throttle_seconds_of("a", now=10.0) == 0.0
    assert d.throttle_seconds("b") == 0.0
