"""Tracebacks formatted without `ast.parse` in the test processes, on CPython 3.11.0-3.11.7.

Those releases keep the depth counter of the AST constructor (`ast.parse`) in state shared by
the whole interpreter (CPython gh-106905, fixed in 3.11.8; pytest-dev/pytest#10874). 3.11's
`traceback` module parses each frame's expression to place its `~~^^` marks. When another
thread formats a traceback while pytest parses a source file (it does, building a failed test's
report), or a finalizer that the garbage collector runs inside that parse logs an error, the
counter comes out wrong and pytest's parse raises `SystemError: AST constructor recursion depth
mismatch`. In a pytest-xdist worker that is an internal error: the worker stops and the whole
run fails. It did, twice in a row, on a strict xfail whose streaming job fails: py4j's callback
thread logs the Spark task's exception, with its traceback, while pytest formats the test's.

`traceback` swallows its own parse's errors (the marks are left out), so only pytest's parse
fails, and only in the pytest processes, which all load the tests' conftest: there the function
that finds the marks' anchors stops parsing. A traceback still marks the whole expression.
"""
from __future__ import annotations

import sys
import traceback


def affected(version: tuple[int, ...] = tuple(sys.version_info[:3])) -> bool:
    return version[:2] >= (3, 11) and version < (3, 11, 8)


def format_without_ast() -> None:
    if affected():
        # A private function of 3.11's traceback module; None means "no anchors in this line".
        traceback._extract_caret_anchors_from_line_segment = (  # type: ignore[attr-defined]
            lambda segment: None)
