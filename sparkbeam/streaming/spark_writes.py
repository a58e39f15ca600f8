"""WriteToSpark in a streaming job: each committed micro-batch's rows written exactly once.

As for an exactly-once WriteToKafka (`staged_writes.py`), the tasks that compute a write's input
stage it in the checkpoint (`spark-staged/<n>/batch-B-part-P`), and the query's sink writes out
what committed micro-batches staged, so a replayed batch (which may compute other elements)
never writes. Writing batch B of write n (`flush_spark_writes`, on the driver):
1. Spark's writer writes the staged rows, decoded in Spark tasks into the target's schema, to a
   directory under the target that Spark's readers skip (`_sparkbeam-staging/`);
2. a `B.moving` record goes into `spark-written/<n>/`, then each file moves into the target
   under a name that says its write and batch (`part-sb-<query>-<n>-<B>-...`);
3. the record becomes `B` (written) and the staged files go.
A driver killed anywhere in 2 leaves `B.moving`: the next flush removes the files of that
batch already moved, then writes the batch again. So each row is in the target once, and a
reader sees a batch's files appear one by one, as with Spark's own file sink.

A table target is written the same way into its location (file-based tables; the first batch
creates it) and refreshed; a Delta table instead takes Spark's writer with Delta's idempotent
`txnAppId`/`txnVersion`. The staging and record directories are local paths (the checkpoint's);
targets are any file system pyarrow reaches (local, HDFS, object stores).
"""
from __future__ import annotations

import os
import posixpath
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
from apache_beam.internal import pickler

from sparkbeam.engine.context import pipeline_context
from sparkbeam.errors import ExecutionError
from sparkbeam.plan.native_spark import FILE_FORMATS, RunnerWrite
from sparkbeam.streaming.checkpoint import CheckpointLayout, read_side_file

STAGING = "_sparkbeam-staging"  # under the target: Spark's readers skip `_` directories


@dataclass(frozen=True)
class SparkStreamWrite:
    transform: str
    index: int
    staged: str  # `CheckpointLayout.spark_staged_dir`
    written: str  # `CheckpointLayout.spark_written_dir`
    payload: bytes  # the pickled target (`io/spark.py`'s SparkWrite)
    components: bytes
    coder_id: str  # the windowed coder of the staged elements


def spark_stream_writes(layout: CheckpointLayout, writes: tuple[RunnerWrite, ...],
                        components: bytes) -> tuple[SparkStreamWrite, ...]:
    return tuple(SparkStreamWrite(w.transform, n, layout.spark_staged_dir(n),
                                  layout.spark_written_dir(n), w.payload, components, w.coder_id)
                 for n, w in enumerate(writes))


def _staged(directory: str, before_batch: int) -> dict[int, list[str]]:
    """batch -> its staged files, for the batches before `before_batch`."""
    try:
        names = sorted(n for n in os.listdir(directory) if n.startswith("batch-"))
    except FileNotFoundError:
        return {}
    out: dict[int, list[str]] = {}
    for name in names:
        batch = int(name.split("-")[1])
        if batch < before_batch:
            out.setdefault(batch, []).append(os.path.join(directory, name))
    return out


@dataclass(frozen=True)
class _StagedRows:
    """A Spark task per staged file: row i of `spark.range` is `paths[i]`; out come its rows
    in the target's schema (a row in several windows once per window, as in batch)."""

    paths: tuple[str, ...]
    payload: bytes
    components: bytes
    coder_id: str

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        target = pickler.loads(self.payload)
        impl = pipeline_context(self.components).coders[self.coder_id].get_impl()
        for batch in batches:
            for index in batch.column(0).to_pylist():
                values = read_side_file(self.paths[index])
                if values:
                    yield target.to_arrow([wv.value for wv in map(impl.decode_nested, values)
                                           for _ in wv.windows])


def flush_spark_writes(spark: Any, writes: tuple[SparkStreamWrite, ...], query: str,
                       before_batch: int) -> int:
    """Writes out what the micro-batches before `before_batch` staged (module doc); returns
    the number of batches written."""
    done = 0
    for write in writes:
        for batch, paths in sorted(_staged(write.staged, before_batch).items()):
            record = os.path.join(write.written, str(batch))
            if not os.path.exists(record):
                try:
                    _write_batch(spark, write, batch, paths, query[:8], record)
                except ExecutionError:
                    raise
                except Exception as exc:  # noqa: BLE001 - Spark's and the file system's
                    target = pickler.loads(write.payload)
                    raise ExecutionError(
                        f"{write.transform}: writing micro-batch {batch} to "
                        f"{target.describe()}: {type(exc).__name__}: {exc}") from exc
                done += 1
            for path in paths:
                os.remove(path)
    return done


def _write_batch(spark: Any, write: SparkStreamWrite, batch: int, paths: list[str],
                 query: str, record: str) -> None:
    target = pickler.loads(write.payload)
    rows = (spark.range(len(paths), numPartitions=len(paths))
            .mapInArrow(_StagedRows(tuple(paths), write.payload, write.components,
                                    write.coder_id), target.struct()))
    location, fmt = _location(spark, target, write.transform)
    os.makedirs(write.written, exist_ok=True)
    if fmt == "delta":  # Delta's own idempotent append: (app id, version) written once
        writer = (rows.write.format("delta").mode("append").options(**dict(target.options))
                  .option("txnAppId", f"sparkbeam-{query}-{write.index}")
                  .option("txnVersion", str(batch)))
        writer.saveAsTable(target.table) if target.table else writer.save(location)
        with open(record, "w", encoding="ascii") as f:
            f.write("written")
        return
    _write_files(rows, target, fmt, _qualified(spark, location), f"{query}-{write.index}",
                 batch, record)
    if target.table:
        # After the record: a driver killed here has written the batch once; the next
        # batch's refresh (and repair, which registers every partition missing) catches up.
        spark.catalog.refreshTable(target.table)
        if target.partition_by:
            spark.sql(f"MSCK REPAIR TABLE {target.table}")


def _location(spark: Any, target: Any, transform: str) -> tuple[str, str]:
    """(where the target's files go, their format): a path target's own, or a table's
    (created by the first batch if it does not exist)."""
    if not target.table:
        return target.path, target.format
    if not spark.catalog.tableExists(target.table):
        empty = spark.createDataFrame([], target.struct()).write.options(**dict(target.options))
        if target.partition_by:
            empty = empty.partitionBy(*target.partition_by)
        empty.saveAsTable(target.table)
    detail = {r[0]: r[1] for r in spark.sql(f"DESCRIBE TABLE EXTENDED {target.table}").collect()}
    provider = str(detail.get("Provider", "")).lower()
    if provider != "delta" and provider not in FILE_FORMATS:
        raise ExecutionError(
            f"{transform}: table {target.table} has provider {provider or 'unknown'}; a "
            "streaming WriteToSpark writes each micro-batch exactly once to tables of files "
            f"({', '.join(sorted(FILE_FORMATS))}) or Delta tables")
    return str(detail["Location"]), provider


def _write_files(rows: Any, target: Any, fmt: str, location: str, name: str, batch: int,
                 record: str) -> None:
    """Writes the batch's files aside, moves them in and records the batch (module doc): the
    record replaces `B.moving` in one rename once every file is in place, so a kill before it
    takes the moved files out again and a kill after it writes nothing again."""
    fs, root = pafs.FileSystem.from_uri(_for_arrow(location))
    staging = posixpath.join(root, STAGING, f"{name}-{batch:010d}")
    prefix = f"part-sb-{name}-{batch:010d}-"
    moving = record + ".moving"
    if os.path.exists(moving):  # an earlier attempt was killed while moving files
        _remove_moved(fs, root, prefix)
    _delete_dir(fs, staging)
    writer = rows.write.format(fmt).mode("overwrite").options(**dict(target.options))
    if target.partition_by:
        writer = writer.partitionBy(*target.partition_by)
    writer.save(_uri(location, staging))
    os.makedirs(os.path.dirname(moving), exist_ok=True)
    with open(moving, "w", encoding="ascii") as f:
        f.write(location)
    for info in fs.get_file_info(pafs.FileSelector(staging, recursive=True)):
        base = posixpath.basename(info.path)
        if info.type != pafs.FileType.File or base.startswith(("_", ".")):
            continue
        relative = posixpath.relpath(posixpath.dirname(info.path), staging)
        folder = root if relative == "." else posixpath.join(root, relative)
        fs.create_dir(folder, recursive=True)
        fs.move(info.path, posixpath.join(folder, prefix + base))
    os.replace(moving, record)
    _delete_dir(fs, staging)


def _remove_moved(fs: pafs.FileSystem, root: str, prefix: str) -> None:
    for info in fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True)):
        if info.type == pafs.FileType.File and posixpath.basename(info.path).startswith(prefix):
            fs.delete_file(info.path)


def _delete_dir(fs: pafs.FileSystem, path: str) -> None:
    if fs.get_file_info(path).type != pafs.FileType.NotFound:
        fs.delete_dir(path)


# Spark's Hadoop names of S3 that pyarrow knows as s3.
_ARROW_SCHEMES = {"s3a": "s3", "s3n": "s3"}


def _for_arrow(location: str) -> str:
    scheme, sep, rest = location.partition("://")
    return f"{_ARROW_SCHEMES.get(scheme, scheme)}://{rest}" if sep else location


def _qualified(spark: Any, location: str) -> str:
    """`location` as a URI or absolute path: a relative one as Spark's file system resolves
    it (the working directory locally, the user's home on HDFS)."""
    if "://" in location or location.startswith("/"):
        return location
    path = spark._jvm.org.apache.hadoop.fs.Path(location)  # noqa: SLF001 - no Python API
    qualified = str(path.getFileSystem(spark._jsc.hadoopConfiguration())  # noqa: SLF001
                    .makeQualified(path))
    return qualified[len("file:"):] if qualified.startswith("file:") else qualified


def _uri(location: str, path: str) -> str:
    """`path` (pyarrow's, on the file system of `location`) as Spark's writer names it: an
    object store's path begins with its bucket, a file system's with `/` after the host."""
    if "://" not in location:
        return path
    scheme, rest = location.split("://", 1)
    if not path.startswith("/"):
        return f"{scheme}://{path}"
    authority = rest.split("/", 1)[0] if scheme != "file" else ""
    return f"{scheme}://{authority}{path}"
