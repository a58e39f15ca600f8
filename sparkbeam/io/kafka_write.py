"""WriteToKafka: at least once by default, exactly once with `exactly_once=True`.

At least once: each bundle flushes its records and checks their delivery before it commits,
so a retried bundle may write a record twice.

Exactly once (streaming on sparkbeam): the composite carries the URN `urns.WRITE_TO_KAFKA`, and
sparkbeam does the write itself (`streaming/staged_writes.py`). Each micro-batch's input
elements are staged in the checkpoint directory by the tasks that compute them; once that
micro-batch has committed, the next one writes them, one Kafka transaction per staged
partition (`TransactionalSink.write_partition`). The transaction also commits, as the
consumer-group offset of `<sink_group_id>.<partition>` on the topic's partition 0, the number
of the last micro-batch written, with the query's id as its metadata (the way Beam's Java
KafkaIO keeps its exactly-once sink state in a group's offsets). A replay of the writing
micro-batch after a crash reads that offset and skips what is already committed; the
transactional id `<sink_group_id>.<partition>` fences a writer left over from before the crash
and aborts its open transaction. Only committed micro-batches are written because a replayed
micro-batch may compute different elements (a read that stops on the wall clock reads a
different number of records): what is staged once the batch commits is what the job's state
agrees with. The cost is one micro-batch of latency.

On other runners, and in batch, `exactly_once=True` runs the DoFn with one transaction per
bundle: a `read_committed` consumer sees a bundle's records all or not at all; a bundle that
a runner retries after its commit may still repeat.
"""
from __future__ import annotations

import contextlib
import dataclasses
import uuid
from typing import Any

import apache_beam as beam

from sparkbeam import urns
from sparkbeam.io.kafka_client import KEY, LOG, KafkaError, client, where

_MARKER_PARTITION = 0  # the topic partition whose group offset records the last batch written
_ATTEMPTS = 3


class _Produce(beam.DoFn):
    def __init__(self, config: dict[str, Any], topic: str, flush_timeout_s: float,
                 transactional: bool = False) -> None:
        self.config, self.topic, self.flush_timeout_s = config, topic, flush_timeout_s
        self.transactional = transactional
        self._producer: Any = None
        self._failed: list[str] = []

    def setup(self) -> None:
        settings = {"logger": LOG, **self.config}
        if self.transactional:
            settings["transactional.id"] = f"sparkbeam-{uuid.uuid4().hex}"
        self._producer = client().Producer(settings)
        if self.transactional:
            self._producer.init_transactions(self.flush_timeout_s)

    def teardown(self) -> None:
        if self._producer is not None:
            if self.transactional:
                # A failed bundle's open transaction would hold readers back (none: raises).
                with contextlib.suppress(Exception):
                    self._producer.abort_transaction(self.flush_timeout_s)
            self._producer.flush(self.flush_timeout_s)
            self._producer = None

    def start_bundle(self) -> None:
        if self.transactional:
            self._producer.begin_transaction()

    def _delivered(self, error: Any, message: Any) -> None:
        if error is not None:
            self._failed.append(str(error))

    def process(self, element: tuple[bytes | None, bytes | None]) -> None:
        # In a transaction a failed delivery fails the commit; no callback needed.
        produce(self._producer, self.topic, element,
                None if self.transactional else self._delivered)

    def finish_bundle(self) -> None:
        if self.transactional:
            try:
                self._producer.commit_transaction(self.flush_timeout_s)
                return
            except Exception as exc:
                raise KafkaError(f"WriteToKafka: {where(self.config, self.topic)}: the "
                                 f"bundle's transaction failed ({exc}); the bundle is "
                                 "retried") from exc
        left = self._producer.flush(self.flush_timeout_s)
        failed, self._failed = self._failed, []
        if left or failed:
            raise KafkaError(
                f"WriteToKafka: {where(self.config, self.topic)}: {left} record(s) not "
                f"delivered within {self.flush_timeout_s:g} s, {len(failed)} refused"
                + (f" (first: {failed[0]})" if failed else "") + "; the bundle is retried")


def produce(producer: Any, topic: str, element: Any, on_delivery: Any = None) -> None:
    """Hands one (key, value) record to the producer, waiting while its queue is full."""
    try:
        key, value = element
    except (TypeError, ValueError):
        raise TypeError(f"WriteToKafka to topic '{topic}' writes (key, value) pairs of bytes "
                        f"(or None); got {type(element).__name__}: {element!r:.80}") from None
    while True:
        try:
            producer.produce(topic, key=key, value=value, on_delivery=on_delivery)
            break
        except BufferError:  # the local queue is full: let deliveries drain it
            producer.poll(0.5)
    producer.poll(0)


@dataclasses.dataclass(frozen=True)
class TransactionalSink:
    """The exactly-once write of one staged partition of one micro-batch (module doc); built by
    WriteToKafka, called by sparkbeam's streaming engine in a Spark task."""

    config: dict[str, Any]
    topic: str
    sink_group_id: str
    timeout_s: float

    def describe(self) -> str:
        return f"sink group '{self.sink_group_id}', {where(self.config, self.topic)}"

    def write_partition(self, query_id: str, batch: int, partition: int,
                        elements: list[Any]) -> int:
        """Writes `elements` in one transaction unless batch `batch` of query `query_id` was
        already written for `partition`; returns the records written (0 when skipped). A
        retriable Kafka error (a coordinator moving, a transaction to abort) is tried again, up
        to `_ATTEMPTS` times, each with a fresh producer."""
        for attempt in range(1, _ATTEMPTS + 1):
            try:
                return self._write_once(query_id, batch, partition, elements)
            except KafkaError as exc:
                cause = exc.__cause__.args[0] if exc.__cause__ and exc.__cause__.args else None
                again = getattr(cause, "retriable", lambda: False)() or getattr(
                    cause, "txn_requires_abort", lambda: False)()
                if not again or attempt == _ATTEMPTS:
                    raise
                LOG.warning("%s; trying again (%d of %d)", exc, attempt + 1, _ATTEMPTS)
        raise AssertionError("unreachable")

    def _write_once(self, query_id: str, batch: int, partition: int,
                    elements: list[Any]) -> int:
        name = f"{self.sink_group_id}.{partition}"
        step = "starting the transactional producer"
        producer = marker = None
        try:
            # A fresh producer each time (its start costs ~65 ms against a warm broker,
            # measured): starting it fences any earlier producer of this id (a task of a
            # killed driver) and aborts the transaction that one left open, so what follows
            # sees only commits.
            producer = client().Producer({"logger": LOG, **self.config,
                                          "transactional.id": name})
            marker = client().Consumer({
                "logger": LOG, "group.id": name, "enable.auto.commit": False,
                "isolation.level": "read_committed",
                **{k: v for k, v in self.config.items()
                   if k == KEY or k.startswith(("security.", "sasl.", "ssl."))}})
            producer.init_transactions(self.timeout_s)
            step = "reading what the sink group recorded"
            done = _last_written(marker, self.topic, query_id, self.timeout_s)
            if done is not None and done >= batch:
                LOG.info("WriteToKafka (%s): micro-batch %d, partition %d was written before "
                         "a restart; skipped", self.describe(), batch, partition)
                return 0
            step = "writing"
            producer.begin_transaction()
            for element in elements:
                produce(producer, self.topic, element)
            tp = client().TopicPartition(self.topic, _MARKER_PARTITION, batch + 1, query_id)
            producer.send_offsets_to_transaction([tp], marker.consumer_group_metadata(),
                                                 self.timeout_s)
            step = "committing"
            producer.commit_transaction(self.timeout_s)
            return len(elements)
        except TypeError:
            raise
        except Exception as exc:
            raise KafkaError(f"WriteToKafka ({self.describe()}): {step} for micro-batch "
                             f"{batch}, partition {partition} (transactional id '{name}') "
                             f"failed: {exc}") from exc
        finally:
            if marker is not None:
                marker.close()


def _last_written(marker: Any, topic: str, query_id: str, timeout_s: float) -> int | None:
    """The last micro-batch of this query the group records, or None."""
    (got,) = marker.committed([client().TopicPartition(topic, _MARKER_PARTITION)],
                              timeout=timeout_s)
    if got.error is not None:
        raise KafkaError(str(got.error))
    if got.offset < 0 or (got.metadata or "") != query_id:
        return None  # never written, or by another query (another checkpoint directory)
    return int(got.offset) - 1


class WriteToKafka(beam.PTransform):  # type: ignore[misc]
    """Writes (key, value) byte pairs to `topic`. At least once by default; with
    `exactly_once=True` and a `sink_group_id` (Beam Java KafkaIO's `withEOS` names), each
    record exactly once for `read_committed` consumers on sparkbeam's streaming engine (module
    doc). One `sink_group_id` per write: it names the transactional producers and the group
    that records what was written."""

    def __init__(self, producer_config: dict[str, Any], topic: str,
                 flush_timeout_s: float = 60.0, *, exactly_once: bool = False,
                 sink_group_id: str | None = None) -> None:
        super().__init__()
        if KEY not in producer_config:
            raise ValueError(f"WriteToKafka: producer_config needs '{KEY}'")
        if exactly_once and not sink_group_id:
            raise ValueError(f"WriteToKafka to topic '{topic}': exactly_once=True needs a "
                             "sink_group_id (one per write: it names the transactional "
                             "producers and the group recording what was written)")
        if exactly_once and "transactional.id" in producer_config:
            raise ValueError(f"WriteToKafka to topic '{topic}': with exactly_once=True the "
                             "transactional.id is sparkbeam's (from sink_group_id); drop it "
                             "from producer_config")
        self.config, self.topic = dict(producer_config), topic
        self.flush_timeout_s = flush_timeout_s
        self.exactly_once, self.sink_group_id = exactly_once, sink_group_id

    def expand(self, pcoll: beam.PCollection) -> Any:
        out = pcoll | "Produce" >> beam.ParDo(_Produce(
            self.config, self.topic, self.flush_timeout_s, transactional=self.exactly_once))
        return beam.pvalue.PDone(pcoll.pipeline) if self.exactly_once else out

    def to_runner_api_parameter(self, context: Any) -> tuple[str, Any]:
        if not self.exactly_once:
            return super().to_runner_api_parameter(context)
        # The URN marks the composite for sparkbeam's streaming engine (module doc); other
        # runners run the expansion.
        from apache_beam.internal import pickler

        assert self.sink_group_id is not None
        return urns.WRITE_TO_KAFKA, bytes(pickler.dumps(TransactionalSink(
            self.config, self.topic, self.sink_group_id, self.flush_timeout_s)))

    @staticmethod
    @beam.PTransform.register_urn(urns.WRITE_TO_KAFKA, None)
    def from_runner_api_parameter(unused_transform: Any, payload: bytes,
                                  unused_context: Any) -> WriteToKafka:
        from apache_beam.internal import pickler

        sink = pickler.loads(payload)
        return WriteToKafka(sink.config, sink.topic, sink.timeout_s, exactly_once=True,
                            sink_group_id=sink.sink_group_id)

