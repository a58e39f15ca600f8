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

A buffer is packed only where every reader is one of those: each stage that reads it is a
GROUPED stage whose grouping of it is by window, or a STATEFUL stage run directly (not a
splittable one, whose bundles are split by element, nor one through Beam's bundle processor,
whose bundles `--bundle_size` bounds in elements, where a row would count as one; the direct
path hands a key over to it only to report the error the key raises), and nothing else reads
it (no side input, no Spark write; no text or Spark read or impulse feeds it). Other
readers take a row for one element: a plain stage, Beam's `GroupingBuffer` through the
trigger driver (which does read a stream, but is kept out: it is the general path, and
`--spark_native=off` keeps every grouping there), the global window's grouping from columns
(`engine/keyed_columns.py`, which counts rows as values), a side input's decoding. Packed
rows are not provably small, so a job with any keeps Spark's byte limit on its Arrow batches
(`plan/arrow_batches.py`), and none are packed when `--arrow_batch_bytes=rows` drops it
(`plan_batch(packing=False)`; `packed_tags` checks the limit again).
"""
from __future__ import annotations

from sparkbeam.plan.arrow_batches import NO_BYTE_LIMIT
from sparkbeam.plan.model import IMPULSE_BUFFER, Plan, Stage, StageKind


def packed_buffers(plan: Plan) -> frozenset[bytes]:
    """The buffers of `plan` whose producers may pack their rows (see the module doc)."""
    readers: dict[bytes, list[bool]] = {}  # buffer -> whether each reader takes packed rows
    other: set[bytes] = {op.buffer_id for op in plan.spark_writes} | {IMPULSE_BUFFER}
    other.update(plan.text_reads, plan.spark_reads)
    for stage in plan.stages:
        other.update(use.buffer_id for use in stage.side_inputs)
        for inp in stage.inputs:
            grouping = plan.groupings.get(inp.buffer_id)
            readers.setdefault(inp.buffer_id, []).append(
                (stage.kind is StageKind.GROUPED and grouping is not None and grouping.by_window)
                or (stage.kind is StageKind.STATEFUL and grouping is None
                    and stage.direct_stateful is not None))
    return frozenset(buffer_id for buffer_id, takes in readers.items()
                     if buffer_id not in other and all(takes))


def packed_tags(plan: Plan, stage: Stage, arrow_batch_bytes: int | None) -> frozenset[int]:
    """The output tags of `stage` (a Spark task's, not the driver's) whose rows its tasks pack;
    none when the job's Arrow batches go by count alone (`arrow_batch_bytes`, the job's byte
    limit: `NO_BYTE_LIMIT` under `--arrow_batch_bytes=rows`), which takes rows as small as
    their coders make them."""
    if arrow_batch_bytes == NO_BYTE_LIMIT:
        return frozenset()
    return frozenset(n for n, o in enumerate(stage.outputs) if o.buffer_id in plan.packed)
