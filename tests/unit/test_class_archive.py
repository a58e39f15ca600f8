"""Which class archive a driver would map: named after its JVM and jars, never a damaged file."""
from __future__ import annotations

import os
import struct

import pytest

from sparkbeam.execute import class_archive
from sparkbeam.execute.class_archive import archive_key, archive_path, driver_java_options, usable

MAGIC = struct.pack("<I", 0xF00BABA8)


@pytest.fixture
def install(tmp_path, monkeypatch):
    """A fake JDK and Spark jars directory, and an empty cache."""
    home = tmp_path / "jdk"
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "java").write_text("#!/bin/sh\n")
    (home / "release").write_text('JAVA_VERSION="17.0.15"\n')
    jars = tmp_path / "jars"
    jars.mkdir()
    for name in ("spark-core.jar", "spark-sql.jar"):
        (jars / name).write_bytes(b"jar " + name.encode())
    monkeypatch.setenv("JAVA_HOME", str(home))
    monkeypatch.setenv("SPARKBEAM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(class_archive, "spark_jars", lambda: str(jars))
    for name in ("SPARK_CONF_DIR", "HADOOP_CONF_DIR", "YARN_CONF_DIR", "SPARK_DIST_CLASSPATH"):
        monkeypatch.delenv(name, raising=False)
    return home, jars


def test_the_key_follows_the_jvm_the_jars_and_the_class_path(install, monkeypatch):
    home, jars = install
    first = archive_key()
    assert first is not None and first == archive_key()
    (jars / "spark-sql.jar").write_bytes(b"another build")  # a jar replaced
    second = archive_key()
    assert second != first
    (jars / "extra.jar").write_bytes(b"x")  # a jar added
    third = archive_key()
    assert third not in (first, second)
    (home / "release").write_text('JAVA_VERSION="17.0.16"\n')  # another JDK build
    fourth = archive_key()
    assert fourth not in (first, second, third)
    monkeypatch.setenv("SPARK_CONF_DIR", "/etc/spark")  # the class path gets a directory
    assert archive_key() not in (first, second, third, fourth)


def test_no_java_no_archive(install, monkeypatch):
    monkeypatch.setenv("JAVA_HOME", "/nonexistent")
    assert archive_key() is None and archive_path() is None
    assert driver_java_options() == ""


def test_only_a_finished_archive_is_usable(tmp_path):
    path = tmp_path / "a.jsa"
    assert not usable(str(path)) and not usable(None)
    path.write_bytes(b"")
    assert not usable(str(path))
    path.write_bytes(b"\x00" * 4096)  # garbage would turn off the JDK's own archive too
    assert not usable(str(path))
    path.write_bytes(MAGIC[:3])
    assert not usable(str(path))
    path.write_bytes(MAGIC + b"\x00" * 64)
    assert usable(str(path))


def test_a_driver_maps_this_machines_archive_unless_off(install):
    assert driver_java_options() == ""  # none made yet
    path = archive_path()
    assert path is not None and path.startswith(os.environ["SPARKBEAM_CACHE_DIR"])
    os.makedirs(os.path.dirname(path))
    with open(path, "wb") as f:
        f.write(MAGIC + b"\x00" * 64)
    options = driver_java_options()
    assert f"-XX:SharedArchiveFile={path}" in options.split()
    # The JVM's own warnings about an archive it cannot use stay off the user's terminal.
    assert {"-Xlog:cds=off", "-Xlog:cds+dynamic=off"} <= set(options.split())
    assert driver_java_options("off") == ""


def test_the_cache_directory(monkeypatch, tmp_path):
    monkeypatch.setenv("SPARKBEAM_CACHE_DIR", str(tmp_path / "c"))
    assert class_archive.cache_dir() == str(tmp_path / "c")
    monkeypatch.delenv("SPARKBEAM_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert class_archive.cache_dir() == str(tmp_path / "xdg" / "sparkbeam")


def test_a_launched_driver_gets_the_archive_unless_the_option_says_off(install):
    from apache_beam.options.pipeline_options import PipelineOptions

    from sparkbeam.execute.session import launched_driver_options
    from sparkbeam.options import SparkOptions

    path = archive_path()
    assert path is not None
    os.makedirs(os.path.dirname(path))
    with open(path, "wb") as f:
        f.write(MAGIC + b"\x00" * 64)

    def options(*flags: str) -> str:
        return launched_driver_options(PipelineOptions(list(flags)).view_as(SparkOptions),
                                       "-Dmine=1")

    on = options().split()
    assert f"-XX:SharedArchiveFile={path}" in on and on[-1] == "-Dmine=1"
    assert "-Dsparkbeam.spark.log.level=ERROR" in on
    off = options("--spark_class_archive=off").split()
    assert not any("SharedArchiveFile" in o for o in off) and off[-1] == "-Dmine=1"


def test_only_the_newest_archives_are_kept(tmp_path):
    for n in range(5):
        path = tmp_path / f"class-archive-{n}.jsa"
        path.write_bytes(MAGIC)
        os.utime(path, (1_000_000 + n, 1_000_000 + n))
    (tmp_path / "other.txt").write_text("not an archive")
    removed = class_archive.prune(str(tmp_path), keep=3)
    assert sorted(os.path.basename(p) for p in removed) == [
        "class-archive-0.jsa", "class-archive-1.jsa"]
    assert sorted(os.listdir(tmp_path)) == [
        "class-archive-2.jsa", "class-archive-3.jsa", "class-archive-4.jsa", "other.txt"]
    assert class_archive.prune(str(tmp_path / "missing"), keep=3) == []


def test_an_archive_a_driver_maps_outlives_newer_ones(install):
    """Three newer archives (fresh virtualenvs' jars) do not push out the one in use."""
    mine = archive_path()
    os.makedirs(os.path.dirname(mine))
    with open(mine, "wb") as f:
        f.write(MAGIC)
    os.utime(mine, (1_000_000, 1_000_000))
    cache = os.path.dirname(mine)
    for n in range(3):
        other = os.path.join(cache, f"class-archive-other{n}.jsa")
        with open(other, "wb") as f:
            f.write(MAGIC)
        os.utime(other, (2_000_000 + n, 2_000_000 + n))
    assert f"-XX:SharedArchiveFile={mine}" in driver_java_options()
    removed = class_archive.prune(cache, keep=3)
    assert [os.path.basename(p) for p in removed] == ["class-archive-other0.jsa"]
    assert os.path.exists(mine)
