"""Spark's Python processes import the installed PySpark, not Spark's zip of it (the site hook)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile

import pyspark
from sparkbeam_site import installed_pyspark_first

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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


def _pyspark_imported_as_spark_starts_python(*flags: str, before: str = "") -> str:
    # Spark's processes get PYTHONPATH=$SPARK_HOME/python/lib/pyspark.zip:...; SPARK_HOME of a
    # pip install is the package directory. No sparkbeam code runs before PySpark's import.
    env = dict(os.environ, PYTHONPATH=_zip(os.path.dirname(pyspark.__file__)))
    code = before + "import pyspark; print(pyspark.__file__)"
    return subprocess.run([sys.executable, *flags, "-c", code], env=env, check=True,
                          capture_output=True, text=True).stdout.strip()


def test_a_process_started_as_spark_starts_python_imports_the_installed_pyspark() -> None:
    # The installed sparkbeam_site.pth did it, before PySpark's import.
    assert _pyspark_imported_as_spark_starts_python() == pyspark.__file__
    # The same path without the .pth (-S: no site processing; the site directory added by
    # hand) imports the zip: the test means something.
    site_dir = os.path.dirname(os.path.dirname(pyspark.__file__))
    unhooked = _pyspark_imported_as_spark_starts_python(
        "-S", before=f"import sys; sys.path.append({site_dir!r}); ")
    assert "pyspark.zip" in unhooked, unhooked


def test_reorder_sys_path_fixes_a_path_that_site_did_not_reorder() -> None:
    site_dir = os.path.dirname(os.path.dirname(pyspark.__file__))
    reordered = _pyspark_imported_as_spark_starts_python(
        "-S", before=f"import sys; sys.path.append({site_dir!r}); sys.path.append({_ROOT!r}); "
                     "import sparkbeam_site; sparkbeam_site.reorder_sys_path(); ")
    assert reordered == pyspark.__file__


def test_a_wheel_built_from_the_sdist_installs_the_site_hook_beside_the_packages(
        tmp_path) -> None:
    # Built from a copy of the checkout, so the build writes nothing into it; through an sdist
    # (what pip builds from a source download), which must carry the .pth for the wheel.
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "sparkbeam_site.py",
                 "sparkbeam_site.pth"):
        shutil.copy(os.path.join(_ROOT, name), src / name)
    shutil.copytree(os.path.join(_ROOT, "sparkbeam"), src / "sparkbeam",
                    ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "setup.py", "-q", "sdist", "-d", str(tmp_path / "sdist")],
                   cwd=src, check=True, capture_output=True)
    (sdist,) = (tmp_path / "sdist").iterdir()
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-index",
                    "--disable-pip-version-check", "--no-build-isolation",
                    "-w", str(tmp_path / "dist"), str(sdist)],
                   check=True, capture_output=True)
    (wheel,) = (tmp_path / "dist").iterdir()
    with zipfile.ZipFile(wheel) as whl:
        names = whl.namelist()
        hook = whl.read("sparkbeam_site.pth").decode()
    # At the wheel's root: installed into the site directory itself, where site runs it.
    assert {"sparkbeam_site.pth", "sparkbeam_site.py", "sparkbeam/__init__.py"} <= set(names)
    with open(os.path.join(_ROOT, "sparkbeam_site.pth")) as pth:
        assert hook == pth.read()


def test_the_hook_is_silent_where_sparkbeam_site_cannot_be_imported(tmp_path) -> None:
    # An editable install whose checkout moved: the .pth stays, its module is gone.
    shutil.copy(os.path.join(_ROOT, "sparkbeam_site.pth"), tmp_path / "sparkbeam_site.pth")
    env = dict(os.environ, PYTHONPATH=_zip(os.path.dirname(pyspark.__file__)))
    done = subprocess.run(
        [sys.executable, "-S", "-c", f"import site; site.addsitedir({str(tmp_path)!r}); "
                                     "import sys; print('sparkbeam_site' in sys.modules)"],
        env=env, check=True, capture_output=True, text=True, cwd=tmp_path)
    assert (done.stdout.strip(), done.stderr) == ("False", "")
