"""Endpoint sets: newest version wins, readers reused or closed in the background, budget reset."""
from __future__ import annotations

import itertools
import logging
import random
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkbeam.errors import SparkBeamError
from sparkbeam.streaming.budget import BudgetDistributor, WorkBudget
from sparkbeam.streaming.endpoints import (
    EndpointSet,
    EndpointSetTracker,
    Reader,
    close_on_daemon_thread,
)


class FakeReader:
    """A reader that counts its closes."""

    _ids = itertools.count()

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.id = next(self._ids)
        self.closes = 0

    def close(self) -> None:
        self.closes += 1

    def __repr__(self) -> str:
        return f"FakeReader({self.endpoint}#{self.id})"


class Harness:
    """A tracker with recording fakes: every opened reader, closes collected synchronously."""

    def __init__(self, total: WorkBudget = WorkBudget(100, 1000)) -> None:
        self.opened: list[FakeReader] = []
        self.closed: list[FakeReader] = []
        self.now = 0.0
        self.tracker = EndpointSetTracker(
            self.open, BudgetDistributor(total), close_later=self.close_later,
            clock=lambda: self.now,
        )

    def close_later(self, reader: Reader) -> None:
        assert isinstance(reader, FakeReader)
        reader.close()
        self.closed.append(reader)

    def open(self, endpoint: str) -> FakeReader:
        reader = FakeReader(endpoint)
        self.opened.append(reader)
        return reader

    def apply(self, version: int, work: str, global_data: str = "") -> None:
        assert self.tracker.publish(EndpointSet(version, frozenset(work), frozenset(global_data)))
        assert self.tracker.consume()


def test_consume_with_nothing_published_returns_false_without_waiting() -> None:
    h = Harness()
    assert h.tracker.consume() is False
    assert h.tracker.current is None and dict(h.tracker.readers) == {}


def test_surviving_endpoints_keep_their_reader_and_stale_ones_are_closed() -> None:
    h = Harness()
    h.apply(1, "ab")
    a, b = h.tracker.readers["a"], h.tracker.readers["b"]
    h.apply(2, "bc")
    assert h.tracker.readers["b"] is b
    assert h.closed == [a]
    assert sorted(r.endpoint for r in h.opened) == ["a", "b", "c"]


def test_older_and_equal_versions_are_ignored_and_counted() -> None:
    h = Harness()
    h.apply(5, "a")
    assert not h.tracker.publish(EndpointSet(5, frozenset("b")))
    assert not h.tracker.publish(EndpointSet(3, frozenset("c")))
    assert h.tracker.ignored_count == 2
    assert h.tracker.consume() is False and h.tracker.current == EndpointSet(5, frozenset("a"))


def test_only_the_newest_pending_set_is_applied_intermediate_ones_are_skipped() -> None:
    h = Harness()
    for version, work in [(1, "a"), (2, "b"), (3, "c")]:
        h.tracker.publish(EndpointSet(version, frozenset(work)))
    assert h.tracker.consume()
    assert h.tracker.current is not None and h.tracker.current.version == 3
    assert [r.endpoint for r in h.opened] == ["c"]  # no reader opened for v1 or v2
    assert h.tracker.superseded_count == 2


def test_budget_is_set_over_the_new_work_endpoints_only() -> None:
    h = Harness(WorkBudget(90, 900))
    h.apply(1, "abc", global_data="g")
    assert h.tracker.distributor.shares() == {e: WorkBudget(30, 300) for e in "abc"}
    h.apply(2, "ab", global_data="g")
    assert h.tracker.distributor.shares() == {e: WorkBudget(45, 450) for e in "ab"}
    assert h.tracker.distributor.remaining("a") == WorkBudget(45, 450)


def test_global_data_endpoints_get_separate_readers_and_no_budget() -> None:
    h = Harness()
    h.apply(1, "a", global_data="ag")
    assert set(h.tracker.global_data_readers) == {"a", "g"}
    assert h.tracker.global_data_readers["a"] is not h.tracker.readers["a"]
    assert h.tracker.distributor.endpoints == ["a"]
    g = h.tracker.global_data_readers["g"]
    h.apply(2, "a", global_data="a")
    assert h.closed == [g]


def test_failed_open_closes_readers_opened_for_the_set_and_keeps_the_old_one() -> None:
    h = Harness()
    h.apply(1, "a")
    old = dict(h.tracker.readers)

    def failing_open(endpoint: str) -> FakeReader:
        if endpoint == "c":
            raise ConnectionError("refused")
        return h.open(endpoint)

    h.tracker._open_reader = failing_open  # type: ignore[assignment]
    h.tracker.publish(EndpointSet(2, frozenset("abc")))
    with pytest.raises(SparkBeamError, match=r"applying endpoint set v2 .* still on endpoint "
                       r"set v1 .*: refused"):
        h.tracker.consume()
    assert dict(h.tracker.readers) == old
    assert [r.endpoint for r in h.closed] == ["b"]  # opened for v2, then closed
    assert h.tracker.has_pending  # retried by the next consume


def test_concurrent_consume_is_refused() -> None:
    entered, release = threading.Event(), threading.Event()
    h = Harness()

    def slow_open(endpoint: str) -> FakeReader:
        entered.set()
        release.wait(5)
        return FakeReader(endpoint)

    h.tracker._open_reader = slow_open  # type: ignore[assignment]
    h.tracker.publish(EndpointSet(1, frozenset("a")))
    worker = threading.Thread(target=h.tracker.consume)
    worker.start()
    assert entered.wait(5)
    with pytest.raises(SparkBeamError, match="single consumer thread"):
        h.tracker.consume()
    release.set()
    worker.join(5)


def test_default_close_does_not_block_the_consumer() -> None:
    release, closed = threading.Event(), threading.Event()

    class SlowReader:
        def close(self) -> None:
            release.wait(5)
            closed.set()

    tracker = EndpointSetTracker(lambda e: SlowReader(), BudgetDistributor(WorkBudget(1, 1)))
    tracker.publish(EndpointSet(1, frozenset("a")))
    tracker.consume()
    tracker.publish(EndpointSet(2, frozenset("b")))
    start = time.monotonic()
    tracker.consume()
    assert time.monotonic() - start < 4.0 and not closed.is_set()  # the close waits 5 s
    release.set()
    assert closed.wait(5)


def test_default_close_logs_a_failing_close(caplog: pytest.LogCaptureFixture) -> None:
    class BrokenReader:
        def close(self) -> None:
            raise OSError("socket gone")

    with caplog.at_level(logging.ERROR, logger="sparkbeam.streaming.endpoints"):
        close_on_daemon_thread(BrokenReader())
        deadline = time.monotonic() + 5
        # The handler keeps the record before it writes its text (the traceback's last line
        # last), so the wait is for the text: waiting for the record raced it once under load.
        while "socket gone" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.01)
    assert "closing stale reader" in caplog.text and "socket gone" in caplog.text


def test_close_hands_every_reader_to_close_later() -> None:
    h = Harness()
    h.apply(1, "ab", global_data="g")
    h.tracker.close()
    assert sorted(r.endpoint for r in h.closed) == ["a", "b", "g"]
    assert h.tracker.distributor.endpoints == []


@settings(max_examples=25, deadline=None)
@given(
    per_thread=st.lists(
        st.lists(st.tuples(st.integers(0, 200), st.sets(st.sampled_from("abcdefgh"))),
                 min_size=1, max_size=40),
        min_size=2, max_size=4,
    ),
    seed=st.integers(0, 2**16),
)
def test_publishing_from_several_threads_ends_on_the_max_version_without_leaking_readers(
    per_thread: list[list[tuple[int, set[str]]]], seed: int
) -> None:
    h = Harness()
    tracker = h.tracker
    rng = random.Random(seed)
    def publisher(updates: list[tuple[int, set[str]]]) -> None:
        for version, work in updates:
            tracker.publish(EndpointSet(version, frozenset(work), frozenset(rng.sample("xyz", 1))))

    def check_step() -> None:
        before = dict(tracker.readers)
        if tracker.consume():
            after = tracker.readers
            for endpoint in before.keys() & after.keys():  # survivors keep the same object
                assert after[endpoint] is before[endpoint]

    threads = [threading.Thread(target=publisher, args=(u,)) for u in per_thread]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        check_step()
    for t in threads:
        t.join()
    check_step()
    assert tracker.current is not None
    assert tracker.current.version == max(v for u in per_thread for v, _ in u)
    live = {id(r) for r in [*tracker.readers.values(), *tracker.global_data_readers.values()]}
    for reader in h.opened:  # every reader is current or closed exactly once, never both
        assert reader.closes == (0 if id(reader) in live else 1), reader
    tracker.close()
    assert all(reader.closes == 1 for reader in h.opened)  # nothing leaked, none closed twice
    assert sorted(map(id, h.closed)) == sorted(map(id, h.opened))
