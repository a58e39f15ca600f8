"""Flow control between the gRPC thread that receives chunks and the threads that write them.

Three pieces:
- `FailureLatch`: a session's first failure, sticky, waking whoever waits for that session.
- `OverflowingSemaphore`: caps the bytes received but not yet written. An acquire waits only
  while the cap is already reached, so it may overshoot the cap once (a chunk larger than the
  cap still passes) and in-flight bytes stay below `capacity + largest chunk`. It never blocks
  forever after a failure: failing it, or the acquirer's latch, releases every waiter.
- `ChunkWriter`: one artifact's bounded chunk queue, drained by a bounded pool of writer
  threads. A writer thread only ever blocks on storage, never on the network, because a
  writer is scheduled only when it has chunks queued; a slow client cannot pin a thread.
  The end of an artifact is a sentinel object, never an empty chunk (empty chunks are legal
  data and are dropped on arrival), so no chunk can be mistaken for the end.
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Generic, Protocol, TypeVar

from sparkbeam.artifacts.failures import Aborted

_LOGGER = logging.getLogger(__name__)

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class FailureLatch:
    """The first failure of a session. Later failures are ignored; listeners hear the first."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self._listeners: dict[Callable[[], None], None] = {}  # an ordered set

    @property
    def error(self) -> BaseException | None:
        """The first failure, or None while all is well."""
        return self._error

    def fail(self, error: BaseException) -> bool:
        """Records `error` unless a failure is already recorded; True if this one was first."""
        with self._lock:
            if self._error is not None:
                return False
            self._error = error
            listeners = list(self._listeners)
            self._listeners.clear()
        # Called outside our lock: listeners take their own locks (see `add_listener`).
        for listener in listeners:
            try:
                listener()
            except Exception:  # noqa: BLE001 - one bad listener must not silence the others
                _LOGGER.exception("failure listener %r raised", listener)
        return True

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Calls `listener()` once on the first failure (at once if it already happened).

        Adding the same listener twice registers it once. Listeners must not call back into
        this latch while holding a lock that `fail` callers might hold.
        """
        with self._lock:
            if self._error is None:
                self._listeners[listener] = None
                return
        listener()

    def remove_listener(self, listener: Callable[[], None]) -> None:
        """Forgets a listener that no longer needs to hear of failures."""
        with self._lock:
            self._listeners.pop(listener, None)

    def check(self, what: str = "artifact staging") -> None:
        """Raises `Aborted` with the first failure as its cause, if there is one."""
        error = self._error
        if error is not None:
            raise Aborted(error, what) from error


class OverflowingSemaphore:
    """A byte budget whose acquires may overshoot the capacity once, and which can fail.

    `acquire(n)` waits while the bytes in use have reached `capacity`, then takes `n` however
    large, so `in_use < capacity + n` holds after every acquire and a single chunk larger
    than the capacity cannot deadlock. `fail(error)` (all acquirers) or a failed latch (the
    acquirers of one session) make waiting acquires raise `Aborted` instead of waiting.
    """

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError(f"capacity must be positive, got {capacity}")
        self.capacity = capacity
        self._cond = threading.Condition()
        self._in_use = 0
        self._peak = 0
        self._error: BaseException | None = None

    @property
    def in_use(self) -> int:
        """Bytes acquired and not yet released."""
        return self._in_use

    @property
    def peak(self) -> int:
        """The most bytes ever in use at once."""
        return self._peak

    def acquire(
        self, n: int, *, latch: FailureLatch | None = None, timeout: float | None = None
    ) -> None:
        """Takes `n` bytes of budget, waiting while the capacity is reached.

        Raises `Aborted` if the semaphore or `latch` has failed (also while waiting) and
        TimeoutError if `timeout` seconds pass first.
        """
        if n < 0:
            raise ValueError(f"cannot acquire a negative number of bytes ({n})")
        if latch is not None:
            latch.add_listener(self._wake)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                self._raise_if_failed(latch)
                if self._in_use < self.capacity:
                    self._in_use += n
                    self._peak = max(self._peak, self._in_use)
                    return
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(
                        f"waited {timeout}s for {n} bytes of budget "
                        f"({self._in_use} of {self.capacity} in use)"
                    )
                self._cond.wait(remaining)

    def release(self, n: int) -> None:
        """Returns `n` bytes of budget and wakes waiters."""
        with self._cond:
            if n < 0 or n > self._in_use:
                raise ValueError(f"cannot release {n} bytes: only {self._in_use} in use")
            self._in_use -= n
            self._cond.notify_all()

    def fail(self, error: BaseException) -> None:
        """Makes every current and future acquire raise `Aborted` caused by `error`."""
        with self._cond:
            if self._error is None:
                self._error = error
            self._cond.notify_all()

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _raise_if_failed(self, latch: FailureLatch | None) -> None:
        if latch is not None:
            latch.check("waiting for write budget")
        if self._error is not None:
            raise Aborted(self._error, "waiting for write budget") from self._error


class ChunkSink(Protocol[T_co]):
    """Where one artifact's chunks go. Called from one writer thread at a time, in order."""

    def write(self, chunk: bytes) -> None:
        """Writes the next chunk."""
        ...

    def complete(self) -> T_co:
        """Called once after the last chunk; returns the writer's result."""
        ...

    def discard(self) -> None:
        """Called instead of `complete` when the artifact is given up; must not raise."""
        ...


_END = object()  # end of an artifact's chunks: an identity, never a value a client could send


class ChunkWriter(Generic[T]):
    """Moves one artifact's chunks from the receiving thread to a writer thread of `pool`.

    The receiver calls `put` for each chunk and `close` after the last; `result` resolves to
    the sink's `complete()` value, or fails with the write error, or with `Aborted` when the
    session's latch fails first (the sink is then discarded and its queued bytes released).
    A write error fails the latch, so the session and its other writers stop too.
    """

    def __init__(
        self,
        sink: ChunkSink[T],
        *,
        pool: Executor,
        budget: OverflowingSemaphore,
        latch: FailureLatch,
        max_queued: int,
        label: str = "artifact",
    ) -> None:
        if max_queued <= 0:
            raise ValueError(f"max_queued must be positive, got {max_queued}")
        self.result: Future[T] = Future()
        self._sink = sink
        self._pool = pool
        self._budget = budget
        self._latch = latch
        self._max_queued = max_queued
        self._label = label
        self._cond = threading.Condition()
        self._queue: collections.deque[object] = collections.deque()
        self._scheduled = False  # a drain is submitted or running
        self._closed = False  # `close` was called: no more chunks
        self._settled = False  # `result` is resolved, or about to be
        latch.add_listener(self._on_failure)

    def put(self, chunk: bytes, timeout: float | None = None) -> None:
        """Queues a chunk, waiting for byte budget and queue room; raises `Aborted` on failure."""
        if not chunk:
            return
        if self._closed:
            raise RuntimeError(f"{self._label}: chunk received after the end of the artifact")
        deadline = None if timeout is None else time.monotonic() + timeout
        self._budget.acquire(len(chunk), latch=self._latch, timeout=timeout)
        try:
            with self._cond:
                while len(self._queue) >= self._max_queued and not self._stopped():
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        raise TimeoutError(f"{self._label}: waited {timeout}s for queue room")
                    self._cond.wait(remaining)
                self._latch.check(f"writing {self._label}")
                if self._settled:
                    raise RuntimeError(f"{self._label}: chunk received after it was settled")
                self._queue.append(chunk)
                start = self._claim_drain()
        except BaseException:
            self._budget.release(len(chunk))
            raise
        if start:
            self._submit()

    def close(self) -> Future[T]:
        """Marks the end of the artifact; returns `result`."""
        with self._cond:
            if self._closed:
                return self.result
            self._closed = True
            self._queue.append(_END)  # the end may exceed the queue bound by one: no bytes
            start = self._claim_drain()
        if start:
            self._submit()
        return self.result

    def _stopped(self) -> bool:
        return self._latch.error is not None or self._settled

    def _claim_drain(self) -> bool:
        """Under `_cond`: whether the caller must submit a drain (at most one at a time)."""
        if self._scheduled or self._settled:
            return False
        self._scheduled = True
        return True

    def _submit(self) -> None:
        try:
            self._pool.submit(self._drain)
        except RuntimeError:  # the pool is shut down: settle here rather than leak
            self._drain()

    def _on_failure(self) -> None:
        with self._cond:
            self._cond.notify_all()
            start = self._claim_drain()
        if start:
            self._submit()

    def _drain(self) -> None:
        """Writes queued chunks until the queue is empty; runs on one pool thread at a time."""
        while True:
            with self._cond:
                if self._settled:
                    self._scheduled = False
                    return
                if self._latch.error is not None:
                    dropped = self._settle_locked()
                    break
                if not self._queue:
                    self._scheduled = False
                    return
                item = self._queue.popleft()
                self._cond.notify_all()  # there is queue room now
            if item is _END:
                self._finish()
                return
            assert isinstance(item, bytes)
            try:
                self._sink.write(item)
            except Exception as exc:  # noqa: BLE001 - becomes the session's failure
                self._budget.release(len(item))  # before `result` settles: no bytes linger
                self._fail(exc)
                return
            self._budget.release(len(item))
        self._give_up(dropped, None)

    def _finish(self) -> None:
        try:
            value = self._sink.complete()
        except Exception as exc:  # noqa: BLE001 - becomes the session's failure
            self._fail(exc)
            return
        with self._cond:
            self._settled = True
            self._scheduled = False
        self._latch.remove_listener(self._on_failure)  # done: the session need not keep us
        self.result.set_result(value)

    def _fail(self, exc: Exception) -> None:
        _LOGGER.warning("%s: write failed: %s", self._label, exc)
        self._latch.fail(exc)
        with self._cond:
            dropped = self._settle_locked()
        self._give_up(dropped, exc)

    def _settle_locked(self) -> int:
        """Under `_cond`: empties the queue and stops the writer; returns the bytes dropped."""
        dropped = sum(len(item) for item in self._queue if isinstance(item, bytes))
        self._queue.clear()
        self._settled = True
        self._scheduled = False
        self._cond.notify_all()
        return dropped

    def _give_up(self, dropped: int, own_error: BaseException | None) -> None:
        """Releases dropped bytes, discards the sink and fails `result`."""
        if dropped:
            self._budget.release(dropped)
        self._sink.discard()
        if own_error is not None:
            self.result.set_exception(own_error)
        else:
            error = self._latch.error
            assert error is not None
            self.result.set_exception(Aborted(error, f"writing {self._label}"))
