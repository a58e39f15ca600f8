"""Keys bucketed per Spark grouping key: the state layout of keyed streaming operators (no
pyspark, no Beam).

Spark's Python `transformWithState` costs a few Python-JVM calls per grouping key and batch
(set the implicit key, read the state, write it, set a timer: ~65-80 µs each, SPARK-52333),
whatever the work inside. Grouped by the Beam key, a micro-batch touching 40 k keys paid them
40 k times. Grouped by a bucket of Beam keys (the key's hash modulo `bucket_count`), it pays
them once per bucket touched: the bucket's one state value holds each of its keys' blob and
what the key waits for (`script.Pending`), read and written whole. What a key costs beside
its own work is then bytes (its entry pickled with the bucket's), not calls; keys not touched
and not due are neither decoded nor run.

The count is fixed for a checkpoint's life (a key's bucket must not move): derived from
`--parallelism`, which the checkpoint already fixes for the query's stateful partitions.
"""
from __future__ import annotations

import pickle

from sparkbeam.streaming.script import Pending

#: Buckets per stateful partition: enough that a bucket holds few keys at small key counts
#: and that a partition's buckets spread its keys' bytes at large ones.
BUCKETS_PER_PARTITION = 64

# key -> (its blob or None, what it waits for or None)
Entries = dict[bytes, tuple[bytes | None, Pending | None]]


def bucket_count(partitions: int) -> int:
    return BUCKETS_PER_PARTITION * max(1, partitions)


def load_entries(value: bytes | None) -> Entries:
    """A bucket's entries from its state value (None: the bucket holds nothing)."""
    if not value:
        return {}
    saved = pickle.loads(value)
    return {key: (blob, None if waits is None else Pending(*waits))
            for key, (blob, waits) in saved.items()}


def dump_entries(entries: Entries) -> bytes:
    return pickle.dumps(
        {key: (blob, None if pending is None
               else (pending.event, pending.processing, pending.hold))
         for key, (blob, pending) in entries.items()},
        protocol=pickle.HIGHEST_PROTOCOL)
