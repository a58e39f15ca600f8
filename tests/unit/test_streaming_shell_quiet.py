"""PySpark's planning process for a keyed streaming operator prints to its stdout, which Spark
copies to the driver's stderr; loading the processor shell there sends its stdout nowhere
(`streaming/shell.py`), and nowhere else."""
from __future__ import annotations

import subprocess
import sys

import pytest

from sparkbeam.streaming.shell import PLANNING_MODULE

_SCRIPT = """
import importlib.machinery, sys
sys.modules["__main__"].__spec__ = importlib.machinery.ModuleSpec({name!r}, None)
print("before", flush=True)
import sparkbeam.streaming.shell
print("after", flush=True)
print("to stderr", file=sys.stderr, flush=True)
"""


@pytest.mark.parametrize(("main", "expected"), [
    (PLANNING_MODULE, "before\n"),
    ("pyspark.worker", "before\nafter\n"),  # a task's worker prints as it always did
])
def test_only_the_planning_process_loses_its_stdout(main: str, expected: str) -> None:
    done = subprocess.run([sys.executable, "-c", _SCRIPT.format(name=main)],
                          capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout == expected
    assert done.stderr.endswith("to stderr\n")
