"""A JVM class archive for the Spark driver sparkbeam launches: a faster start and first job.

A local Spark driver loads and verifies ~15 k classes from Spark's jars before its first job
ends: most of a session's ~5 s start on two cores, and much of the first job's planning. The
JDK's application class-data sharing (CDS) keeps those classes, parsed and verified, in an
archive file the JVM maps at start. `build` makes one (`sparkbeam class-archive`; `make test`
and `make bench` do it once a machine): it starts a driver with `-XX:ArchiveClassesAtExit`,
runs small batch and streaming pipelines on it, and the JVM writes every class it loaded as it
exits. A session sparkbeam starts then maps that archive (`driver_java_options`). Measured on
this project's 2-core machine (bench/ANALYSIS.md): the session's start 5.3-6.4 s to 3.0-3.2 s,
a small word count's first job 7.4-8.1 s to 6.4-6.7 s.

An archive is only good for the JVM and the jars it was made with (the JVM refuses another's,
and a damaged one turns off the JDK's own archive too), so its file is named after them
(`archive_key`) and a file without the archive's magic number is never handed to the JVM.
Nothing here is required: without an archive a session starts as Spark's own would.
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import struct
import sys
import tempfile
import time
from collections.abc import Callable

#: What a dynamic archive of JDK 13+ starts with (HotSpot's CDS_DYNAMIC_ARCHIVE_MAGIC).
_MAGIC = 0xF00BABA8
#: Environment variables that put entries on the driver's class path (spark-class reads them).
_CLASSPATH_ENV = ("SPARK_CONF_DIR", "HADOOP_CONF_DIR", "YARN_CONF_DIR", "SPARK_DIST_CLASSPATH",
                  "SPARK_PREPEND_CLASSES", "SPARK_HOME", "JAVA_HOME")
#: The JVM's own messages about an archive it cannot use (a class path that grew, say) would
#: reach the user's terminal: the session simply starts without it.
_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def cache_dir() -> str:
    """Where archives are kept: $SPARKBEAM_CACHE_DIR, else $XDG_CACHE_HOME/sparkbeam, else
    ~/.cache/sparkbeam."""
    explicit = os.environ.get("SPARKBEAM_CACHE_DIR")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "sparkbeam")


def java_executable() -> str | None:
    """The `java` spark-class launches: $JAVA_HOME/bin/java, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return os.path.realpath(found) if found and os.path.isfile(found) else None


def spark_jars() -> str:
    from pyspark.find_spark_home import _find_spark_home

    return os.path.join(_find_spark_home(), "jars")


def archive_key(java: str | None = None, jars: str | None = None) -> str | None:
    """A name for the archive of this JVM and these Spark jars (None: no java found). Any
    change to the JVM's files, to a jar (name, size, time) or to the variables that extend
    the class path gives another name."""
    java = java or java_executable()
    if java is None:
        return None
    jars = jars or spark_jars()
    digest = hashlib.sha256()
    java_home = os.path.dirname(os.path.dirname(java))
    for path in (java, os.path.join(java_home, "lib", "server", "libjvm.so"),
                 os.path.join(java_home, "release")):
        digest.update(_stamp(path))
    try:
        entries = sorted(os.scandir(jars), key=lambda e: e.name)
    except OSError:
        return None
    for entry in entries:
        digest.update(_stamp(entry.path))
    for name in _CLASSPATH_ENV:
        digest.update(f"{name}={os.environ.get(name, '')}\0".encode())
    return digest.hexdigest()[:20]


def _stamp(path: str) -> bytes:
    try:
        stat = os.stat(path)
    except OSError:
        return f"{path}:-\0".encode()
    return f"{path}:{stat.st_size}:{stat.st_mtime_ns}\0".encode()


def archive_path(key: str | None = None) -> str | None:
    key = key or archive_key()
    return os.path.join(cache_dir(), f"class-archive-{key}.jsa") if key else None


def usable(path: str | None) -> bool:
    """Whether `path` is a finished archive (a damaged file would cost the JDK's own one)."""
    if not path:
        return False
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return False
    return len(head) == 4 and struct.unpack("<I", head)[0] == _MAGIC


def driver_java_options(setting: str = "auto") -> str:
    """The driver JVM's options that map this machine's archive, or "" (`setting` "off", no
    archive made for this JVM and these jars yet)."""
    if setting == "off":
        return ""
    path = archive_path()
    if path is None or not usable(path):
        return ""
    _mark_used(path)
    return f"-XX:SharedArchiveFile={path} {_QUIET}"


def _mark_used(path: str) -> None:
    """Sets the archive's time to now, so `prune` keeps the archives drivers map, not only the
    newest made: three fresh virtualenvs' archives (a CI's clones) used to push out the one of
    the checkout in daily use. The JVM checks the jars' times, never the archive's own."""
    # A read-only cache: the archive still maps; only pruning sees it as older.
    with contextlib.suppress(OSError):
        os.utime(path)


def build(force: bool = False, log: Callable[[str], None] = print) -> str:
    """Makes this machine's archive unless it has one (`force`: again); returns its path.

    Runs in a process of its own with no SparkSession yet (the archive's JVM is started here
    and must exit to write it): `python -m sparkbeam.execute.class_archive`."""
    from pyspark.sql import SparkSession

    from sparkbeam.execute.session import LOG4J_CONFIG, active_session, session_config

    target = archive_path()
    if target is None:
        raise RuntimeError("no java found (JAVA_HOME or PATH): no class archive to make")
    if usable(target) and not force:
        log(f"class archive: {target} (already made)")
        return target
    if active_session() is not None:
        raise RuntimeError("a class archive is made by a process without a SparkSession")
    os.makedirs(cache_dir(), exist_ok=True)
    partial = f"{target}.{os.getpid()}.partial"
    started = time.monotonic()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # as the sessions sparkbeam starts
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.master("local[2]").appName("sparkbeam-class-archive")
    for key, value in session_config().items():
        builder = builder.config(key, value)
    spark = (builder.config("spark.ui.enabled", "false")
             .config("spark.driver.extraJavaOptions",
                     # C1 only: what the archive holds (the classes loaded) does not depend
                     # on the JIT, and C2's compiling was most of this short run's CPU.
                     f"-XX:ArchiveClassesAtExit={partial} {_QUIET} -XX:TieredStopAtLevel=1 "
                     f"-Dlog4j2.configurationFile={LOG4J_CONFIG} "
                     "-Dsparkbeam.spark.log.level=ERROR")
             .getOrCreate())
    proc = getattr(spark.sparkContext._gateway, "proc", None)  # PySpark's launched JVM
    try:
        try:
            with tempfile.TemporaryDirectory(prefix="sparkbeam-class-archive-") as work:
                _exercise(work)
        finally:
            spark.stop()
            # The driver JVM exits when its stdin closes (PySpark's gateway); it writes the
            # archive as it exits.
            if proc is not None and proc.stdin is not None:
                proc.stdin.close()
                proc.wait(timeout=600)
        if not usable(partial):
            raise RuntimeError(f"the driver JVM wrote no class archive at {partial}")
        os.replace(partial, target)
        prune(cache_dir(), keep=KEEP)
    finally:
        if os.path.exists(partial):
            os.remove(partial)
    log(f"class archive: {target} ({os.path.getsize(target) >> 20} MB, made in "
        f"{time.monotonic() - started:.0f} s)")
    return target


#: Archives kept in the cache, the most recently made or mapped first (~180 MB each): one per
#: Java and Spark install a machine has used lately; each new install's archive (a fresh
#: virtualenv's jars) pushes out the one least recently used, which is made again if its
#: install is used again.
KEEP = 3


def prune(directory: str, keep: int) -> list[str]:
    """Removes all but the `keep` archives in `directory` most recently made or mapped (by
    their times, which a mapping driver sets: `_mark_used`); returns those removed."""
    try:
        names = [n for n in os.listdir(directory)
                 if n.startswith("class-archive-") and n.endswith(".jsa")]
    except OSError:
        return []
    paths = sorted((os.path.join(directory, n) for n in names), key=os.path.getmtime,
                   reverse=True)
    removed = []
    for path in paths[keep:]:
        try:
            os.remove(path)
            removed.append(path)
        except OSError:
            pass  # in use elsewhere, or gone already: another process's business
    return removed


def _exercise(work: str) -> None:
    """Small pipelines that load what sparkbeam's jobs load in the driver JVM: Spark's text
    source and writer paths, shuffles, `mapInArrow`, a gathered side input, and a streaming
    query with `transformWithState`."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.testing.test_stream import TestStream
    from apache_beam.transforms import window

    source = os.path.join(work, "in.txt")
    with open(source, "w") as f:
        f.write("a b\nb c\nc a b\n")
    batch = PipelineOptions(["--runner=sparkbeam.SparkRunner", "--progress_interval=0"])
    with beam.Pipeline(options=batch) as p:
        words = p | beam.io.ReadFromText(source) | beam.FlatMap(str.split)
        sizes = p | "Sizes" >> beam.Create([("a", 1), ("b", 2), ("c", 3)])
        _ = (words | beam.combiners.Count.PerElement()
             | beam.Map(lambda kv, size: (kv[0], kv[1] * size[kv[0]]), beam.pvalue.AsDict(sizes))
             | beam.GroupByKey() | beam.MapTuple(lambda k, vs: f"{k} {sorted(vs)}")
             | beam.io.WriteToText(os.path.join(work, "out")))
    streaming = PipelineOptions(["--runner=sparkbeam.SparkRunner", "--streaming",
                                 "--progress_interval=0",
                                 f"--checkpoint_dir={os.path.join(work, 'checkpoint')}"])
    events = (TestStream().add_elements([window.TimestampedValue(("k", 1), 1)])
              .advance_watermark_to(20).add_elements([window.TimestampedValue(("k", 2), 21)])
              .advance_watermark_to_infinity())
    with beam.Pipeline(options=streaming) as p:
        _ = (p | events | beam.WindowInto(window.FixedWindows(10)) | beam.CombinePerKey(sum)
             | beam.Map(str))


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Make this machine's JVM class archive for "
                                     "the Spark drivers sparkbeam starts.")
    parser.add_argument("--force", action="store_true", help="make it again")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    build(force=args.force)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
