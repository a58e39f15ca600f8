"""Whether Spark may batch the rows it hands a batch pipeline's Python workers by count alone.

Spark 4 cuts each Arrow batch it sends a `mapInArrow` worker at 10,000 rows
(`spark.sql.execution.arrow.maxRecordsPerBatch`, its default) or 64 MB
(`...maxBytesPerBatch`), whichever comes first, and to know the bytes it asks the Arrow writer
for its size after every row. On the skewed GroupByKey's 10 M rows that check was ~15 % of the
JVM's samples (Java Flight Recorder) and the run took 31.7-34.0 s against 25.1-26.3 s without
it (bench/ANALYSIS.md). Spark skips it when the byte limit is `Int.MaxValue`.

That is only safe when 10,000 rows cannot be much more than 64 MB anyway: when every row a
stage reads is provably small. A row is (input, key, value); its value is an element in the
stage input's coder, its key at most that. This module answers, at Prepare, from the coders
alone: every stage input (a grouped one: its elements before grouping) is the impulse, a line
of a Spark text read (a batch of lines is at most its task's file split, itself at most
128 MB), or an element whose coder bounds its encoding (`max_encoded_size`) at
`MAX_ROW_BYTES`; a buffer WriteToSpark writes (decoded into Arrow batches the same way) is
such an element too; and there is no ReadFromSpark (its rows are the user's table's).
An input that provably holds at most one element is left out of the check, whatever its coder:
a batch of it is that one row with the limit or without (Spark checks the bytes only before
adding a row). Every bounded file write has one, read twice: `WriteImpl`'s `DoOnce`, a
`Create([None])` that `PreFinalize` and `FinalizeWrite` read, whose coder bounds nothing;
before it was left out, no job ending in a `WriteToText` batched by count. A stage may have one
such input: read beside bounded ones in a shuffled or spread stage (which mix their inputs'
rows), it adds its one row to a batch of them, at most that row over 64 MB.
Anything else keeps Spark's byte limit, unless `--arrow_batch_bytes` says otherwise.

Such a job's batches may also hold more rows than Spark's 10,000 (`batch_rows`): as many as
keep the largest row the coders allow within the same 64 MB, up to `MAX_BATCH_ROWS`. Each
batch costs the JVM and the Python worker a fixed amount (the Arrow stream's messages, and
the worker's NumPy and Arrow calls per batch): in Spark alone, handing 6.5 M shuffled rows of
four columns to a Python function that only counts them took 7.8 s in batches of 100,000
against 9.5 s in batches of 10,000 (bench/ANALYSIS.md).
"""
from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.runners.portability.fn_api_runner import translations

from sparkbeam.plan.direct_paths import loaded_dofn, same_code, wrapped_fn
from sparkbeam.plan.model import IMPULSE_BUFFER, Plan

#: Spark's own row limit (`spark.sql.execution.arrow.maxRecordsPerBatch`), and the most rows
#: a batch of provably small rows is given.
SPARK_BATCH_ROWS = 10_000
MAX_BATCH_ROWS = 100_000
#: Spark's default byte limit over its default row limit: rows this small
#: fill a 10,000-row batch to at most the 64 MB Spark would allow.
MAX_ROW_BYTES = (64 << 20) // SPARK_BATCH_ROWS
#: Where a packed row (`engine/packed_rows.py`) is cut: several of a key's elements, less than
#: this many bytes of them and one more (a counted row's count besides). Below
#: `MAX_ROW_BYTES` with room for a key and an element, so a job of provably small elements
#: packed stays provably small and is batched by count (Spark's byte check on every row cost a
#: skewed GroupByKey ~20 % of its run, module doc).
PACKED_ROW_BYTES = 1024
#: The most rows a producer packs at once: so no packed row holds more values than this.
PACKED_STRETCH_ROWS = 100_000

_C = common_urns.coders
# Largest encodings of Beam's standard coders of fixed-size values.
_FIXED = {
    _C.VARINT.urn: 10,
    _C.BOOL.urn: 1,
    _C.DOUBLE.urn: 8,
    _C.GLOBAL_WINDOW.urn: 0,
    _C.INTERVAL_WINDOW.urn: 8 + 10,  # its end (8 bytes), its span (a varint)
}
# A windowed value's timestamp (8), window count (4) and pane (its byte and two varints).
_WINDOWED_HEADER = 8 + 4 + 1 + 10 + 10


def max_encoded_size(coder_id: str, coders: Mapping[str, beam_runner_api_pb2.Coder]
                     ) -> int | None:
    """The most bytes an element can take in coder `coder_id` (nested), or None when its
    values have no bound (strings, bytes, iterables, pickled objects, any other coder)."""
    coder = coders.get(coder_id)
    if coder is None:
        return None
    urn = coder.spec.urn
    if urn in _FIXED:
        return _FIXED[urn]
    parts = [max_encoded_size(c, coders) for c in coder.component_coder_ids]
    if any(p is None for p in parts):
        return None
    sizes = [p for p in parts if p is not None]
    if urn == _C.KV.urn:
        return sum(sizes)
    if urn == _C.LENGTH_PREFIX.urn:
        return sizes[0] + 5  # its length as a varint of a 32-bit size
    if urn == _C.WINDOWED_VALUE.urn and coders[coder.component_coder_ids[1]].spec.urn == (
            _C.GLOBAL_WINDOW.urn):
        # The global window encodes as nothing, so the count of windows is all they take.
        return _WINDOWED_HEADER + sizes[0]
    if urn == _C.PARAM_WINDOWED_VALUE.urn:
        return sizes[0]  # the value alone: its window, time and pane are the coder's
    return None


_IMPULSE = common_urns.primitives.IMPULSE.urn
_PAR_DO = common_urns.primitives.PAR_DO.urn
_MAX_CHAIN = 16  # transforms followed back from a buffer before giving up


@functools.cache
def _create_lambda() -> Any:
    """The code of Beam's `Create` expansion's `FlatMap(lambda _: serialized_values)`."""
    from apache_beam.transforms import core

    found = [c for c in core.Create.expand.__code__.co_consts
             if getattr(c, "co_freevars", None) == ("serialized_values",)]
    return found[0] if len(found) == 1 else None


def _one_input_pardo_fn(transform: beam_runner_api_pb2.PTransform) -> tuple[Any, str] | None:
    """(the function, its one input PCollection) of a ParDo of Beam's `CallableWrapperDoFn`
    with one input, one output, no side input, state or timer; else None."""
    if transform.spec.urn != _PAR_DO or len(transform.inputs) != 1 or len(transform.outputs) != 1:
        return None
    payload = beam_runner_api_pb2.ParDoPayload.FromString(transform.spec.payload)
    if payload.side_inputs or payload.state_specs or payload.timer_family_specs:
        return None
    try:
        dofn = loaded_dofn(transform)[0]
    except Exception:  # noqa: BLE001 - a DoFn this process cannot load is not one of Beam's
        return None
    fn = getattr(dofn, "_fn", None)
    return (fn, next(iter(transform.inputs.values()))) if fn is not None else None


def element_bound(comps: beam_runner_api_pb2.Components, pcoll: str) -> int | None:
    """The most elements PCollection `pcoll` can hold, when its producers prove it: an
    Impulse's one, Beam's `Create` expansion's FlatMap (as many as it was given, per input
    element), Beam's one-argument `Map` (one per input element); None otherwise."""
    # A transform whose output is its input (Create's `MaybeReshuffle` of one value, a
    # composite that returned its input) produces nothing: the one before it does.
    producers = {out: t for _, t in sorted(comps.transforms.items()) if not t.subtransforms
                 for out in t.outputs.values() if out not in t.inputs.values()}
    factor = 1
    for _ in range(_MAX_CHAIN):
        transform = producers.get(pcoll)
        if transform is None:
            return None
        if transform.spec.urn == _IMPULSE:
            return factor
        found = _one_input_pardo_fn(transform)
        if found is None:
            return None
        fn, pcoll = found
        wrapped = wrapped_fn(fn)
        if wrapped is not None and wrapped[0] == "map":
            continue
        if same_code(getattr(fn, "__code__", None), _create_lambda()):
            values = fn.__closure__[0].cell_contents
            if not isinstance(values, list):
                return None
            factor *= len(values)
            continue
        return None
    return None


def holds_one_element(comps: beam_runner_api_pb2.Components, buffer_id: bytes) -> bool:
    """Whether a stage input's buffer is a PCollection's that provably holds at most one
    element. Beam names a Flatten's buffer after the transform, not a PCollection: a buffer
    whose name is also a transform's is not taken for the PCollection of that id."""
    kind, pcoll = translations.split_buffer_id(buffer_id)
    if kind != "materialize" or pcoll not in comps.pcollections:
        return False
    if any(t.unique_name == pcoll for t in comps.transforms.values()):
        return False
    bound = element_bound(comps, pcoll)
    return bound is not None and bound <= 1


def rows_provably_small(plan: Plan) -> bool:
    """Whether every row a batch plan's Python workers read is small enough (see the module
    doc): the stages' inputs, and the buffers WriteToSpark decodes into Arrow batches."""
    largest = largest_row(plan)
    return largest is not None and largest <= MAX_ROW_BYTES


def largest_row(plan: Plan) -> int | None:
    """The most bytes a row a batch plan's Python workers read can take, by its coder (0:
    every row is the impulse's, a text line or one provably single element's); None when
    some row has no bound."""
    if plan.spark_reads:
        return None
    read: list[str] = [write.coder_id for write in plan.spark_writes]
    comps = beam_runner_api_pb2.Components.FromString(plan.components)
    packed = 0
    for stage in plan.stages:
        exempt = False
        for use in stage.inputs:
            if use.buffer_id == IMPULSE_BUFFER or use.buffer_id in plan.text_reads:
                continue
            # A grouped input's rows are its ungrouped elements (grouped in the worker).
            grouping = plan.groupings.get(use.buffer_id)
            coder_id = grouping.input_coder_id if grouping else use.coder_id
            if use.buffer_id in plan.packed:
                # Elements a row up to `PACKED_ROW_BYTES`, one more and a count; the key at
                # most an element's.
                value = max_encoded_size(coder_id, comps.coders)
                if value is None:
                    return None
                packed = max(packed, _ROW_OVERHEAD + 2 * value + PACKED_ROW_BYTES + 4)
                continue
            if (grouping is None and not exempt
                    and max_encoded_size(coder_id, comps.coders) is None
                    and holds_one_element(comps, use.buffer_id)):
                # One row: batched alike with the limit or without. One such input a stage:
                # a shuffled or spread stage mixes its inputs' rows in a batch.
                exempt = True
                continue
            read.append(coder_id)
    largest = packed
    for coder_id in read:
        value = max_encoded_size(coder_id, comps.coders)
        if value is None:
            return None
        # The row's key is (at most) the value's own key, encoded again.
        largest = max(largest, _ROW_OVERHEAD + 2 * value)
    return largest


#: What a row takes in an Arrow batch besides its key's and value's bytes: its input number,
#: its two binary columns' offsets and a keyed stage's sort column (4 + 4 + 4 + 8).
_ROW_OVERHEAD = 20


def batch_rows(largest: int) -> int:
    """Rows per Arrow batch when no row takes more than `largest` bytes (at most
    `MAX_ROW_BYTES`): as many as fit within Spark's 64 MB, between Spark's 10,000 and
    `MAX_BATCH_ROWS`."""
    fit = (MAX_ROW_BYTES * SPARK_BATCH_ROWS) // max(largest, 1)
    return max(SPARK_BATCH_ROWS, min(MAX_BATCH_ROWS, fit))


#: Spark's `Int.MaxValue`: the byte limit at which it batches rows by count alone.
NO_BYTE_LIMIT = 2**31 - 1


def setting_problem(setting: str) -> str | None:
    """Why `--arrow_batch_bytes` cannot be used, or None."""
    if setting in ("auto", "rows") or (setting.isdigit() and int(setting) > 0):
        return None
    return "--arrow_batch_bytes takes auto, rows or a number of bytes (at least 1)"


def batch_limits(setting: str, plan: Plan, session_rows: int | None = None
                 ) -> tuple[int | None, int | None, str]:
    """The byte limit (None: Spark's own, 64 MB unless the session says otherwise) and the
    row limit (None: Spark's own, 10,000 unless the session says otherwise) of the Arrow
    batches a batch job's Python workers get, and why, for the job's log.
    `session_rows`: the row limit the session itself holds, which wins over the job's (a
    session the user made, a cluster's defaults); more rows than provably fit 64 MB keep
    Spark's byte limit."""
    if setting == "rows":
        return NO_BYTE_LIMIT, None, ("Arrow batches to Python workers by row count alone "
                                     "(--arrow_batch_bytes=rows)")
    if setting != "auto":
        return int(setting), None, (f"Arrow batches to Python workers of at most "
                                    f"{int(setting)} bytes")
    largest = largest_row(plan)
    if largest is not None and largest <= MAX_ROW_BYTES:
        rows = batch_rows(largest)
        if session_rows is not None and session_rows > rows:
            return None, None, (
                f"Arrow batches to Python workers keep Spark's byte limit: the session cuts "
                f"them at {session_rows:,} rows (spark.sql.execution.arrow.maxRecordsPerBatch), "
                f"more than the {rows:,} rows of at most {largest} bytes that fit 64 MB")
        return NO_BYTE_LIMIT, rows, (
            f"Arrow batches to Python workers by row count alone, up to {rows:,} rows: every row "
            f"the stages read is at most {largest} bytes (its coder bounds it) or a line of a "
            "text file")
    return None, None, ("Arrow batches to Python workers keep Spark's byte limit: some stage "
                        "reads elements whose coder does not bound their size "
                        "(--arrow_batch_bytes=rows lifts it)")
