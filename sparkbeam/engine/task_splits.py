"""A task's side of dynamic work rebalancing (runner-initiated splits) for splittable stages.

While a bundle runs, a monitor thread tells the driver's Rebalancer the bundle is busy; when the
driver answers "split", the monitor asks the SDK to split the running bundle
(`ProcessBundleSplitRequest`, the SDK splits the restriction in progress and/or the unread
input), sends the residual to the driver as work for an idle task, and the split is recorded so
a retry of this task replays it (runs the primary only). When the task runs out of input it asks
for work until the driver says every task's work is done.

No pyspark here: the stage task is a plain function of its rows.
"""
from __future__ import annotations

import base64
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from apache_beam.portability.api import beam_fn_api_pb2

from sparkbeam.control.rebalance_channel import RebalanceClient
from sparkbeam.control.shell import SplitOutcome

_LOG = logging.getLogger(__name__)
_POLL_S = 0.1

Chunks = dict[int, list[bytes]]  # stage input index -> encoded elements


class Splittable(Protocol):
    """A worker whose running bundle can be split (embedded or gRPC)."""

    def split(self, fraction: float) -> SplitOutcome | None: ...


class TaskSplitter:
    """Splits this task's bundles when the driver asks, replays the splits of an earlier
    attempt, and fetches other tasks' residuals once this task's own input is done."""

    def __init__(
        self,
        client: RebalanceClient,
        partitions: int,
        input_ids: list[str],
        route: Callable[[beam_fn_api_pb2.BundleApplication], int],
    ) -> None:
        self._client = client
        self._input_ids = input_ids
        self._route = route
        replay = client.hello(partitions)
        self._replay: dict[str, dict[str, Any]] = replay.get("splits", {})
        self._assigned: list[list[list[Any]]] = replay.get("assigned", [])
        self._seq = 0
        self._failure: BaseException | None = None
        self.splits = 0

    def next_bundle(self, chunks: Chunks) -> tuple[int, Chunks, bool]:
        """This bundle's number and inputs (an earlier attempt's split applied), and whether
        it may be split now (a replayed bundle is never split again)."""
        seq = self._seq
        self._seq += 1
        record = self._replay.get(str(seq))
        if record is None:
            return seq, chunks, True
        kept: Chunks = {}
        keep = {int(n): k for n, k in record["keep"].items()}
        for n, elements in chunks.items():
            kept[n] = elements[:keep[n]] if n in keep else list(elements)
        for n, element in record["primary"]:
            kept.setdefault(int(n), []).append(base64.b64decode(element))
        return seq, kept, False

    @contextlib.contextmanager
    def watching(self, seq: int, chunks: Chunks, worker: Splittable) -> Iterator[None]:
        """Runs the split monitor while the bundle `seq` runs in the caller's thread."""
        stop = threading.Event()
        monitor = threading.Thread(
            target=self._monitor, args=(seq, chunks, worker, stop),
            name=f"sparkbeam-split-{seq}", daemon=True,
        )
        monitor.start()
        try:
            yield
        finally:
            stop.set()
            monitor.join()
        self._client.bundle_done(seq)
        if self._failure is not None:
            raise RuntimeError(
                f"bundle {seq} was split but its residual could not be handed to the driver"
            ) from self._failure

    def _monitor(
        self, seq: int, chunks: Chunks, worker: Splittable, stop: threading.Event
    ) -> None:
        while not stop.wait(_POLL_S):
            try:
                answer = self._client.busy(seq)
            except (OSError, ConnectionError) as exc:
                _LOG.warning("rebalancing unavailable, bundle %d runs unsplit: %s", seq, exc)
                return
            if "split" not in answer:
                continue
            # A later split of the same bundle supersedes the earlier record: its primary
            # lies within the earlier one, so replaying the latest is replaying all.
            outcome = worker.split(float(answer["split"]))
            record, items = self._residual(outcome, chunks)
            try:
                self._client.split_result(seq, record, items)
            except (OSError, ConnectionError) as exc:
                if record is not None:
                    self._failure = exc  # the residual would never run: fail the attempt
                return
            if record is not None:
                self.splits += 1

    def _residual(
        self, outcome: SplitOutcome | None, chunks: Chunks
    ) -> tuple[dict[str, Any] | None, list[tuple[int, str]]]:
        """What a retry replays (elements kept per input, primary roots) and the work that
        goes to other tasks (inputs the SDK gave back, residual roots), from the protocol."""
        if outcome is None:
            return None, []
        items: list[tuple[int, str]] = []
        for resend in outcome.resends:
            n = self._input_ids.index(resend.transform_id)
            elements = chunks.get(n, [])[resend.first_element:resend.last_element + 1]
            items.extend((n, _b64(e)) for e in elements)
        for reschedule in outcome.reschedules:
            items.append((self._route(reschedule.application),
                          _b64(reschedule.application.element)))
        keep = {str(self._input_ids.index(c.transform_id)): c.last_primary_element + 1
                for c in outcome.channel_splits}
        primary = [(self._route(r), _b64(r.element)) for r in outcome.primary_roots]
        return {"keep": keep, "primary": primary}, items

    def more_work(self) -> Iterator[Chunks]:
        """Work handed to this partition before (a retry replays it), then new residuals of
        other tasks until the driver says the stage's work is all taken."""
        for batch in self._assigned:
            yield _chunks(batch)
        while True:
            answer = self._client.want_work()
            if "work" in answer:
                yield _chunks(answer["work"])
            elif "wait" in answer:
                time.sleep(float(answer["wait"]))
            else:
                break

    def close(self) -> None:
        self._client.finished()
        self._client.close()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _chunks(batch: list[list[Any]]) -> Chunks:
    out: Chunks = {}
    for n, element in batch:
        out.setdefault(int(n), []).append(base64.b64decode(element))
    return out
