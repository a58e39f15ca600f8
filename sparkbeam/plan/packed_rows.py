"""Which shuffled buffers a batch job's producers may pack: a key's elements in fewer rows.

A keyed stage's input reaches it as rows (input, key, value), one element a row, and every row
costs the JVM a fixed amount however small it is: handed from Python as Arrow, hashed, written
to the shuffle, read back, sorted by `order`, handed to Python again (~0.7 µs a row each side on
the skewed GroupByKey's 10 M rows, bench/ANALYSIS.md), and the Python workers a tuple and a list
entry each way. A sessions job shuffles 1 M events of 10,000 keys, ~100 a key.

Two readers take a key's rows as one stream of its elements: the grouping of a GroupByKey
that the runner groups per window (`Grouping.by_window`: `ByWindowGrouper.grouped` joins a
key's values and decodes elements until they end, on either path, and `bundles.keyed_bundles`
hands its runs to it for the bundle processor), and a stateful stage (the direct path decodes
a key's joined values the same way, `engine/direct_stateful.py`; Beam's bundle processor
reads a bundle's data as a stream of elements). So the value of a row they read may as well
hold several of the key's encoded elements back to back: they decode the same elements, in
the same order within a key. The producer's tasks then pack (`engine/packed_rows.py`) the
rows of such an output, per key over a stretch of their output, into one row a key (up to a
size), which is all the JVM sees.

A third reader takes a key's rows together but not as a stream: the global window's grouping
from columns (`engine/keyed_columns.py`, the default windowing's GroupByKey), which cuts each
row's value out of its encoded element without decoding it and counts rows as values. Its
buffers are packed *counted*: a row is a count, then that many values as the grouping's value
coder nests them, without each element's timestamp, window, pane and key (what the grouping
drops anyway), and it adds the counts and joins the values. A buffer is counted only where
the grouping is sure to read it from columns (every input of each reading stage is a grouping
`grouping_paths.columnar_coders` takes) and its producers write it in the grouping's own input
coder; `Grouping.counted` tells the reader, which then takes every row of it for a count
(`engine/task.py` refuses a counted input its stage does not group from columns).

A fourth takes a key's rows together and reads only each element's window and value: the
grouping per window under Beam's own Sessions with the end-of-window output time
(`grouping_paths.session_coders`). Its buffers are packed as *session rows*
(`engine/session_rows.py`): a count, then the windows' bounds as integers and the values, so
the reader merges the windows with NumPy and decodes a row's values in one call; an element
whose bytes are not as expected stays whole in a row of its own. `Grouping.session_rows`
tells the reader (`ByWindowGrouper`, on either path), as for counted ones the producers write
it in the grouping's own input coder.

A buffer is packed only where every reader takes the same one of those: each stage that
reads it is a GROUPED stage whose grouping of it is by window, or a STATEFUL stage run directly
(not a splittable one, whose bundles are split by element, nor one through Beam's bundle
processor, whose bundles `--bundle_size` bounds in elements, where a row would count as one;
the direct path hands a key over to it only to report the error the key raises), or, for
counted ones, a GROUPED stage grouping from columns; and nothing else reads it (no side input,
no Spark write; no text or Spark read or impulse feeds it). Other readers take a row for one
element: a plain stage, Beam's `GroupingBuffer` through the trigger driver (which does read a
stream, but is kept out: it is the general path, and `--spark_native=off` keeps every grouping
there), a side input's decoding. A packed row is cut at `arrow_batches.PACKED_ROW_BYTES` of
elements (or is one larger), which `plan/arrow_batches.py` counts in its bound on a job's rows,
and none are packed when `--arrow_batch_bytes=rows` drops Spark's byte limit
(`plan_batch(packing=False)`): the user's say that rows are as small as their coders make them.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_fn_api_pb2, beam_runner_api_pb2
from apache_beam.runners.pipeline_context import PipelineContext

from sparkbeam.plan.grouping_paths import columnar_coders, session_coders
from sparkbeam.plan.model import IMPULSE_BUFFER, Grouping, Plan, Stage, StageKind

_STREAMED, _COUNTED, _SESSIONS = "streamed", "counted", "sessions"
_PRECOMBINE = common_urns.combine_components.COMBINE_PER_KEY_PRECOMBINE.urn


def packed_buffers(plan: Plan) -> tuple[frozenset[bytes], frozenset[bytes], frozenset[bytes]]:
    """The buffers of `plan` whose producers may pack their rows, those of them whose rows
    are counted, and those packed as session rows (see the module doc)."""
    ctx = PipelineContext(beam_runner_api_pb2.Components.FromString(plan.components))
    lifted = _lifted(plan)
    columnar = {b: _takes(columnar_coders, g, ctx) and b not in lifted
                for b, g in plan.groupings.items()}
    sessions = {b for b, g in plan.groupings.items() if _takes(session_coders, g, ctx)}
    readers: dict[bytes, list[str | None]] = {}  # buffer -> the rows each reader takes
    other: set[bytes] = {op.buffer_id for op in plan.spark_writes} | {IMPULSE_BUFFER}
    other.update(plan.text_reads, plan.spark_reads)
    uncut: set[bytes] = set()  # written in a coder other than its grouping's
    for stage in plan.stages:
        other.update(use.buffer_id for use in stage.side_inputs)
        # The grouping from columns takes a stage whose every input it groups.
        from_columns = stage.kind is StageKind.GROUPED and all(
            columnar.get(i.buffer_id, False) for i in stage.inputs)
        for inp in stage.inputs:
            readers.setdefault(inp.buffer_id, []).append(_reader(
                plan, stage, inp.buffer_id, from_columns, inp.buffer_id in sessions))
        for out in stage.outputs:  # a counted row's values are cut as the grouping's coder's
            grouping = plan.groupings.get(out.buffer_id)
            if grouping is not None and out.coder_id != grouping.input_coder_id:
                uncut.add(out.buffer_id)
    kinds = {b: takes[0] for b, takes in readers.items()
             if b not in other and takes[0] is not None and len(set(takes)) == 1
             and not (takes[0] in (_COUNTED, _SESSIONS) and b in uncut)}
    return (frozenset(kinds), frozenset(b for b, kind in kinds.items() if kind == _COUNTED),
            frozenset(b for b, kind in kinds.items() if kind == _SESSIONS))


def _lifted(plan: Plan) -> set[bytes]:
    """The GroupByKey buffers that a combiner lifted into its pre-combine feeds: the
    pre-combine already holds one accumulator a key a task (`engine/direct.py`), so counting
    would pack next to nothing, at the cost of its flush. Left out: measured, the job
    server's memory test (100 word counts) grew ~20 % with them counted, flat without."""
    out: set[bytes] = set()
    for stage in plan.stages:
        descriptor = beam_fn_api_pb2.ProcessBundleDescriptor.FromString(stage.descriptor)
        if any(t.spec.urn == _PRECOMBINE for t in descriptor.transforms.values()):
            out.update(o.buffer_id for o in stage.outputs if o.buffer_id in plan.groupings)
    return out


def _takes(coders_of: Callable[[Grouping, Any], Any], grouping: Grouping, ctx: Any) -> bool:
    """Whether `coders_of` (`columnar_coders`, `session_coders`) takes `grouping`."""
    try:
        return coders_of(grouping, ctx) is not None
    except Exception:  # noqa: BLE001 - a coder Beam cannot build: its stage reports it, unpacked
        return False


def _reader(plan: Plan, stage: Stage, buffer_id: bytes, from_columns: bool, sessions: bool
            ) -> str | None:
    """The packed rows `stage` can read of `buffer_id`, if any."""
    grouping = plan.groupings.get(buffer_id)
    if stage.kind is StageKind.GROUPED and grouping is not None:
        if grouping.by_window:
            return _SESSIONS if sessions else _STREAMED
        return _COUNTED if from_columns else None
    if stage.kind is StageKind.STATEFUL and grouping is None and stage.direct_stateful:
        return _STREAMED
    return None


def packed_tags(plan: Plan, stage: Stage) -> tuple[frozenset[int], frozenset[int]]:
    """The output tags of `stage` whose rows its tasks pack as streams, and those they count
    (see the module doc). The plan alone says: one batched by count alone on the user's say
    (`--arrow_batch_bytes=rows`) packs nothing (`plan_batch(packing=False)`), and a packed row
    is bounded (`plan/arrow_batches.py`), so a job batched by count on its own finding of
    small rows may pack. Counting is not optional: a counted buffer's readers take every row
    of it for a count and values."""
    counted = frozenset(n for n, o in enumerate(stage.outputs)
                        if o.buffer_id in plan.groupings and plan.groupings[o.buffer_id].counted)
    sessions = session_tags(plan, stage)
    return frozenset(n for n, o in enumerate(stage.outputs) if o.buffer_id in plan.packed
                     and n not in counted and n not in sessions), counted


def session_tags(plan: Plan, stage: Stage) -> frozenset[int]:
    """The output tags of `stage` whose rows its tasks pack as session rows: not optional
    either, their readers take every row of them for one."""
    return frozenset(n for n, o in enumerate(stage.outputs) if o.buffer_id in plan.groupings
                     and plan.groupings[o.buffer_id].session_rows)


def with_counted(plan: Plan, counted: frozenset[bytes], sessions: frozenset[bytes] = frozenset()
                 ) -> dict[bytes, Grouping]:
    """`plan`'s groupings, those of `counted` and `sessions` marked so (`Grouping.counted`,
    `Grouping.session_rows`)."""
    return {b: dataclasses.replace(g, counted=b in counted, session_rows=b in sessions)
            for b, g in plan.groupings.items()}
