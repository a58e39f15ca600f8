"""What a stage's descriptor means to the runner, worked out once per stage per process.

A `StageProgram` knows, for one stage: which data-input transform each stage input feeds, how a
residual or a split's primary is routed back to a stage input, which output elements need their
key encoded beside them (a keyed consumer reads them), how its timer families are encoded and in
which time domain they fire, and how a GroupByKey input is grouped per key in batch. It holds no
rows, no state and no worker: the same program serves every task, key and micro-batch of its
stage in a Python worker process (`program_for` caches it).
"""
from __future__ import annotations

import collections
import hashlib
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_fn_api_pb2

from sparkbeam.engine import context
from sparkbeam.engine.grouping import Grouper, grouper_for
from sparkbeam.plan.model import Grouping, Stage

if TYPE_CHECKING:
    from sparkbeam.engine.direct import DirectProgram
    from sparkbeam.engine.direct_stateful import StatefulProgram
    from sparkbeam.engine.keyed_columns import GlobalGrouping

TRUNCATE_URN = common_urns.sdf_components.TRUNCATE_SIZED_RESTRICTION.urn

Chunks = dict[int, list[bytes]]  # stage input index -> encoded elements (nested context)
OutRow = tuple[int, bytes | None, bytes]  # (stage output index, encoded key or None, element)
TimerFamilyId = tuple[str, str]  # (transform id, timer family id)


@dataclass(frozen=True)
class StageProgram:
    """A stage as the runner drives it (see the module doc)."""

    stage: Stage
    descriptor: beam_fn_api_pb2.ProcessBundleDescriptor
    input_ids: tuple[str, ...]  # stage input index -> its DATA_INPUT transform
    out_index: Mapping[str, int]  # DATA_OUTPUT transform -> stage output index
    key_impls: Mapping[str, tuple[Any, Any]]  # DATA_OUTPUT -> (element impl, key impl)
    out_coders: Mapping[int, Any]  # keyed stage output index -> its elements' coder
    timer_impls: Mapping[TimerFamilyId, Any]
    timer_domains: Mapping[TimerFamilyId, int]
    groupers: Mapping[int, Grouper]  # stage input index -> how batch groups it per key
    # Every input a global-window GroupByKey input: grouped from Arrow columns (None: not).
    column_groupings: Mapping[int, GlobalGrouping] | None
    pcoll_to_input: Mapping[str, str]  # PCollection read in the stage -> its data input
    direct: DirectProgram | None = None  # batch: its functions called without the SDK
    stateful: StatefulProgram | None = None  # batch: its stateful DoFn, without the SDK

    def route(self, app: beam_fn_api_pb2.BundleApplication) -> int:
        """The stage input a residual or primary root is fed back through."""
        pcoll = self.descriptor.transforms[app.transform_id].inputs[app.input_id]
        return self.input_ids.index(self.pcoll_to_input[pcoll])

    def data(self, chunks: Chunks) -> list[beam_fn_api_pb2.Elements.Data]:
        """One bundle's input messages."""
        return [
            beam_fn_api_pb2.Elements.Data(transform_id=self.input_ids[n], data=b"".join(parts))
            for n, parts in chunks.items()
            if parts
        ]

    def counts(self, chunks: Chunks, elements: Mapping[int, int] | None = None
               ) -> dict[str, int]:
        """Elements per input transform (what lets a running bundle be split): one per part,
        unless `elements` says how many each input's parts hold (runs of elements)."""
        return {self.input_ids[n]: (len(parts) if elements is None else elements[n])
                for n, parts in chunks.items() if parts}

    def rows(self, outputs: Iterable[tuple[str, bytes]]) -> Iterator[OutRow]:
        """A bundle's output elements as rows, with the key where a keyed consumer needs it."""
        for transform_id, data in outputs:
            keyed = self.key_impls.get(transform_id)
            key = None
            if keyed is not None:
                key = keyed[1].encode_nested(keyed[0].decode_nested(data).value[0])
            yield self.out_index[transform_id], key, data


def build_program(stage: Stage, components: bytes, groupings: Mapping[bytes, Grouping]
                  ) -> StageProgram:
    """Works out the program of `stage` (prefer the cached `program_for`)."""
    ctx = context.pipeline_context(components)
    descriptor = beam_fn_api_pb2.ProcessBundleDescriptor.FromString(stage.descriptor)
    input_ids = tuple(i.transform_id for i in stage.inputs)
    pcoll_to_input: dict[str, str] = {}
    for tid in input_ids:
        for pcoll in descriptor.transforms[tid].outputs.values():
            pcoll_to_input[pcoll] = tid
    # A residual addressed to an SDF's Process reads what Truncate made (drained jobs): route
    # it back through the data input that feeds the Truncate, as FnApiRunner does.
    for transform in descriptor.transforms.values():
        if transform.spec.urn == TRUNCATE_URN:
            source = next(iter(transform.inputs.values()))
            for pcoll in transform.outputs.values():
                if source in pcoll_to_input:
                    pcoll_to_input[pcoll] = pcoll_to_input[source]
    return StageProgram(
        stage=stage,
        descriptor=descriptor,
        input_ids=input_ids,
        out_index={o.transform_id: n for n, o in enumerate(stage.outputs)},
        # Keyed outputs' only (as `key_impls`): a counted output is one.
        out_coders={n: ctx.coders[o.coder_id] for n, o in enumerate(stage.outputs)
                    if o.key_coder_id},
        key_impls={
            o.transform_id: (ctx.coders[o.coder_id].get_impl(),
                             ctx.coders[o.key_coder_id].get_impl())
            for o in stage.outputs if o.key_coder_id
        },
        timer_impls={(t.transform_id, t.family_id): ctx.coders[t.coder_id].get_impl()
                     for t in stage.timers},
        timer_domains={(t.transform_id, t.family_id): t.time_domain for t in stage.timers},
        groupers={n: grouper_for(groupings[i.buffer_id], ctx)
                  for n, i in enumerate(stage.inputs) if i.buffer_id in groupings},
        pcoll_to_input=pcoll_to_input,
        column_groupings=_column_groupings(stage, groupings, ctx),
        direct=_direct(stage, components),
        stateful=_stateful(stage, components),
    )


def _column_groupings(stage: Stage, groupings: Mapping[bytes, Grouping], ctx: Any
                      ) -> Mapping[int, GlobalGrouping] | None:
    # Imported here: `keyed_columns` cuts `bundles.Bundle`s, and `bundles` reads `Chunks`.
    from sparkbeam.engine.keyed_columns import global_grouping

    found = {n: global_grouping(groupings[i.buffer_id], ctx)
             for n, i in enumerate(stage.inputs) if i.buffer_id in groupings}
    if not stage.inputs or len(found) < len(stage.inputs) or None in found.values():
        return None
    return {n: g for n, g in found.items() if g is not None}


def _direct(stage: Stage, components: bytes) -> DirectProgram | None:
    # Imported here: the direct path's rows are this module's `OutRow`s.
    from sparkbeam.engine.direct import DirectProgram

    return DirectProgram(stage, components) if stage.direct is not None else None


def _stateful(stage: Stage, components: bytes) -> StatefulProgram | None:
    # Imported here, as `_direct`.
    from sparkbeam.engine.direct_stateful import StatefulProgram

    return StatefulProgram(stage, components) if stage.direct_stateful is not None else None


_PROGRAMS: collections.OrderedDict[tuple[str, str, frozenset[Grouping], Any], StageProgram] = (
    collections.OrderedDict())
_LOCK = threading.Lock()
_MAX_PROGRAMS = 64


def program_for(stage: Stage, components: bytes, groupings: Mapping[bytes, Grouping]
                ) -> StageProgram:
    """The stage's program, built once per process (the most recent 64 are kept). Batch
    groups GroupByKey inputs itself; a streaming stage gets them grouped, and no groupings."""
    digest = hashlib.sha1(stage.descriptor)
    digest.update(components)
    # The groupings whole: a stage's buffer is grouped per window or not, counted or not,
    # as the plan says (`--spark_native`, `--arrow_batch_bytes`).
    grouped = frozenset(groupings[i.buffer_id] for i in stage.inputs if i.buffer_id in groupings)
    # The direct chain too: a stage with and without one (the tests' two paths) differ.
    key = (stage.label, digest.hexdigest(), grouped, (stage.direct, stage.direct_stateful))
    with _LOCK:
        found = _PROGRAMS.get(key)
        if found is not None:
            _PROGRAMS.move_to_end(key)
            return found
    program = build_program(stage, components, groupings)
    with _LOCK:
        _PROGRAMS[key] = program
        while len(_PROGRAMS) > _MAX_PROGRAMS:
            _PROGRAMS.popitem(last=False)
    return program
