"""The column expressions stages are declared with are built once per session (pure logic:
the builders are stubs; the Columns' use in real plans is every integration test's)."""
from __future__ import annotations

from typing import Any

from sparkbeam.execute.dataset import _Columns


class _Builder:
    def __init__(self) -> None:
        self.built: list[tuple[Any, ...]] = []

    def __call__(self, columns: _Columns, key: tuple[Any, ...]) -> Any:
        def make() -> Any:
            self.built.append(key)
            return object()

        return columns.get(key, make)


def test_a_column_is_built_once_and_then_shared() -> None:
    columns, build = _Columns(), _Builder()
    first = build(columns, ("int", 3, "input"))
    assert build(columns, ("int", 3, "input")) is first
    assert build(columns, ("int", 4, "input")) is not first
    assert build.built == [("int", 3, "input"), ("int", 4, "input")]


def test_the_cache_is_bounded() -> None:
    columns, build = _Columns(), _Builder()
    for n in range(_Columns._LIMIT + 10):
        build(columns, ("int", n, "input"))
    assert len(columns._made) <= _Columns._LIMIT
    build(columns, ("int", 0, "input"))
    assert build.built.count(("int", 0, "input")) == 2  # dropped with the rest, built again
