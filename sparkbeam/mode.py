"""Batch or streaming: what the pipeline's graph says when `--streaming` is not given.

Beam's Dataflow runner infers streaming from the graph (any unbounded PCollection) and Beam's
DirectRunner switches to its streaming runner for a TestStream; a user who ran their pipeline
there expects the same here. The one exception is Dataflow's experiment
`unsafely_attempt_to_process_unbounded_data_in_batch_mode`, which keeps batch: an unbounded
splittable DoFn then runs until it stops claiming work, as on FnApiRunner.
"""
from __future__ import annotations

from collections.abc import Iterable

from apache_beam.portability.api import beam_runner_api_pb2

from sparkbeam.urns import TEST_STREAM

BATCH_EXPERIMENT = "unsafely_attempt_to_process_unbounded_data_in_batch_mode"


def unbounded_reason(proto: beam_runner_api_pb2.Pipeline) -> str | None:
    """Why the graph needs streaming (naming a transform or PCollection), or None."""
    comps = proto.components
    for tid in sorted(comps.transforms):
        transform = comps.transforms[tid]
        if transform.spec.urn == TEST_STREAM:
            return f"it reads the TestStream '{transform.unique_name or tid}'"
    for pid in sorted(comps.pcollections):
        pcoll = comps.pcollections[pid]
        if pcoll.is_bounded == beam_runner_api_pb2.IsBounded.UNBOUNDED:
            return f"its PCollection '{pcoll.unique_name or pid}' is unbounded"
    return None


def inferred_streaming(proto: beam_runner_api_pb2.Pipeline, *, streaming: bool,
                       experiments: Iterable[str]) -> str | None:
    """The reason to run as a stream although `--streaming` was not given, or None (the flag
    was given, the graph is bounded, or the batch experiment asks to stay in batch)."""
    if streaming or BATCH_EXPERIMENT in set(experiments):
        return None
    return unbounded_reason(proto)
