"""The dependency rules of docs/ARCHITECTURE.md, checked on the source and by importing.

- Layers: `execute/` and `streaming/` build on `engine/`, which builds on `control/` and `plan/`;
  nothing below imports what is above it, `execute/` and `streaming/` do not import each other,
  and they reach SDK workers only through the engine (never `control/` directly).
- `jobservice/` never imports `execute/` (the executor is injected) nor the engine.
- No module imports another package's underscore names.
- `plan/` and `engine/` load no pyspark; the pure logic of `control/` and `streaming/` opens no
  sockets.
"""
from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "sparkbeam"

# package -> the sparkbeam packages it may import (top-level modules such as errors.py,
# metrics.py, options.py and urns.py may be imported by all; runner.py, spark_executor.py and
# cli.py compose the parts and may import any).
ALLOWED = {
    "plan": {"plan"},
    "control": {"control", "plan"},
    "engine": {"engine", "control", "plan"},
    "execute": {"execute", "engine", "plan"},
    "streaming": {"streaming", "engine", "plan"},
    "artifacts": {"artifacts"},
    "jobservice": {"jobservice", "artifacts"},
    "io": {"io"},  # plain Beam transforms: they run on any runner
}
TOP_LEVEL = {"errors", "logs", "metrics", "mode", "options", "urns"}


def _sources() -> list[pathlib.Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _package_of(path: pathlib.Path) -> str | None:
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 else None


def _imports(path: pathlib.Path) -> list[tuple[int, str, list[str]]]:
    """(line, module, names imported from it) of every import of a sparkbeam module."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sparkbeam"):
            out.append((node.lineno, node.module or "", [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out.extend((node.lineno, a.name, []) for a in node.names
                       if a.name.startswith("sparkbeam"))
    return out


def _target(module: str, names: list[str]) -> list[str]:
    """The sparkbeam packages (or top-level modules) an import reaches."""
    parts = module.split(".")
    if len(parts) >= 2:
        return [parts[1]]
    return names  # `from sparkbeam import x`


def test_packages_import_only_the_layers_below_them() -> None:
    broken = []
    for path in _sources():
        package = _package_of(path)
        if package is None or package not in ALLOWED:
            continue
        for line, module, names in _imports(path):
            for target in _target(module, names):
                if target in TOP_LEVEL or target in ALLOWED[package]:
                    continue
                broken.append(f"{path.relative_to(ROOT)}:{line} imports {module} ({target})")
    assert broken == []


def test_no_module_imports_another_packages_underscore_names() -> None:
    broken = []
    for path in _sources():
        package = _package_of(path)
        for line, module, names in _imports(path):
            target = module.split(".")[1] if module.count(".") >= 1 else None
            private = [n for n in names if n.startswith("_")]
            if private and target != package:
                broken.append(f"{path.relative_to(ROOT)}:{line} imports {private} from {module}")
    assert broken == []


def test_no_module_reaches_into_another_packages_underscore_attributes() -> None:
    """`module._name` where `module` is a sparkbeam module of another package."""
    broken = []
    for path in _sources():
        package = _package_of(path)
        tree = ast.parse(path.read_text())
        foreign: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sparkbeam."):
                target = (node.module or "").split(".")[1]
                if target != package:
                    foreign.update(a.asname or a.name for a in node.names)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in foreign and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                broken.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value.id}.{node.attr}")
    assert broken == []


IMPORT_RULES = [
    # (modules to import, modules that must not be loaded afterwards)
    (["sparkbeam.plan.fuse", "sparkbeam.plan.check", "sparkbeam.plan.model",
      "sparkbeam.plan.validate"], ["pyspark"]),
    (["sparkbeam.engine.task", "sparkbeam.engine.run", "sparkbeam.engine.timers",
      "sparkbeam.engine.bundles", "sparkbeam.engine.watermarks", "sparkbeam.engine.arrow"],
     ["pyspark", "sparkbeam.control.grpc_server", "sparkbeam.execute", "sparkbeam.streaming"]),
    (["sparkbeam.runner"], ["pyspark"]),
    (["sparkbeam.io"], ["pyspark", "confluent_kafka", "sparkbeam.execute", "sparkbeam.engine"]),
    (["sparkbeam.jobservice"], ["sparkbeam.execute", "sparkbeam.engine", "pyspark"]),
    (["sparkbeam.streaming.budget", "sparkbeam.streaming.endpoints", "sparkbeam.streaming.script",
      "sparkbeam.streaming.checkpoint", "sparkbeam.streaming.gbk", "sparkbeam.streaming.plan",
      "sparkbeam.streaming.stateful", "sparkbeam.streaming.splittable",
      "sparkbeam.streaming.sides"], ["pyspark"]),
    (["sparkbeam.control.bundle_protocol", "sparkbeam.control.shell",
      "sparkbeam.control.rebalance", "sparkbeam.control.progress"], ["pyspark"]),
]


@pytest.mark.parametrize("imports, forbidden", IMPORT_RULES)
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


# The pure logic of control/, engine/ and streaming/: no sockets, no gRPC, no pyspark.
PURE_MODULES = [
    "sparkbeam/control/bundle_protocol.py",
    "sparkbeam/control/rebalance.py",
    "sparkbeam/control/progress.py",
    "sparkbeam/engine/bundles.py",
    "sparkbeam/engine/timers.py",
    "sparkbeam/engine/watermarks.py",
    "sparkbeam/streaming/budget.py",
    "sparkbeam/streaming/endpoints.py",
    "sparkbeam/streaming/script.py",
    "sparkbeam/streaming/checkpoint.py",
]


@pytest.mark.parametrize("path", PURE_MODULES)
def test_pure_logic_opens_no_sockets(path: str) -> None:
    tree = ast.parse((ROOT / path).read_text())
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


def test_no_module_is_over_six_hundred_lines() -> None:
    """Modules of a few hundred lines (STYLE.md); ~500 is the aim, 600 the hard limit."""
    long = {str(p.relative_to(ROOT)): n for p in _sources()
            if (n := len(p.read_text().splitlines())) > 600}
    assert long == {}


def test_every_module_imports() -> None:
    """A module importing one that no longer exists fails here, not in a Spark worker (mypy
    ignores missing imports)."""
    modules = [".".join(p.relative_to(ROOT).with_suffix("").parts) for p in _sources()]
    modules = [m.removesuffix(".__init__") for m in modules]
    code = "import importlib\n" + "".join(f"importlib.import_module({m!r})\n" for m in modules)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
