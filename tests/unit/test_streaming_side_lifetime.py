"""What a streaming side input's readers see, and what is kept (`streaming/sides.py`:
`visible_elements`, `SideCompactor`; `checkpoint.SideStore`): expired windows go, a
discarding side input shows each window's latest pane, and compaction changes nothing a
reader sees (no Spark)."""
from __future__ import annotations

import os

from apache_beam import coders
from apache_beam.transforms.window import GlobalWindow, IntervalWindow
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkbeam.plan.model import SideInputUse
from sparkbeam.streaming.checkpoint import (
    CheckpointLayout,
    FileHoldStore,
    SideStore,
    write_hold,
    write_side_file,
)
from sparkbeam.streaming.sides import (
    SideCompactor,
    StreamingSide,
    reader_bound,
    visible_elements,
)

FIXED = coders.WindowedValueCoder(coders.VarIntCoder(), coders.coders.IntervalWindowCoder())
GLOBAL = coders.WindowedValueCoder(coders.VarIntCoder(), coders.coders.GlobalWindowCoder())


def _window(n: int) -> IntervalWindow:
    return IntervalWindow(10 * n, 10 * n + 10)


def _encoded(value: int, *windows: int) -> bytes:
    return FIXED.encode(WindowedValue(value, Timestamp(10 * windows[0]),
                                      tuple(_window(w) for w in windows)))


def _seen(values: list[bytes]) -> list[tuple[int, list[int]]]:
    out = []
    for v in values:
        wv = FIXED.decode(v)
        out.append((wv.value, sorted(int(w.start) // 10 for w in wv.windows)))
    return out


def test_accumulating_and_unbounded_is_everything_in_order() -> None:
    batches = [(0, [_encoded(1, 0)]), (3, [_encoded(2, 0), _encoded(3, 1)])]
    assert visible_elements(batches, FIXED.get_impl(), False, None) == [
        v for _, vs in batches for v in vs]


def test_discarding_shows_each_windows_latest_pane() -> None:
    batches = [(0, [_encoded(1, 0), _encoded(2, 1)]), (3, [_encoded(3, 0), _encoded(4, 0)])]
    assert _seen(visible_elements(batches, FIXED.get_impl(), True, None)) == [
        (2, [1]), (3, [0]), (4, [0])]


def test_a_window_ending_before_the_bound_is_gone_and_an_element_keeps_its_live_windows() -> None:
    # Window 0 ends at 10 s (max timestamp 9.999999 s): dead once the bound passes it.
    batches = [(0, [_encoded(1, 0), _encoded(2, 1), _encoded(3, 0, 1)])]
    bound = Timestamp(10).micros
    assert _seen(visible_elements(batches, FIXED.get_impl(), False, bound)) == [
        (2, [1]), (3, [1])]
    assert _seen(visible_elements(batches, FIXED.get_impl(), False, bound - 1)) == [
        (1, [0]), (2, [1]), (3, [0, 1])]


def test_the_global_window_never_ends_and_discarding_keeps_its_latest_pane() -> None:
    def glob(value: int) -> bytes:
        return GLOBAL.encode(WindowedValue(value, Timestamp(0), (GlobalWindow(),)))

    batches = [(b, [glob(b), glob(100 + b)]) for b in range(5)]
    seen = visible_elements(batches, GLOBAL.get_impl(), True, 1 << 62)
    assert [GLOBAL.decode(v).value for v in seen] == [4, 104]


_ELEMENTS = st.lists(st.tuples(st.integers(0, 6), st.integers(0, 99),
                               st.lists(st.integers(0, 3), min_size=1, max_size=2, unique=True)),
                     max_size=30)


@settings(max_examples=150, deadline=None)
@given(elements=_ELEMENTS, discarding=st.booleans(),
       bound=st.one_of(st.none(), st.integers(0, 45).map(lambda s: Timestamp(s).micros)),
       cut=st.integers(0, 7))
def test_compacting_the_batches_before_a_cut_changes_nothing_a_reader_sees(
        elements: list[tuple[int, int, list[int]]], discarding: bool, bound: int | None,
        cut: int) -> None:
    """What readers see of batches up to `cut` - 1, as one batch `cut` - 1, and the later
    batches after it: the same as before (a replay after a compaction reads what the first
    attempt read; a later reader's bound only grows)."""
    by_batch: dict[int, list[bytes]] = {}
    for batch, value, windows in sorted(elements, key=lambda e: e[0]):
        by_batch.setdefault(batch, []).append(_encoded(value, *windows))
    batches = sorted(by_batch.items())
    impl = FIXED.get_impl()
    before = [(b, vs) for b, vs in batches if b < cut]
    compacted = [(cut - 1, visible_elements(before, impl, discarding, bound))] + [
        (b, vs) for b, vs in batches if b >= cut]
    assert (_seen(visible_elements(compacted, impl, discarding, bound))
            == _seen(visible_elements(batches, impl, discarding, bound)))


def test_the_compactor_folds_files_and_readers_read_the_same(tmp_path) -> None:  # type: ignore[no-untyped-def]
    layout = CheckpointLayout(str(tmp_path))
    directory = layout.side_dir(7)
    for batch in range(12):
        write_side_file(directory, batch, 0, [_encoded(batch, batch % 3)])
        write_side_file(directory, batch, 1, [_encoded(100 + batch, batch % 3)])
    context = _context()
    side = StreamingSide(SideInputUse("t", "side0", b"buf", b"", context[1]), 7,
                         discarding=True, lateness=0, reader="stage-001")
    store = SideStore(layout)
    impl = FIXED.get_impl()
    watermark = Timestamp(10).micros  # window 0 is gone
    before = _seen(visible_elements(store.batches(7, 12), impl, True, watermark))
    assert before == [(10, [1]), (110, [1]), (11, [2]), (111, [2])]
    compactor = SideCompactor({"stage-001": (side,)}, context[0], store,
                              lambda batch: watermark, FileHoldStore(layout), every=8)
    assert compactor.compact(12) == 1
    assert os.listdir(directory) == ["batch-0000000011-compact"]
    assert _seen(visible_elements(store.batches(7, 12), impl, True, watermark)) == before
    assert compactor.compact(12) == 0  # one file: nothing to fold
    # An interrupted compaction leaves superseded files beside the compacted one: not read.
    write_side_file(directory, 5, 0, [_encoded(5, 2)])
    assert _seen(visible_elements(store.batches(7, 12), impl, True, watermark)) == before


def _context() -> tuple[bytes, str]:
    from apache_beam.runners.pipeline_context import PipelineContext

    ctx = PipelineContext()
    coder_id = ctx.coders.get_id(FIXED)
    return ctx.to_runner_api().SerializeToString(), coder_id


def test_a_reader_keeps_what_its_waiting_elements_and_late_arrivals_may_read(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The bound is the earlier of the main input's watermark less its allowed lateness and
    the reader's earliest element waiting since the batch before."""
    layout = CheckpointLayout(str(tmp_path))
    holds = FileHoldStore(layout)
    side = StreamingSide(SideInputUse("t", "side0", b"buf", b"", "c"), 7, lateness=2_000_000,
                         reader="stage-004")
    write_hold(layout.hold_dir("stage-004"), 4, 0, 12_000_000)  # waiting at 12 s
    assert reader_bound(side, 5, lambda batch: 30_000_000, holds) == 12_000_000
    assert reader_bound(side, 6, lambda batch: 30_000_000, holds) == 28_000_000  # released
    custom = StreamingSide(side.use, 7, lateness=None)
    assert reader_bound(custom, 5, lambda batch: 30_000_000, holds) is None
