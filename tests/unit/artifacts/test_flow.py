"""Flow control: the overflowing semaphore, the failure latch and the chunk writer."""
from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkbeam.artifacts.failures import Aborted
from sparkbeam.artifacts.flow import ChunkWriter, FailureLatch, OverflowingSemaphore

pytestmark = pytest.mark.timeout(120)

JOIN = 10.0  # seconds any helper thread may take to stop; a hang fails the test instead


def start(target: Any, *args: Any) -> tuple[threading.Thread, list[BaseException]]:
    """Runs target in a daemon thread; returns the thread and the errors it raised."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            target(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, errors


def wait_until(predicate: Any, timeout: float = JOIN) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.005)


# --- OverflowingSemaphore -----------------------------------------------------------------


def test_a_chunk_larger_than_the_capacity_passes_when_nothing_is_in_flight() -> None:
    sem = OverflowingSemaphore(10)
    sem.acquire(25, timeout=1)
    assert sem.in_use == 25
    with pytest.raises(TimeoutError, match="waited 0.05s for 1 bytes of budget"):
        sem.acquire(1, timeout=0.05)
    sem.release(25)
    sem.acquire(1, timeout=1)


def test_an_acquire_overshoots_once_then_waits_for_a_release() -> None:
    sem = OverflowingSemaphore(10)
    sem.acquire(9)
    sem.acquire(5)  # 9 < 10: room, so it may overshoot to 14
    assert sem.in_use == 14
    thread, errors = start(sem.acquire, 3)
    time.sleep(0.05)
    assert thread.is_alive()  # 14 >= 10: waits
    sem.release(5)
    thread.join(JOIN)
    assert not thread.is_alive() and not errors and sem.in_use == 12


def test_releasing_more_than_acquired_is_a_bug() -> None:
    sem = OverflowingSemaphore(10)
    sem.acquire(3)
    with pytest.raises(ValueError, match="cannot release 4 bytes: only 3 in use"):
        sem.release(4)
    with pytest.raises(ValueError, match="negative"):
        sem.acquire(-1)


def test_failing_the_semaphore_releases_every_waiter_with_the_cause() -> None:
    sem = OverflowingSemaphore(1)
    sem.acquire(1)
    waiters = [start(sem.acquire, 1) for _ in range(3)]
    time.sleep(0.05)
    sem.fail(OSError("disk full"))
    for thread, errors in waiters:
        thread.join(JOIN)
        assert not thread.is_alive()
        assert len(errors) == 1 and isinstance(errors[0], Aborted)
        assert isinstance(errors[0].cause, OSError)
        assert "waiting for write budget aborted: OSError: disk full" in str(errors[0])
    with pytest.raises(Aborted, match="disk full"):  # later acquires fail at once, room or not
        sem.acquire(0)


def test_a_failed_latch_releases_only_its_own_waiters() -> None:
    sem = OverflowingSemaphore(1)
    sem.acquire(1)
    mine, theirs = FailureLatch(), FailureLatch()
    my_thread, my_errors = start(lambda: sem.acquire(1, latch=mine))
    their_thread, their_errors = start(lambda: sem.acquire(1, latch=theirs))
    time.sleep(0.05)
    mine.fail(ConnectionError("client went away"))
    my_thread.join(JOIN)
    assert not my_thread.is_alive()
    assert isinstance(my_errors[0], Aborted) and "client went away" in str(my_errors[0])
    assert their_thread.is_alive()  # another session still waits for budget, as it should
    sem.release(1)
    their_thread.join(JOIN)
    assert not their_thread.is_alive() and not their_errors


def test_the_latch_keeps_the_first_failure_and_calls_listeners_once() -> None:
    latch, calls = FailureLatch(), []
    latch.add_listener(lambda: calls.append("a"))
    assert latch.fail(ValueError("first")) and not latch.fail(ValueError("second"))
    assert str(latch.error) == "first" and calls == ["a"]
    latch.add_listener(lambda: calls.append("late"))  # after the failure: called at once
    assert calls == ["a", "late"]
    with pytest.raises(Aborted, match="upload aborted: ValueError: first"):
        latch.check("upload")


@settings(max_examples=200, deadline=None)
@given(
    capacity=st.integers(1, 50),
    ops=st.lists(st.tuples(st.booleans(), st.integers(0, 80)), max_size=40),
)
def test_sequential_model_in_use_below_capacity_plus_one_chunk(
    capacity: int, ops: list[tuple[bool, int]]
) -> None:
    """Model check: an acquire succeeds exactly when in_use < capacity."""
    sem, held = OverflowingSemaphore(capacity), []
    for is_acquire, n in ops:
        if is_acquire:
            before = sem.in_use
            try:
                sem.acquire(n, timeout=0)
            except TimeoutError:
                assert before >= capacity
            else:
                assert before < capacity
                held.append(n)
            assert sem.in_use < capacity + max(n, 1) or sem.in_use == before
        elif held:
            sem.release(held.pop(0))
        assert sem.in_use == sum(held)


@settings(max_examples=30, deadline=None)
@given(
    capacity=st.integers(1, 64),
    producers=st.lists(st.lists(st.integers(0, 100), min_size=1, max_size=12), min_size=1,
                       max_size=3),
    fail_after=st.none() | st.integers(0, 20),
)
def test_threads_in_flight_within_capacity_plus_one_chunk_and_never_stuck_after_failure(
    capacity: int, producers: list[list[int]], fail_after: int | None
) -> None:
    """Producers acquire chunks; one writer releases them, and may die after `fail_after`.

    Whatever the interleaving: in-flight bytes stay below capacity + the largest chunk, and
    every producer stops in bounded time, also those blocked when the writer dies.
    """
    sem = OverflowingSemaphore(capacity)
    latch = FailureLatch()
    handed: queue.Queue[int | None] = queue.Queue()
    largest = max(max(chunks) for chunks in producers)

    def produce(chunks: list[int]) -> None:
        for n in chunks:
            sem.acquire(n, latch=latch)
            handed.put(n)

    def write() -> None:
        written = 0
        while True:
            n = handed.get()
            if n is None:
                return
            if fail_after is not None and written == fail_after:
                latch.fail(OSError("writer died"))
                return  # a dead writer releases nothing more
            sem.release(n)
            written += 1

    writer, _ = start(write)
    threads = [start(produce, chunks) for chunks in producers]
    for thread, _ in threads:
        thread.join(JOIN)
        assert not thread.is_alive(), "a producer blocked forever"
    handed.put(None)
    writer.join(JOIN)
    assert not writer.is_alive()
    assert sem.peak == 0 or sem.peak < capacity + largest
    for _, errors in threads:
        assert all(isinstance(e, Aborted) and "writer died" in str(e) for e in errors)
        if latch.error is None:
            assert not errors
    if latch.error is None:
        assert sem.in_use == 0


# --- ChunkWriter ----------------------------------------------------------------------------


class ListSink:
    """Collects chunks; can fail on the n-th write or block each write on a gate."""

    def __init__(self, fail_on: int | None = None, gate: threading.Event | None = None) -> None:
        self.chunks: list[bytes] = []
        self.discarded = False
        self.completed = False
        self._fail_on = fail_on
        self._gate = gate
        self.entered = threading.Event()  # a write has started

    def write(self, chunk: bytes) -> None:
        self.entered.set()
        if self._gate is not None:
            assert self._gate.wait(JOIN)
        if self._fail_on is not None and len(self.chunks) == self._fail_on:
            raise OSError(f"write {self._fail_on} failed")
        self.chunks.append(chunk)

    def complete(self) -> bytes:
        self.completed = True
        return b"".join(self.chunks)

    def discard(self) -> None:
        self.discarded = True


@pytest.fixture
def pool() -> Any:
    executor = ThreadPoolExecutor(max_workers=2)
    yield executor
    executor.shutdown(wait=True)


def writer_for(sink: ListSink, pool: Any, sem: OverflowingSemaphore, latch: FailureLatch,
               max_queued: int = 2) -> ChunkWriter[bytes]:
    return ChunkWriter(sink, pool=pool, budget=sem, latch=latch, max_queued=max_queued,
                       label="artifact 'x'")


def test_chunks_arrive_in_order_and_empty_chunks_are_not_the_end(pool: Any) -> None:
    sem, latch, sink = OverflowingSemaphore(8), FailureLatch(), ListSink()
    writer = writer_for(sink, pool, sem, latch)
    for chunk in [b"ab", b"", b"cdef", b"", b"g" * 20, b"h"]:
        writer.put(chunk, timeout=JOIN)
    assert writer.close().result(JOIN) == b"abcdef" + b"g" * 20 + b"h"
    assert sink.completed and not sink.discarded and sem.in_use == 0


def test_an_empty_artifact_completes(pool: Any) -> None:
    sem, latch, sink = OverflowingSemaphore(8), FailureLatch(), ListSink()
    assert writer_for(sink, pool, sem, latch).close().result(JOIN) == b""


def test_bounded_queue_blocks_the_receiver_until_the_writer_catches_up(pool: Any) -> None:
    gate = threading.Event()
    sem, latch, sink = OverflowingSemaphore(1000), FailureLatch(), ListSink(gate=gate)
    writer = writer_for(sink, pool, sem, latch, max_queued=2)
    for _ in range(3):  # one being written (blocked on the gate), two queued
        writer.put(b"x", timeout=JOIN)
    with pytest.raises(TimeoutError, match="waited 0.05s for queue room"):
        writer.put(b"y", timeout=0.05)
    assert sem.in_use == 3  # the refused chunk's budget went back
    gate.set()
    writer.put(b"z", timeout=JOIN)
    assert writer.close().result(JOIN) == b"xxxz"


def test_a_write_error_fails_the_latch_releases_budget_and_wakes_the_receiver(
    pool: Any,
) -> None:
    gate = threading.Event()
    sem, latch = OverflowingSemaphore(1000), FailureLatch()
    sink = ListSink(fail_on=0, gate=gate)
    writer = writer_for(sink, pool, sem, latch, max_queued=1)
    writer.put(b"a", timeout=JOIN)  # taken by the writer thread, which blocks on the gate
    assert sink.entered.wait(JOIN)
    writer.put(b"b", timeout=JOIN)  # fills the queue
    blocked, errors = start(writer.put, b"c")  # waits for queue room
    time.sleep(0.05)
    assert blocked.is_alive()
    gate.set()  # writing "a" fails
    blocked.join(JOIN)
    assert not blocked.is_alive()
    assert isinstance(errors[0], Aborted) and "OSError: write 0 failed" in str(errors[0])
    with pytest.raises(OSError, match="write 0 failed"):
        writer.result.result(JOIN)
    assert isinstance(latch.error, OSError) and sink.discarded and not sink.completed
    assert sem.in_use == 0  # "b" was dropped and its bytes released; "c" never counted


def test_an_idle_writer_is_discarded_when_its_session_fails(pool: Any) -> None:
    sem, latch, sink = OverflowingSemaphore(1000), FailureLatch(), ListSink()
    writer = writer_for(sink, pool, sem, latch)
    writer.put(b"partial", timeout=JOIN)
    wait_until(lambda: sink.chunks == [b"partial"])
    latch.fail(ConnectionError("client cancelled"))  # no more chunks will ever come
    with pytest.raises(Aborted, match="writing artifact 'x' aborted: ConnectionError"):
        writer.result.result(JOIN)
    assert sink.discarded and sem.in_use == 0
    with pytest.raises(Aborted, match="client cancelled"):
        writer.put(b"more", timeout=JOIN)
    assert sem.in_use == 0


def test_a_writer_settles_even_when_the_pool_is_shut_down() -> None:
    executor = ThreadPoolExecutor(max_workers=1)
    sem, latch, sink = OverflowingSemaphore(1000), FailureLatch(), ListSink()
    writer = writer_for(sink, executor, sem, latch)
    executor.shutdown(wait=True)
    writer.put(b"abc", timeout=JOIN)  # drained inline rather than lost
    assert writer.close().result(JOIN) == b"abc"
    assert sem.in_use == 0
