"""The test processes format tracebacks without `ast.parse` where CPython shares the AST
constructor's state between threads (tests/support/tracebacks.py)."""
from __future__ import annotations

import ast
import traceback

import pytest

from tests.support.tracebacks import affected


@pytest.mark.parametrize(("version", "expected"), [
    ((3, 11, 0), True), ((3, 11, 7), True), ((3, 11, 8), False), ((3, 12, 0), False),
    ((3, 10, 13), False),
])
def test_the_releases_with_the_shared_ast_state(version, expected) -> None:  # type: ignore[no-untyped-def]
    assert affected(version) is expected


def test_a_traceback_is_formatted_without_parsing_where_the_state_is_shared(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    parsed: list[str] = []
    real = ast.parse

    def parse(source, *args, **kwargs):  # type: ignore[no-untyped-def]
        parsed.append(source)
        return real(source, *args, **kwargs)

    monkeypatch.setattr(ast, "parse", parse)
    values: dict[str, dict[str, int] | None] = {"a": None}
    try:
        values["a"]["b"] + 1  # type: ignore[index]
    except TypeError:
        text = traceback.format_exc()
    assert "TypeError" in text and "^" in text  # the expression is still marked
    assert bool(parsed) is not affected()
