"""Shared fixtures: one local[2] SparkSession per test session, made on first use."""
from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

from tests.support.jvm import apply_to_spark_submit  # noqa: E402
from tests.support.tracebacks import guard_ast_parse  # noqa: E402

apply_to_spark_submit()  # the C1-only JIT of tests/support/jvm.py, for every driver started
guard_ast_parse()  # CPython 3.11.0-3.11.7's shared AST state (tests/support/tracebacks.py)

# Every temporary file of the test run, in this process and in every process it starts (Spark's
# Python workers, child drivers, the cluster's JVMs), goes under one directory removed when the
# run ends: tests, Beam (each Pipeline makes a `beam-pipeline-temp` directory it never removes),
# the runner's checkpoints and Spark's local directories of JVMs that are killed.
_TMP_ROOT = tempfile.mkdtemp(prefix="sparkbeam-test-run-")
os.environ["TMPDIR"] = _TMP_ROOT
os.environ["SPARK_LOCAL_DIRS"] = _TMP_ROOT
tempfile.tempdir = _TMP_ROOT

_SESSION = []


def shared_spark():
    """The test session's SparkSession (local[2], small shuffles, quiet logs)."""
    if not _SESSION:
        from pyspark.sql import SparkSession

        from sparkbeam.execute.class_archive import driver_java_options
        from sparkbeam.execute.session import session_config

        builder = SparkSession.builder
        for key, value in session_config().items():
            builder = builder.config(key, value)
        archive = driver_java_options()  # the class archive `make test` makes, as sparkbeam's
        if archive:
            builder = builder.config("spark.driver.extraJavaOptions", archive)
        spark = (
            builder
            .master(os.environ.get("SPARKBEAM_TEST_MASTER", "local[2]"))
            .appName("sparkbeam-tests")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "4")
            .config("spark.default.parallelism", "2")
            .config("spark.driver.memory", "2g")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        _SESSION.append(spark)
    return _SESSION[0]


@pytest.fixture(scope="session")
def spark():
    return shared_spark()


def _pytests(handler: logging.Handler) -> bool:
    return type(handler).__module__ == "_pytest.logging"


def _per_phase(handler: logging.Handler) -> bool:
    """pytest's handlers that come and go with each test phase (caplog's and the report's)."""
    return _pytests(handler) and type(handler).__name__ == "LogCaptureHandler"


@pytest.fixture(autouse=True)
def _root_logger_kept() -> Iterator[None]:
    """Each test leaves the root logger's level and handlers as it found them. The job server's
    `main`, which tests run in this process, calls `logging.basicConfig(level=INFO,
    force=True)` as a command's entry point should: the root logger then stayed at INFO for the
    rest of the test process, writing to the stderr that one test had captured and pytest had
    closed, so every later INFO line (py4j's, Beam's, the runner's) was formatted only to fail
    with "I/O operation on closed file", a traceback printed each time. pytest's per-phase
    capturing handlers are left to pytest; its session-wide ones, which `force=True` removes
    too, are put back (a --log-file handler it has closed drops later records all the same:
    `make test` writes no log file)."""
    root = logging.getLogger()
    level, kept = root.level, [h for h in root.handlers if not _per_phase(h)]
    yield
    for handler in root.handlers[:]:
        if not _pytests(handler) and handler not in kept:
            root.removeHandler(handler)
    for handler in kept:
        if handler not in root.handlers:
            root.addHandler(handler)
    root.setLevel(level)


def pytest_sessionfinish(session, exitstatus):
    if _SESSION:
        _SESSION[0].stop()
    # py4j logs from a destructor at interpreter exit, after logging's handlers are closed.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    shutil.rmtree(_TMP_ROOT, ignore_errors=True)


@contextlib.contextmanager
def beam_worker_pool(boot: str) -> Iterator[str]:
    """Beam's own worker pool (what `--environment_type=EXTERNAL` points at), starting each SDK
    worker through the boot program `boot`; yields its 127.0.0.1 address, stops it after."""
    import socket
    import subprocess

    import grpc

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    proc = subprocess.Popen([
        sys.executable, "-m", "apache_beam.runners.worker.worker_pool_main",
        f"--service_port={port}", f"--container_executable={boot}",
    ])
    url = f"127.0.0.1:{port}"
    try:
        grpc.channel_ready_future(grpc.insecure_channel(url)).result(timeout=60)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
