"""How ReadFromKafka's partition reader waits (pure logic: a consumer stub that answers as
librdkafka does): a poll returns the first records that arrive rather than waiting for all it
asked for, and a partition counts as caught up only on the broker's word, never on a question
the broker did not answer."""
from __future__ import annotations

import time
from typing import Any

from confluent_kafka import KafkaError as ClientError
from confluent_kafka import KafkaException, TopicPartition

from sparkbeam.io import kafka


class _Consumer:
    """Answers `consume` from a script of results; each result is what librdkafka would hand
    back within the call's timeout. Records every timeout it was given."""

    def __init__(self, results: list[list[str]], ends: Any = (0, 40)) -> None:
        self.results, self.ends, self.timeouts = results, ends, []  # type: ignore[var-annotated]

    def consume(self, num_messages: int, timeout: float) -> list[str]:
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
    assert len(consumer.timeouts) >= 3


def test_a_partition_is_at_its_end_only_when_the_broker_says_so() -> None:
    at = TopicPartition("t", 0, 40)
    assert kafka._at_end(_Consumer([], ends=(0, 40)), at, 1.0)
    assert not kafka._at_end(_Consumer([], ends=(0, 41)), at, 1.0)
    assert not kafka._at_end(_Consumer([], ends=(-1001, -1001)), at, 1.0)
    # No answer (a broker restarting): not caught up; the poll decides, as before.
    unanswered = KafkaException(ClientError(ClientError._TIMED_OUT, "timed out"))
    assert not kafka._at_end(_Consumer([], ends=unanswered), at, 1.0)


def test_records_read_up_to_the_reported_end_are_caught_up() -> None:
    at = TopicPartition("t", 0, 0)
    assert kafka._caught_up(_Consumer([], ends=(0, 40)), at, 40)
    assert not kafka._caught_up(_Consumer([], ends=(0, 41)), at, 40)
    assert not kafka._caught_up(_Consumer([], ends=(-1001, -1001)), at, 40)
