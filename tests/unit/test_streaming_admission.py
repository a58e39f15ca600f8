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
from sparkbeam.streaming.script import MAX_MICROS, MIN_MICROS, Endpoint, Item, Script

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
)
def test_budget_bounds_every_batch_and_loses_nothing(
    shapes: list[list[int | None]], max_items: int, max_bytes: int
) -> None:
    """Any endpoints (element events of 0-30 rows, watermark events as None), any budget: each
    batch stays within both dimensions (or is one row larger than the byte budget), every row
    is read exactly once in order, and the watermark never passes an event not fully read."""
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
    reader = BeamStreamReader(script, budget=WorkBudget(max_items, max_bytes))
    batches = run_batches(reader, limit=5_000)
    for _, read in batches:
        size = sum(len(r[2]) for r in read)
        assert len(read) <= max_items
        assert size <= max_bytes or len(read) == 1
    for e, endpoint in enumerate(endpoints):
        expected = [r for item in endpoint.items for r in item.rows]
        assert [r for _, read in batches for r in read if r[0] == e] == expected
    for end, _ in batches:
        assert end["wm"] == script.watermark(end["pos"])
