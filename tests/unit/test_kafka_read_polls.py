"""How ReadFromKafka's partition reader waits (pure logic: a consumer stub that answers as
librdkafka does): a poll returns the first records that arrive rather than waiting for all it
asked for, and a partition counts as caught up only on the broker's word, never on a question
the broker did not answer or an offset past the end."""
from __future__ import annotations

import time
from typing import Any

from confluent_kafka import KafkaError as ClientError
from confluent_kafka import KafkaException, TopicPartition

from sparkbeam.io import kafka


class _Consumer:
    """Answers `consume` from a script of results; each result is what librdkafka would hand
    back within the call's timeout. Records every timeout it was given."""

    def __init__(self, results: list[list[Any]], ends: Any = (0, 40)) -> None:
        self.results, self.ends, self.timeouts = results, ends, []  # type: ignore[var-annotated]

    def consume(self, num_messages: int, timeout: float) -> list[Any]:
        self.timeouts.append(timeout)
        if self.results:
            return self.results.pop(0)
        time.sleep(timeout)
        return []

    def get_watermark_offsets(self, tp: Any, timeout: float | None = None,
                              cached: bool = False) -> tuple[int, int]:
        if isinstance(self.ends, Exception):
            raise self.ends
        return tuple(self.ends)  # type: ignore[return-value]


def test_a_poll_returns_the_first_records_without_waiting_for_all_it_asked_for() -> None:
    consumer = _Consumer([[], [], ["r1", "r2"]])
    began = time.monotonic()
    assert kafka._poll(consumer, 500, timeout_s=30.0) == ["r1", "r2"]
    assert time.monotonic() - began < 5
    # Every call is short: one long call would hold on until 500 records or its timeout.
    assert consumer.timeouts and max(consumer.timeouts) <= kafka._POLL_STEP_S


def test_a_poll_with_nothing_to_read_waits_out_its_timeout_and_returns_nothing() -> None:
    consumer = _Consumer([])
    began = time.monotonic()
    assert kafka._poll(consumer, 500, timeout_s=0.3) == []
    assert time.monotonic() - began >= 0.25
    # In short calls (how many depends on how late each sleep wakes on a loaded machine).
    assert consumer.timeouts and max(consumer.timeouts) <= kafka._POLL_STEP_S < 0.3


def test_a_partition_is_at_its_end_only_when_the_broker_says_so() -> None:
    at = TopicPartition("t", 0, 40)
    assert kafka._at_end(_Consumer([], ends=(0, 40)), at, 1.0)
    assert not kafka._at_end(_Consumer([], ends=(0, 41)), at, 1.0)
    # Past the end (a truncated log, a topic made again): the poll finds out, as before.
    assert not kafka._at_end(_Consumer([], ends=(0, 39)), at, 1.0)
    assert not kafka._at_end(_Consumer([], ends=(-1001, -1001)), at, 1.0)
    # No answer (a broker restarting): not caught up; the poll decides, as before.
    unanswered = KafkaException(ClientError(ClientError._TIMED_OUT, "timed out"))
    assert not kafka._at_end(_Consumer([], ends=unanswered), at, 1.0)


def test_records_read_up_to_the_reported_end_are_caught_up() -> None:
    at = TopicPartition("t", 0, 0)
    assert kafka._caught_up(_Consumer([], ends=(0, 40)), at, 40)
    assert not kafka._caught_up(_Consumer([], ends=(0, 41)), at, 40)
    assert not kafka._caught_up(_Consumer([], ends=(-1001, -1001)), at, 40)


class _Message:
    def __init__(self, offset: int, millis: int) -> None:
        self._offset, self._millis = offset, millis

    def error(self) -> None:
        return None

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        return 1, self._millis  # TIMESTAMP_CREATE_TIME

    def key(self) -> bytes:
        return b"k"

    def value(self) -> bytes:
        return b"v"


class _Tracker:
    def __init__(self) -> None:
        self.deferred: list[Any] = []

    def try_claim(self, offset: int) -> bool:
        return True

    def defer_remainder(self, delay: Any = None) -> None:
        self.deferred.append(delay)


class _Reading(_Consumer):
    def __init__(self, results: list[list[Any]], ends: Any) -> None:
        super().__init__(results, ends)
        self.at = 0

    def consume(self, num_messages: int, timeout: float) -> list[Any]:
        got = super().consume(num_messages, timeout)
        self.at = got[-1].offset() + 1 if got else self.at
        return got

    def position(self, tps: list[Any]) -> list[Any]:
        return [TopicPartition("t", 0, self.at)]


def _read(consumer: _Reading, start: int) -> tuple[list[Any], _Tracker, Any]:
    from apache_beam.io.restriction_trackers import OffsetRange
    from apache_beam.io.watermark_estimators import ManualWatermarkEstimator

    from sparkbeam.io.kafka_client import END, Partition

    reader = kafka._ReadPartition({"bootstrap.servers": "127.0.0.1:9"}, kafka.CREATE_TIME,
                                  False, 0.2, False)
    tracker, watermark = _Tracker(), ManualWatermarkEstimator(None)
    element = Partition("t", 0, start, END, None)
    out = list(reader._read(consumer, TopicPartition("t", 0, start), element,
                            OffsetRange(start, END), None, tracker, watermark))
    return out, tracker, watermark.current_watermark()


def test_records_read_to_the_end_keep_the_watermark_at_their_times() -> None:
    """The fetch that brought them said they were the last; more may have come since, and the
    wall clock would make those late. The bundle ends; the watermark is the records'."""
    consumer = _Reading([[_Message(0, 1_000), _Message(1, 2_000)]], ends=(0, 2))
    # The broker is asked first (not at the end: 0 of 2), then the poll reads both.
    out, tracker, mark = _read(consumer, 0)
    assert [v.timestamp.micros for v in out] == [1_000_000, 2_000_000]
    assert tracker.deferred == [None]  # the bundle ended at once, no poll waited out
    assert mark.micros == 2_000_000


def test_a_partition_the_broker_says_is_at_its_end_moves_to_the_wall_clock() -> None:
    before = time.time()
    out, tracker, mark = _read(_Reading([], ends=(0, 5)), 5)
    assert out == [] and len(tracker.deferred) == 1 and tracker.deferred[0] is not None
    assert before - 1 <= mark.micros / 1e6 <= time.time()
