"""Streaming script: endpoint watermarks, batch positions, offsets and the runner's clock."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkbeam.streaming.script import (
    MAX_MICROS,
    EVERY_BATCH,
    MIN_MICROS,
    Endpoint,
    Item,
    Pending,
    RunnerTime,
    Script,
    offset_for,
    runner_time,
)


def row(n: int) -> tuple[int, bytes | None, bytes]:
    return (0, b"k%d" % n, b"v%d" % n)


def test_micro_bounds_are_beams() -> None:
    from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP

    assert MIN_TIMESTAMP.micros == MIN_MICROS
    assert MAX_TIMESTAMP.micros == MAX_MICROS


def test_what_spark_unpickles_to_plan_a_query_imports_no_beam() -> None:
    """Spark starts a Python process per streaming query to plan its source's batches, and one
    per transformWithState operator to learn its state: they unpickle the source's script and
    the operator's processor shell, call `init` and `close`, and must not load apache_beam
    (~1 s each, on every query's start)."""
    import base64
    import subprocess
    import sys

    from pyspark import cloudpickle

    from sparkbeam.streaming.beam_source import encode
    from sparkbeam.streaming.operators import GroupByKeyProcessor
    from sparkbeam.streaming.shell import ProcessorShell

    script = encode(Script((Endpoint("ts", (Item(rows=(row(1),), watermark=5),)),)))
    shell = base64.b64encode(cloudpickle.dumps(
        ProcessorShell(GroupByKeyProcessor.__new__(GroupByKeyProcessor)))).decode()
    probe = f"""
import base64, pickle, sys
from pyspark import cloudpickle
from sparkbeam.streaming.beam_source import BeamSource
source = BeamSource({{"script": {script!r}}})
reader = source.streamReader(None)
assert reader.initialOffset() is not None
class Handle:
    def getValueState(self, name, schema):
        return (name, schema)
shell = cloudpickle.loads(base64.b64decode({shell!r}))
shell.init(Handle())
shell.close()
assert shell.blob[0] == "beam"
print(sorted(m for m in sys.modules if m.split(".")[0] == "apache_beam"))
"""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_endpoint_watermark_is_max_of_items_read_then_final() -> None:
    """MIN before any item, the largest watermark read so far, then final once exhausted."""
    e = Endpoint("ts", (Item(watermark=5), Item(), Item(watermark=3), Item(watermark=8), Item()))
    assert [e.watermark_after(i) for i in range(5)] == [MIN_MICROS, 5, 5, 5, 8]
    assert e.watermark_after(5) == MAX_MICROS
    assert e.watermark_after(99) == MAX_MICROS
    assert Endpoint("x", (Item(),), final_watermark=42).watermark_after(1) == 42
    assert Endpoint("empty", ()).watermark_after(0) == MAX_MICROS


def test_advance_until_sums_items_read() -> None:
    e = Endpoint("ts", (Item(advance=2), Item(), Item(advance=7)))
    assert [e.advance_until(i) for i in range(4)] == [0, 2, 2, 9]


def test_script_watermark_is_min_over_endpoints() -> None:
    a = Endpoint("a", (Item(watermark=10), Item(watermark=20)))
    b = Endpoint("b", (Item(watermark=15),), per_batch=1)
    s = Script((a, b))
    assert s.watermark({}) == MIN_MICROS
    assert s.watermark({"a": 1}) == MIN_MICROS  # b has read nothing
    assert s.watermark({"a": 1, "b": 0}) == MIN_MICROS
    assert s.watermark({"a": 2, "b": 0}) == MIN_MICROS
    # b exhausted: its watermark is final (MAX), a's governs
    assert s.watermark({"a": 1, "b": 1}) == 10
    assert s.watermark({"a": 2, "b": 1}) == MAX_MICROS
    assert Script(()).watermark({}) == MAX_MICROS


def test_next_positions_advance_at_most_per_batch_and_stop_at_end() -> None:
    a = Endpoint("a", tuple(Item() for _ in range(5)), per_batch=2)
    b = Endpoint("b", (Item(),), per_batch=1)
    s = Script((a, b))
    assert s.next_positions({}) == {"a": 2, "b": 1}
    assert s.next_positions({"a": 2, "b": 1}) == {"a": 4, "b": 1}
    assert s.next_positions({"a": 4, "b": 1}) == {"a": 5, "b": 1}
    assert s.next_positions({"a": 5, "b": 1}) == {"a": 5, "b": 1}
    assert not s.exhausted({"a": 4, "b": 1})
    assert s.exhausted({"a": 5, "b": 1})


def test_rows_are_exactly_the_range_and_replay_identically() -> None:
    """Positions count units: a row each, one for an item without rows."""
    items = (Item(rows=(row(0), row(1))), Item(), Item(rows=(row(2),)), Item(rows=(row(3),)))
    e = Endpoint("a", items)
    s = Script((e,))
    assert e.ends == (2, 3, 4, 5) and e.units == 5
    assert s.rows("a", 0, 2) == [row(0), row(1)]
    assert s.rows("a", 0, 1) == [row(0)]  # a budget may stop inside an item
    assert s.rows("a", 1, 4) == [row(1), row(2)]
    assert s.rows("a", 2, 5) == [row(2), row(3)]
    assert s.rows("a", 4, 4) == []
    assert s.rows("a", 0, 5) == [row(i) for i in range(4)]
    assert s.rows("a", 1, 5) == s.rows("a", 1, 5)
    with pytest.raises(KeyError):
        s.rows("missing", 0, 1)


def test_an_items_watermark_and_advance_count_once_all_its_rows_are_read() -> None:
    e = Endpoint("a", (Item(rows=(row(0), row(1)), watermark=7, advance=3), Item(watermark=9)))
    assert [e.watermark_after(p) for p in range(3)] == [MIN_MICROS, MIN_MICROS, 7]
    assert [e.advance_until(p) for p in range(3)] == [0, 0, 3]
    assert e.watermark_after(3) == MAX_MICROS


def test_next_position_finishes_the_item_being_read() -> None:
    e = Endpoint("a", (Item(rows=(row(0), row(1), row(2))), Item(watermark=4), Item()))
    # An element event takes the watermark event after it along (one batch for both).
    assert [e.next_position(p) for p in range(6)] == [4, 4, 4, 4, 5, 5]
    advancing = Endpoint("c", (Item(rows=(row(0),)), Item(advance=5), Item(watermark=4)))
    assert advancing.next_position(0) == 1  # processing time moves in a batch of its own
    two = Endpoint("b", e.items, per_batch=2)
    assert [two.next_position(p) for p in (0, 1, 3, 4)] == [4, 4, 5, 5]


def test_costs_are_row_bytes_and_none_for_items_without_rows() -> None:
    e = Endpoint("a", (Item(rows=((0, b"kk", b"vvv"), (0, None, b"v"))), Item(watermark=1)))
    assert e.costs(0, 3) == [5, 1, None]
    assert e.costs(1, 2) == [1]
    assert e.costs(2, 3) == [None]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.integers(0, 5), max_size=6), max_size=8),
       st.integers(1, 40), st.integers(0, 8))
def test_unit_ranges_partition_the_rows(sizes: list[list[int]], cut: int, start: int) -> None:
    """Reading [0, a) then [a, units) gives every row once, in order, for any cut point."""
    n = 0
    items = []
    for rows in sizes:
        items.append(Item(rows=tuple(row(n + i) for i in range(len(rows)))))
        n += len(rows)
    e = Endpoint("a", tuple(items))
    a = min(cut, e.units)
    assert e.rows(0, a) + e.rows(a, e.units) == [row(i) for i in range(n)]
    assert len(e.costs(0, e.units)) == e.units


def test_offsets_chain_and_test_clock_sums_advances() -> None:
    a = Endpoint("a", (Item(watermark=10, advance=3), Item(watermark=20, advance=4)))
    s = Script((a,), test_clock=True)
    first = offset_for(s, {"a": 1}, {}, wall_clock_micros=10**15, tick=1)
    assert first == {"pos": {"a": 1}, "wm0": MIN_MICROS, "wm": 10, "pt0": 3, "pt": 3,
                     "tick": 1, "done": False}
    second = offset_for(s, {"a": 2}, first, wall_clock_micros=0, tick=2)
    assert (second["wm0"], second["pt0"]) == (first["wm"], first["pt"])
    assert (second["wm"], second["pt"], second["done"]) == (MAX_MICROS, 7, True)


def test_done_needs_exhausted_and_final_watermark() -> None:
    held = Script((Endpoint("a", (Item(),), final_watermark=100),))
    assert offset_for(held, {"a": 1}, {}, 0, 0)["done"] is False
    s = Script((Endpoint("a", (Item(), Item())),))
    assert offset_for(s, {"a": 1}, {}, 0, 0)["done"] is False
    assert offset_for(s, {"a": 2}, {}, 0, 0)["done"] is True


def test_wall_clock_processing_time_never_goes_backwards() -> None:
    s = Script((Endpoint("a", (Item(advance=999),)),), test_clock=False)
    first = offset_for(s, {"a": 0}, {}, wall_clock_micros=1_000, tick=0)
    assert (first["pt0"], first["pt"]) == (1_000, 1_000)  # advances ignored
    later = offset_for(s, {"a": 1}, first, wall_clock_micros=5_000, tick=1)
    assert (later["pt0"], later["pt"]) == (1_000, 5_000)
    skewed = offset_for(s, {"a": 1}, later, wall_clock_micros=2_000, tick=2)
    assert (skewed["pt0"], skewed["pt"]) == (5_000, 5_000)


def test_offset_is_json_able_and_runner_time_reads_it() -> None:
    import json

    s = Script((Endpoint("b", (Item(watermark=7, advance=2),)), Endpoint("a", (Item(),))))
    off = offset_for(s, {"b": 1, "a": 0}, {"wm": 1, "pt": 0}, 0, 3)
    assert list(off["pos"]) == ["a", "b"]  # sorted: stable in Spark's offset log
    back = json.loads(json.dumps(off))
    assert runner_time(back) == RunnerTime(
        watermark_before=1, watermark=MIN_MICROS, processing_before=0, processing=2, done=False
    )
    assert runner_time({"wm0": 1, "wm": 2, "pt0": 3, "pt": 4}).done is False


items_st = st.lists(
    st.builds(
        Item,
        watermark=st.none() | st.integers(MIN_MICROS, MAX_MICROS),
        advance=st.integers(0, 10**9),
    ),
    max_size=6,
)
endpoints_st = st.lists(
    st.tuples(items_st, st.integers(1, 3)), min_size=1, max_size=3
).map(lambda es: tuple(Endpoint(f"e{i}", tuple(it), per_batch=n) for i, (it, n) in enumerate(es)))


@settings(max_examples=150, deadline=None)
@given(
    endpoints=endpoints_st,
    test_clock=st.booleans(),
    steps=st.lists(
        st.tuples(st.lists(st.booleans(), min_size=3, max_size=3), st.integers(0, 10**12)),
        max_size=12,
    ),
)
def test_watermark_and_processing_time_never_decrease(
    endpoints: tuple[Endpoint, ...], test_clock: bool, steps: list[tuple[list[bool], int]]
) -> None:
    """Over any sequence of latest offsets (each endpoint advanced or held), the watermark and
    the processing time are non-decreasing, and each offset chains onto the previous one."""
    s = Script(endpoints, test_clock=test_clock)
    positions: dict[str, int] = {}
    previous: dict = {}
    for tick, (advance, wall) in enumerate(steps):
        nxt = s.next_positions(positions)
        positions = {
            e.name: nxt[e.name] if advance[i] else positions.get(e.name, 0)
            for i, e in enumerate(endpoints)
        }
        off = offset_for(s, positions, previous, wall, tick)
        if previous:
            assert (off["wm0"], off["pt0"]) == (previous["wm"], previous["pt"])
        assert off["wm"] >= off["wm0"]
        assert off["pt"] >= off["pt0"]
        assert off["wm"] == s.watermark(positions)
        if off["done"]:
            assert s.exhausted(positions) and off["wm"] == MAX_MICROS
        previous = off


def test_a_drained_offset_reads_nothing_more_and_ends_at_the_final_watermark() -> None:
    script = Script((Endpoint("ts", tuple(Item(rows=(row(i),), watermark=i) for i in range(9))),))
    first = offset_for(script, {"ts": 1}, {}, 0, 1)
    second = offset_for(script, script.next_positions(first["pos"]), first, 0, 2)
    assert (second["pos"], second["wm"], second["done"]) == ({"ts": 2}, 1, False)
    drained = offset_for(script, script.next_positions(second["pos"]), second, 0, 3, drained=True)
    assert drained["pos"] == {"ts": 2}  # what was planned for this batch is not read
    assert (drained["wm0"], drained["wm"], drained["done"], drained["drained"]) == (
        1, MAX_MICROS, True, True)
    # Once drained, always drained: a later offset (or a replay) never reads again.
    after = offset_for(script, script.next_positions(drained["pos"]), drained, 0, 4)
    assert (after["pos"], after["wm"], after["done"]) == ({"ts": 2}, MAX_MICROS, True)
    assert runner_time(after).done


@given(event=st.integers(MIN_MICROS, MAX_MICROS), processing=st.integers(MIN_MICROS, MAX_MICROS),
       wm=st.integers(MIN_MICROS, MAX_MICROS), pt=st.integers(MIN_MICROS, MAX_MICROS))
def test_pending_is_due_once_either_time_reaches_its_timer(
        event: int, processing: int, wm: int, pt: int) -> None:
    time = RunnerTime(watermark_before=MIN_MICROS, watermark=wm, processing_before=MIN_MICROS,
                      processing=pt)
    due = Pending(event=event, processing=processing).due(time)
    assert due == (event <= wm or processing <= pt or wm >= MAX_MICROS)
    assert EVERY_BATCH.due(time)
    assert Pending().due(time) == (wm >= MAX_MICROS or pt >= MAX_MICROS)  # only at the end
