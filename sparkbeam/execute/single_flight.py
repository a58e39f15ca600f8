"""One call of a factory at a time, shared by everyone who asks while it runs (no pyspark).

Jobs that reach a fresh job server together must not each start a SparkContext: two starts
race for the JVM gateway and one job fails with JAVA_GATEWAY_EXITED. `SingleFlight.run` lets
the first caller run the factory; callers that arrive while it runs wait for it and get its
outcome, the value or the very exception it raised. Once a flight has landed the next caller
starts a new one, so a failed start is tried again by the next job, and a successful one is
found again by the factory itself (the session is active by then).
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Generic, TypeVar

T = TypeVar("T")


class SingleFlight(Generic[T]):
    """Runs `factory` once for all concurrent callers of `run`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._flight: Future[T] | None = None
        self.flights = 0  # factory calls so far (how many times a start was tried)

    def run(self, factory: Callable[[], T]) -> T:
        """The factory's value, or its exception raised; waits for a flight under way."""
        with self._lock:
            flight = self._flight
            leader = flight is None
            if flight is None:
                flight = self._flight = Future()
                self.flights += 1
        if not leader:
            return flight.result()
        try:
            value = factory()
        except BaseException as exc:
            flight.set_exception(exc)
            raise
        else:
            flight.set_result(value)
            return value
        finally:
            with self._lock:
                self._flight = None
