"""The pipeline catalogue on a `local[1]` Spark session (the shared session is `local[2]`).

One JVM per process, so this runs the catalogue in a child pytest whose session is local[1].
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.pipelines import PIPELINES

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(900)
def test_pipeline_catalogue_on_local_1() -> None:
    env = dict(os.environ, SPARKBEAM_TEST_MASTER="local[1]", PYSPARK_PYTHON=sys.executable)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/integration/test_pipelines.py", "-k", "greedy"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=880, check=False,
    )
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert f"{len(PIPELINES)} passed" in summary, summary
