"""The Spark driver a sparkbeam job launches maps this machine's class archive (`make test` makes
it, as `sparkbeam class-archive` does); a driver that cannot use it runs without it, quietly."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from sparkbeam.execute.class_archive import archive_path, usable

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc/<pid>/maps")

# A fresh process: one small job on a driver sparkbeam launches, then whether that driver JVM
# has a class archive mapped (the file in its memory map).
JOB = """
import sys
import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from pyspark import SparkContext

options = PipelineOptions(["--runner=sparkbeam.SparkRunner", "--spark_master=local[1]",
                           *sys.argv[2:]])
with beam.Pipeline(options=options) as p:
    _ = (p | beam.Create(["a", "b", "a"]) | beam.combiners.Count.PerElement()
         | beam.MapTuple(lambda w, n: f"{w} {n}")
         | beam.io.WriteToText(sys.argv[1], shard_name_template=""))
pid = SparkContext._active_spark_context._jvm.java.lang.ProcessHandle.current().pid()
with open(f"/proc/{pid}/maps") as f:
    mapped = sorted({line.split()[-1] for line in f if line.rstrip().endswith(".jsa")})
print("ARCHIVES", [m for m in mapped if "class-archive-" in m])
"""


@pytest.fixture(scope="module")
def archive() -> str:
    # A no-op when `make test` (or an earlier run) has made it; ~45 s otherwise.
    subprocess.run([sys.executable, "-m", "sparkbeam.cli", "class-archive"], check=True,
                   timeout=600, capture_output=True)
    path = archive_path()
    assert usable(path)
    return str(path)


def _job(tmp_path, *flags: str, env: dict[str, str] | None = None
         ) -> subprocess.CompletedProcess[str]:
    out = tmp_path / "counts.txt"
    done = subprocess.run([sys.executable, "-c", JOB, str(out), *flags], capture_output=True,
                          text=True, timeout=300, env={**os.environ, **(env or {})})
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(out.read_text().splitlines()) == ["a 2", "b 1"]
    return done


def test_the_driver_maps_the_archive(archive, tmp_path):
    done = _job(tmp_path)
    assert f"ARCHIVES ['{archive}']" in done.stdout


def test_a_driver_that_cannot_use_an_archive_runs_without_it_quietly(archive, tmp_path,
                                                                     monkeypatch):
    # Another class path (a configuration directory first on it): an archive made for the
    # usual one, placed under this class path's name, is refused by the JVM itself.
    conf = tmp_path / "conf"
    conf.mkdir()
    env = {"SPARK_CONF_DIR": str(conf), "SPARKBEAM_CACHE_DIR": str(tmp_path / "cache")}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    misplaced = archive_path()
    assert misplaced is not None and misplaced != archive
    os.makedirs(os.path.dirname(misplaced))
    shutil.copyfile(archive, misplaced)
    done = _job(tmp_path, env=env)
    assert "ARCHIVES []" in done.stdout
    said = (done.stdout + done.stderr).lower()
    assert "cds" not in said and "shared archive" not in said, said[-2000:]
