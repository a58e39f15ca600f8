"""Global-window GroupByKey inputs grouped from Arrow columns are Beam's `GroupingBuffer`'s
groups, in the bundles `keyed_bundles` cuts row by row."""
from __future__ import annotations

import dataclasses
from typing import Any
from unittest import mock

import pyarrow as pa
import pytest
from apache_beam.coders import coders
from apache_beam.runners.pipeline_context import PipelineContext
from apache_beam.transforms import window
from apache_beam.transforms.core import Windowing
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import PaneInfo, PaneInfoTiming, WindowedValue
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkbeam.engine.arrow import OUT_ARROW
from sparkbeam.engine.bundles import keyed_bundles
from sparkbeam.engine.grouping import TriggerDriverGrouper
from sparkbeam.engine import keyed_columns
from sparkbeam.engine.keyed_columns import global_grouping, keyed_column_bundles
from sparkbeam.engine.packed_rows import counted_value, packed
from sparkbeam.plan.model import Grouping

# (key coder, value coder, values)
CODERS = [
    (coders.VarIntCoder(), coders.VarIntCoder(), st.integers(-(2 ** 63), 2 ** 63 - 1)),
    (coders.StrUtf8Coder(), coders.StrUtf8Coder(), st.text(max_size=8)),
    (coders.BytesCoder(), coders.FastPrimitivesCoder(),
     st.one_of(st.none(), st.floats(allow_nan=False), st.integers(), st.text(max_size=4),
               st.tuples(st.integers(), st.binary(max_size=3)),
               st.lists(st.booleans(), max_size=3))),
    (coders.TupleCoder([coders.VarIntCoder(), coders.StrUtf8Coder()]),
     coders.TupleCoder([coders.BytesCoder(), coders.FloatCoder()]),
     st.tuples(st.binary(max_size=4), st.floats(allow_nan=False))),
]
KEYS = {
    "VarIntCoder": st.one_of(st.just(1), st.integers(-3, 300)),
    "StrUtf8Coder": st.sampled_from(["", "a", "ab", "é", "b" * 20]),
    "BytesCoder": st.binary(max_size=3),
    "TupleCoder": st.tuples(st.integers(0, 2), st.sampled_from(["", "x"])),
}
PANES = [PaneInfo(True, False, PaneInfoTiming.ON_TIME, 0, 0),
         PaneInfo(False, False, PaneInfoTiming.LATE, 3, 2),  # more than one byte
         PaneInfo(False, False, PaneInfoTiming.LATE, 1, 1),  # two: the second as key 1's
         PaneInfo(True, True, PaneInfoTiming.UNKNOWN, 0, 0)]
# Rows the columns cannot cut directly: a pane of more than one byte, no window (GroupingBuffer
# keeps the value all the same), a key encoded otherwise than in the key column.
ODD = ["plain"] * 5 + ["pane", "no window", "padded key"]


def _grouping(key: coders.Coder, value: coders.Coder, windowing: Windowing | None = None
              ) -> tuple[Grouping, PipelineContext]:
    ctx = PipelineContext()
    windowing = windowing or Windowing(window.GlobalWindows())
    window_coder = windowing.windowfn.get_window_coder()
    pre = coders.WindowedValueCoder(coders.TupleCoder([key, value]), window_coder)
    post = coders.WindowedValueCoder(coders.TupleCoder([key, coders.IterableCoder(value)]),
                                     window_coder)
    return Grouping(b"buffer", "GroupByKey", ctx.coders.get_id(pre), ctx.coders.get_id(post),
                    ctx.windowing_strategies.get_id(windowing)), ctx


def _batches(rows: list[tuple[int, bytes, bytes]], cut: int, sliced: bool
             ) -> list[pa.RecordBatch]:
    batches = []
    for start in range(0, len(rows), cut):
        part = rows[start:start + cut]
        if sliced:  # offsets not starting at 0 in either binary column
            part = [(0, b"k", b"before")] + part
        batch = pa.RecordBatch.from_arrays(
            [pa.array([r[0] for r in part], pa.int32()),
             pa.array([r[1] for r in part], pa.binary()),
             pa.array([r[2] for r in part], pa.binary())], schema=OUT_ARROW)
        batches.append(batch.slice(1) if sliced else batch)
    return batches


def _drawn_rows(data: Any, which: int) -> tuple[Grouping, PipelineContext, list[Any]]:
    """A grouping of `CODERS[which]` and generated rows of its input: (input, key column,
    element), some elements of the `ODD` kinds."""
    key_coder, value_coder, values = CODERS[which]
    grouping, ctx = _grouping(key_coder, value_coder)
    pre = ctx.coders[grouping.input_coder_id].get_impl()
    key_impl = key_coder.get_impl()
    elements = data.draw(st.lists(st.tuples(
        st.integers(0, 1), KEYS[type(key_coder).__name__], values,
        st.integers(-(2 ** 50), 2 ** 50), st.sampled_from(ODD)), max_size=50))
    rows = []
    for n, key, value, micros, odd in elements:
        pane = PANES[1 + micros % 2] if odd == "pane" else PANES[0]
        windows = [] if odd == "no window" else [window.GlobalWindow()]
        row = pre.encode_nested(WindowedValue((key, value), Timestamp(micros=micros), windows,
                                              pane))
        if odd == "padded key" and row[13] < 64:
            # The key's leading varint padded: not the key column's bytes, the same key.
            row = row[:13] + bytes([row[13] | 0x80, 0]) + row[14:]
        rows.append((n, key_impl.encode_nested(key), row))
    return grouping, ctx, rows


def _shape(bundles):  # type: ignore[no-untyped-def]
    return [({n: b"".join(parts) for n, parts in b.chunks.items()}, b.counts, b.count, b.size,
             b.closes_keys) for b in bundles]


@settings(max_examples=200, deadline=None)
@given(data=st.data(), which=st.integers(0, len(CODERS) - 1), size=st.integers(1, 6),
       max_bytes=st.integers(1, 300), cut=st.integers(1, 30), sliced=st.booleans(),
       run_rows=st.sampled_from([1, 3, 7, keyed_columns._RUN_ROWS]))
def test_column_groups_are_grouping_buffers_in_the_same_bundles(  # type: ignore[no-untyped-def]
        data, which, size, max_bytes, cut, sliced, run_rows) -> None:
    # `run_rows`: the slices a batch is grouped in (a batch of up to 100,000 rows is taken
    # 10,000 at a time), down to one row.
    grouping, ctx, rows = _drawn_rows(data, which)
    rows.sort(key=lambda r: (r[1], r[0]))
    grouper = TriggerDriverGrouper(grouping, ctx)
    expected = keyed_bundles(rows, size, max_bytes, {0: grouper, 1: grouper})
    column = global_grouping(grouping, ctx)
    assert column is not None
    with mock.patch.object(keyed_columns, "_RUN_ROWS", run_rows):
        got = list(keyed_column_bundles(_batches(rows, cut, sliced), size, max_bytes,
                                        {0: column, 1: column}))
    assert _shape(got) == _shape(expected)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), which=st.integers(0, len(CODERS) - 1), size=st.integers(1, 6),
       max_bytes=st.integers(1, 300), cut=st.integers(1, 30),
       max_rows=st.sampled_from([1, 2, 7, 1000]), row_bytes=st.sampled_from([1, 8, 1024]),
       run_rows=st.sampled_from([1, 3, keyed_columns._RUN_ROWS]), sliced=st.booleans())
def test_counted_rows_group_as_the_elements_they_pack(  # type: ignore[no-untyped-def]
        data, which, size, max_bytes, cut, max_rows, row_bytes, run_rows, sliced) -> None:
    # The producer counts its rows (`engine/packed_rows.py`) in stretches of `max_rows`, cut
    # at `row_bytes`; the shuffle brings a key's rows together (in order, here); grouped from
    # the counted rows, the groups and bundles are GroupingBuffer's of the elements.
    grouping, ctx, rows = _drawn_rows(data, which)
    pre_coder = ctx.coders[grouping.input_coder_id]
    grouper = TriggerDriverGrouper(grouping, ctx)
    expected = keyed_bundles(sorted(rows, key=lambda r: (r[1], r[0])), size, max_bytes,
                             {0: grouper, 1: grouper})
    revalue = counted_value(pre_coder)
    counted = list(packed(rows, frozenset(), max_rows=max_rows, max_row_bytes=row_bytes,
                          counted={0: revalue, 1: revalue}))
    assert len(counted) <= len(rows)
    # Less than the cut of values, one more and the count (`arrow_batches.largest_row`).
    largest = max((len(r[2]) for r in rows), default=0)
    assert all(len(value) < row_bytes + largest + 4 for _, _, value in counted)
    counted.sort(key=lambda r: (r[1], r[0]))
    column = dataclasses.replace(global_grouping(grouping, ctx), counted=True)
    with mock.patch.object(keyed_columns, "_RUN_ROWS", run_rows):
        got = list(keyed_column_bundles(_batches(counted, cut, sliced), size, max_bytes,
                                        {0: column, 1: column}))
    assert _shape(got) == _shape(expected)


def test_a_counted_input_of_uncounted_rows_is_an_error_not_elements() -> None:
    grouping, ctx = _grouping(coders.VarIntCoder(), coders.VarIntCoder())
    column = dataclasses.replace(global_grouping(grouping, ctx), counted=True)
    # A row of fewer than 4 bytes, and one whose first 4 say no values: no producer packed them.
    for value, match in ((b"\x01\x02", "holds no count"), (b"\x00\x00\x00\x00\x05",
                                                            "counts no values")):
        with pytest.raises(ValueError, match=match):
            list(keyed_column_bundles(_batches([(0, b"\x01", value)], 5, False), 5, 100,
                                      {0: column}))


def test_no_rows_make_one_empty_bundle_that_closes_its_keys() -> None:
    grouping, ctx = _grouping(coders.VarIntCoder(), coders.VarIntCoder())
    column = global_grouping(grouping, ctx)
    assert column is not None
    assert _shape(keyed_column_bundles([], 5, 100, {0: column})) == [({}, {}, 0, 0, True)]


@pytest.mark.parametrize("windowing", [Windowing(window.FixedWindows(10)),
                                       Windowing(window.Sessions(10))])
def test_other_windowings_keep_the_row_by_row_grouping(windowing) -> None:  # type: ignore[no-untyped-def]
    grouping, ctx = _grouping(coders.VarIntCoder(), coders.VarIntCoder(), windowing)
    assert global_grouping(grouping, ctx) is None


def test_a_grouped_coder_other_than_the_values_keeps_the_row_by_row_grouping() -> None:
    ctx = PipelineContext()
    window_coder = coders.GlobalWindowCoder()
    pre = coders.WindowedValueCoder(
        coders.TupleCoder([coders.VarIntCoder(), coders.VarIntCoder()]), window_coder)
    post = coders.WindowedValueCoder(coders.TupleCoder(
        [coders.VarIntCoder(), coders.IterableCoder(coders.FastPrimitivesCoder())]), window_coder)
    grouping = Grouping(b"buffer", "GroupByKey", ctx.coders.get_id(pre), ctx.coders.get_id(post),
                        ctx.windowing_strategies.get_id(Windowing(window.GlobalWindows())))
    assert global_grouping(grouping, ctx) is None
