"""Fixtures of the cluster tier: a Spark Connect server and a standalone cluster (master plus
two workers), each in child processes on 127.0.0.1. The Connect server is started once per test
module, the standalone cluster once for the tier's modules (its start is ~8 s; the tier's last
test, in `make test-slow`, kills one of its workers); each is killed at its teardown.

Pipelines run in yet another child process (one Spark driver per process), so the local[2]
session the rest of the test session shares is never touched.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import pytest

from tests.support.jvm import with_test_jit

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STARTUP_TIMEOUT = 60.0
RUN_TIMEOUT = 170.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def archive_options() -> str:
    """The class archive `make test` makes (sparkbeam/execute/class_archive.py), for the
    cluster's own JVMs too: the master, workers, executors and Connect server start from the
    same Spark jars, class path and Java as a driver sparkbeam launches."""
    from sparkbeam.execute.class_archive import driver_java_options

    return driver_java_options()


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_DAEMON_MEMORY="256m",
        # The master's and the workers' (with the tests' JIT: tests/support/jvm.py).
        SPARK_DAEMON_JAVA_OPTS=with_test_jit(archive_options()),
        PYTHONPATH=os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH", "")) if p),
    )
    env.pop("SPARK_REMOTE", None)
    env.pop("SPARK_CONNECT_MODE_ENABLED", None)
    env.update(extra)
    return env


def start(cmd: list[str], log: str, env: dict[str, str]) -> subprocess.Popen:
    """A child in a process group of its own (so its JVMs go with it), logging to `log`."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    else:  # the leader is gone; its group may not be
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def wait_for(proc: subprocess.Popen, log: str, text: str, timeout: float = STARTUP_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(log, errors="replace") as f:
            if text in f.read():
                return
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    with open(log, errors="replace") as f:
        tail = f.read()[-3000:]
    raise RuntimeError(f"{text!r} not seen in {log} (exit {proc.poll()}):\n{tail}")


def run_pipelines(
    workdir: str, names: list[str], args: list[str], timeout: float = RUN_TIMEOUT
) -> dict[str, dict]:
    """Runs `names` in a child driver (FnApiRunner, then SparkRunner with `args`)."""
    out = os.path.join(workdir, f"results-{time.monotonic_ns()}.json")
    log = out + ".log"
    proc = start(
        [sys.executable, "-m", "tests.cluster.run_pipelines", out, ",".join(names), "--", *args],
        log, child_env(SPARKBEAM_TEST_TMP=os.path.join(workdir, "data")),
    )
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        pass
    finally:
        stop(proc)
    with open(log, errors="replace") as f:
        tail = f.read()[-4000:]
    if not os.path.exists(out):
        raise AssertionError(f"the child driver wrote no results (exit {proc.returncode}):\n{tail}")
    with open(out) as f:
        results: dict[str, dict] = json.load(f)
    missing = [n for n in names if n not in results]
    assert not missing, f"no result for {missing} (exit {proc.returncode}):\n{tail}"
    return results


@pytest.fixture(scope="session")
def cluster_tmp() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="sparkbeam-cluster-") as d:
        yield d


@contextlib.contextmanager
def connect_cluster(workdir: str) -> Iterator[str]:
    """A Spark Connect server (local[2]) in a child process; yields its sc:// URL.

    A free port can be taken by another process in the seconds before the server's JVM binds
    it (a fresh-clone run of 6dd6365 lost every Connect test so); the server then exits
    saying so, and it starts again on another port, three tries at most."""
    for attempt in range(3):
        port = free_port()
        log = os.path.join(workdir, f"connect-server-{port}.log")
        proc = start([sys.executable, "-m", "tests.cluster.connect_server", str(port)], log,
                     child_env())
        try:
            wait_for(proc, log, "READY")
            break
        except RuntimeError as exc:
            stop(proc)
            if attempt == 2 or "to an available port" not in str(exc):
                raise
    try:
        yield f"sc://127.0.0.1:{port}"
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def connect_server(cluster_tmp: str) -> Iterator[str]:
    with connect_cluster(cluster_tmp) as url:
        yield url


@pytest.fixture(scope="package")
def standalone_master(cluster_tmp: str) -> Iterator[str]:
    with standalone_cluster(cluster_tmp) as url:
        yield url


@contextlib.contextmanager
def standalone_cluster(cluster_tmp: str) -> Iterator[str]:
    """A standalone master and two workers (1 core, 512m each) on 127.0.0.1; yields spark://.

    `standalone_workers[url]` lists the workers' process groups (a test may kill one)."""
    import pyspark

    spark_home = os.path.dirname(pyspark.__file__)
    spark_class = os.path.join(spark_home, "bin", "spark-class")
    env = child_env(SPARK_HOME=spark_home)
    port = free_port()
    url = f"spark://127.0.0.1:{port}"
    run = os.path.join(cluster_tmp, f"standalone-{port}")
    os.makedirs(run)
    master_log = os.path.join(run, "master.log")
    procs = [start([spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                    "--port", str(port), "--webui-port", "0"], master_log, env)]
    try:
        wait_for(procs[0], master_log, "I have been elected leader")
        for n in range(2):
            log = os.path.join(run, f"worker-{n}.log")
            work_dir = os.path.join(run, f"worker-{n}-work")
            os.makedirs(work_dir)
            procs.append(start([spark_class, "org.apache.spark.deploy.worker.Worker", url,
                                "--host", "127.0.0.1", "--cores", "1", "--memory", "512m",
                                "--webui-port", "0", "--work-dir", work_dir], log, env))
            wait_for(procs[-1], log, "Successfully registered with master")
        standalone_workers[url] = procs[1:]
        yield url
    finally:
        standalone_workers.pop(url, None)
        for proc in reversed(procs):
            stop(proc)


standalone_workers: dict[str, list[subprocess.Popen]] = {}


def standalone_args(url: str, cores: int = 1) -> list[str]:
    """SparkRunner arguments for the standalone fixture's cluster (small JVMs, no UI)."""
    archive = archive_options()
    return [
        f"--spark_master={url}",
        "--spark_conf=spark.executor.memory=512m",
        "--spark_conf=spark.driver.memory=512m",
        "--spark_conf=spark.driver.host=127.0.0.1",
        "--spark_conf=spark.driver.bindAddress=127.0.0.1",
        "--spark_conf=spark.ui.enabled=false",
        f"--spark_conf=spark.cores.max={cores}",
        f"--spark_conf=spark.executor.extraJavaOptions={with_test_jit(archive)}",
    ]
