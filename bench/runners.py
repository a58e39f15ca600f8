"""The runners under test. Each one is started (timed as start-up: session or
cluster creation), runs any number of workloads, and is stopped.

Runners:

* ``pyspark-handwritten`` -- the computation written as PySpark RDD code.
* ``pyspark-dataframe`` -- word count and combine written as PySpark DataFrame code.
* ``sparkbeam`` -- this project's ``sparkbeam.SparkRunner`` on ``local[2]``.
* ``fnapi`` -- Beam's FnApiRunner, in process, one worker.
* ``fnapi-mp`` -- FnApiRunner with two SDK worker subprocesses.
* ``dask`` -- Beam's DaskRunner on a 2-worker ``LocalCluster``, with plain
  file I/O instead of ReadFromText/WriteToText (see ``Dask``).
  ``dask-beamio`` (not run by default) runs the unmodified pipelines.
* ``beam-pyspark-runner`` -- the 0.0.3 release from PyPI on ``local[2]``.

Every Spark-based runner gets the same ``local[2]`` session settings.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from bench import pipelines
from bench.workloads import Dataset

SPARK_MASTER = "local[2]"
#: Settings shared by every runner that runs on a local Spark session.
SPARK_CONF = {
    "spark.ui.enabled": "false",
    "spark.driver.memory": "2g",
    "spark.ui.showConsoleProgress": "false",
}


def spark_session(app: str, extra: dict[str, str] | None = None) -> Any:
    """Creates (or returns) the process's ``local[2]`` SparkSession (``extra``: settings of
    one runner's own on top of the shared ones)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(SPARK_MASTER).appName(app)
    for key, value in {**SPARK_CONF, **(extra or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


class Runner:
    """A started runner. ``run`` executes one workload; ``stop`` shuts down."""

    name = ""
    spark_jobs: int | None = None  # Spark jobs of the last run, where the runner says

    def run(self, ds: Dataset, out_prefix: str) -> str:
        """Runs the workload, writing under ``out_prefix``; returns the output glob."""
        raise NotImplementedError

    def stop(self) -> None:
        """Releases the session/cluster (not part of the timed wall time)."""


class BeamRunner(Runner):
    """Runs the Beam pipeline with a runner object and/or option flags."""

    def __init__(
        self, runner_factory: Callable[[], Any] | None, flags: list[str], io: str = "beam"
    ) -> None:
        self._runner_factory = runner_factory
        self._flags = flags
        self._io = io

    def run(self, ds: Dataset, out_prefix: str) -> str:
        options = PipelineOptions(self._flags)
        runner = self._runner_factory() if self._runner_factory else None
        p = beam.Pipeline(runner=runner, options=options)
        pipelines.build(p, ds, out_prefix, self._io)
        result = p.run()
        state = result.wait_until_finish()
        self.spark_jobs = getattr(result, "spark_jobs", None)
        if state is not None and str(state) not in ("DONE", "PipelineState.DONE"):
            raise RuntimeError(f"pipeline finished in state {state}")
        return out_prefix + "*"


class SparkBeamRunner(BeamRunner):
    """``--runner=sparkbeam.SparkRunner``; the session is created up front so
    that JVM start-up is timed as start-up (the runner should pick it up with
    ``SparkSession.builder.getOrCreate()``)."""

    def __init__(self, flags: tuple[str, ...] = ()) -> None:
        from sparkbeam.execute.class_archive import driver_java_options
        from sparkbeam.execute.session import session_config

        # The session sparkbeam would create itself (its worker daemon, adaptive execution
        # off, the driver mapping this machine's class archive when `sparkbeam class-archive`
        # made one), made here only so that the JVM's start is timed as start-up.
        archive = driver_java_options()
        extra = session_config()
        if archive:
            extra["spark.driver.extraJavaOptions"] = archive
        self._spark = spark_session("bench-sparkbeam", extra)
        super().__init__(None, ["--runner=sparkbeam.SparkRunner", f"--spark_master={SPARK_MASTER}",
                                *flags])

    def stop(self) -> None:
        self._spark.stop()


class FnApi(BeamRunner):
    """Beam's FnApiRunner (in process, or with worker subprocesses)."""

    def __init__(self, flags: list[str]) -> None:
        from apache_beam.runners.portability.fn_api_runner import FnApiRunner

        super().__init__(FnApiRunner, flags)


class Dask(BeamRunner):
    """Beam's DaskRunner on ``LocalCluster(n_workers=2, threads_per_worker=1)``.

    Beam 2.77's DaskRunner cannot run the standard text I/O: ``ReadFromText``
    becomes a no-op yielding ``None`` (its ``_Read`` override has no entry in
    ``TRANSLATIONS``), and ``WriteToText`` writes an empty shard (side inputs
    are recomputed inside tasks, so ``InitializeWrite`` runs several times and
    the finalize step looks in another temp dir). So by default the pipelines
    use the ``plain`` I/O mode here (one Dask partition per input file);
    ``io="beam"`` runs them unmodified (runner ``dask-beamio``).
    """

    def __init__(self, io: str = "plain") -> None:
        from apache_beam.runners.dask.dask_runner import DaskRunner
        from dask.distributed import LocalCluster

        from bench.workloads import N_SHARDS

        self._cluster = LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        )
        flags = [
            f"--dask_client_address={self._cluster.scheduler_address}",
            f"--dask_npartitions={N_SHARDS}",
        ]
        super().__init__(DaskRunner, flags, io)

    def stop(self) -> None:
        self._cluster.close()


class BeamPySparkRunner(BeamRunner):
    """``beam_pyspark_runner.pyspark_runner.PySparkRunner`` (PyPI 0.0.3).

    It takes no master option: it calls ``SparkSession.builder.appName(...)
    .getOrCreate()``, so it runs on the ``local[2]`` session created here.
    """

    def __init__(self) -> None:
        from beam_pyspark_runner.pyspark_runner import PySparkRunner

        self._spark = spark_session("bench-beam-pyspark-runner")
        super().__init__(PySparkRunner, ["--application_name=bench-beam-pyspark-runner"])

    def stop(self) -> None:
        self._spark.stop()


class Handwritten(Runner):
    """The workload as hand-written PySpark RDD code."""

    def __init__(self, app: str = "bench-handwritten") -> None:
        self._spark = spark_session(app)

    def run(self, ds: Dataset, out_prefix: str) -> str:
        from bench import handwritten

        handwritten.run(self._spark.sparkContext, ds, out_prefix)
        return os.path.join(out_prefix, "part-*")

    def stop(self) -> None:
        self._spark.stop()


class DataFrames(Handwritten):
    """Word count and combine as PySpark DataFrame code (`dataframes.py`): Spark alone."""

    def __init__(self) -> None:
        super().__init__("bench-dataframe")

    def run(self, ds: Dataset, out_prefix: str) -> str:
        from bench import dataframes

        dataframes.run(self._spark, ds, out_prefix)
        return os.path.join(out_prefix, "part-*")


#: Runner name -> constructor; constructing a runner is its (timed) start-up.
RUNNERS: dict[str, Callable[[], Runner]] = {
    "pyspark-handwritten": Handwritten,
    "pyspark-dataframe": DataFrames,
    "sparkbeam": SparkBeamRunner,
    # Beam's transforms everywhere (no Spark-native translations): what they are worth.
    "sparkbeam-beam-only": lambda: SparkBeamRunner(("--spark_native=off",)),
    # Arrow batches to Python workers by row count alone, for pipelines of small elements.
    "sparkbeam-rows": lambda: SparkBeamRunner(("--arrow_batch_bytes=rows",)),
    "fnapi": lambda: FnApi([]),
    "fnapi-mp": lambda: FnApi(["--direct_num_workers=2", "--direct_running_mode=multi_processing"]),
    "dask": Dask,
    "dask-beamio": lambda: Dask("beam"),
    "beam-pyspark-runner": BeamPySparkRunner,
}

#: Reference runners that ratios are computed against.
LIMIT = "pyspark-handwritten"
FNAPI = "fnapi"
