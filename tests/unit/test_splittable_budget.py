"""A spread key's work budget over its restrictions (`SplittableKey._run_budgeted`), against a
fake run (pure logic: restrictions with a backlog each, a runner checkpoint at the share)."""
from __future__ import annotations

import itertools
from collections import Counter
from types import SimpleNamespace
from typing import Any

from apache_beam.portability.api import beam_fn_api_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkbeam.streaming.splittable import SplittableKey


class FakeRun:
    """Restriction `name` outputs one element per record of its backlog; reaching the cap with
    records left, it is checkpointed (the rest resent as `name`)."""

    def __init__(self, backlog: dict[bytes, int]) -> None:
        self.backlog = dict(backlog)
        self.running = b""

    def run_capped(self, chunks: dict[int, list[bytes]], items: int, size: int,
                   on_reached: Any) -> tuple[list[Any], int, int]:
        ((_, (name,)),) = chunks.items()
        self.running = name
        take = min(self.backlog[name], items, size)
        self.backlog[name] -= take
        if self.backlog[name]:
            on_reached()
        return [(0, None, name)] * take, take, take

    def checkpoint(self) -> Any:
        app = beam_fn_api_pb2.BundleApplication(element=self.running)
        return SimpleNamespace(reschedules=[SimpleNamespace(application=app)], resends=[])


def run_budgeted(backlog: list[int], items: int) -> tuple[Counter, bool]:
    """(records read per restriction, whether the budget stopped the key)."""
    key = SplittableKey.__new__(SplittableKey)
    key.program = SimpleNamespace(route=lambda app: 0)  # type: ignore[assignment]
    names = [b"r%d" % i for i in range(len(backlog))]
    run = FakeRun(dict(zip(names, backlog, strict=True)))
    out, left, stopped = key._run_budgeted(run, [(0, n, 0) for n in names],  # type: ignore[arg-type]
                                           (items, 1 << 62))
    # What is left is every restriction with records left (and those the budget never started).
    assert {element for _, element, _ in left} >= {n for n in names if run.backlog[n]}
    return Counter(value for _, _, value in out), stopped


def test_whatever_the_order_a_small_restriction_gives_its_part_to_the_others() -> None:
    for order in set(itertools.permutations([40, 600, 600, 600])):
        read, stopped = run_budgeted(list(order), 1000)
        assert sorted(read.values()) == [40, 320, 320, 320], order
        assert stopped


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 3000), min_size=1, max_size=6), st.integers(1, 5000))
def test_shares_are_even_and_the_budget_is_spent_while_records_remain(
        backlog: list[int], items: int) -> None:
    read, stopped = run_budgeted(backlog, items)
    names = [b"r%d" % i for i in range(len(backlog))]
    total = sum(read.values())
    left = {n for n, b in zip(names, backlog, strict=True) if read[n] < b}
    assert total <= items
    # The budget is not left unused while a restriction still has records...
    assert total == items or not left
    assert stopped or not left
    assert total == items or not stopped
    # ...and one that still has records read no less than any other, but for rounding.
    for n in left:
        assert all(read[n] >= read[m] - 1 for m in names), (backlog, items, read)


def test_a_keys_blob_records_the_endpoints_it_left_waiting_and_reads_older_blobs() -> None:
    import pickle

    from sparkbeam.streaming.splittable import _load

    entry = (0, 0, b"element", 5)
    assert _load(None) == ([], False, ())
    assert _load(pickle.dumps(([entry], True))) == ([entry], True, ())  # before endpoints
    assert _load(pickle.dumps(([entry], True, ("t-1", "t-2")))) == ([entry], True, ("t-1", "t-2"))
