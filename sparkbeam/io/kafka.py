"""Kafka in and out with the parameters of Beam's `ReadFromKafka`/`WriteToKafka`, on
confluent-kafka (librdkafka) instead of a Java expansion service.

Reading is a splittable DoFn over topic-partitions (what Beam's Java KafkaIO does too): the
partitions and their start offsets are listed once, when the read starts; each partition is an
offset-range restriction, so a replayed bundle or micro-batch re-reads exactly the offsets its
restriction names, and the offsets a job has read live in its restrictions (the runner's
checkpoint), not in the consumer group. Each partition has its own watermark estimator (the
timestamp policy's); the runner takes their minimum, and a partition with nothing left to read
moves its watermark to the wall clock, so an idle partition does not hold the rest back
(KafkaIO's rule for a caught-up partition). A bundle reads at most `_BUNDLE_RECORDS` records or
`_BUNDLE_SECONDS` before it checkpoints, so micro-batches stay short.

`max_num_records` makes the read bounded: the records are shared evenly over the partitions
that hold them when the read starts (a partition with fewer gives its surplus to the others),
and what the partitions do not hold yet is shared evenly as records still to come. Writing is in
`kafka_write.py` (at least once, or exactly once).
"""
from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker
from apache_beam.io.watermark_estimators import ManualWatermarkEstimator
from apache_beam.transforms.core import RestrictionProvider
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Duration, Timestamp

from sparkbeam.io.kafka_client import (
    END,
    KEY,
    KafkaError,
    Partition,
    advance,
    client,
    new_consumer,
    where,
)
from sparkbeam.io.kafka_listing import ListPartitions, WatchPartitions
from sparkbeam.io.kafka_write import WriteToKafka

PROCESSING_TIME, CREATE_TIME, LOG_APPEND_TIME = "ProcessingTime", "CreateTime", "LogAppendTime"
__all__ = ["KafkaError", "ReadFromKafka", "WriteToKafka"]
_POLICIES = (PROCESSING_TIME, CREATE_TIME, LOG_APPEND_TIME)
_BUNDLE_RECORDS = 10_000
_BUNDLE_SECONDS = 1.0
_POLL_STEP_S = 0.05


class _Offsets(RestrictionProvider):  # type: ignore[misc]
    def initial_restriction(self, element: Partition) -> OffsetRange:
        return OffsetRange(element.start, element.stop)

    def create_tracker(self, restriction: OffsetRange) -> OffsetRestrictionTracker:
        return OffsetRestrictionTracker(restriction)

    def restriction_size(self, element: Partition, restriction: OffsetRange) -> int:
        return 1 if restriction.stop == END else max(0, restriction.stop - restriction.start)

    def truncate(self, element: Partition, restriction: OffsetRange) -> None:
        return None  # drained: stop reading (what was read is processed)


class _ReadPartition(beam.DoFn):
    """Reads one partition's offset range; bounded when the range has a stop."""

    def __init__(self, config: dict[str, Any], policy: str, with_metadata: bool,
                 poll_timeout_s: float, commit: bool) -> None:
        self.config, self.policy, self.with_metadata = config, policy, with_metadata
        self.poll_timeout_s, self.commit = poll_timeout_s, commit
        self._consumer: Any = None

    def _reader(self) -> Any:
        """This DoFn instance's consumer (reused by its bundles), assigned per restriction."""
        if self._consumer is None:
            self._consumer = new_consumer(self.config)
        return self._consumer

    def teardown(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def process(
        self,
        element: Partition,
        # Before the restriction and watermark parameters: after them, Beam 2.77's invoker
        # passes the tracker twice ("multiple values for argument 'tracker'").
        finalizer: Any = beam.DoFn.BundleFinalizerParam,
        tracker: Any = beam.DoFn.RestrictionParam(_Offsets()),
        watermark: Any = beam.DoFn.WatermarkEstimatorParam(
            ManualWatermarkEstimator.default_provider()),
    ) -> Iterator[Any]:
        restriction = tracker.current_restriction()
        consumer = self._reader()
        tp = client().TopicPartition(element.topic, element.partition, restriction.start)
        consumer.assign([tp])
        try:
            yield from self._read(consumer, tp, element, restriction, finalizer, tracker,
                                  watermark)
        finally:
            # An assigned consumer goes on fetching between bundles; nothing reads that. (A
            # generator closed after teardown finds its consumer closed: nothing to stop.)
            with contextlib.suppress(RuntimeError, client().KafkaException):
                consumer.unassign()

    def _read(self, consumer: Any, tp: Any, element: Partition, restriction: OffsetRange,
              finalizer: Any, tracker: Any, watermark: Any) -> Iterator[Any]:
        began, claimed, last = time.monotonic(), 0, None
        asked = Timestamp.now()  # before the question: a record appended after its answer
        # is not in it, and was appended no earlier than this
        if (restriction.start < restriction.stop and not _past(element.deadline)
                and _at_end(consumer, tp, self.poll_timeout_s)):
            # Nothing to read now (the broker's answer, not a poll's timeout): caught up.
            advance(watermark, asked)
            tracker.defer_remainder(Duration(seconds=self.poll_timeout_s))
            return
        while True:
            if _past(element.deadline):
                tracker.try_claim(restriction.stop)  # max_read_time is up: the read ends
                return
            wanted = min(500, restriction.stop - restriction.start - claimed)
            messages = _poll(consumer, max(1, wanted), self.poll_timeout_s)
            records = [m for m in messages if m.error() is None]
            for message in messages:
                # librdkafka reconnects by itself (a broker restarting); only a fatal error,
                # or one naming the topic or partition itself, ends the read.
                error = message.error()
                if error is not None and (error.fatal() or error.code() in _fatal_codes()):
                    raise KafkaError(f"ReadFromKafka: {where(self.config, element.topic)} "
                                     f"partition {element.partition}: {message.error()}")
            for message in records:
                if not tracker.try_claim(message.offset()):
                    return
                claimed, last = claimed + 1, message.offset()
                stamp = self._timestamp(message)
                if self.policy != PROCESSING_TIME:
                    advance(watermark, stamp)
                yield TimestampedValue(self._element(message), stamp)
            if self.commit and last is not None:
                finalizer.register(self._committer(element, last + 1))
            position = consumer.position([tp])[0].offset
            if restriction.stop != END and position >= restriction.stop:
                tracker.try_claim(restriction.stop)  # past the end (e.g. a transaction marker)
                return
            now = Timestamp.now()
            if not records:
                # Caught up: the watermark may move to the wall clock; look again later.
                advance(watermark, now)
                tracker.defer_remainder(Duration(seconds=self.poll_timeout_s))
                return
            if _caught_up(consumer, tp, position):
                # Read up to the end the broker reported with these records: the next poll
                # would only wait out its timeout, so this bundle ends here. The watermark
                # stays at the records' times: records may have arrived since that fetch (and
                # downstream has been busy with these), so the wall clock now could make them
                # late. The next bundle asks the broker again.
                tracker.defer_remainder()
                return
            if self.policy == PROCESSING_TIME:
                advance(watermark, now)
            if claimed >= _BUNDLE_RECORDS or time.monotonic() - began >= _BUNDLE_SECONDS:
                tracker.defer_remainder()
                return

    def _timestamp(self, message: Any) -> Timestamp:
        kind, millis = message.timestamp()
        if self.policy == PROCESSING_TIME or kind == client().TIMESTAMP_NOT_AVAILABLE:
            return Timestamp.now()
        return Timestamp(micros=millis * 1000)

    def _element(self, message: Any) -> Any:
        if not self.with_metadata:
            return message.key(), message.value()
        kind, millis = message.timestamp()
        return beam.Row(topic=message.topic(), partition=message.partition(),
                        offset=message.offset(), timestamp=millis, timestampTypeId=kind,
                        key=message.key(), value=message.value(),
                        headers=[(k, v) for k, v in (message.headers() or [])])

    def _committer(self, element: Partition, offset: int):  # type: ignore[no-untyped-def]
        def commit() -> None:
            self._reader().commit(offsets=[client().TopicPartition(
                element.topic, element.partition, offset)], asynchronous=False)
        return commit


def _past(deadline: float | None) -> bool:
    return deadline is not None and time.time() >= deadline


def _poll(consumer: Any, wanted: int, timeout_s: float) -> list[Any]:
    """The records that arrive first, waiting up to `timeout_s` for any. librdkafka's batch
    consume waits until it holds all `wanted` or its timeout is up, so a partition holding
    fewer records than asked for cost the whole timeout; short calls return what is queued."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        messages: list[Any] = consumer.consume(num_messages=wanted,
                                               timeout=max(0.0, min(_POLL_STEP_S, left)))
        if messages or left <= _POLL_STEP_S:
            return messages


def _at_end(consumer: Any, tp: Any, timeout_s: float) -> bool:
    """Whether the broker says `tp`'s offset is the partition's end (its high watermark,
    asked now). An unanswered question is not an answer, nor is an offset past the end (a
    truncated log, a topic made again): the poll decides, as it did before this check."""
    try:
        high = consumer.get_watermark_offsets(tp, timeout=timeout_s, cached=False)[1]
    except client().KafkaException:
        return False
    return bool(high >= 0 and tp.offset == high)


def _caught_up(consumer: Any, tp: Any, position: int) -> bool:
    """Whether `position` is at the partition's end as of the last fetch response (the high
    watermark librdkafka caches from it; -1001 before any). Asked only after records came back,
    so that response is from this assignment; it only ends the bundle, never moves the
    watermark."""
    high = consumer.get_watermark_offsets(tp, cached=True)[1]
    return bool(high >= 0 and position >= high)


def _fatal_codes() -> frozenset[int]:
    error = client().KafkaError
    return frozenset([error.TOPIC_AUTHORIZATION_FAILED, error.UNKNOWN_TOPIC_OR_PART,
                      error._UNKNOWN_TOPIC, error._UNKNOWN_PARTITION])


class _ReadPartitionUnbounded(_ReadPartition):
    @beam.DoFn.unbounded_per_element()
    def process(self, element, finalizer=beam.DoFn.BundleFinalizerParam,  # type: ignore[no-untyped-def, override]
                tracker=beam.DoFn.RestrictionParam(_Offsets()),
                watermark=beam.DoFn.WatermarkEstimatorParam(
                    ManualWatermarkEstimator.default_provider())):
        yield from super().process(element, finalizer, tracker, watermark)


class ReadFromKafka(beam.PTransform):  # type: ignore[misc]
    """Reads `topics` as (key, value) byte pairs (None for a record without one), or as Rows
    with the record's metadata (`with_metadata`). Unbounded unless `max_num_records` or
    `max_read_time` (seconds) bounds it, as Beam's `ReadFromKafka`."""

    def __init__(self, consumer_config: dict[str, Any], topics: list[str],
                 start_read_time: int | None = None, max_num_records: int | None = None,
                 max_read_time: float | None = None, commit_offset_in_finalize: bool = False,
                 timestamp_policy: str = PROCESSING_TIME, consumer_polling_timeout: float = 2,
                 with_metadata: bool = False,
                 dynamic_read_poll_interval_seconds: float | None = None) -> None:
        super().__init__()
        if timestamp_policy not in _POLICIES:
            raise ValueError(f"timestamp_policy should be one of {list(_POLICIES)}, "
                             f"not {timestamp_policy!r}")
        if KEY not in consumer_config:
            raise ValueError(f"ReadFromKafka: consumer_config needs '{KEY}'")
        if not topics:
            raise ValueError("ReadFromKafka: no topics")
        if max_num_records is not None and max_num_records < 0:
            raise ValueError(f"ReadFromKafka: max_num_records={max_num_records} < 0")
        self.config, self.topics = dict(consumer_config), list(topics)
        self.start_read_time, self.max_num_records = start_read_time, max_num_records
        self.max_read_time, self.commit = max_read_time, commit_offset_in_finalize
        self.policy, self.poll_timeout_s = timestamp_policy, float(consumer_polling_timeout)
        self.with_metadata = with_metadata
        self.watch_s = dynamic_read_poll_interval_seconds
        if self.watch_s is not None and (max_num_records is not None
                                         or max_read_time is not None):
            raise ValueError("ReadFromKafka: dynamic_read_poll_interval_seconds applies to an "
                             "unbounded read (no max_num_records or max_read_time)")

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        bounded = self.max_num_records is not None or self.max_read_time is not None
        reader = (_ReadPartition if bounded else _ReadPartitionUnbounded)(
            self.config, self.policy, self.with_metadata, self.poll_timeout_s, self.commit)
        args = (self.config, self.topics, self.start_read_time, self.max_num_records,
                self.max_read_time, max(10.0, self.poll_timeout_s))
        listing = (ListPartitions(*args) if self.watch_s is None
                   else WatchPartitions(*args, interval_s=self.watch_s))
        return (pbegin | "Impulse" >> beam.Impulse()
                | "ListPartitions" >> beam.ParDo(listing)
                | "ReadPartitions" >> beam.ParDo(reader))
