"""Pipelines whose environment is PROCESS or EXTERNAL run on SDK workers over the gRPC Fn API
and give exactly what FnApiRunner gives; a worker killed mid-bundle costs a retry, not data."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest

from tests.conftest import beam_worker_pool
from tests.integration.conftest import expected_from_fnapi, run_and_collect, spark_runner
from tests.integration.pipelines import PIPELINES

BOOT = os.path.join(os.path.dirname(sys.executable), "sparkbeam-boot")
PROCESS_ARGS = [
    "--environment_type=PROCESS",
    f"--environment_config={json.dumps({'command': BOOT})}",
    "--parallelism=2",
]
PROCESS_PIPELINES = [
    "group_by_key", "side_inputs_all_kinds", "stateful_bag_combining_timers",
    "splittable_dofn_checkpoints", "session_windows", "pardo_multiple_outputs",
]
EXTERNAL_PIPELINES = ["group_by_key", "side_inputs_all_kinds", "stateful_bag_combining_timers"]



@pytest.fixture(scope="module")
def worker_pool() -> Iterator[str]:
    with beam_worker_pool(BOOT) as url:
        yield url


def test_the_boot_program_is_installed() -> None:
    assert os.access(BOOT, os.X_OK), f"{BOOT} missing: is the package installed?"


@pytest.mark.parametrize("name", PROCESS_PIPELINES)
def test_process_environment_gives_the_same_output_as_fnapi(name: str) -> None:
    build = PIPELINES[name]
    expected = expected_from_fnapi(name, build)
    assert expected
    assert run_and_collect(build, spark_runner(), PROCESS_ARGS) == expected


@pytest.mark.parametrize("name", EXTERNAL_PIPELINES)
def test_external_environment_gives_the_same_output_as_fnapi(name: str, worker_pool: str) -> None:
    build = PIPELINES[name]
    expected = expected_from_fnapi(name, build)
    args = ["--environment_type=EXTERNAL", f"--environment_config={worker_pool}",
            "--parallelism=2"]
    assert run_and_collect(build, spark_runner(), args) == expected


def test_a_worker_that_never_connects_fails_the_job_naming_the_environment(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from sparkbeam import SparkRunner
    from sparkbeam.errors import ExecutionError

    silent = tmp_path / "silent.sh"
    silent.write_text("#!/bin/sh\nsleep 30\n")
    silent.chmod(0o755)
    options = PipelineOptions([
        "--environment_type=PROCESS",
        f"--environment_config={json.dumps({'command': str(silent)})}",
        "--worker_connect_timeout=2",
    ])
    p = beam.Pipeline(runner=SparkRunner(), options=options)
    _ = p | beam.Create([1, 2, 3]) | beam.Map(lambda x: x + 1)
    with pytest.raises(ExecutionError, match=r"beam:env:process:v1 command=.*silent\.sh.*within 2"):
        p.run().wait_until_finish()


# A driver of its own (local[2,3], for retries) with PROCESS workers, ~30 s: `make test-slow`.
# `make test` keeps its parts: a killed PROCESS worker fails its bundle and is replaced
# (tests/component/test_grpc_worker.py), a retried task's metrics count once
# (test_runner_behaviour.py).
@pytest.mark.slow
def test_killed_sdk_worker_is_retried_with_correct_output_and_metrics_once(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The SDK worker running a bundle is killed (SIGKILL) once; Spark retries the task
    (local[2,3] allows retries) on a fresh worker and the job finishes correctly."""
    marker = tmp_path / "killed-once"
    out = tmp_path / "out.txt"
    script = tmp_path / "kill.py"
    script.write_text(textwrap.dedent(f"""
        import json, os, signal
        import apache_beam as beam
        from apache_beam.metrics import Metrics, MetricsFilter
        from apache_beam.options.pipeline_options import PipelineOptions
        from sparkbeam import SparkRunner

        def maybe_die(x):
            Metrics.counter("ns", "seen").inc()
            if x == 33 and not os.path.exists({str(marker)!r}):
                open({str(marker)!r}, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)  # this process is the SDK worker
            return x

        options = PipelineOptions([
            "--spark_master=local[2,3]", "--parallelism=2", "--environment_type=PROCESS",
            "--environment_config=" + json.dumps({{"command": {BOOT!r}}}),
        ])
        p = beam.Pipeline(runner=SparkRunner(), options=options)
        def write(s):
            with open({str(out)!r}, "w") as f:
                f.write(str(s))

        _ = (p | beam.Create(range(100)) | beam.Map(maybe_die)
             | beam.CombineGlobally(sum) | beam.Map(write))
        result = p.run()
        result.wait_until_finish()
        (c,) = result.metrics().query(MetricsFilter().with_name("seen"))["counters"]
        print("COMMITTED", c.committed)
    """))
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert marker.exists(), "the worker was never killed, so the test proved nothing"
    assert out.read_text() == str(sum(range(100)))
    assert "COMMITTED 100" in proc.stdout
