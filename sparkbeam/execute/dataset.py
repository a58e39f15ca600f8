"""The dataset layer: every pyspark call the executor makes, in one place.

Buffers are DataFrames of encoded elements: (input int, key binary, value binary) going into a
stage and (tag int, key binary, value binary) coming out. Only DataFrames and `mapInArrow`:
faster on grouping than RDDs on this design's measurements, and the same code runs over Spark
Connect, where there are no RDDs.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import operator
import os
import re
import socket
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sparkbeam.engine.arrow import ArrowRows, to_arrow_batches
from sparkbeam.engine.key_runs import MAX_ORDERED_INPUTS, ORDER_INPUT_BITS, contiguous_keys
from sparkbeam.execute.session import FILE_OPEN_COST, bytes_setting, is_connect
from sparkbeam.plan.native_text import spark_splits
from sparkbeam.plan.arrow_batches import SPARK_BATCH_ROWS

_LOG = logging.getLogger(__name__)

# A stage's input rows are (input: int, key: binary or null, value: binary).
OUT_SCHEMA = T.StructType(
    [
        T.StructField("tag", T.IntegerType(), False),
        T.StructField("key", T.BinaryType(), True),
        T.StructField("value", T.BinaryType(), False),
    ]
)


# Types as objects, never as SQL text: a type name or expression in a string goes through
# Spark's SQL parser (ANTLR), whose first use in a JVM costs ~0.3 s (its grammar's tables are
# built then; bench/ANALYSIS.md), and every later one ~1-30 ms. Objects are sent as JSON.
_BINARY = T.BinaryType()
_INT = T.IntegerType()
_KEY_VALUE = T.StructType([T.StructField("key", _BINARY, True),
                           T.StructField("value", _BINARY, True)])

ARROW_BATCH_BYTES = "spark.sql.execution.arrow.maxBytesPerBatch"
ARROW_BATCH_ROWS = "spark.sql.execution.arrow.maxRecordsPerBatch"
#: The bits of the key's hash a keyed shuffle sorts by (`by_key`): all above the input
#: number's. Tests narrow it to make keys collide.
ORDER_HASH_MASK = -(1 << ORDER_INPUT_BITS)
#: What turns a task's Arrow batches into (input, key, value) batches (`map_stage`'s `prepare`).
BatchReader = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]


class _Columns:
    """The column expressions a session's stages are declared with, each built once. On a
    classic session every Column built from a name or a literal is 3-14 py4j calls (`F.col`
    13, `.cast` 14, `.alias` 11, measured), and every stage declares the same few: a tiny
    pipeline's job made ~930 calls, two thirds of them for these. A Column is an unresolved
    expression, analysed anew in each plan that uses it, so sharing one is safe."""

    _LIMIT = 4096  # keys are small ints (tags, input numbers); a bound all the same

    def __init__(self) -> None:
        self._made: dict[tuple[Any, ...], Column] = {}

    def get(self, key: tuple[Any, ...], make: Callable[[], Column]) -> Column:
        column = self._made.get(key)
        if column is None:
            if len(self._made) >= self._LIMIT:
                self._made.clear()
            column = self._made[key] = make()
        return column

    def col(self, name: str) -> Column:
        return self.get(("col", name), lambda: F.col(name))

    def int_literal(self, value: int, alias: str) -> Column:
        return self.get(("int", value, alias), lambda: F.lit(value).cast(_INT).alias(alias))

    def null_key(self) -> Column:
        return self.get(("null key",), lambda: F.lit(None).cast(_BINARY).alias("key"))

    def tag_is(self, tag: int) -> Column:
        return self.get(("tag", tag), lambda: self.col("tag") == tag)


# Per session: a session's Columns hold objects of its JVM gateway.
_COLUMNS: weakref.WeakKeyDictionary[SparkSession, _Columns] = weakref.WeakKeyDictionary()


def _columns_of(spark: SparkSession) -> _Columns:
    columns = _COLUMNS.get(spark)
    if columns is None:
        columns = _COLUMNS.setdefault(spark, _Columns())
    return columns


class Datasets:
    """DataFrame operations over one SparkSession, with job groups for cancellation."""

    def __init__(self, spark: SparkSession, parallelism: int | None = None) -> None:
        self.spark = spark
        self.connect = is_connect(spark)
        self.parallelism = parallelism or _default_parallelism(spark, self.connect)
        self._c = _columns_of(spark)
        self._file_settings: tuple[int, int] | None = None  # read once (`file_partitions`)

    # -- building buffers -------------------------------------------------------------------

    def impulse(self, value: bytes) -> DataFrame:
        return self._literal_rows(1, value)

    def empty(self) -> DataFrame:
        return self._literal_rows(0, b"")

    def _literal_rows(self, count: int, value: bytes) -> DataFrame:
        """`count` rows (input 0, no key, `value`) made by the JVM: a classic session's
        createDataFrame of local rows goes through a Python RDD, which costs each task that
        reads it a Python worker and the first job a second worker daemon (~1 s to start,
        with Beam's imports)."""
        c = self._c

        def literal() -> Column:
            return F.lit(bytearray(value)).cast(_BINARY).alias("value")

        # Kept only when short: the impulse's few bytes, the same for every job.
        value_column = c.get(("value", value), literal) if len(value) <= 64 else literal()
        return self.spark.range(0, count, 1, 1).select(
            c.int_literal(0, "input"), c.null_key(), value_column)

    def text_lines(self, paths: list[str], prefix: bytes) -> DataFrame:
        """The lines of local text files as a buffer of encoded elements (`prefix`, the
        line's length as a varint, its bytes: `plan/native_text.py`), made by Spark's text
        source in the JVM. Lines end at '\\n'; one '\\r' before it is dropped from the
        bytes, which are never decoded here."""
        if not paths:
            return self.empty()
        lines = self.raw_lines(paths).select(self._c.get(("line",), _line))
        c = self._c
        # Built once per session (and prefix): the varint alone is ~60 Columns, ~0.04 s of
        # py4j calls a job.
        element = c.get(("text element", prefix), lambda: _text_element(prefix))
        return lines.select(c.get(("stripped line",), _stripped_line)).select(
            c.null_key(), element)

    def raw_lines(self, paths: list[str]) -> DataFrame:
        """The lines of local text files (at least one) as Spark's text source gives them:
        one string column, each line cut at '\\n' (`engine/arrow.py`'s `encoded_lines` makes
        elements of them in the reading stage's tasks)."""
        # Spark's options to skip files it cannot read, off: Beam fails on them.
        return (self.spark.read.option("lineSep", "\n").option("ignoreCorruptFiles", "false")
                .option("ignoreMissingFiles", "false")
                .text([f"file://{p}" for p in paths]))

    def encode_rows(self, df: DataFrame, prepare: BatchReader, name: str = "") -> DataFrame:
        """Any DataFrame's rows as a buffer: `prepare`, in each task, turns its Arrow batches
        into batches of (input, key, value)."""

        def encode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            for batch in prepare(batches):
                yield pa.RecordBatch.from_arrays([batch.column(1), batch.column(2)],
                                                 names=["key", "value"])

        if name:
            encode.__name__ = encode.__qualname__ = _ui_name(name)
        return df.mapInArrow(encode, _KEY_VALUE)

    def decode_rows(self, df: DataFrame,
                    decoder: Callable[[], Callable[[list[bytes]], pa.RecordBatch]],
                    schema: T.StructType, name: str = "") -> DataFrame:
        """A buffer's elements as rows of `schema`: in each task, `decoder()` makes the
        function that turns a list of encoded elements into an Arrow batch of them."""

        def decode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            convert = decoder()
            for batch in batches:
                if batch.num_rows:
                    yield convert(batch.column(0).to_pylist())

        if name:
            decode.__name__ = decode.__qualname__ = _ui_name(name)
        return df.select("value").mapInArrow(decode, schema)

    def file_partitions(self, sizes: Iterable[int]) -> int:
        """How many tasks Spark's file source makes of files of `sizes` bytes, by its rule
        (`native_text.spark_splits`) and the session's open cost and largest split. More
        splits were tried (four a core, for a shorter tail): each task's lifted combiners
        then flush once more, and a word count's shuffle grew by as much."""
        if self._file_settings is None:
            self._file_settings = (
                bytes_setting(self.spark, "spark.sql.files.openCostInBytes", FILE_OPEN_COST),
                bytes_setting(self.spark, "spark.sql.files.maxPartitionBytes", 128 << 20))
        open_cost, max_bytes = self._file_settings
        return max(1, spark_splits(sizes, self.parallelism, open_cost, max_bytes))

    def with_metric_rows(self, out: DataFrame, tag: int, index: int, metrics_tag: int
                         ) -> DataFrame:
        """A stage output's rows tagged `tag` as input `index`, and its metric rows as input
        `metrics_tag`, in one pass over it (two selections of an unpersisted output would
        compute it twice)."""
        c = self._c
        either = c.get(("tag or", tag, metrics_tag),
                       lambda: c.tag_is(tag) | c.tag_is(metrics_tag))
        number = c.get(("input or metrics", index, metrics_tag), lambda: F.when(
            c.tag_is(metrics_tag), F.lit(metrics_tag)).otherwise(F.lit(index)).cast(_INT)
            .alias("input"))
        return out.where(either).select(number, c.col("key"), c.col("value"))

    def as_input(self, df: DataFrame, index: int) -> DataFrame:
        """A buffer's rows tagged as input number `index` of the reading stage."""
        c = self._c
        return df.select(c.int_literal(index, "input"), c.col("key"), c.col("value"))

    def union(self, dfs: list[DataFrame]) -> DataFrame:
        """Buffers (key, value) or stage inputs unioned; no parts is an empty input."""
        return _union(dfs) if dfs else self.empty()

    def by_key(self, df: DataFrame, inputs: int = 1) -> tuple[DataFrame, BatchReader | None]:
        """Each key in exactly one partition, its rows together and ordered by input: the
        shuffle; with how the stage's tasks must read its batches (`map_stage`'s `prepare`).
        Rows are sorted by one long, `order`: the key's hash in the high 48 bits over the
        input number, which Spark sorts by radix, and read through `contiguous_keys`, which
        keeps two keys with the same hash apart (`engine/key_runs.py`). A stage with more
        `inputs` than the low bits hold is sorted by (key, input) instead, with no `order`
        column and no reader."""
        c = self._c
        key = c.col("key")
        parted = df.repartition(self.parallelism, key)
        if inputs >= MAX_ORDERED_INPUTS:
            return parted.sortWithinPartitions(key, c.col("input")), None
        mask = ORDER_HASH_MASK
        order = c.get(("order", mask), lambda: F.xxhash64(key).bitwiseAND(F.lit(mask))
                      .bitwiseOR(c.col("input").cast(T.LongType())
                                 .bitwiseAND(F.lit(MAX_ORDERED_INPUTS))).alias("order"))
        # The input number travels in `order`'s low bits only (`contiguous_keys` reads it).
        return (parted.select(key, c.col("value"), order)
                .sortWithinPartitions(c.col("order")), contiguous_keys)

    def spread(self, df: DataFrame) -> DataFrame:
        """Rows dealt round-robin over the partitions (initial splits of splittable DoFns)."""
        return df.repartition(self.parallelism)

    def select_tag(self, df: DataFrame, tag: int) -> DataFrame:
        c = self._c
        return df.where(c.tag_is(tag)).select(c.col("key"), c.col("value"))

    # -- running stages ---------------------------------------------------------------------

    def map_stage(
        self,
        df: DataFrame,
        task: Callable[[Iterable[tuple[int, Any, bytes]], tuple[int, int, int]], Iterator[tuple]],
        name: str = "",
        prepare: BatchReader | None = None,
        persist: bool = True,
    ) -> DataFrame:
        """Runs `task(rows, attempt)` over each partition; `attempt` is Spark's (stage id,
        partition id, attempt number). The output is persisted once, so every consumer reads
        it without recomputing (which would repeat side effects and metrics); not with
        `persist=False`, for an output read once (by one shuffle, by one plain stage in the
        same tasks, or by the next action alone). `prepare`, if given, first turns each
        partition's batches of `df` into (input, key, value) batches, in the same task (a
        query's rows encoded where they are consumed: no second trip between the JVM and
        Python)."""

        def arrow_task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            from pyspark import TaskContext

            tc = TaskContext.get()
            attempt = (tc.stageId(), tc.partitionId(), tc.attemptNumber()) if tc else (0, 0, 0)
            if prepare is not None:
                batches = prepare(batches)
            yield from to_arrow_batches(task(ArrowRows(batches), attempt))

        if name:
            # The SQL tab of the Spark UI names each MapInArrow node by its function.
            arrow_task.__name__ = arrow_task.__qualname__ = _ui_name(name)
        out = df.mapInArrow(arrow_task, OUT_SCHEMA)
        return out.persist(StorageLevel.MEMORY_AND_DISK) if persist else out

    def collect_tag(self, df: DataFrame, tag: int) -> list[tuple[bytes | None, bytes]]:
        """The (key, value) rows tagged `tag` of a stage output, as Arrow columns."""
        table = self.select_tag(df, tag).toArrow()
        return list(zip(table.column("key").to_pylist(), table.column("value").to_pylist(),
                        strict=True))

    def master(self) -> str:
        """The session's master URL ('' when Spark Connect does not say)."""
        if self.connect:
            try:
                return str(self.spark.conf.get("spark.master", "") or "")
            except Exception:  # noqa: BLE001 - a Connect server may refuse to tell
                return ""
        return str(self.spark.sparkContext.master)

    def driver_host(self) -> str:
        """Where tasks can reach the driver (for live metrics)."""
        if self.connect:
            # The Spark driver is the Connect server's; the collector runs in this client.
            return _client_host(self.spark)
        try:
            return str(self.spark.conf.get("spark.driver.host", "127.0.0.1"))
        except Exception:  # noqa: BLE001 - Connect sessions may not expose it
            return "127.0.0.1"

    def gather(
        self, sides: list[DataFrame], stage_outs: list[tuple[DataFrame, tuple[int, ...]]],
        tag: int,
    ) -> tuple[list[list[bytes]], list[tuple[bytes | None, bytes]], list[dict[int, list[bytes]]]]:
        """In one Spark action: the values of each side-input buffer, each in its own order;
        the rows tagged `tag` of the stage outputs (their metric rows); and, per stage output,
        the values of the other tags given with it, each tag's in its order (one pass over an
        output that is not persisted). Spark runs every stage these need, side by side where
        they are independent; nothing to gather is no action at all."""
        c = self._c
        parts = [df.select(c.int_literal(n, "part"), c.int_literal(0, "tag"), c.null_key(),
                           c.col("value"))
                 for n, df in enumerate(sides)]
        for n, (out, tags) in enumerate(stage_outs):
            wanted = c.get(("tags", tag, tags), functools.partial(_any_tag, c, (tag, *tags)))
            parts.append(out.where(wanted).select(
                c.int_literal(-1 - n, "part"), c.col("tag"), c.col("key"), c.col("value")))
        values: list[list[bytes]] = [[] for _ in sides]
        tagged: list[tuple[bytes | None, bytes]] = []
        outs: list[dict[int, list[bytes]]] = [{t: [] for t in tags} for _, tags in stage_outs]
        if not parts:
            return values, tagged, outs
        # As Arrow columns: a Row per element through Spark's pickler took ~10x as long
        # (100k rows: 2.2-2.8 s against 0.19-0.35 s). A union keeps each part's rows in order,
        # and Spark hands the Arrow batches over in partition order.
        table = _union(parts).toArrow()
        columns = [table.column(name).to_pylist() for name in ("part", "tag", "key", "value")]
        for part, row_tag, key, value in zip(*columns, strict=True):
            if part >= 0:
                values[part].append(value)
            elif row_tag == tag:
                tagged.append((key, value))
            else:
                outs[-1 - part][row_tag].append(value)
        return values, tagged, outs

    def release(self, df: DataFrame) -> None:
        with contextlib.suppress(Exception):
            df.unpersist(blocking=False)

    def add_py_file(self, path: str) -> None:
        """Makes an importable archive (wheel, zip, egg) available to every executor; once per
        session and path (Spark keeps what was added for the session's life)."""
        key = (id(self.spark), path)
        if key in _ADDED:
            return
        if self.connect:
            self.spark.addArtifacts(path, pyfile=True)
        else:
            self.spark.sparkContext.addPyFile(path)
        _ADDED.add(key)

    def ship_sparkbeam(self) -> bool:
        """Ships this sparkbeam (a zip of the package) to executors that may not have it (any
        master but local). Once per session; True when it shipped now. Not over Connect: the
        server's Python workers need sparkbeam installed (its own daemon settings rule)."""
        if self.connect or str(self.spark.sparkContext.master).startswith("local"):
            return False
        key = id(self.spark)
        if key in _SHIPPED_TO:
            return False
        self.add_py_file(_sparkbeam_zip())
        _SHIPPED_TO.add(key)
        return True

    def ship(self, value: Any) -> Any:
        """Makes `value` available to tasks: a broadcast on classic Spark; over Connect (no
        broadcasts) the value travels inside the task's pickled closure."""
        if self.connect:
            return _Captured(value)
        return _Shipped(self.spark.sparkContext.broadcast(value))

    # -- job groups -------------------------------------------------------------------------

    @contextlib.contextmanager
    def job_group(self, group: str, description: str) -> Iterator[None]:
        if self.connect:
            # Connect has job tags (per client thread) instead of job groups.
            self.spark.addTag(group)
            try:
                yield
            finally:
                self.spark.removeTag(group)
            return
        sc = self.spark.sparkContext
        sc.setJobGroup(group, description, interruptOnCancel=True)
        try:
            yield
        finally:
            sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
            sc.setLocalProperty("spark.job.description", None)  # type: ignore[arg-type]

    def session_arrow_rows(self) -> int | None:
        """The Arrow batches' row limit the session holds (Spark's 10,000 unless set), which
        wins over a job's own; None over Connect, where no job sets its own."""
        if self.connect:
            return None
        return int(self.spark.conf.get(ARROW_BATCH_ROWS, None) or SPARK_BATCH_ROWS)

    @contextlib.contextmanager
    def arrow_batch_limits(self, limit: int | None, rows: int | None = None) -> Iterator[None]:
        """The Spark jobs this thread starts meanwhile cut the Arrow batches of their Python
        workers at `limit` bytes and `rows` rows (None: as the session says). Local
        properties of this thread's jobs, not session settings: other jobs on the session
        keep theirs, and a value the session sets explicitly still wins (Spark copies the
        session's settings over a job's properties). Not over Connect, which has no local
        properties."""
        props = {name: value for name, value in ((ARROW_BATCH_BYTES, limit),
                                                 (ARROW_BATCH_ROWS, rows)) if value is not None}
        if not props or self.connect:
            yield
            return
        sc = self.spark.sparkContext
        for name, value in props.items():
            sc.setLocalProperty(name, str(value))
        try:
            yield
        finally:
            for name in props:
                sc.setLocalProperty(name, None)  # type: ignore[arg-type]

    def describe(self, description: str) -> None:
        if self.connect:
            return  # no job descriptions over Connect
        self.spark.sparkContext.setJobDescription(description)

    def spark_jobs(self, group: str) -> int | None:
        """How many Spark jobs ran in the job group (None over Connect, which does not say)."""
        if self.connect:
            return None
        try:
            sc = self.spark.sparkContext
            # The status store learns of jobs from Spark's listener bus, asynchronously.
            with contextlib.suppress(Exception):
                sc._jsc.sc().listenerBus().waitUntilEmpty(5000)  # type: ignore[union-attr]
            return len(sc.statusTracker().getJobIdsForGroup(group))
        except Exception:  # noqa: BLE001 - a count is informative only
            return None

    def cancel(self, group: str) -> None:
        if self.connect:
            self.spark.interruptTag(group)
            return
        self.spark.sparkContext.cancelJobGroup(group)


class _Shipped:
    """A handle whose `.value` works on the executors."""

    def __init__(self, broadcast: Any) -> None:
        self._broadcast = broadcast

    @property
    def value(self) -> Any:
        return self._broadcast.value


class _Captured:
    """Over Connect: the value itself, pickled with the task; `.value` like a broadcast."""

    def __init__(self, value: Any) -> None:
        self.value = value


_FALLBACK_PARALLELISM = 8


def _default_parallelism(spark: SparkSession, connect: bool = False) -> int:
    if connect:
        # No SparkContext: the server's spark.default.parallelism when it is set.
        try:
            configured = spark.conf.get("spark.default.parallelism", None)
            return max(1, int(configured)) if configured else _FALLBACK_PARALLELISM
        except Exception:  # noqa: BLE001 - unreadable or not a number
            return _FALLBACK_PARALLELISM
    try:
        return max(1, int(spark.sparkContext.defaultParallelism))
    except Exception:  # noqa: BLE001 - no usable SparkContext
        return _FALLBACK_PARALLELISM


def _client_host(spark: Any) -> str:
    """This client's address as the Connect server's executors would see it: loopback for a
    local server, else the local address of the route to the server."""
    host = "127.0.0.1"
    with contextlib.suppress(Exception):
        host = str(spark.client.host)
    if host in ("localhost", "127.0.0.1", "::1", ""):
        return "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((host, 9))  # UDP: no packet is sent
            return str(probe.getsockname()[0])
    except OSError:
        return "127.0.0.1"


_SHIPPED_TO: set[int] = set()
_ADDED: set[tuple[int, str]] = set()  # (session, path) pairs added with add_py_file


def _sparkbeam_zip() -> str:
    """The sparkbeam package as an importable zip (built once per process, named by content)."""
    import hashlib
    import tempfile
    import zipfile

    import sparkbeam

    root = os.path.dirname(os.path.abspath(sparkbeam.__file__))
    files = sorted(
        os.path.join(d, f) for d, _, names in os.walk(root) for f in names if f.endswith(".py")
    )
    digest = hashlib.sha256()
    for path in files:
        with open(path, "rb") as f:
            digest.update(path[len(root):].encode() + f.read())
    target = os.path.join(tempfile.gettempdir(), f"sparkbeam-{digest.hexdigest()[:12]}.zip")
    if not os.path.exists(target):
        partial = f"{target}.{os.getpid()}.tmp"
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as z:
            for path in files:
                z.write(path, os.path.join("sparkbeam", os.path.relpath(path, root)))
        os.replace(partial, target)
    return target


def _ui_name(text: str, limit: int = 120) -> str:
    """`stage-003 [Count/CombinePerKey]` as an identifier: stage_003__Count_CombinePerKey."""
    return re.sub(r"\W+", "_", text).strip("_")[:limit] or "sparkbeam_stage"


def _line() -> Column:
    return F.col("value").cast(_BINARY).alias("line")


def _stripped_line() -> Column:
    """The line without the one '\\r' that may end it (Beam drops it with the '\\n')."""
    line = F.col("line")
    n = F.octet_length(line)
    return F.when((n > 0) & (F.substring(line, -1, 1) == F.lit(bytearray(b"\r"))),
                  F.substring(line, F.lit(1), n - 1)).otherwise(line).alias("line")


def _text_element(prefix: bytes) -> Column:
    """A line's encoded element: `prefix`, its length as a varint, its bytes."""
    line = F.col("line")
    return F.concat(F.lit(bytearray(prefix)).cast(_BINARY), _varint(F.octet_length(line)),
                    line).alias("value")


def _varint(length: Column) -> Column:
    """Beam's varint of the int column `length` (< 2**35), as binary: one byte per 7 bits,
    low first, the high bit set on all but the last."""
    parts = []
    for i in range(5):
        more = F.when(length >= F.lit(1 << 7 * (i + 1)), F.lit(128)).otherwise(F.lit(0))
        byte = F.shiftright(length, 7 * i).bitwiseAND(F.lit(127)).bitwiseOR(more)
        one = F.unhex(F.lpad(F.hex(byte), 2, "0"))
        parts.append(one if i == 0 else F.when(length >= F.lit(1 << 7 * i), one)
                     .otherwise(F.lit(bytearray())))
    return F.concat(*parts)


def _any_tag(c: _Columns, tags: tuple[int, ...]) -> Column:
    return functools.reduce(operator.or_, [c.tag_is(t) for t in tags])


def _union(dfs: list[DataFrame]) -> DataFrame:
    out = dfs[0]
    for df in dfs[1:]:
        out = out.unionByName(df)
    return out
