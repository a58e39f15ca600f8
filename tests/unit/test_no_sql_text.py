"""sparkbeam declares its DataFrames without SQL text.

A type name or an expression in a string is parsed by Spark's SQL parser (ANTLR) in the JVM:
its first use there costs ~0.3 s of a session's first job, every later one 1-30 ms
(bench/ANALYSIS.md). Types go as objects (sent as JSON) and expressions as Column calls, so
a batch job never warms the parser. This scans the package's source for the calls that would
take text: `expr` and `selectExpr` however called, and a string given to `cast`, `mapInArrow`,
`transformWithState`, `where` or `filter` (by position or keyword, as a literal or a module
constant of any of the package's modules). Statements are another matter: the one `spark.sql`,
a partitioned table's repair after a streaming write, runs only there.
"""
from __future__ import annotations

import ast
import pathlib
from collections.abc import Collection

ROOT = pathlib.Path(__file__).resolve().parents[2] / "sparkbeam"
# Calls that take SQL text, whatever their arguments.
_TEXT_ALWAYS = {"expr", "selectExpr"}
# Method -> (the positional index, the keyword) of the argument that is SQL text when a string.
_TEXT_AT = {"cast": (0, "dataType"), "astype": (0, "dataType"), "mapInArrow": (1, "schema"),
            "transformWithState": (1, "outputStructType"), "where": (0, "condition"),
            "filter": (0, "condition"), "applyInPandas": (1, "schema"),
            "mapInPandas": (1, "schema")}


def string_constants(source: str) -> set[str]:
    """Names a module binds to a string at its top level (`ROW_SCHEMA = "tag int, ..."`)."""
    return {target.id for node in ast.parse(source).body if isinstance(node, ast.Assign)
            and isinstance(node.value, (ast.Constant, ast.JoinedStr))
            and (isinstance(node.value, ast.JoinedStr) or isinstance(node.value.value, str))
            for target in node.targets if isinstance(target, ast.Name)}


def _is_text(arg: ast.expr, constants: set[str]) -> bool:
    if isinstance(arg, ast.JoinedStr):
        return True
    if isinstance(arg, ast.Constant):
        return isinstance(arg.value, str)
    name = arg.id if isinstance(arg, ast.Name) else getattr(arg, "attr", None)
    return name in constants


def sql_text_calls(source: str, name: str, package_constants: Collection[str] = ()
                   ) -> list[str]:
    found = []
    constants = set(package_constants) | string_constants(source)
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if called in _TEXT_ALWAYS:
            found.append(f"{name}:{node.lineno} {called}(...)")
            continue
        if called not in _TEXT_AT or not isinstance(func, ast.Attribute):
            continue
        index, keyword = _TEXT_AT[called]
        args = [node.args[index]] if len(node.args) > index else []
        args += [k.value for k in node.keywords if k.arg == keyword]
        for arg in args:
            if _is_text(arg, constants):
                found.append(f"{name}:{node.lineno} .{called}({ast.unparse(arg)})")
    return found


def test_the_package_declares_no_sql_text() -> None:
    paths = sorted(ROOT.rglob("*.py"))
    constants = {c for path in paths for c in string_constants(path.read_text())}
    found = [hit for path in paths
             for hit in sql_text_calls(path.read_text(), str(path.relative_to(ROOT)), constants)]
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
        'SCHEMA_TEXT = "tag int, key binary"',
        'df.mapInArrow(fn, SCHEMA_TEXT)',
        'df.mapInArrow(fn, schema="id long")',
        'F.expr(text)',
        'grouped.transformWithState(shell, operators.ROW_TEXT, "Append")',
    ])
    assert [hit.split(" ", 1)[1] for hit in sql_text_calls(source, "m.py", {"ROW_TEXT"})] == [
        "expr(...)", "selectExpr(...)", ".cast('int')",
        ".mapInArrow('key binary, value binary')", ".where('a > 1')",
        ".mapInArrow(SCHEMA_TEXT)", ".mapInArrow('id long')", "expr(...)",
        ".transformWithState(operators.ROW_TEXT)"]
