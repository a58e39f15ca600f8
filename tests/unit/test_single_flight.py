"""SingleFlight: one factory call for every caller that arrives while it runs (no Spark)."""
from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from sparkbeam.execute.single_flight import SingleFlight

pytestmark = pytest.mark.timeout(30)


def _callers(
    flight: SingleFlight[object], factory: Callable[[], object], n: int
) -> tuple[list[threading.Thread], list[object]]:
    """Starts n callers of `flight.run(factory)`; returns what each got (value or error)."""
    results: list[object] = [None] * n
    arrived = threading.Barrier(n + 1)

    def call(i: int) -> None:
        arrived.wait()
        try:
            results[i] = flight.run(factory)
        except Exception as exc:  # noqa: BLE001 - recorded for the assertions
            results[i] = exc

    threads = [threading.Thread(target=call, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    arrived.wait()
    return threads, results


class _CountingLock:
    """The flight's lock, counting who has taken it: each caller takes it once on arrival
    (the leader again only when its start is over)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.taken = 0

    def __enter__(self) -> None:
        self._lock.acquire()
        self.taken += 1

    def __exit__(self, *_: object) -> None:
        self._lock.release()


def _counted(flight: SingleFlight[object] | SingleFlight[str]) -> _CountingLock:
    lock = flight._lock = _CountingLock()  # type: ignore[assignment]
    return lock


def _until_arrived(lock: _CountingLock, n: int) -> None:
    """Every caller has reached the flight (a fixed wait was a guess on a loaded machine)."""
    for _ in range(1000):
        if lock.taken >= n:
            return
        threading.Event().wait(0.01)
    raise AssertionError(f"only {lock.taken} of {n} callers reached the flight")


def test_callers_that_arrive_during_a_start_share_its_value() -> None:
    flight: SingleFlight[object] = SingleFlight()
    release = threading.Event()
    calls = []

    def start() -> object:
        calls.append(1)
        release.wait(10)
        return object()

    lock = _counted(flight)
    threads, results = _callers(flight, start, 12)
    _until_arrived(lock, 12)  # every caller reaches the flight before the start finishes
    release.set()
    for t in threads:
        t.join(10)
    assert len(calls) == 1 and flight.flights == 1
    assert len({id(r) for r in results}) == 1 and results[0] is not None


def test_a_failed_start_fails_its_waiters_with_its_cause_and_the_next_caller_retries() -> None:
    flight: SingleFlight[str] = SingleFlight()
    release = threading.Event()
    attempts = []

    def broken() -> str:
        attempts.append(1)
        release.wait(10)
        raise RuntimeError("JAVA_GATEWAY_EXITED: the gateway did not start")

    lock = _counted(flight)
    threads, results = _callers(flight, broken, 6)
    _until_arrived(lock, 6)
    release.set()
    for t in threads:
        t.join(10)
    assert len(attempts) == 1
    assert all(isinstance(r, RuntimeError) and "JAVA_GATEWAY_EXITED" in str(r) for r in results)
    assert flight.run(lambda: "started") == "started"  # the next job tries again
    assert flight.flights == 2
