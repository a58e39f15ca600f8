"""The work budget applied to the Beam source's micro-batches (`admission.py`, `beam_source.py`).

Pure: the reader's planning methods run here without Spark, batch after batch, as Spark's
planning process calls them.
"""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sparkbeam.streaming.admission import BatchAdmission
from sparkbeam.streaming.beam_source import BeamStreamReader
from sparkbeam.streaming.budget import WorkBudget
from sparkbeam.streaming.script import (
    MAX_MICROS,
    MIN_MICROS,
    Endpoint,
    Item,
    Script,
    runner_time,
)

UNLIMITED = 1 << 40


def rows(endpoint: int, n: int, size: int = 3) -> tuple:
    return tuple((endpoint, None, b"%d-%d:" % (endpoint, i) + b"x" * size) for i in range(n))


def run_batches(reader: BeamStreamReader, limit: int = 500) -> list[tuple[dict, list]]:
    """(end offset, rows read) per micro-batch until the source is done."""
    offset = reader.initialOffset()
    out = []
    for _ in range(limit):
        end = reader.latestOffset(offset, None)
        read = [r for p in reader.partitions(offset, end) for r in reader.read(p)]
        out.append((end, read))
        offset = end
        if end["done"]:
            return out
    raise AssertionError(f"not done after {limit} batches")


def test_four_endpoints_under_a_budget_of_1000_items() -> None:
    """The issue's case: no batch reads more than 1,000 items, every element is read once, in
    order per endpoint, and the watermark event after the elements counts only once all of
    them are read."""
    endpoints = tuple(
        Endpoint(f"ts{e}", (Item(rows=rows(e, 600)), Item(watermark=1_000))) for e in range(4)
    )
    reader = BeamStreamReader(Script(endpoints), budget=WorkBudget(1000, UNLIMITED))
    batches = run_batches(reader)
    assert max(len(read) for _, read in batches) == 1000
    for e in range(4):
        assert [r for _, read in batches for r in read if r[0] == e] == list(rows(e, 600))
    before_all_read = [end["wm"] for end, _ in batches[:2]]
    assert before_all_read == [MIN_MICROS, MIN_MICROS]
    assert batches[-1][0]["wm"] == MAX_MICROS


def test_without_a_budget_an_event_and_its_watermark_are_one_batch() -> None:
    endpoints = (Endpoint("a", (Item(rows=rows(0, 600)), Item(watermark=5), Item(watermark=9))),)
    batches = run_batches(BeamStreamReader(Script(endpoints)))
    assert [(len(read), end["wm0"], end["wm"]) for end, read in batches][:2] == [
        (600, MIN_MICROS, 5), (0, 5, MAX_MICROS)]
    assert "throttle" not in batches[0][0]


def test_an_element_larger_than_the_byte_budget_is_read_alone() -> None:
    endpoints = (Endpoint("a", (Item(rows=rows(0, 3, size=100)),)),)
    batches = run_batches(BeamStreamReader(Script(endpoints), budget=WorkBudget(UNLIMITED, 10)))
    assert [len(read) for _, read in batches if read] == [1, 1, 1]


def test_cut_endpoints_are_throttled_until_topped_up() -> None:
    admission = BatchAdmission(WorkBudget(10, UNLIMITED))
    wanted = {"a": WorkBudget(50, 50), "b": WorkBudget(2, 2)}
    grant = admission.grant(wanted, now=0.0)
    # Each dimension is split on its own; the items bind here.
    assert grant.budgets == {"a": WorkBudget(5, 50), "b": WorkBudget(2, 2)}
    admission.taken("a", WorkBudget(5, 5), wanted["a"], now=0.0)
    admission.taken("b", WorkBudget(2, 2), wanted["b"], now=0.0)
    later = admission.grant({"a": WorkBudget(45, 45)}, now=2.5)
    assert later.throttled == {"a": 2.5, "b": 0.0}  # b read all it had: never held back
    assert later.budgets == {"a": WorkBudget(10, 45)}  # b finished: a gets the whole budget


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.one_of(st.integers(0, 30), st.none()), min_size=1, max_size=5),
             min_size=1, max_size=4),
    st.integers(1, 40),
    st.integers(1, 400),
    st.integers(0, 3),
)
def test_budget_bounds_every_batch_and_loses_nothing(
    shapes: list[list[int | None]], max_items: int, max_bytes: int, spread_keys: int
) -> None:
    """Any endpoints (element events of 0-30 rows, watermark events as None), 0-3 splittable
    spread keys, any budget: each batch's rows and splittable shares together stay within both
    dimensions (or the batch is one row larger than the byte budget), every row is read
    exactly once in order, and the watermark never passes an event not fully read."""
    endpoints = []
    for e, shape in enumerate(shapes):
        wm = 0
        items = []
        for n in shape:
            if n is None:
                wm += 10
                items.append(Item(watermark=wm))
            else:
                items.append(Item(rows=rows(e, n)))
        endpoints.append(Endpoint(f"ts{e}", tuple(items)))
    script = Script(tuple(endpoints))
    splittable = tuple(f"stage-001/{k}" for k in range(spread_keys))
    reader = BeamStreamReader(script, budget=WorkBudget(max_items, max_bytes),
                              splittable=splittable)
    batches = run_batches(reader, limit=5_000)
    for end, read in batches:
        size = sum(len(r[2]) for r in read)
        shares = [runner_time(end).budget_of(name) for name in splittable]
        assert all(share is not None for share in shares)
        assert len(read) + sum(share[0] for share in shares if share) <= max_items
        assert size + sum(share[1] for share in shares if share) <= max_bytes or len(read) == 1
    for e, endpoint in enumerate(endpoints):
        expected = [r for item in endpoint.items for r in item.rows]
        assert [r for _, read in batches for r in read if r[0] == e] == expected
    for end, _ in batches:
        assert end["wm"] == script.watermark(end["pos"])


def test_splittable_spread_keys_share_what_the_script_leaves() -> None:
    """A splittable stage's spread keys want the whole budget: each batch they get what a fair
    split of the endpoints' shares gives them (set afresh every batch, never more than the
    total with the rows read), and read it from the offset."""
    endpoints = (Endpoint("ts", (Item(rows=rows(0, 4)), Item(watermark=MAX_MICROS))),)
    reader = BeamStreamReader(Script(endpoints), budget=WorkBudget(10, 1000),
                              splittable=("stage-001/0", "stage-001/1"))
    offsets = [reader.initialOffset()]
    for _ in range(3):
        offsets.append(reader.latestOffset(offsets[-1], None))
    assert [(o["pos"]["ts"], o["admitted"]["items"], o["sdf"]) for o in offsets[1:]] == [
        (3, 3, {"stage-001/0": [4, 334], "stage-001/1": [3, 334]}),  # ten items: 4 + 3 + 3
        (5, 1, {"stage-001/0": [4, 334], "stage-001/1": [4, 334]}),  # shares of ceil(10 / 3)
        (5, 0, {"stage-001/0": [5, 500], "stage-001/1": [5, 500]}),  # ts is done: two left
    ]
    assert runner_time(offsets[2]).budget_of("stage-001/1") == (4, 334)
    assert runner_time(offsets[2]).budget_of("stage-002/0") == (0, 0)  # not an endpoint
    assert runner_time({"wm0": 0, "wm": 0, "pt0": 0, "pt": 0}).budget_of("stage-001/0") is None


def _live(script: Script) -> Script:
    return Script(script.endpoints, test_clock=False)


def test_a_job_on_the_wall_clock_admits_nothing_in_its_first_batch() -> None:
    """Its first micro-batch reads no row and keeps every position, while its clock moves (a
    new tick, the wall clock's processing time); the next batch reads what the first would
    have. A scripted job (TestStream's clock) reads its first event at once."""
    endpoints = (Endpoint("ts", (Item(rows=rows(0, 4)), Item(watermark=MAX_MICROS))),)
    live = BeamStreamReader(_live(Script(endpoints)))
    scripted = BeamStreamReader(Script(endpoints))
    warm, first = run_batches(live)[:2]
    assert warm[1] == [] and warm[0]["pos"] == {} and warm[0]["tick"] == 1
    assert warm[0]["pt"] > 0 and warm[0]["wm"] == MIN_MICROS
    assert first[1] == list(rows(0, 4)) and first[0]["tick"] == 2
    assert run_batches(scripted)[0][1] == list(rows(0, 4))


def test_the_warm_batch_gives_splittable_readers_no_share_of_a_budget() -> None:
    """Under a work budget the first batch admits nothing and grants the splittable readers'
    spread keys nothing (a restarted job's residuals wait one batch); the budget's shares start
    with the next batch."""
    endpoints = (Endpoint("ts", (Item(rows=rows(0, 4)), Item(watermark=MAX_MICROS))),)
    reader = BeamStreamReader(_live(Script(endpoints)), budget=WorkBudget(10, 1000),
                              splittable=("stage-001/0",))
    warm = reader.latestOffset(reader.initialOffset(), None)
    assert (warm["pos"], warm["admitted"]) == ({}, {"items": 0, "bytes": 0})
    assert runner_time(warm).budget_of("stage-001/0") == (0, 0)
    after = reader.latestOffset(warm, None)
    assert after["admitted"]["items"] == 4 and runner_time(after).budget_of("stage-001/0") != (0, 0)


def test_a_restarted_query_warms_again_from_its_last_offset() -> None:
    """A new planning process (a restart) starts cold: its first batch admits nothing from
    where the checkpoint left off."""
    endpoints = (Endpoint("ts", (Item(rows=rows(0, 2)), Item(rows=rows(0, 2)),
                                 Item(watermark=MAX_MICROS))),)
    script = _live(Script(endpoints))
    first = BeamStreamReader(script)
    offset = first.latestOffset(first.latestOffset(first.initialOffset(), None), None)
    assert offset["pos"] == {"ts": 2}
    restarted = BeamStreamReader(script)
    warm = restarted.latestOffset(offset, None)
    assert warm["pos"] == {"ts": 2} and warm["tick"] == offset["tick"] + 1
    assert restarted.latestOffset(warm, None)["pos"] == {"ts": 5}  # with the watermark after


def test_a_job_drained_before_its_first_batch_drains_in_it(tmp_path) -> None:
    endpoints = (Endpoint("ts", (Item(rows=rows(0, 2)),)),)
    marker = tmp_path / "drain"
    marker.write_text("")
    reader = BeamStreamReader(_live(Script(endpoints)), drain_marker=str(marker))
    first = reader.latestOffset(reader.initialOffset(), None)
    assert first["drained"] and first["done"] and first["wm"] == MAX_MICROS
