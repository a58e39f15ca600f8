"""What the Kafka transforms share: the client library (imported when first used), consumers
made the one way the reads need them, errors that name the servers and topic, and the element
the partition listing hands the reader (no Beam transforms here)."""
from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from typing import Any, NamedTuple

from apache_beam.utils.timestamp import Timestamp

END = (1 << 63) - 1  # the stop offset of an unbounded partition read
KEY = "bootstrap.servers"
LOG = logging.getLogger("sparkbeam.io.kafka")


class KafkaError(RuntimeError):
    """Kafka refused or could not be reached; the message names the servers and topic."""


def client():  # type: ignore[no-untyped-def]
    try:
        import confluent_kafka
    except ImportError as exc:  # pragma: no cover - an install without the extra
        raise ImportError("sparkbeam.io.kafka needs confluent-kafka: pip install "
                          "'sparkbeam[kafka]'") from exc
    return confluent_kafka


class Partition(NamedTuple):
    topic: str
    partition: int
    start: int
    stop: int  # END: unbounded
    deadline: float | None  # wall-clock end of the read (max_read_time), seconds


def new_consumer(config: Mapping[str, Any]) -> Any:
    settings = dict(config)
    # Offsets are the restrictions'; the group (if any) only gets optional commits.
    settings.setdefault("group.id", f"sparkbeam-{uuid.uuid4().hex[:12]}")
    settings["enable.auto.commit"] = False
    settings.setdefault("enable.partition.eof", False)
    # A reader assigns one partition after another; librdkafka sends the new partition's first
    # fetch only once the broker answers the previous one, which it holds for up to this long
    # when there is nothing new (500 ms by default, paid on every switch).
    settings.setdefault("fetch.wait.max.ms", 50)
    # librdkafka's own log lines (a broker that went away...) through Python's logging.
    settings.setdefault("logger", LOG)
    return client().Consumer(settings)


def where(config: Mapping[str, Any], topic: str | None = None) -> str:
    at = f"{KEY}={config.get(KEY, '(not set)')}"
    return f"topic '{topic}' at {at}" if topic else at


def advance(watermark: Any, to: Timestamp) -> None:
    """Moves a manual watermark estimator forward only (it starts at None)."""
    current = watermark.current_watermark()
    if current is None or to > current:
        watermark.set_watermark(to)
