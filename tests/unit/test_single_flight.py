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


def test_callers_that_arrive_during_a_start_share_its_value() -> None:
    flight: SingleFlight[object] = SingleFlight()
    release = threading.Event()
    calls = []

    def start() -> object:
        calls.append(1)
        release.wait(10)
        return object()

    threads, results = _callers(flight, start, 12)
    # Let every caller reach the flight before the start finishes.
    threading.Event().wait(0.3)
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

    threads, results = _callers(flight, broken, 6)
    threading.Event().wait(0.3)
    release.set()
    for t in threads:
        t.join(10)
    assert len(attempts) == 1
    assert all(isinstance(r, RuntimeError) and "JAVA_GATEWAY_EXITED" in str(r) for r in results)
    assert flight.run(lambda: "started") == "started"  # the next job tries again
    assert flight.flights == 2
