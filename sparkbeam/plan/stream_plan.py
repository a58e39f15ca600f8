"""The streaming plan: Beam's fusion, with exactly-once WriteToKafka composites (`urns.
WRITE_TO_KAFKA`) lifted out as writes the streaming engine does itself (`streaming/
staged_writes.py`) instead of running their transaction-per-bundle expansion, and
ReadFromSpark / WriteToSpark made parts of the query (`native_spark.py`; the stream's
DataFrame feeds its consumers, `streaming/spark_streams.py`)."""
from __future__ import annotations

import dataclasses

from apache_beam.portability.api import beam_runner_api_pb2

from sparkbeam import urns
from sparkbeam.errors import Unsupported, UnsupportedFeatureError
from sparkbeam.plan.fuse import plan_pipeline
from sparkbeam.plan.model import Plan
from sparkbeam.plan.native_spark import (
    lift_composites,
    split_runner_writes,
    translate_spark_io,
)


def plan_streaming(proto: beam_runner_api_pb2.Pipeline, *, pickle_library: str = "default",
                   is_drain: bool = False) -> Plan:
    proto, spark_reads, spark_writes, _ = translate_spark_io(proto)
    proto, names = lift_composites(proto, urns.WRITE_TO_KAFKA)
    _refuse_shared_groups(names)
    plan = plan_pipeline(proto, pickle_library=pickle_library, is_drain=is_drain,
                         streaming=True,
                         runner_urns=frozenset([urns.WRITE_TO_KAFKA, urns.WRITE_TO_SPARK]))
    stages, writes = split_runner_writes(plan, names, "WriteToKafka")
    stages, spark_out = split_runner_writes(dataclasses.replace(plan, stages=stages),
                                            spark_writes, "WriteToSpark")
    decisions = tuple(f"{w.transform}: written exactly once, in Kafka transactions per "
                      "committed micro-batch" for w in writes)
    decisions += tuple(f"{r.transform}: Spark streams {r.described} into the query"
                       for r in spark_reads.values())
    decisions += tuple(f"{w.transform}: Spark writes each committed micro-batch's rows once"
                       for w in spark_out)
    return dataclasses.replace(plan, stages=stages, kafka_writes=writes,
                               spark_reads=spark_reads, spark_writes=spark_out,
                               decisions=decisions)


def _refuse_shared_groups(names: dict[str, bytes]) -> None:
    """Two exactly-once writes with one sink group would share transactional ids and the
    record of what was written: one would skip the other's batches (lost records) or fence
    it."""
    from apache_beam.internal import pickler

    by_group: dict[str, list[str]] = {}
    for name, payload in sorted(names.items()):
        by_group.setdefault(pickler.loads(payload).sink_group_id, []).append(name)
    shared = {g: ns for g, ns in by_group.items() if len(ns) > 1}
    if shared:
        raise UnsupportedFeatureError([
            Unsupported(f"exactly-once writes sharing sink_group_id '{group}'",
                        ", ".join(f"transform '{n}'" for n in ns),
                        "give each WriteToKafka a sink_group_id of its own")
            for group, ns in sorted(shared.items())])
