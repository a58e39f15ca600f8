"""The job service never imports the executor, the runner or pyspark (ARCHITECTURE.md)."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import sparkbeam.jobservice

pytestmark = pytest.mark.timeout(60)

PACKAGE = Path(sparkbeam.jobservice.__file__).parent
FORBIDDEN = ("sparkbeam.execute", "sparkbeam.runner", "pyspark")


def imported_names(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    return names


@pytest.mark.parametrize("path", sorted(PACKAGE.glob("*.py")), ids=lambda p: p.name)
def test_no_module_names_a_forbidden_import(path: Path) -> None:
    bad = [n for n in imported_names(path)
           if any(n == f or n.startswith(f + ".") for f in FORBIDDEN)
           or n in ("sparkbeam.SparkRunner", "sparkbeam.SparkPipelineResult")]
    assert bad == [], f"{path.name} imports {bad}"


def test_importing_the_job_service_loads_no_executor_or_pyspark() -> None:
    # `import sparkbeam` loads its runner only on first use; what matters is that the job
    # service itself loads neither the executor nor pyspark.
    modules = [f"sparkbeam.jobservice.{p.stem}" for p in sorted(PACKAGE.glob("*.py"))
               if p.stem != "__init__"]
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in modules)
        + "print(','.join(m for m in sys.modules if any(m == f or m.startswith(f + '.') "
        "for f in ('sparkbeam.execute', 'pyspark'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=50)
    assert out.stdout.strip() == ""
