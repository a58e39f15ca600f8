"""spark-submit and a lost executor on the two-worker standalone cluster.

- `spark-submit --master spark://... my_pipeline.py --runner=sparkbeam.SparkRunner` runs on the
  submitted cluster (no `--spark_master` needed) and gives the right output.
- One worker (its JVM, its executor and Python workers) is killed while the job runs: Spark
  reschedules and recomputes, the output is still right and committed metrics count once.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.cluster.conftest import (
    ROOT,
    child_env,
    standalone_args,
    standalone_workers,
    start,
    stop,
)

pytestmark = pytest.mark.cluster

WORDS = ["apple", "banana", "cherry", "apple", "banana", "apple"] * 50


def test_spark_submit_runs_the_pipeline_on_the_submitted_cluster(
    standalone_master: str, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    import pyspark

    script = tmp_path / "wordcount.py"
    out = tmp_path / "counts.json"
    script.write_text(textwrap.dedent(f"""
        import json, sys
        import apache_beam as beam
        from apache_beam.options.pipeline_options import PipelineOptions
        from pyspark import SparkContext

        def write(counts):
            with open({str(out)!r}, "w") as f:
                json.dump(sorted(counts), f)

        with beam.Pipeline(options=PipelineOptions(sys.argv[1:])) as p:
            _ = (p | beam.Create({WORDS!r}) | beam.combiners.Count.PerElement()
                 | beam.combiners.ToList() | beam.Map(write))
        print("MASTER", SparkContext._active_spark_context.master)
    """))
    submit = os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-submit")
    conf = [a.split("=", 1)[1] for a in standalone_args(standalone_master)
            if a.startswith("--spark_conf=")]
    cmd = [submit, "--master", standalone_master]
    for c in conf:
        cmd += ["--conf", c]
    cmd += [str(script), "--runner=sparkbeam.SparkRunner"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=ROOT,
                          env=child_env(SPARK_HOME=os.path.dirname(pyspark.__file__)))
    errors = [ln for ln in proc.stderr.splitlines() if "Error" in ln or "Exception" in ln]
    assert proc.returncode == 0, "\n".join(errors[-30:]) + proc.stderr[-2000:]
    assert f"MASTER {standalone_master}" in proc.stdout
    assert json.loads(out.read_text()) == [["apple", 150], ["banana", 100], ["cherry", 50]]


@pytest.mark.slow  # waits for Spark to notice the lost executor: wall-clock bound, ~50 s
def test_losing_an_executor_mid_job_still_gives_the_right_output(
    standalone_master: str, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    started = tmp_path / "started"
    out = tmp_path / "result.json"
    script = tmp_path / "slow.py"
    script.write_text(textwrap.dedent(f"""
        import json, os, sys, time
        import apache_beam as beam
        from apache_beam.metrics import Metrics, MetricsFilter
        from apache_beam.options.pipeline_options import PipelineOptions
        from sparkbeam import SparkRunner

        def slow(x):
            Metrics.counter("ns", "seen").inc()
            with open({str(started)!r}, "a") as f:
                f.write(f"{{os.getpid()}}\\n")
            time.sleep(0.05)
            return (x % 10, x)

        p = beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(sys.argv[1:]))
        _ = (p | beam.Create(range(400)) | beam.Reshuffle() | beam.Map(slow)
             | beam.GroupByKey() | beam.MapTuple(lambda k, vs: (k, sum(vs)))
             | beam.combiners.ToList()
             | beam.Map(lambda kv: open({str(out)!r}, "w").write(json.dumps(sorted(kv)))))
        result = p.run()
        result.wait_until_finish()
        (c,) = result.metrics().query(MetricsFilter().with_name("seen"))["counters"]
        print("COMMITTED", c.committed)
    """))
    args = ["--parallelism=4", *standalone_args(standalone_master, cores=2),
            "--spark_conf=spark.task.maxFailures=4"]
    log = str(tmp_path / "driver.log")
    driver = start([sys.executable, str(script), *args], log, child_env())
    try:
        deadline = time.monotonic() + 120
        while not (started.exists() and started.read_text().strip()):
            assert time.monotonic() < deadline and driver.poll() is None, _tail(log)
            time.sleep(0.2)
        pid = int(started.read_text().split()[0])
        victim = next(w for w in standalone_workers[standalone_master]
                      if _descends_from(pid, w.pid))
        os.killpg(victim.pid, signal.SIGKILL)  # the worker JVM, its executor and Python workers
        driver.wait(240)
    finally:
        stop(driver)
    text = _tail(log, 100_000)
    assert driver.returncode == 0, text[-4000:]
    expected = sorted([k, sum(x for x in range(400) if x % 10 == k)] for k in range(10))
    assert json.loads(out.read_text()) == expected
    assert "COMMITTED 400" in text


def _descends_from(pid: int, ancestor: int) -> bool:
    """Whether `pid` (a Python worker) runs under `ancestor` (a worker JVM), via /proc."""
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
    return False


def _tail(path: str, n: int = 3000) -> str:
    with open(path, errors="replace") as f:
        return f.read()[-n:]
