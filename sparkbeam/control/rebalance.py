"""Dynamic work rebalancing for splittable stages, as pure logic (the driver's side).

When a splittable stage's tasks finish their own input at different times, the idle ones ask
here for work; we ask the straggler (the task whose bundle has run longest) to split, its
residual is queued and handed to an idle task. Runner-initiated splits
(`ProcessBundleSplitRequest`), which no other Python runner does.

Spark retries a failed task on the same input partition, so every decision is recorded per
partition, not per attempt: a retried straggler replays its recorded splits (runs the primary
only) and a retried thief gets the same work again, in the same order. Nothing is processed
twice and nothing is lost whichever attempt fails.

No sockets, no threads, no clock: `rebalance_channel.py` is the shell; time comes in as `now`.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any

WorkItem = tuple[int, str]  # (stage input index, base64 element) as sent over the wire
_STALE_AFTER_S = 3.0  # a busy task silent for this long is considered gone
HISTORY_KEPT = 100  # decisions kept per stage at each end, for a failed or puzzling run's message


@dataclass
class _Bundle:
    seq: int
    started: float
    unsplittable: bool = False


@dataclass
class _StageWork:
    """The rebalancing state of one stage of one job."""

    partitions: int
    started: set[int] = field(default_factory=set)
    # partition -> (its running bundle, when it last said so)
    busy: dict[int, tuple[_Bundle, float]] = field(default_factory=dict)
    idle: dict[int, float] = field(default_factory=dict)  # partition -> since
    queue: collections.deque[list[WorkItem]] = field(default_factory=collections.deque)
    split_asked: tuple[int, int] | None = None  # (partition, bundle seq) asked to split
    assigned: dict[int, list[list[WorkItem]]] = field(default_factory=dict)
    splits: dict[int, dict[str, Any]] = field(default_factory=dict)  # partition -> {seq: record}
    splits_done: int = 0
    items_moved: int = 0
    # Partitions heard from since their (latest) hello: a bundle reported, work asked for, or
    # finished. A started partition not yet heard from may be a straggler whose first busy
    # report (one monitor poll after its bundle starts) is still on its way.
    heard: set[int] = field(default_factory=set)
    unheard_since: dict[int, float] = field(default_factory=dict)  # waiter -> since
    # What was asked and answered, in order (a waiting task's repeated asks once per wait),
    # so a run that did not split can say why: the first decisions and the latest.
    history: list[str] = field(default_factory=list)
    latest: collections.deque[str] = field(
        default_factory=lambda: collections.deque(maxlen=HISTORY_KEPT))
    dropped: int = 0

    def note(self, event: str) -> None:
        if len(self.history) < HISTORY_KEPT:
            self.history.append(event)
            return
        if len(self.latest) == HISTORY_KEPT:
            self.dropped += 1
        self.latest.append(event)


class Rebalancer:
    """Decides who splits and who gets the residuals, for every stage of every job."""

    def __init__(self) -> None:
        self._stages: dict[tuple[str, str], _StageWork] = {}

    def _stage(self, job: str, stage: str, partitions: int = 0) -> _StageWork:
        key = (job, stage)
        work = self._stages.get(key)
        if work is None:
            work = self._stages[key] = _StageWork(partitions=max(1, partitions))
        return work

    # -- requests from tasks ----------------------------------------------------------------

    def hello(self, job: str, stage: str, partition: int, partitions: int) -> dict[str, Any]:
        """A task attempt starts: what an earlier attempt of this partition decided."""
        work = self._stage(job, stage, partitions)
        work.started.add(partition)
        work.heard.discard(partition)  # a new attempt: not heard from yet
        work.idle.pop(partition, None)
        work.note(f"p{partition} hello")
        return {
            "splits": dict(work.splits.get(partition, {})),
            "assigned": [list(batch) for batch in work.assigned.get(partition, [])],
        }

    def busy(self, job: str, stage: str, partition: int, seq: int, now: float) -> dict[str, Any]:
        """A task's bundle `seq` is running. Answers {"split": fraction} when it should split."""
        work = self._stage(job, stage)
        work.heard.add(partition)
        work.idle.pop(partition, None)
        current = work.busy.get(partition)
        if current and current[0].seq == seq:
            bundle = current[0]
        else:
            bundle = _Bundle(seq, now)
            work.note(f"p{partition} busy bundle {seq}")
        work.busy[partition] = (bundle, now)
        if work.split_asked is not None or work.queue or bundle.unsplittable:
            return {}
        waiting = [p for p in work.idle if p not in work.busy]
        if not waiting:
            return {}
        longest = min(
            (b.started, p) for p, (b, seen) in work.busy.items()
            if not b.unsplittable and now - seen < _STALE_AFTER_S
        )
        if longest[1] != partition:
            return {}
        work.split_asked = (partition, seq)
        work.note(f"p{partition} asked to split bundle {seq} (waiting: {sorted(waiting)})")
        # Keep a share of the remainder, give the rest to the idle tasks.
        return {"split": 1.0 / (1 + len(waiting))}

    def split_result(
        self,
        job: str,
        stage: str,
        partition: int,
        seq: int,
        record: dict[str, Any] | None,
        items: list[WorkItem],
    ) -> dict[str, Any]:
        """What the asked task's split gave: the record to replay and the residual work."""
        work = self._stage(job, stage)
        if work.split_asked == (partition, seq):
            work.split_asked = None
        if record is None or not items:
            entry = work.busy.get(partition)
            if entry and entry[0].seq == seq:
                entry[0].unsplittable = True
            work.note(f"p{partition} bundle {seq} split with no residual: unsplittable")
            return {}
        work.note(f"p{partition} bundle {seq} split: {len(items)} item(s) queued")
        work.splits.setdefault(partition, {})[str(seq)] = record
        work.queue.append(list(items))
        work.splits_done += 1
        work.items_moved += len(items)
        return {}

    def bundle_done(self, job: str, stage: str, partition: int, seq: int) -> dict[str, Any]:
        work = self._stage(job, stage)
        work.heard.add(partition)
        entry = work.busy.get(partition)
        if entry and entry[0].seq == seq:
            del work.busy[partition]
        if work.split_asked == (partition, seq):
            work.split_asked = None  # finished before it could split
            work.note(f"p{partition} bundle {seq} done before it split")
        else:
            work.note(f"p{partition} bundle {seq} done")
        return {}

    def want_work(self, job: str, stage: str, partition: int, now: float) -> dict[str, Any]:
        """A task ran out of input: {"work": items}, {"wait": seconds} or {"exit": True}."""
        work = self._stage(job, stage)
        work.heard.add(partition)
        work.busy.pop(partition, None)
        if work.queue:
            batch = work.queue.popleft()
            work.assigned.setdefault(partition, []).append(batch)
            work.idle.pop(partition, None)
            work.unheard_since.pop(partition, None)
            work.note(f"p{partition} wants work: given {len(batch)} item(s)")
            return {"work": batch}
        if len(work.started) < work.partitions:
            work.note(f"p{partition} wants work: exit ({len(work.started)} of "
                      f"{work.partitions} partitions started)")
            return {"exit": True}  # free the slot for a partition still waiting to start
        live = [
            p for p, (b, seen) in work.busy.items()
            if now - seen < _STALE_AFTER_S and (not b.unsplittable or work.split_asked)
        ]
        if not live and work.split_asked is None:
            # A partition that started but has not been heard from yet may be a straggler
            # whose bundle began less than a monitor poll ago: wait for its first report, for
            # a bounded time (a task that died before reporting must not hold the others).
            unheard = any(p not in work.heard for p in work.started if p != partition)
            since = work.unheard_since.setdefault(partition, now)
            if not unheard or now - since >= _STALE_AFTER_S:
                work.idle.pop(partition, None)
                work.unheard_since.pop(partition, None)
                work.note(f"p{partition} wants work: exit (no live bundle"
                          f"{', none unheard' if not unheard else ', unheard for too long'})")
                return {"exit": True}
        else:
            work.unheard_since.pop(partition, None)  # a live bundle: its own wait, not this one
        if partition not in work.idle:
            work.note(f"p{partition} wants work: wait (live: {sorted(live)}, "
                      f"split asked: {work.split_asked})")
        work.idle.setdefault(partition, now)
        return {"wait": 0.05}

    def finished(self, job: str, stage: str, partition: int) -> dict[str, Any]:
        work = self._stage(job, stage)
        work.heard.add(partition)
        work.idle.pop(partition, None)
        work.busy.pop(partition, None)
        work.note(f"p{partition} finished")
        return {}

    # -- views ------------------------------------------------------------------------------

    def stats(self, job: str, stage: str) -> dict[str, int]:
        work = self._stages.get((job, stage))
        if work is None:
            return {"splits": 0, "items_moved": 0}
        return {"splits": work.splits_done, "items_moved": work.items_moved}

    def history(self, job: str, stage: str) -> list[str]:
        """The stage's decisions in order: the first and the latest `HISTORY_KEPT`, and how many
        between them were left out."""
        work = self._stages.get((job, stage))
        if work is None:
            return []
        gap = [f"... {work.dropped} decision(s) left out ..."] if work.dropped else []
        return [*work.history, *gap, *work.latest]

    def forget(self, job: str) -> None:
        for key in [k for k in self._stages if k[0] == job]:
            del self._stages[key]

    def validate(self) -> None:
        for key, work in self._stages.items():
            assert not (set(work.busy) & set(work.idle)), f"{key}: busy and idle at once"
            assert all(0 <= p < work.partitions for p in work.started), (
                f"{key}: a partition outside 0..{work.partitions - 1} started")
            for partition, records in work.splits.items():
                assert partition in work.started, f"{key}: split of a task never started"
                assert all(r for r in records.values()), f"{key}: empty split record"
