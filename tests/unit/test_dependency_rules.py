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
