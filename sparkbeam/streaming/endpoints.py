"""Versioned endpoint sets of a streaming worker, and the readers kept for them.

The backend tells a worker, from time to time, which endpoints to read work from and which serve
side inputs ("global data"). `EndpointSetTracker.publish` takes such a set from any thread;
`consume`, on the one consumer thread, applies the newest one. Invariants:

- One pending slot: a set whose version is not newer than one published before is ignored (and
  counted); a pending set replaced by a newer one is never applied.
- One reader per endpoint for as long as the endpoint is in the set: a surviving endpoint keeps
  its reader, a new one gets a reader opened once (`_reuse_or_open`, one pass), a gone one's
  reader is handed to `close_later`, which never blocks the consumer (the default closes it on
  a daemon thread of its own). Without `open_reader` the endpoints are tracked with no readers.
- Global-data endpoints get readers of their own and no work budget.
- Applying a set redistributes the work budget over its endpoints (set, never adjusted).
- A failure to open readers propagates to the consumer (the readers opened for the failed set
  are closed and the set stays pending for a retry), rather than being logged and skipped.
- The tracker needs no start call: `consume` never waits for a first set. The lock guards the
  pending slot only; the applied state belongs to the consumer thread.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

from sparkbeam.errors import SparkBeamError
from sparkbeam.streaming.budget import BudgetDistributor

_LOG = logging.getLogger(__name__)


class Reader(Protocol):
    """What the tracker needs of a per-endpoint reader (a stream to one backend endpoint)."""

    def close(self) -> None: ...


@dataclass(frozen=True)
class EndpointSet:
    """One version of the backend's endpoint assignment for this worker."""

    version: int
    endpoints: frozenset[str]
    global_data: frozenset[str] = frozenset()

    def __str__(self) -> str:
        return (
            f"endpoint set v{self.version} ({len(self.endpoints)} work, "
            f"{len(self.global_data)} global data)"
        )


def close_on_daemon_thread(reader: Reader) -> None:
    """Close `reader` on a new daemon thread; returns at once, never blocks the caller."""
    threading.Thread(
        target=_close_logging_errors, args=(reader,), name="close-stale-reader", daemon=True
    ).start()


def _close_logging_errors(reader: Reader) -> None:
    try:
        reader.close()
    except Exception:  # noqa: BLE001 - a stale reader's close failure must not kill anything
        _LOG.exception("closing stale reader %r failed", reader)


class EndpointSetTracker:
    """Applies the newest published endpoint set: readers kept, opened, closed; budget reset.

    `publish` is thread-safe; `consume` and `close` belong to one consumer thread, which also
    owns `distributor`. Reads of `readers` / `global_data_readers` return immutable snapshots.
    """

    def __init__(
        self,
        open_reader: Callable[[str], Reader] | None,
        distributor: BudgetDistributor,
        *,
        open_global_data_reader: Callable[[str], Reader] | None = None,
        close_later: Callable[[Reader], None] = close_on_daemon_thread,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # None: the endpoints are tracked and budgeted without readers (a source that plans
        # batches reads through Spark's tasks, not through per-endpoint streams).
        self._open_reader = open_reader
        self._open_global_data_reader = open_global_data_reader or open_reader
        self._close_later = close_later
        self._clock = clock
        self.distributor = distributor
        self._lock = threading.Lock()  # guards the three fields below only
        self._pending: EndpointSet | None = None
        self._newest_version: int | None = None
        self._ignored = 0
        self._superseded = 0
        self._consuming = threading.Lock()  # detects a second concurrent consumer
        self._current: EndpointSet | None = None
        self._readers: Mapping[str, Reader] = MappingProxyType({})
        self._global_data_readers: Mapping[str, Reader] = MappingProxyType({})

    # -- any thread ---------------------------------------------------------------------------
    def publish(self, new_set: EndpointSet) -> bool:
        """Offer a set; True when it is now the pending one, False when ignored as not newer
        than one already published."""
        with self._lock:
            if self._newest_version is not None and new_set.version <= self._newest_version:
                self._ignored += 1
                return False
            if self._pending is not None:
                self._superseded += 1
            self._pending = new_set
            self._newest_version = new_set.version
            return True

    @property
    def ignored_count(self) -> int:
        """Published sets ignored because their version was not newer."""
        with self._lock:
            return self._ignored

    @property
    def superseded_count(self) -> int:
        """Pending sets replaced by a newer one before the consumer applied them."""
        with self._lock:
            return self._superseded

    @property
    def has_pending(self) -> bool:
        """True when a published set waits for `consume`."""
        with self._lock:
            return self._pending is not None

    # -- consumer thread ----------------------------------------------------------------------
    @property
    def current(self) -> EndpointSet | None:
        """The endpoint set applied last, or None before the first one."""
        return self._current

    @property
    def readers(self) -> Mapping[str, Reader]:
        """Work endpoint -> its reader, for the current set."""
        return self._readers

    @property
    def global_data_readers(self) -> Mapping[str, Reader]:
        """Global-data (side input) endpoint -> its reader, for the current set."""
        return self._global_data_readers

    def consume(self) -> bool:
        """Apply the newest pending set, if any; False when there was none. Never blocks."""
        if not self._consuming.acquire(blocking=False):
            raise SparkBeamError(
                "endpoint set tracker: consume() called while another consume() runs; "
                "expected a single consumer thread"
            )
        try:
            with self._lock:
                new_set, self._pending = self._pending, None
            if new_set is None:
                return False
            self._apply(new_set)
            return True
        finally:
            self._consuming.release()

    def _apply(self, new_set: EndpointSet) -> None:
        opened: list[Reader] = []
        try:
            readers = self._reuse_or_open(new_set.endpoints, self._readers, self._open_reader,
                                          opened)
            global_readers = self._reuse_or_open(new_set.global_data, self._global_data_readers,
                                                 self._open_global_data_reader, opened)
        except Exception as exc:
            for reader in opened:
                self._close_later(reader)
            with self._lock:  # let a later consume() retry unless something newer came
                if self._pending is None:
                    self._pending = new_set
            raise SparkBeamError(
                f"applying {new_set} failed while opening readers; still on "
                f"{self._current or 'no endpoint set'}: {exc}"
            ) from exc
        stale = [r for e, r in self._readers.items() if e not in readers]
        stale += [r for e, r in self._global_data_readers.items() if e not in global_readers]
        for reader in stale:
            self._close_later(reader)  # does not block: closing happens elsewhere
        self._readers = MappingProxyType(readers)
        self._global_data_readers = MappingProxyType(global_readers)
        self._current = new_set
        # Budgets are set for the new set, not adjusted (no upward drift); global data gets none.
        self.distributor.distribute(sorted(new_set.endpoints), self._clock())
        _LOG.info("applied %s: %d reader(s) opened, %d closed", new_set, len(opened), len(stale))

    @staticmethod
    def _reuse_or_open(
        endpoints: frozenset[str],
        existing: Mapping[str, Reader],
        open_reader: Callable[[str], Reader] | None,
        opened: list[Reader],
    ) -> dict[str, Reader]:
        readers: dict[str, Reader] = {}
        if open_reader is None:
            return readers
        for endpoint in sorted(endpoints):
            reader = existing.get(endpoint)
            if reader is None:
                reader = open_reader(endpoint)
                opened.append(reader)
            readers[endpoint] = reader
        return readers

    def close(self) -> None:
        """Hand every current reader to `close_later` and forget them (worker shutdown)."""
        for reader in [*self._readers.values(), *self._global_data_readers.values()]:
            self._close_later(reader)
        self._readers = MappingProxyType({})
        self._global_data_readers = MappingProxyType({})
        self._current = None
        self.distributor.distribute([], self._clock())
