"""A Python worker's PySpark comes from the installed package, not Spark's zip of it."""
from __future__ import annotations

import os
import subprocess
import sys

import pyspark

from sparkbeam.execute.worker_path import installed_pyspark_first


def _zip(home: str) -> str:
    return os.path.join(home, "python", "lib", "pyspark.zip")


def test_the_zip_of_an_installed_pyspark_package_goes_behind_the_site_directory(tmp_path) -> None:
    site = tmp_path / "site-packages"
    (site / "pyspark").mkdir(parents=True)
    (site / "pyspark" / "__init__.py").write_text("")
    installed = _zip(str(site / "pyspark"))
    py4j = os.path.join(str(site / "pyspark"), "python", "lib", "py4j-0.10.9.9-src.zip")
    path = ["", installed, py4j, "/work/app", str(site)]
    assert installed_pyspark_first(path) == ["", py4j, "/work/app", str(site), installed]


def test_the_zip_of_another_spark_installation_stays_first(tmp_path) -> None:
    home = tmp_path / "spark-4.3.0-bin-hadoop3"  # SPARK_HOME of a Spark download
    (home / "python").mkdir(parents=True)
    path = [_zip(str(home)), "/usr/lib/python3.11/site-packages"]
    assert installed_pyspark_first(path) == path
    # A directory named pyspark that is not a package: not what pip installs.
    other = tmp_path / "pyspark"
    other.mkdir()
    assert installed_pyspark_first([_zip(str(other)), str(tmp_path)]) == [
        _zip(str(other)), str(tmp_path)]


def test_the_zip_stays_first_for_a_python_whose_path_lacks_its_site_directory(tmp_path) -> None:
    # SPARK_HOME is another environment's installed pyspark: this worker's own PySpark (if
    # any) may be another release than the JVM's, so the zip must keep winning.
    elsewhere = tmp_path / "other-env" / "site-packages"
    (elsewhere / "pyspark").mkdir(parents=True)
    (elsewhere / "pyspark" / "__init__.py").write_text("")
    path = [_zip(str(elsewhere / "pyspark")), str(tmp_path / "this-env" / "site-packages")]
    assert installed_pyspark_first(path) == path


def test_a_process_started_as_spark_starts_workers_imports_the_installed_pyspark() -> None:
    # Spark's workers get PYTHONPATH=$SPARK_HOME/python/lib/pyspark.zip:...; SPARK_HOME of a
    # pip install is the package directory. Without the reordering PySpark comes from the zip.
    home = os.path.dirname(pyspark.__file__)
    code = ("import sys; from sparkbeam.execute.worker_path import installed_pyspark_first; "
            "{fix}import pyspark; print(pyspark.__file__)")
    env = dict(os.environ, PYTHONPATH=_zip(home))
    fixed, unfixed = (
        subprocess.run([sys.executable, "-c", code.format(fix=fix)], env=env, check=True,
                       capture_output=True, text=True).stdout.strip()
        for fix in ("sys.path[:] = installed_pyspark_first(sys.path); ", ""))
    assert "pyspark.zip" in unfixed, unfixed  # what Spark's path gives: the test means something
    assert fixed == pyspark.__file__
