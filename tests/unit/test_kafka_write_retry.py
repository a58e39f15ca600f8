"""TransactionalSink's retry rule (pure logic: one write attempt stubbed to fail with the
errors confluent-kafka raises): retriable errors and transactions to abort are tried again
with a fresh attempt, up to three in all; anything else fails at once, naming the sink."""
from __future__ import annotations

import logging
from typing import Any

import pytest
from confluent_kafka import KafkaError as ClientError
from confluent_kafka import KafkaException

from sparkbeam.io.kafka_client import KafkaError
from sparkbeam.io.kafka_write import TransactionalSink


def _flaky(failures: list[ClientError]) -> tuple[TransactionalSink, list[int]]:
    """A sink whose attempts fail with `failures` in turn, then write; and its attempt count."""
    attempts = [0]

    class Flaky(TransactionalSink):
        def _write_once(self, query_id: str, batch: int, partition: int,
                        elements: list[Any]) -> int:
            attempts[0] += 1
            if failures:
                cause = KafkaException(failures.pop(0))
                raise KafkaError(f"WriteToKafka ({self.describe()}): committing failed: "
                                 f"{cause}") from cause
            return len(elements)

    return Flaky({"bootstrap.servers": "127.0.0.1:9"}, "out", "group", 1.0), attempts


def _error(**kind: bool) -> ClientError:
    return ClientError(ClientError._TIMED_OUT, "coordinator moved", **kind)


def test_retriable_errors_and_aborted_transactions_are_tried_again(caplog) -> None:  # type: ignore[no-untyped-def]
    sink, attempts = _flaky([_error(retriable=True), _error(txn_requires_abort=True)])
    with caplog.at_level(logging.WARNING):
        assert sink.write_partition("query", 4, 0, [(b"k", b"v")] * 3) == 3
    assert attempts == [3]
    assert [r.getMessage().endswith(f"trying again ({n} of 3)")
            for r, n in zip(caplog.records, (2, 3), strict=True)] == [True, True]


def test_a_third_retriable_failure_is_the_error() -> None:
    sink, attempts = _flaky([_error(retriable=True)] * 3)
    with pytest.raises(KafkaError, match=r"sink group 'group'.*committing failed"):
        sink.write_partition("query", 4, 0, [])
    assert attempts == [3]


def test_other_errors_fail_at_once() -> None:
    sink, attempts = _flaky([_error(fatal=True)])
    with pytest.raises(KafkaError, match="coordinator moved"):
        sink.write_partition("query", 4, 0, [])
    assert attempts == [1]
