"""Which topic-partitions a Kafka read reads, from which offset to which: listed once when the
read starts (`ListPartitions`), or every few seconds by an unbounded splittable DoFn whose
restriction is the set handed out so far (`WatchPartitions`, Beam's
`dynamic_read_poll_interval_seconds`); `shares` spreads `max_num_records` over them."""
from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, NamedTuple

import apache_beam as beam
from apache_beam.io.iobase import RestrictionProgress, RestrictionTracker
from apache_beam.io.watermark_estimators import ManualWatermarkEstimator
from apache_beam.transforms.core import RestrictionProvider
from apache_beam.utils.timestamp import Duration, Timestamp

from sparkbeam.io.kafka_client import (
    END,
    KafkaError,
    Partition,
    advance,
    client,
    new_consumer,
    where,
)


class ListPartitions(beam.DoFn):
    """Impulse -> one `Partition` per topic-partition, with its start and stop offsets."""

    def __init__(self, config: dict[str, Any], topics: list[str], start_read_time: int | None,
                 max_num_records: int | None, max_read_time: float | None,
                 timeout_s: float) -> None:
        self.config, self.topics = config, topics
        self.start_read_time, self.max_num_records = start_read_time, max_num_records
        self.max_read_time, self.timeout_s = max_read_time, timeout_s

    def process(self, _: Any) -> Iterator[Partition]:
        consumer = new_consumer(self.config)
        try:
            yield from self._list(consumer)
        finally:
            consumer.close()

    def _list(self, consumer: Any, skip: frozenset[tuple[str, int]] = frozenset(),
              first: bool = True) -> Iterator[Partition]:
        """The partitions not in `skip`; a partition found after the first listing starts at
        its earliest offset (it was created while the job ran: none of it is read yet)."""
        kafka = client()
        deadline = time.time() + self.max_read_time if self.max_read_time else None
        found: list[tuple[str, int, int, int]] = []  # topic, partition, start, high
        for topic in self.topics:
            info = self._topic(consumer, topic)
            if info is None or info.error is not None or not info.partitions:
                why = info.error if info is not None and info.error else "no partitions"
                raise KafkaError(f"ReadFromKafka: {where(self.config, topic)}: {why}")
            for partition in sorted(info.partitions):
                if (topic, partition) in skip:
                    continue
                tp = kafka.TopicPartition(topic, partition)
                low, high = consumer.get_watermark_offsets(tp, timeout=self.timeout_s)
                start = self._start(consumer, tp, low, high) if first else low
                found.append((topic, partition, start, high))
        stops = (shares(self.max_num_records, [(s, h) for _, _, s, h in found])
                 if self.max_num_records is not None else [END] * len(found))
        for (topic, partition, start, _), stop in zip(found, stops, strict=True):
            yield Partition(topic, partition, start, stop, deadline)

    def _topic(self, consumer: Any, topic: str) -> Any:
        """The topic's metadata; a broker unreachable for a while (restarting) is asked again
        until the timeout, then the error names the servers."""
        kafka = client()
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                left = max(0.5, deadline - time.monotonic())
                return consumer.list_topics(topic, timeout=left).topics.get(topic)
            except kafka.KafkaException as exc:
                if time.monotonic() >= deadline:
                    raise KafkaError(f"ReadFromKafka could not reach {where(self.config)} "
                                     f"within {self.timeout_s:g} s: {exc}") from None
                time.sleep(0.5)

    def _start(self, consumer: Any, tp: Any, low: int, high: int) -> int:
        kafka = client()
        if self.start_read_time is not None:
            at = kafka.TopicPartition(tp.topic, tp.partition, int(self.start_read_time))
            (found,) = consumer.offsets_for_times([at], timeout=self.timeout_s)
            return high if found.offset < 0 else int(found.offset)
        if "group.id" in self.config:  # the user's group: resume from its commits
            committed = self._committed(consumer, tp)
            if committed >= 0:
                return committed
        reset = str(self.config.get("auto.offset.reset", "latest")).lower()
        return low if reset in ("earliest", "smallest", "beginning") else high


    def _committed(self, consumer: Any, tp: Any) -> int:
        """The group's committed offset (-1: none); a broker still electing the group's
        coordinator (a new broker, a restart) is asked again until the timeout."""
        kafka = client()
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                (committed,) = consumer.committed([tp], timeout=self.timeout_s)
                return int(committed.offset)
            except kafka.KafkaException as exc:
                error = exc.args[0]
                waiting = error.retriable() or error.code() in (
                    kafka.KafkaError.NOT_COORDINATOR, kafka.KafkaError.COORDINATOR_NOT_AVAILABLE,
                    kafka.KafkaError.COORDINATOR_LOAD_IN_PROGRESS)
                if not waiting or time.monotonic() >= deadline:
                    raise KafkaError(f"ReadFromKafka: the committed offsets of group "
                                     f"'{self.config['group.id']}' for "
                                     f"{where(self.config, tp.topic)}: {exc}") from None
                time.sleep(0.2)


class _Seen(NamedTuple):
    """The restriction of the partition watch: the partitions handed out so far."""

    seen: frozenset[tuple[str, int]]
    rounds: int
    done: bool = False


class _SeenTracker(RestrictionTracker):  # type: ignore[misc]
    """One listing round per claim; a checkpoint hands the next round what was seen."""

    def __init__(self, restriction: _Seen) -> None:
        self._restriction = restriction
        self._claimed: _Seen | None = None
        self._checkpointed = False

    def current_restriction(self) -> _Seen:
        return self._restriction

    def try_claim(self, seen: frozenset[tuple[str, int]]) -> bool:
        if self._restriction.done or self._checkpointed or self._claimed is not None:
            return False
        self._claimed = _Seen(seen, self._restriction.rounds + 1)
        return True

    def try_split(self, fraction_of_remainder: float) -> tuple[_Seen, _Seen] | None:
        if fraction_of_remainder != 0 or self._checkpointed or self._restriction.done:
            return None  # rounds are not divisible; only a checkpoint splits
        self._checkpointed = True
        after = self._claimed or self._restriction
        primary = _Seen(after.seen, after.rounds, done=True)
        self._restriction = primary
        return primary, _Seen(after.seen, after.rounds)

    def check_done(self) -> None:
        if not (self._checkpointed or self._restriction.done):
            raise ValueError("the partition watch ended a round without a checkpoint")

    def current_progress(self) -> RestrictionProgress:
        return RestrictionProgress(completed=0, remaining=1)

    def is_bounded(self) -> bool:
        return False


class _Rounds(RestrictionProvider):  # type: ignore[misc]
    def initial_restriction(self, element: Any) -> _Seen:
        return _Seen(frozenset(), 0)

    def create_tracker(self, restriction: _Seen) -> _SeenTracker:
        return _SeenTracker(restriction)

    def restriction_size(self, element: Any, restriction: _Seen) -> int:
        return 1

    def truncate(self, element: Any, restriction: _Seen) -> None:
        return None  # drained: no more partitions


class WatchPartitions(ListPartitions):
    """Lists the topics' partitions every `interval_s` (Beam's
    `dynamic_read_poll_interval_seconds`) and hands out those not seen before: partitions
    added to a topic while the job runs are read from their first offset."""

    def __init__(self, *args: Any, interval_s: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.interval_s = interval_s

    @beam.DoFn.unbounded_per_element()
    def process(self, _: Any, tracker=beam.DoFn.RestrictionParam(_Rounds()),  # type: ignore[no-untyped-def, override]
                watermark=beam.DoFn.WatermarkEstimatorParam(
                    ManualWatermarkEstimator.default_provider())):
        restriction = tracker.current_restriction()
        if restriction.done:
            return
        consumer = new_consumer(self.config)
        try:
            new = list(self._list(consumer, restriction.seen, first=restriction.rounds == 0))
        finally:
            consumer.close()
        if not tracker.try_claim(restriction.seen | {(p.topic, p.partition) for p in new}):
            return
        yield from new
        advance(watermark, Timestamp.now())  # a partition found later starts from now on
        tracker.defer_remainder(Duration(seconds=self.interval_s))


def shares(total: int, ranges: list[tuple[int, int]]) -> list[int]:
    """Stop offsets giving `total` records in all: even shares of what each partition holds
    (a partition with less gives its surplus to the others), then of what is still to come."""
    held = [max(0, high - start) for start, high in ranges]
    take = [0] * len(ranges)
    left = total
    open_ = [i for i, h in enumerate(held) if h > 0]
    while left > 0 and open_:
        share = max(1, left // len(open_))
        for i in list(open_):
            step = min(share, held[i] - take[i], left)
            take[i] += step
            left -= step
            if take[i] >= held[i]:
                open_.remove(i)
            if left == 0:
                break
    for n in range(left):  # records not in any partition yet: wait for them evenly
        take[n % len(ranges)] += 1
    return [start + t for (start, _), t in zip(ranges, take, strict=True)]
