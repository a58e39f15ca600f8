"""Global-window GroupByKey inputs grouped from Arrow columns, without decoding each value.

Under the default windowing (the global window, the default trigger) Beam's `GroupingBuffer`
decodes every pre-grouped element `WindowedValue(KV(key, value))`, keeps only `value`, and
encodes one `WindowedValue(KV(key, [values]))` per key, in the global window at its maximum
timestamp with pane `(first, last, ON_TIME, 0, 0)`. Row by row that cost most of a skewed
GroupByKey's reduce stage (in-process, 1 M rows: 2.3 of 3.0 s, before Arrow's `to_pylist`).

The same bytes come out of the encoded rows directly, as Beam's Java runners shuffle values
without decoding them. A global-window element in the nested context is
`timestamp (8 bytes) | window count (4 bytes, 1) | pane (1 byte when its type nibble is 0) |
key (nested) | value (nested)`, and the grouped element is
`header | key (nested) | count (int32, big-endian) | the values (nested), in order`
(`SequenceCoderImpl.encode_to_stream` for a list). So, per Arrow batch, with NumPy:

- runs of equal (key, input) are found by comparing neighbouring keys;
- each row's header is checked (one window, a one-byte pane) and its key bytes compared with
  the key column's; the value bytes of every row that passes are cut out of the batch's buffer
  in one masked copy;
- a row that does not pass (another pane encoding, no window, a key encoded otherwise) is
  decoded by Beam's coder and its value encoded again, as `GroupingBuffer` would.

Values keep their encoded bytes instead of being decoded and encoded again: the same elements
for any coder whose `decode(encode(x)) == x`, which Beam's coders promise. A key is decoded and
encoded again once per key, as `GroupingBuffer` does. Used only where the pre- and post-grouping
coders share the key and value coders (`global_grouping`); byte-equal to `GroupingBuffer` on
Hypothesis inputs (`tests/unit/engine/test_keyed_columns.py`). Bundles are cut exactly as
`bundles.keyed_bundles` cuts them.
"""
from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.coders import coders
from apache_beam.transforms.window import GlobalWindow, GlobalWindows
from apache_beam.utils.windowed_value import PaneInfo, PaneInfoTiming

from sparkbeam.engine.arrow import Columns, binary_buffers, columns_of, cut_out
from sparkbeam.engine.bundles import Bundle
from sparkbeam.plan.arrow_batches import PACKED_STRETCH_ROWS
from sparkbeam.plan.grouping_paths import columnar_coders
from sparkbeam.plan.model import Grouping

_HEADER = 13  # timestamp (8) + window count (4) + a one-byte pane
_GROUPED_PANE = PaneInfo(is_first=True, is_last=True, timing=PaneInfoTiming.ON_TIME, index=0,
                         nonspeculative_index=0)


@dataclass(frozen=True)
class GlobalGrouping:
    """One GroupByKey input under the default windowing, grouped from encoded bytes."""

    pre: Any  # the pre-grouping element's coder impl: WindowedValue(KV(key, value))
    key: Any  # the key coder's impl
    value: Any  # the value coder's impl
    header: bytes  # the grouped element's WindowedValue header
    # Each row a count and that many values (`engine/packed_rows.py`), not an element.
    counted: bool = False

    def element(self, key: bytes, count: int, values: Iterable[bytes]) -> bytes:
        """The grouped element of `count` nested-encoded values of key `key` (as encoded in
        the key column); the key decoded and encoded again, as `GroupingBuffer` does."""
        key = self.key.encode_nested(self.key.decode_nested(key))
        return b"".join((self.header, key, struct.pack(">i", count), *values))

    def value_of(self, row: bytes) -> bytes:
        """The value of a row the fast path cannot cut, through Beam's coders."""
        return self.value.encode_nested(self.pre.decode_nested(row).value[1])


def global_grouping(grouping: Grouping, ctx: Any) -> GlobalGrouping | None:
    """The columnar grouping of `grouping`, or None where it does not apply (other windowing,
    other coders: `columnar_coders`): those keep `engine/grouping.py`."""
    found = columnar_coders(grouping, ctx)
    if found is None:
        return None
    pre, key, value = found
    # The grouped element's header: the same WindowedValue over a value of known bytes.
    probe = coders.WindowedValueCoder(coders.BytesCoder(), pre.window_coder).get_impl()
    wrapped = probe.encode_nested(GlobalWindows.windowed_value(
        b"", timestamp=GlobalWindow().max_timestamp(), pane_info=_GROUPED_PANE))
    return GlobalGrouping(pre=pre.get_impl(), key=key.get_impl(), value=value.get_impl(),
                          header=wrapped[:-1],  # less the empty bytes' length (0)
                          counted=grouping.counted)


@dataclass
class _Batch:
    """One Arrow batch of a keyed stage's input, cut into runs of equal (key, input)."""

    columns: Columns
    keys: pa.Array
    starts: np.ndarray  # the first row of each run, then the row count
    ok: np.ndarray  # rows whose value is cut out of the buffer directly
    cut: np.ndarray  # those values, back to back
    cut_ends: np.ndarray  # end of each ok row's value in `cut` (a bad row ends where it starts)
    # How many values the rows before each row hold (then all of them): one an element, a
    # counted row's count.
    held: list[int]


def _runs(batch: pa.RecordBatch, counted: list[int]) -> _Batch:
    """`batch`'s runs, its rows' values cut out; `counted`, the inputs whose rows are counted
    (`engine/packed_rows.py`: a big-endian int32 count, then the values)."""
    cols = columns_of(batch)
    keys = batch.column(1)
    n = len(cols.inputs)
    change = np.ones(n, dtype=bool)
    if n > 1:
        change[1:] = (cols.inputs[1:] != cols.inputs[:-1]) | pc.not_equal(
            keys.slice(1), keys.slice(0, n - 1)).to_numpy(zero_copy_only=False)
    starts = np.append(np.flatnonzero(change), n)
    data = np.frombuffer(cols.data, dtype=np.uint8)
    key_offsets, key_view = binary_buffers(keys)
    key_data = np.frombuffer(key_view, dtype=np.uint8)
    begin, end = cols.offsets[:-1], cols.offsets[1:]
    packs = (np.isin(cols.inputs, counted) if counted else np.zeros(n, dtype=bool))
    ok, value_begin = cuttable(data, begin, end, key_offsets, key_data, ~packs)
    # The ok rows' values: [value_begin, end), cut in one gather; a counted row's all of
    # [begin + 4, end).
    value_begin = np.where(packs, begin + 4, value_begin)
    counts = np.ones(n, dtype=np.int64)
    if packs.any():
        counts[packs] = _counts(data, begin[packs], end[packs])
        ok |= packs
    cut = cut_out(data, value_begin[ok], end[ok])
    cut_ends = np.cumsum(np.where(ok, end - value_begin, 0))
    return _Batch(cols, keys, starts, ok, cut, cut_ends,
                  np.concatenate(([0], np.cumsum(counts))).tolist())


def cuttable(data: np.ndarray, begin: np.ndarray, end: np.ndarray, key_offsets: np.ndarray,
             key_data: np.ndarray, ok: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Which of the elements [begin, end) of `data` (those `ok` says to look at) are a global
    window's `WindowedValue(KV)` whose value starts right after a 13-byte header (one window, a
    one-byte pane) and the key's bytes (`key_offsets` into `key_data`, one a row), and where
    each one's value then starts: it is `[start, end)`."""
    n = len(begin)
    key_len = np.diff(key_offsets)
    ok = ok & ((end - begin) >= _HEADER + key_len)
    last = max(len(data) - 1, 0)
    at = np.where(ok, begin, 0)

    def byte(k: int) -> np.ndarray:
        return data[np.minimum(at + k, last)] if len(data) else np.zeros(n, dtype=np.uint8)

    ok &= (byte(8) == 0) & (byte(9) == 0) & (byte(10) == 0) & (byte(11) == 1) & (byte(12) < 16)
    # Each row's key bytes against its key column's.
    total = int(key_len.sum())
    if total:
        row = np.repeat(np.arange(n), key_len)
        in_key = np.arange(total) - np.repeat(key_offsets[:-1], key_len)
        where = np.minimum(np.where(ok[row], at[row] + _HEADER + in_key, 0), last)
        same = data[where] == key_data
        ok &= np.bincount(row[~same], minlength=n) == 0
    return ok, begin + _HEADER + key_len


def _counts(data: np.ndarray, begin: np.ndarray, end: np.ndarray) -> np.ndarray:
    """The counts (big-endian int32) that counted rows [begin, end) start with. A row too
    short for one, or a count below one, is no row a producer packed: an error, not a guess."""
    if np.any(end - begin < 4):
        raise ValueError("a grouped input's packed row holds no count: its producer did not "
                         "pack it (a row of fewer than 4 bytes)")
    quads = data[begin[:, None] + np.arange(4)].astype(np.int64)
    counts = (quads[:, 0] << 24) | (quads[:, 1] << 16) | (quads[:, 2] << 8) | quads[:, 3]
    # A producer packs at most a stretch's rows in one. An element's first 4 bytes (its
    # timestamp's highest) make a count of 1 to 100,000 only within ~13,600 years of the
    # earliest timestamp: a net for a plan's mistake, not a proof.
    if np.any((counts < 1) | (counts > PACKED_STRETCH_ROWS)):
        raise ValueError("a grouped input's packed row counts no values or more than a "
                         "producer packs: its producer did not pack it")
    return counts


def keyed_column_bundles(batches: Iterable[pa.RecordBatch], size: int, max_bytes: int,
                         groupings: Mapping[int, GlobalGrouping]) -> Iterator[Bundle]:
    """What `bundles.keyed_bundles` makes of the same rows when every input of the stage is
    a global-window GroupByKey input (see the module doc)."""
    bundle = Bundle()
    current: tuple[bytes, int] | None = None
    pieces: list[bytes] = []
    count = 0
    counted = [n for n, g in groupings.items() if g.counted]

    def close_run() -> None:
        nonlocal count
        if current is None or not count:
            return
        n = current[1]
        bundle.add(n, groupings[n].element(current[0], count, pieces))
        pieces.clear()
        count = 0

    for record_batch in _slices(batches):
        if record_batch.column(1).null_count:
            raise ValueError("a grouped input row has no key")
        batch = _runs(record_batch, counted)
        # Per run, Python values taken from the batch once (not a NumPy or Arrow call per run:
        # most runs of a combiner's merge or a word count are one or two rows long).
        firsts = batch.starts[:-1]
        starts = batch.starts.tolist()
        inputs = batch.columns.inputs[firsts].tolist()
        keys = batch.keys.take(pa.array(firsts)).to_pylist()
        whole = np.logical_and.reduceat(batch.ok, firsts).tolist()
        ends = batch.cut_ends.tolist()
        held = batch.held
        cut = batch.cut.tobytes()
        for r, key in enumerate(keys):
            a, b, n = starts[r], starts[r + 1], inputs[r]
            if current is not None and (key, n) != current:
                close_run()
                if key != current[0] and bundle.full(size, max_bytes):
                    bundle.closes_keys = True
                    yield bundle
                    bundle = Bundle()
            current = (key, n)
            if whole[r]:  # every row's value cut out: the run's values are back to back
                pieces.append(cut[ends[a - 1] if a else 0:ends[b - 1]])
            else:
                pieces.extend(_values(batch, cut, ends, a, b, groupings[n]))
            count += held[b] - held[a]
    close_run()
    bundle.closes_keys = True
    yield bundle


#: The most rows `_runs` takes at once, and about the most bytes: its NumPy temporaries are
#: ~18 times a slice's bytes, and a batch can hold up to 100,000 rows
#: (`plan/arrow_batches.py`), or rows of up to ~1 KB where they are packed.
_RUN_ROWS = 10_000
_RUN_BYTES = 1 << 20


def _slices(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The batches' rows in slices of at most `_RUN_ROWS` and, where rows are larger than
    ~100 bytes, about `_RUN_BYTES` (no copy), empty ones left out."""
    for batch in batches:
        if not batch.num_rows:
            continue
        size = batch.column(2).nbytes
        rows = max(1, min(_RUN_ROWS, _RUN_BYTES * batch.num_rows // max(size, 1)))
        for start in range(0, batch.num_rows, rows):
            yield batch.slice(start, rows)


def _values(batch: _Batch, cut: bytes, ends: list[int], a: int, b: int,
            grouping: GlobalGrouping) -> list[bytes]:
    """Rows [a, b)'s values, nested-encoded, in order: cut out of `cut` (the batch's cut
    values, `ends` their ends), or through Beam's coders where a row could not be cut."""
    out = []
    cols = batch.columns
    for i in range(a, b):
        if batch.ok[i]:
            out.append(cut[ends[i - 1] if i else 0:ends[i]])
        else:
            out.append(grouping.value_of(bytes(cols.data[cols.offsets[i]:cols.offsets[i + 1]])))
    return out
