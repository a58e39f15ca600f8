"""Child process: a Spark Connect server on local[2] at 127.0.0.1:PORT, until killed.

    python -m tests.cluster.connect_server PORT
"""
from __future__ import annotations

import os
import sys
import time


def main(port: int) -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from sparkbeam.execute.class_archive import driver_java_options
    from sparkbeam.execute.session import session_config

    builder = SparkSession.builder.master("local[2]").appName("sparkbeam-connect-test")
    for key, value in {
        **session_config(),
        "spark.plugins": "org.apache.spark.sql.connect.SparkConnectPlugin",
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.memory": "512m",
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "4",
        "spark.default.parallelism": "2",
        # The class archive `make test` makes, as a driver sparkbeam launches would map it.
        "spark.driver.extraJavaOptions": driver_java_options(),
    }.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    print("READY", flush=True)
    try:
        while True:
            time.sleep(1)
    finally:
        spark.stop()


if __name__ == "__main__":
    main(int(sys.argv[1]))
