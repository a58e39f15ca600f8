"""Shared fixtures: one local[2] SparkSession per test session, made on first use."""
from __future__ import annotations

import logging
import os
import sys

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

_SESSION = []


def shared_spark():
    """The test session's SparkSession (local[2], small shuffles, quiet logs)."""
    if not _SESSION:
        from pyspark.sql import SparkSession

        from sparkbeam.execute.dataset import session_config

        builder = SparkSession.builder
        for key, value in session_config().items():
            builder = builder.config(key, value)
        spark = (
            builder
            .master(os.environ.get("SPARKBEAM_TEST_MASTER", "local[2]"))
            .appName("sparkbeam-tests")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "4")
            .config("spark.default.parallelism", "2")
            .config("spark.driver.memory", "2g")
            .config("spark.sql.adaptive.enabled", "true")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        _SESSION.append(spark)
    return _SESSION[0]


@pytest.fixture(scope="session")
def spark():
    return shared_spark()


def pytest_sessionfinish(session, exitstatus):
    if _SESSION:
        _SESSION[0].stop()
    # py4j logs from a destructor at interpreter exit, after logging's handlers are closed.
    logging.getLogger("py4j").setLevel(logging.WARNING)
