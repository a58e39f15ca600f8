"""The test processes' guard against CPython 3.11.0-3.11.7's shared AST constructor state
(tests/support/tracebacks.py)."""
from __future__ import annotations

import ast
import threading
import traceback

import pytest

from tests.support.tracebacks import _SPURIOUS, _TRIES, affected, parse_retrying


@pytest.mark.parametrize(("version", "expected"), [
    ((3, 11, 0), True), ((3, 11, 7), True), ((3, 11, 8), False), ((3, 12, 0), False),
    ((3, 10, 13), False),
])
def test_the_releases_with_the_shared_ast_state(version, expected) -> None:  # type: ignore[no-untyped-def]
    assert affected(version) is expected


def test_the_guard_is_on_exactly_where_the_state_is_shared() -> None:
    assert hasattr(ast.parse, "__wrapped__") is affected()


def test_a_traceback_is_formatted_without_parsing_where_the_state_is_shared(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    parsed: list[str] = []
    real = ast.parse
    mine = threading.get_ident()

    def parse(source, *args, **kwargs):  # type: ignore[no-untyped-def]
        if threading.get_ident() == mine:  # not a parse of some other test's leftover thread
            parsed.append(source)
        return real(source, *args, **kwargs)

    monkeypatch.setattr(ast, "parse", parse)
    values: dict[str, dict[str, int] | None] = {"a": None}
    try:
        values["a"]["b"] + 1  # type: ignore[index]
    except TypeError:
        text = traceback.format_exc()
    assert "TypeError" in text and "^" in text  # shorter than its line: still marked
    assert bool(parsed) is not affected()


class _Flaky:
    def __init__(self, errors: list[Exception]) -> None:
        self.errors, self.calls = errors, 0

    def __call__(self, source: str) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return f"tree of {source}"


def test_a_spurious_depth_mismatch_is_parsed_again() -> None:
    flaky = _Flaky([SystemError(f"{_SPURIOUS} (before=147, after=46)")] * 2)
    assert parse_retrying(flaky)("x + 1") == "tree of x + 1"
    assert flaky.calls == 3


def test_any_other_error_and_a_mismatch_that_stays_are_raised() -> None:
    other = _Flaky([SystemError("something else")])
    with pytest.raises(SystemError, match="something else"):
        parse_retrying(other)("x")
    assert other.calls == 1
    stuck = _Flaky([SystemError(_SPURIOUS)] * (_TRIES + 1))
    with pytest.raises(SystemError, match=_SPURIOUS):
        parse_retrying(stuck)("x")
    assert stuck.calls == _TRIES
    with pytest.raises(SyntaxError):
        parse_retrying(ast.parse)("x +")
