"""ARCHITECTURE.md's dependency rules, checked by importing each package in a fresh process."""
from __future__ import annotations

import subprocess
import sys

import pytest

RULES = [
    # (modules to import, modules that must not be loaded afterwards)
    (["sparkbeam.plan.fuse", "sparkbeam.plan.check", "sparkbeam.plan.model"], ["pyspark"]),
    (["sparkbeam.control.embedded", "sparkbeam.execute.stage_task"], ["pyspark"]),
    (["sparkbeam.runner"], ["pyspark"]),
    (["sparkbeam.jobservice"], ["sparkbeam.execute", "pyspark"]),
    (["sparkbeam.streaming.budget", "sparkbeam.streaming.endpoints", "sparkbeam.streaming.script",
      "sparkbeam.streaming.clock", "sparkbeam.streaming.gbk", "sparkbeam.streaming.plan"],
     ["pyspark"]),
    (["sparkbeam.control.bundle_protocol", "sparkbeam.control.shell",
      "sparkbeam.control.rebalance", "sparkbeam.control.progress"], ["pyspark"]),
]

# The pure logic of control/ and streaming/: no sockets, no gRPC, no clocks of its own.
PURE_MODULES = [
    "sparkbeam/control/bundle_protocol.py",
    "sparkbeam/control/rebalance.py",
    "sparkbeam/control/progress.py",
    "sparkbeam/streaming/budget.py",
    "sparkbeam/streaming/endpoints.py",
    "sparkbeam/streaming/script.py",
]


@pytest.mark.parametrize("imports, forbidden", RULES)
def test_import_rules(imports: list[str], forbidden: list[str]) -> None:
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in imports)
        + f"bad = [m for m in sys.modules if any(m == f or m.startswith(f + '.') "
        f"for f in {forbidden!r})]\n"
        + "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"{imports} pulled in {out.stdout.strip()}"


@pytest.mark.parametrize("path", PURE_MODULES)
def test_pure_logic_opens_no_sockets(path: str) -> None:
    import ast
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2]
    tree = ast.parse((root / path).read_text())
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        (node.module or "").split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
    }
    assert not imported & {"grpc", "socket", "socketserver", "pyspark"}, imported
