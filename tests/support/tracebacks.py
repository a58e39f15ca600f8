"""`ast.parse` made safe from other threads in the test processes, on CPython 3.11.0-3.11.7.

Those releases keep the depth counter of the AST constructor (`ast.parse`) in state shared by
the whole interpreter (CPython gh-106905; the thread-safe counter came in 3.11.8;
pytest-dev/pytest#10874). When another thread parses while pytest parses a source file (it
does, building a failed test's report), or a finalizer that the garbage collector runs inside
that parse parses too, the counter comes out wrong and pytest's parse raises `SystemError: AST
constructor recursion depth mismatch`. In a pytest-xdist worker that is an internal error: the
worker stops and the whole run fails. It did, twice in a row, on a strict xfail whose streaming
job fails: py4j's callback thread logged the Spark task's exception, with its traceback, while
pytest formatted the test's. 3.11's `traceback` module parses each frame's expression to place
its `~~^^` marks.

Two things, in every pytest process (the controller and each worker load the tests' conftest):

- the function of 3.11's traceback module that finds the marks' anchors no longer parses (by
  far the most frequent parse off the main thread here: every logged traceback). A frame's
  expression is still marked with `^` where it is shorter than its line;
- `ast.parse` tries again when it raises that SystemError. The error is spurious (the tree was
  built; only the counter's check failed) and the parse is deterministic, so a second parse
  gives what the first should have. This covers the parses that remain on other threads
  (`inspect.signature` of a builtin, which Beam's SDK harness threads call) and the nested case.
"""
from __future__ import annotations

import ast
import sys
import traceback
from typing import Any

_SPURIOUS = "AST constructor recursion depth mismatch"
_TRIES = 4


def affected(version: tuple[int, ...] = tuple(sys.version_info[:3])) -> bool:
    return version[:2] >= (3, 11) and version < (3, 11, 8)


def parse_retrying(parse: Any) -> Any:
    """`parse` (`ast.parse`), tried again on the spurious SystemError, up to `_TRIES` times."""

    def retrying(*args: Any, **kwargs: Any) -> Any:
        for _ in range(_TRIES - 1):
            try:
                return parse(*args, **kwargs)
            except SystemError as exc:
                if _SPURIOUS not in str(exc):
                    raise
        return parse(*args, **kwargs)  # the last try: whatever it raises is raised

    retrying.__wrapped__ = parse  # type: ignore[attr-defined]
    return retrying


def guard_ast_parse() -> None:
    if not affected():
        return
    # A private function of 3.11's traceback module; None means "no anchors in this line".
    traceback._extract_caret_anchors_from_line_segment = (  # type: ignore[attr-defined]
        lambda segment: None)
    if not hasattr(ast.parse, "__wrapped__"):
        ast.parse = parse_retrying(ast.parse)
