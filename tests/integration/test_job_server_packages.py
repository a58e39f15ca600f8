"""Python packages a PortableRunner client stages reach the Spark executors of its job."""
from __future__ import annotations

import tarfile
import textwrap
from pathlib import Path

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to

from sparkbeam.jobservice.server import JobServer
from sparkbeam.spark_executor import SparkJobExecutor


def _sdist(tmp_path: Path) -> Path:
    src = tmp_path / "sparkbeam_probe_pkg-0.1"
    src.mkdir()
    (src / "sparkbeam_probe_pkg.py").write_text("OFFSET = 1000\n")
    (src / "setup.py").write_text(textwrap.dedent("""
        from setuptools import setup
        setup(name="sparkbeam_probe_pkg", version="0.1", py_modules=["sparkbeam_probe_pkg"])
    """))
    sdist = tmp_path / "sparkbeam_probe_pkg-0.1.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        tar.add(src, arcname=src.name)
    return sdist


def _add_offset(x: int) -> int:
    import sparkbeam_probe_pkg  # only the staged package provides it

    return sparkbeam_probe_pkg.OFFSET + x


def test_extra_package_sdist_is_importable_in_spark_tasks(tmp_path: Path) -> None:
    server = JobServer(SparkJobExecutor(), artifacts_dir=str(tmp_path / "artifacts"))
    server.start()
    try:
        options = PipelineOptions([
            "--runner=PortableRunner", f"--job_endpoint={server.endpoint}",
            "--environment_type=LOOPBACK", f"--extra_package={_sdist(tmp_path)}",
            "--job_server_timeout=600",
        ])
        with beam.Pipeline(options=options) as p:
            assert_that(p | beam.Create([1, 2]) | beam.Map(_add_offset), equal_to([1001, 1002]))
    finally:
        server.stop()


def test_loopback_clients_run_user_code_in_their_own_process(tmp_path: Path) -> None:
    """LOOPBACK: Spark tasks drive the client's own SDK worker over the gRPC Fn API, so user
    code runs in the submitting process (what Beam users expect of LOOPBACK)."""
    import os

    server = JobServer(SparkJobExecutor(), artifacts_dir=str(tmp_path / "artifacts"))
    server.start()
    try:
        options = PipelineOptions([
            "--runner=PortableRunner", f"--job_endpoint={server.endpoint}",
            "--environment_type=LOOPBACK", "--job_server_timeout=600",
        ])
        with beam.Pipeline(options=options) as p:
            pids = p | beam.Create([1, 2, 3]) | beam.Map(lambda _: os.getpid())
            assert_that(pids, equal_to([os.getpid()] * 3))
    finally:
        server.stop()
