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
and what the partitions do not hold yet is shared evenly as records still to come. Writing is
at least once: a bundle's records are flushed, and their delivery checked, before it commits.
"""
from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import apache_beam as beam
from apache_beam.io.iobase import RestrictionProgress, RestrictionTracker
from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker
from apache_beam.io.watermark_estimators import ManualWatermarkEstimator
from apache_beam.transforms.core import RestrictionProvider
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Duration, Timestamp

PROCESSING_TIME, CREATE_TIME, LOG_APPEND_TIME = "ProcessingTime", "CreateTime", "LogAppendTime"
_POLICIES = (PROCESSING_TIME, CREATE_TIME, LOG_APPEND_TIME)
_END = (1 << 63) - 1  # the stop offset of an unbounded partition read
_BUNDLE_RECORDS = 10_000
_BUNDLE_SECONDS = 1.0
_KEY = "bootstrap.servers"
_LOG = logging.getLogger(__name__)


class KafkaError(RuntimeError):
    """Kafka refused or could not be reached; the message names the servers and topic."""


def _client():  # type: ignore[no-untyped-def]
    try:
        import confluent_kafka
    except ImportError as exc:  # pragma: no cover - an install without the extra
        raise ImportError("sparkbeam.io.kafka needs confluent-kafka: pip install "
                          "'sparkbeam[kafka]'") from exc
    return confluent_kafka


class _Partition(NamedTuple):
    topic: str
    partition: int
    start: int
    stop: int  # _END: unbounded
    deadline: float | None  # wall-clock end of the read (max_read_time), seconds


def _new_consumer(config: Mapping[str, Any]) -> Any:
    settings = dict(config)
    # Offsets are the restrictions'; the group (if any) only gets optional commits.
    settings.setdefault("group.id", f"sparkbeam-{uuid.uuid4().hex[:12]}")
    settings["enable.auto.commit"] = False
    settings.setdefault("enable.partition.eof", False)
    # librdkafka's own log lines (a broker that went away...) through Python's logging.
    settings.setdefault("logger", _LOG)
    return _client().Consumer(settings)


def _where(config: Mapping[str, Any], topic: str | None = None) -> str:
    at = f"{_KEY}={config.get(_KEY, '(not set)')}"
    return f"topic '{topic}' at {at}" if topic else at


class _ListPartitions(beam.DoFn):
    """Impulse -> one `_Partition` per topic-partition, with its start and stop offsets."""

    def __init__(self, config: dict[str, Any], topics: list[str], start_read_time: int | None,
                 max_num_records: int | None, max_read_time: float | None,
                 timeout_s: float) -> None:
        self.config, self.topics = config, topics
        self.start_read_time, self.max_num_records = start_read_time, max_num_records
        self.max_read_time, self.timeout_s = max_read_time, timeout_s

    def process(self, _: Any) -> Iterator[_Partition]:
        consumer = _new_consumer(self.config)
        try:
            yield from self._list(consumer)
        finally:
            consumer.close()

    def _list(self, consumer: Any, skip: frozenset[tuple[str, int]] = frozenset(),
              first: bool = True) -> Iterator[_Partition]:
        """The partitions not in `skip`; a partition found after the first listing starts at
        its earliest offset (it was created while the job ran: none of it is read yet)."""
        kafka = _client()
        deadline = time.time() + self.max_read_time if self.max_read_time else None
        found: list[tuple[str, int, int, int]] = []  # topic, partition, start, high
        for topic in self.topics:
            info = self._topic(consumer, topic)
            if info is None or info.error is not None or not info.partitions:
                why = info.error if info is not None and info.error else "no partitions"
                raise KafkaError(f"ReadFromKafka: {_where(self.config, topic)}: {why}")
            for partition in sorted(info.partitions):
                if (topic, partition) in skip:
                    continue
                tp = kafka.TopicPartition(topic, partition)
                low, high = consumer.get_watermark_offsets(tp, timeout=self.timeout_s)
                start = self._start(consumer, tp, low, high) if first else low
                found.append((topic, partition, start, high))
        stops = (_shares(self.max_num_records, [(s, h) for _, _, s, h in found])
                 if self.max_num_records is not None else [_END] * len(found))
        for (topic, partition, start, _), stop in zip(found, stops, strict=True):
            yield _Partition(topic, partition, start, stop, deadline)

    def _topic(self, consumer: Any, topic: str) -> Any:
        """The topic's metadata; a broker unreachable for a while (restarting) is asked again
        until the timeout, then the error names the servers."""
        kafka = _client()
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                left = max(0.5, deadline - time.monotonic())
                return consumer.list_topics(topic, timeout=left).topics.get(topic)
            except kafka.KafkaException as exc:
                if time.monotonic() >= deadline:
                    raise KafkaError(f"ReadFromKafka could not reach {_where(self.config)} "
                                     f"within {self.timeout_s:g} s: {exc}") from None
                time.sleep(0.5)

    def _start(self, consumer: Any, tp: Any, low: int, high: int) -> int:
        kafka = _client()
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
        kafka = _client()
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
                                     f"{_where(self.config, tp.topic)}: {exc}") from None
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


class _WatchPartitions(_ListPartitions):
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
        consumer = _new_consumer(self.config)
        try:
            new = list(self._list(consumer, restriction.seen, first=restriction.rounds == 0))
        finally:
            consumer.close()
        if not tracker.try_claim(restriction.seen | {(p.topic, p.partition) for p in new}):
            return
        yield from new
        _advance(watermark, Timestamp.now())  # a partition found later starts from now on
        tracker.defer_remainder(Duration(seconds=self.interval_s))


def _shares(total: int, ranges: list[tuple[int, int]]) -> list[int]:
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


class _Offsets(RestrictionProvider):  # type: ignore[misc]
    def initial_restriction(self, element: _Partition) -> OffsetRange:
        return OffsetRange(element.start, element.stop)

    def create_tracker(self, restriction: OffsetRange) -> OffsetRestrictionTracker:
        return OffsetRestrictionTracker(restriction)

    def restriction_size(self, element: _Partition, restriction: OffsetRange) -> int:
        return 1 if restriction.stop == _END else max(0, restriction.stop - restriction.start)

    def truncate(self, element: _Partition, restriction: OffsetRange) -> None:
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
            self._consumer = _new_consumer(self.config)
        return self._consumer

    def teardown(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def process(
        self,
        element: _Partition,
        # Before the restriction and watermark parameters: after them, Beam 2.77's invoker
        # passes the tracker twice ("multiple values for argument 'tracker'").
        finalizer: Any = beam.DoFn.BundleFinalizerParam,
        tracker: Any = beam.DoFn.RestrictionParam(_Offsets()),
        watermark: Any = beam.DoFn.WatermarkEstimatorParam(
            ManualWatermarkEstimator.default_provider()),
    ) -> Iterator[Any]:
        kafka = _client()
        restriction = tracker.current_restriction()
        consumer = self._reader()
        tp = kafka.TopicPartition(element.topic, element.partition, restriction.start)
        consumer.assign([tp])
        began, claimed, last = time.monotonic(), 0, None
        while True:
            if element.deadline is not None and time.time() >= element.deadline:
                tracker.try_claim(restriction.stop)  # max_read_time is up: the read ends
                return
            wanted = min(500, restriction.stop - restriction.start - claimed)
            messages = consumer.consume(num_messages=max(1, wanted),
                                        timeout=self.poll_timeout_s)
            records = [m for m in messages if m.error() is None]
            for message in messages:
                # librdkafka reconnects by itself (a broker restarting); only a fatal error,
                # or one naming the topic or partition itself, ends the read.
                error = message.error()
                if error is not None and (error.fatal() or error.code() in _fatal_codes()):
                    raise KafkaError(f"ReadFromKafka: {_where(self.config, element.topic)} "
                                     f"partition {element.partition}: {message.error()}")
            for message in records:
                if not tracker.try_claim(message.offset()):
                    return
                claimed, last = claimed + 1, message.offset()
                stamp = self._timestamp(message)
                if self.policy != PROCESSING_TIME:
                    _advance(watermark, stamp)
                yield TimestampedValue(self._element(message), stamp)
            if self.commit and last is not None:
                finalizer.register(self._committer(element, last + 1))
            position = consumer.position([tp])[0].offset
            if restriction.stop != _END and position >= restriction.stop:
                tracker.try_claim(restriction.stop)  # past the end (e.g. a transaction marker)
                return
            now = Timestamp.now()
            if not records:
                # Caught up: the watermark may move to the wall clock; look again later.
                _advance(watermark, now)
                tracker.defer_remainder(Duration(seconds=self.poll_timeout_s))
                return
            if self.policy == PROCESSING_TIME:
                _advance(watermark, now)
            if claimed >= _BUNDLE_RECORDS or time.monotonic() - began >= _BUNDLE_SECONDS:
                tracker.defer_remainder()
                return

    def _timestamp(self, message: Any) -> Timestamp:
        kind, millis = message.timestamp()
        if self.policy == PROCESSING_TIME or kind == _client().TIMESTAMP_NOT_AVAILABLE:
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

    def _committer(self, element: _Partition, offset: int):  # type: ignore[no-untyped-def]
        def commit() -> None:
            self._reader().commit(offsets=[_client().TopicPartition(
                element.topic, element.partition, offset)], asynchronous=False)
        return commit


def _fatal_codes() -> frozenset[int]:
    error = _client().KafkaError
    return frozenset([error.TOPIC_AUTHORIZATION_FAILED, error.UNKNOWN_TOPIC_OR_PART,
                      error._UNKNOWN_TOPIC, error._UNKNOWN_PARTITION])


def _advance(watermark: Any, to: Timestamp) -> None:
    """Moves a manual watermark estimator forward only (it starts at None)."""
    current = watermark.current_watermark()
    if current is None or to > current:
        watermark.set_watermark(to)


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
        if _KEY not in consumer_config:
            raise ValueError(f"ReadFromKafka: consumer_config needs '{_KEY}'")
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
        listing = (_ListPartitions(*args) if self.watch_s is None
                   else _WatchPartitions(*args, interval_s=self.watch_s))
        return (pbegin | "Impulse" >> beam.Impulse()
                | "ListPartitions" >> beam.ParDo(listing)
                | "ReadPartitions" >> beam.ParDo(reader))


class _Produce(beam.DoFn):
    def __init__(self, config: dict[str, Any], topic: str, flush_timeout_s: float) -> None:
        self.config, self.topic, self.flush_timeout_s = config, topic, flush_timeout_s
        self._producer: Any = None
        self._failed: list[str] = []

    def setup(self) -> None:
        self._producer = _client().Producer({"logger": _LOG, **self.config})

    def teardown(self) -> None:
        if self._producer is not None:
            self._producer.flush(self.flush_timeout_s)
            self._producer = None

    def _delivered(self, error: Any, message: Any) -> None:
        if error is not None:
            self._failed.append(str(error))

    def process(self, element: tuple[bytes | None, bytes | None]) -> None:
        key, value = element
        while True:
            try:
                self._producer.produce(self.topic, key=key, value=value,
                                       on_delivery=self._delivered)
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                self._producer.poll(0.5)
        self._producer.poll(0)

    def finish_bundle(self) -> None:
        left = self._producer.flush(self.flush_timeout_s)
        failed, self._failed = self._failed, []
        if left or failed:
            raise KafkaError(
                f"WriteToKafka: {_where(self.config, self.topic)}: {left} record(s) not "
                f"delivered within {self.flush_timeout_s:g} s, {len(failed)} refused"
                + (f" (first: {failed[0]})" if failed else "") + "; the bundle is retried")


class WriteToKafka(beam.PTransform):  # type: ignore[misc]
    """Writes (key, value) byte pairs to `topic`, at least once: each bundle waits for its
    records' delivery before it commits, so a retried bundle may write a record twice."""

    def __init__(self, producer_config: dict[str, Any], topic: str,
                 flush_timeout_s: float = 60.0) -> None:
        super().__init__()
        if _KEY not in producer_config:
            raise ValueError(f"WriteToKafka: producer_config needs '{_KEY}'")
        self.config, self.topic = dict(producer_config), topic
        self.flush_timeout_s = flush_timeout_s

    def expand(self, pcoll: beam.PCollection) -> beam.PCollection:
        return pcoll | "Produce" >> beam.ParDo(_Produce(self.config, self.topic,
                                                         self.flush_timeout_s))
