"""The batch plan: Beam's fusion with the native translations around it.

Text reads go to Spark's text source where that reads Beam's lines exactly (`native_text.py`,
`--spark_native`), plain stages of Map/FlatMap/Filter functions call them without Beam's bundle
processor (`direct_paths.py`, also `--spark_native`), a WindowInto(GlobalWindows) that the
bundle processor runs is an operation of sparkbeam's own (`global_window.py`, also
`--spark_native`), and windowed GroupByKeys under the default trigger are grouped per window
without Beam's trigger driver (`plan/grouping_paths.py`, also `--spark_native`); ReadFromSpark
and WriteToSpark always become parts of the Spark plan (`native_spark.py`): their expansions
would start a SparkSession inside a Spark task.
"""
from __future__ import annotations

import dataclasses

from apache_beam.portability.api import beam_runner_api_pb2

from sparkbeam import urns
from sparkbeam.errors import Unsupported, UnsupportedFeatureError
from sparkbeam.plan.direct_paths import with_direct_chains
from sparkbeam.plan.direct_stateful import with_direct_stateful
from sparkbeam.plan.fuse import plan_pipeline
from sparkbeam.plan.global_window import with_global_window_operation
from sparkbeam.plan.grouping_paths import grouping_decisions, unlifted_decisions
from sparkbeam.plan.model import Plan
from sparkbeam.plan.native_spark import (
    overwritten_sources,
    split_runner_writes,
    translate_spark_io,
    with_constant_windowing,
)
from sparkbeam.plan.native_text import translate_text_reads, wire_prefix
from sparkbeam.plan.packed_rows import packed_buffers, with_counted
from sparkbeam.plan.write_results import without_write_regroups


def plan_batch(
    proto: beam_runner_api_pb2.Pipeline, *, pickle_library: str = "default",
    is_drain: bool = False, native: bool = True, packing: bool = True,
) -> Plan:
    """The batch plan of `proto`, its text reads done by Spark where they read Beam's lines
    exactly (`native`), else by Beam's reader; `Plan.decisions` says which and why. `packing`:
    whether shuffled rows may be packed per key (`plan/packed_rows.py`; not when the job's
    Arrow batches go by count alone, `--arrow_batch_bytes=rows`)."""
    from apache_beam.runners.pipeline_context import PipelineContext

    proto, spark_reads, spark_writes, spark_decisions = translate_spark_io(proto)
    overwrites = overwritten_sources(spark_reads, spark_writes)
    if overwrites:
        raise UnsupportedFeatureError([
            Unsupported(what, f"transform '{name}'", "Spark clears the target before it reads "
                        "the source; write elsewhere, then move it") for name, what in overwrites])
    regroups: list[str] = []
    kept_in_spark: frozenset[str] = frozenset()
    if native:  # else Beam's expansion runs as it is
        proto, regroups, kept_in_spark = without_write_regroups(proto)
    skip: list[str] = []
    while True:
        rewritten, reads, decisions = (translate_text_reads(proto, skip) if native
                                       else (proto, {}, []))
        plan = plan_pipeline(rewritten, pickle_library=pickle_library, is_drain=is_drain,
                             runner_urns=frozenset([urns.WRITE_TO_SPARK]), beam_phases=not native)
        if not reads:
            break
        ctx = PipelineContext(beam_runner_api_pb2.Components.FromString(plan.components))
        odd = []
        for stage in plan.stages:
            for inp in stage.inputs:
                if inp.buffer_id in reads:
                    prefix = wire_prefix(ctx.coders[inp.coder_id].get_impl())
                    if prefix is None:
                        odd.append(reads[inp.buffer_id].transform)
                    else:
                        reads[inp.buffer_id] = dataclasses.replace(
                            reads[inp.buffer_id], prefix=prefix)
        if not odd:
            break
        skip.extend(odd)  # rare: planned again with those reads left to Beam
    if not native:  # Beam's GroupingBuffer and trigger driver for every GroupByKey
        plan = dataclasses.replace(plan, groupings={
            b: dataclasses.replace(g, by_window=False) for b, g in plan.groupings.items()})
    stages, writes = split_runner_writes(plan, spark_writes, "WriteToSpark")
    plan = with_constant_windowing(dataclasses.replace(plan, stages=stages), spark_reads)
    paths: tuple[str, ...] = ()
    if native:  # else Beam's bundle processor runs every stage as Beam made it
        plan, direct = with_direct_chains(plan)
        plan, stateful = with_direct_stateful(plan)
        plan, windowing = with_global_window_operation(plan)
        paths = direct + stateful + windowing
    plan = dataclasses.replace(
        plan, text_reads=reads, spark_reads=spark_reads, spark_writes=writes,
        kept_in_spark=kept_in_spark)
    if native and packing:
        packed, counted, sessions = packed_buffers(plan)
        plan = dataclasses.replace(plan, packed=packed,
                                   groupings=with_counted(plan, counted, sessions))
    return dataclasses.replace(
        plan, decisions=(tuple(spark_decisions) + tuple(str(d) for d in decisions) + tuple(regroups)
                   + grouping_decisions(plan)
                   + (unlifted_decisions(proto.components) if native else ()) + paths))
