"""A cross-section of the pipeline catalogue on a `local[1]` Spark session (the shared session
is `local[2]`): shuffles, side inputs, splittable and stateful DoFns, IO.

One JVM per process, so this runs them in a child pytest whose session is local[1]. (The whole
catalogue took ~2 min here; these cover the stages that wait on others, for the CI's budget.)
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.pipelines import PIPELINES

ROOT = Path(__file__).resolve().parents[2]


# Stages that wait on others' output: side inputs gathered first, a splittable DoFn's
# residuals run again, a stateful DoFn behind a shuffle (co_group_by_key and text_io_round_trip
# ran here too until 2026-11-27: a shuffle and an IO stage, which one core changes nothing for).
ONE_CORE = [
    "side_inputs_all_kinds", "splittable_dofn_checkpoints", "stateful_bag_combining_timers",
]


@pytest.mark.timeout(900)
def test_pipeline_catalogue_on_local_1() -> None:
    assert set(ONE_CORE) <= set(PIPELINES)
    env = dict(os.environ, SPARKBEAM_TEST_MASTER="local[1]", PYSPARK_PYTHON=sys.executable)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         *[f"tests/integration/test_pipelines.py::test_same_output_as_fnapi_runner"
           f"[{n}-greedy-p2]" for n in ONE_CORE]],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=880, check=False,
    )
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert f"{len(ONE_CORE)} passed" in summary, summary
