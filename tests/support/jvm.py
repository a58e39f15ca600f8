"""JVM options of every JVM the tests start (drivers, cluster daemons, executors, Kafka).

`-XX:TieredStopAtLevel=1`: the client JIT compiler (C1) only. The tests run many short jobs on
small data; with C2 as well, compiling Spark's hot code took half of the test driver's CPU on a
streaming test run (52 of 98 s: Spark's planner, codegen, serializers, state store), on a
machine of two cores the tests share with it, and never paid back within a test. C1's code is
slower at its peak, which the tests never reach; what a job computes does not depend on it.
sparkbeam's own sessions keep Java's default (C1 and C2): they run real data (bench/).
"""
from __future__ import annotations

import os

TEST_JIT = "-XX:TieredStopAtLevel=1"


def with_test_jit(options: str) -> str:
    """`options` (a JVM options string, maybe empty) with the tests' JIT setting added."""
    return " ".join(part for part in (options, TEST_JIT) if part)


def apply_to_spark_submit() -> None:
    """Every JVM `spark-submit` starts from this process and its children (PySpark's gateway
    JVMs included) gets the tests' JIT setting: Spark's launcher adds $SPARK_SUBMIT_OPTS to the
    driver's command line (JAVA_TOOL_OPTIONS would print a notice on every JVM's stderr)."""
    os.environ["SPARK_SUBMIT_OPTS"] = with_test_jit(
        os.environ.get("SPARK_SUBMIT_OPTS", "").replace(TEST_JIT, "").strip())
