"""sparkbeam declares its DataFrames without SQL text.

A type name or an expression in a string is parsed by Spark's SQL parser (ANTLR) in the JVM:
its first use there costs ~0.3 s of a session's first job, every later one 1-30 ms
(bench/ANALYSIS.md). Types go as objects (sent as JSON) and expressions as Column calls, so
a batch job never warms the parser. This scans the package's source for the calls that would
take text: `expr`, `selectExpr`, and a string literal given to `cast`, `mapInArrow`,
`transformWithState`, `where` or `filter`.
"""
from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2] / "sparkbeam"
# Calls whose every string-literal argument is SQL text.
_TEXT_ANYWHERE = {"expr", "selectExpr"}
# Method -> the positional argument that is SQL text when it is a string.
_TEXT_AT = {"cast": 0, "astype": 0, "mapInArrow": 1, "transformWithState": 1, "where": 0,
            "filter": 0, "applyInPandas": 1, "mapInPandas": 1}


def sql_text_calls(source: str, name: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        args = node.args
        if called in _TEXT_ANYWHERE and any(
                isinstance(a, (ast.Constant, ast.JoinedStr)) for a in args):
            found.append(f"{name}:{node.lineno} {called}(...)")
        elif called in _TEXT_AT and isinstance(func, ast.Attribute) and len(args) > _TEXT_AT[
                called]:
            arg = args[_TEXT_AT[called]]
            if isinstance(arg, ast.JoinedStr) or (
                    isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
                found.append(f"{name}:{node.lineno} .{called}({ast.unparse(arg)})")
    return found


def test_the_package_declares_no_sql_text() -> None:
    found = [hit for path in sorted(ROOT.rglob("*.py"))
             for hit in sql_text_calls(path.read_text(), str(path.relative_to(ROOT)))]
    assert not found, f"SQL text, parsed by Spark's SQL parser in the JVM: {found}"


def test_the_scan_finds_each_kind_of_sql_text() -> None:
    """The scan itself: each form it must catch, and the object forms it must let through."""
    source = '\n'.join([
        'F.expr("concat(a, b)")',
        'df.selectExpr(f"x + {n}")',
        'col.cast("int")',
        'df.mapInArrow(fn, "key binary, value binary")',
        'df.where("a > 1")',
        'col.cast(T.IntegerType())',
        'df.mapInArrow(fn, SCHEMA)',
        'names.filter(lambda x: x)',
    ])
    assert [hit.split(" ", 1)[1] for hit in sql_text_calls(source, "m.py")] == [
        "expr(...)", "selectExpr(...)", ".cast('int')",
        ".mapInArrow('key binary, value binary')", ".where('a > 1')"]
