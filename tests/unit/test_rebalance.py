"""The Rebalancer's decisions, as event lists (no sockets, no Spark): who splits, who gets the
residual, who waits, who exits, and what a retried attempt replays."""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from sparkbeam.control.rebalance import Rebalancer

JOB, STAGE = "job-1", "stage-003"


@pytest.fixture
def rb() -> Iterator[Rebalancer]:
    r = Rebalancer()
    yield r
    r.validate()


def test_an_idle_task_exits_while_partitions_still_wait_to_start(rb: Rebalancer) -> None:
    rb.hello(JOB, STAGE, 0, partitions=4)
    rb.hello(JOB, STAGE, 1, partitions=4)
    assert rb.want_work(JOB, STAGE, 0, now=1.0) == {"exit": True}


def test_the_longest_running_bundle_is_asked_to_split_when_a_task_waits(rb: Rebalancer) -> None:
    for p in (0, 1, 2):
        rb.hello(JOB, STAGE, p, partitions=3)
    assert rb.busy(JOB, STAGE, 0, seq=0, now=0.0) == {}  # nobody idle yet
    assert rb.busy(JOB, STAGE, 1, seq=0, now=0.5) == {}
    assert rb.want_work(JOB, STAGE, 2, now=1.0) == {"wait": 0.05}
    assert rb.busy(JOB, STAGE, 1, seq=0, now=1.1) == {}  # not the longest running
    assert rb.busy(JOB, STAGE, 0, seq=0, now=1.2) == {"split": 0.5}
    assert rb.busy(JOB, STAGE, 0, seq=0, now=1.3) == {}  # one split in flight at a time


def test_the_residual_goes_to_the_waiting_task_and_is_recorded_for_replay(rb: Rebalancer) -> None:
    rb.hello(JOB, STAGE, 0, partitions=2)
    rb.hello(JOB, STAGE, 1, partitions=2)
    rb.busy(JOB, STAGE, 0, seq=3, now=0.0)
    rb.want_work(JOB, STAGE, 1, now=1.0)
    assert rb.busy(JOB, STAGE, 0, seq=3, now=1.1) == {"split": 0.5}
    record = {"keep": {"0": 2}, "primary": [(0, "cHJpbWFyeQ==")]}
    rb.split_result(JOB, STAGE, 0, seq=3, record=record, items=[(0, "cmVzaWR1YWw=")])
    assert rb.want_work(JOB, STAGE, 1, now=1.2) == {"work": [(0, "cmVzaWR1YWw=")]}
    assert rb.stats(JOB, STAGE) == {"splits": 1, "items_moved": 1}
    # Both partitions fail and are retried: each replays exactly what it did.
    assert rb.hello(JOB, STAGE, 0, partitions=2) == {"splits": {"3": record}, "assigned": []}
    assert rb.hello(JOB, STAGE, 1, partitions=2) == {
        "splits": {}, "assigned": [[(0, "cmVzaWR1YWw=")]]}


def test_an_empty_split_marks_the_bundle_unsplittable_and_waiters_exit(rb: Rebalancer) -> None:
    rb.hello(JOB, STAGE, 0, partitions=2)
    rb.hello(JOB, STAGE, 1, partitions=2)
    rb.busy(JOB, STAGE, 0, seq=0, now=0.0)
    assert rb.want_work(JOB, STAGE, 1, now=1.0) == {"wait": 0.05}
    assert rb.busy(JOB, STAGE, 0, seq=0, now=1.1) == {"split": 0.5}
    rb.split_result(JOB, STAGE, 0, seq=0, record=None, items=[])
    assert rb.busy(JOB, STAGE, 0, seq=0, now=1.2) == {}
    assert rb.want_work(JOB, STAGE, 1, now=1.3) == {"exit": True}
    # Its next bundle may split again.
    rb.want_work(JOB, STAGE, 1, now=1.4)
    assert rb.busy(JOB, STAGE, 0, seq=1, now=1.5) == {}  # the waiter left already


def test_a_waiter_exits_once_the_busy_task_goes_silent(rb: Rebalancer) -> None:
    rb.hello(JOB, STAGE, 0, partitions=2)
    rb.hello(JOB, STAGE, 1, partitions=2)
    rb.busy(JOB, STAGE, 0, seq=0, now=0.0)
    assert rb.want_work(JOB, STAGE, 1, now=1.0) == {"wait": 0.05}
    assert rb.want_work(JOB, STAGE, 1, now=10.0) == {"exit": True}


def test_a_bundle_that_ends_before_splitting_releases_the_split_slot(rb: Rebalancer) -> None:
    rb.hello(JOB, STAGE, 0, partitions=3)
    rb.hello(JOB, STAGE, 1, partitions=3)
    rb.hello(JOB, STAGE, 2, partitions=3)
    rb.busy(JOB, STAGE, 0, seq=0, now=0.0)
    rb.busy(JOB, STAGE, 1, seq=0, now=0.1)
    rb.want_work(JOB, STAGE, 2, now=1.0)
    assert rb.busy(JOB, STAGE, 0, seq=0, now=1.1) == {"split": 0.5}
    rb.bundle_done(JOB, STAGE, 0, seq=0)
    assert rb.busy(JOB, STAGE, 1, seq=0, now=1.2) == {"split": 0.5}


def test_stages_and_jobs_are_independent_and_forgotten(rb: Rebalancer) -> None:
    rb.hello(JOB, STAGE, 0, partitions=2)
    rb.hello("job-2", STAGE, 0, partitions=1)
    assert rb.want_work("job-2", STAGE, 0, now=0.0) == {"exit": True}
    assert rb.want_work(JOB, STAGE, 0, now=0.0) == {"exit": True}  # partition 1 not started
    rb.forget(JOB)
    assert rb.stats(JOB, STAGE) == {"splits": 0, "items_moved": 0}


def test_a_waiter_waits_for_a_started_straggler_to_report_then_it_is_split(
        rb: Rebalancer) -> None:
    """The straggler's bundle started less than a monitor poll ago: no busy report yet. The
    idle task waits for it instead of leaving, and the straggler is asked to split."""
    rb.hello(JOB, STAGE, 0, partitions=2)
    rb.hello(JOB, STAGE, 1, partitions=2)
    assert rb.want_work(JOB, STAGE, 1, now=1.0) == {"wait": 0.05}
    assert rb.busy(JOB, STAGE, 0, seq=0, now=1.1) == {"split": 0.5}


def test_a_waiter_stops_waiting_for_a_started_task_that_never_reports(rb: Rebalancer) -> None:
    rb.hello(JOB, STAGE, 0, partitions=2)
    rb.hello(JOB, STAGE, 1, partitions=2)
    assert rb.want_work(JOB, STAGE, 1, now=1.0) == {"wait": 0.05}
    assert rb.want_work(JOB, STAGE, 1, now=2.5) == {"wait": 0.05}
    assert rb.want_work(JOB, STAGE, 1, now=4.0) == {"exit": True}


def test_a_waiter_exits_at_once_when_every_other_task_is_done(rb: Rebalancer) -> None:
    rb.hello(JOB, STAGE, 0, partitions=2)
    rb.hello(JOB, STAGE, 1, partitions=2)
    rb.busy(JOB, STAGE, 0, seq=0, now=0.5)
    rb.bundle_done(JOB, STAGE, 0, seq=0)
    rb.finished(JOB, STAGE, 0)
    assert rb.want_work(JOB, STAGE, 1, now=1.0) == {"exit": True}


def test_the_decisions_are_kept_in_order_for_a_run_that_did_not_split(rb: Rebalancer) -> None:
    """What a failed run's message shows: each report, ask and answer once, a waiting task's
    repeated asks once per wait."""
    rb.hello(JOB, STAGE, 0, partitions=2)
    rb.hello(JOB, STAGE, 1, partitions=2)
    rb.busy(JOB, STAGE, 0, seq=0, now=0.0)
    rb.busy(JOB, STAGE, 0, seq=0, now=0.1)  # the same bundle again: not a new entry
    rb.want_work(JOB, STAGE, 1, now=1.0)
    rb.want_work(JOB, STAGE, 1, now=1.05)  # still waiting: not a new entry
    rb.busy(JOB, STAGE, 0, seq=0, now=1.1)
    rb.split_result(JOB, STAGE, 0, seq=0, record=None, items=[])
    rb.want_work(JOB, STAGE, 1, now=1.2)
    assert rb.history(JOB, STAGE) == [
        "p0 hello",
        "p1 hello",
        "p0 busy bundle 0",
        "p1 wants work: wait (live: [0], split asked: None)",
        "p0 asked to split bundle 0 (waiting: [1])",
        "p0 bundle 0 split with no residual: unsplittable",
        "p1 wants work: exit (no live bundle, none unheard)",
    ]
    rb.forget(JOB)
    assert rb.history(JOB, STAGE) == []


def test_the_history_keeps_the_first_and_the_latest_decisions(rb: Rebalancer) -> None:
    """A long stage's history is bounded, and what a puzzled run needs last (the late asks
    and answers) is kept as well as how it began."""
    from sparkbeam.control.rebalance import HISTORY_KEPT

    rb.hello(JOB, STAGE, 0, partitions=1)
    for seq in range(3 * HISTORY_KEPT):
        rb.busy(JOB, STAGE, 0, seq=seq, now=float(seq))
        rb.bundle_done(JOB, STAGE, 0, seq=seq)
    history = rb.history(JOB, STAGE)
    assert len(history) == 2 * HISTORY_KEPT + 1
    assert history[:2] == ["p0 hello", "p0 busy bundle 0"]
    left_out = 6 * HISTORY_KEPT + 1 - 2 * HISTORY_KEPT  # a hello, then a busy and a done each
    assert history[HISTORY_KEPT] == f"... {left_out} decision(s) left out ..."
    assert history[-1] == f"p0 bundle {3 * HISTORY_KEPT - 1} done"
