"""Spark's tables and data sources as Beam sources and sinks: `ReadFromSpark`, `WriteToSpark`.

Both are plain Beam transforms, so they run on any runner in the simplest correct way: the
read is a bounded source that runs the query on a SparkSession in the process that reads it
(the active one, else a local one) and yields its rows; the write gathers the rows into one
element and writes them with such a session. On sparkbeam neither runs that way: at Prepare
the read becomes a data input of its consumers' stage made from the query's DataFrame, and the
write a Spark write of the input's DataFrame (`plan/native_spark.py`), so the data never
passes through one process and only the conversion between Arrow and Beam's encoding runs in
Python.

The query's schema is resolved when the pipeline is built (Beam needs a PCollection's coder
then): with `schema=` as given, else by asking Spark (which for files may infer it).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, cast

import apache_beam as beam
from apache_beam.coders import RowCoder
from apache_beam.io import iobase
from apache_beam.io.range_trackers import OffsetRangeTracker
from apache_beam.portability.api import schema_pb2
from apache_beam.transforms.window import GlobalWindows
from apache_beam.typehints import schemas

from sparkbeam import urns
from sparkbeam.io.spark_schema import (
    UnsupportedSparkType,
    beam_schema,
    spark_schema,
    to_arrow,
    to_beam,
)

MODES = ("append", "overwrite", "error", "errorifexists", "ignore")
FILE_FORMATS = urns.SPARK_FILE_FORMATS


@dataclass(frozen=True)
class SparkQuery:
    """What to read: a table, a data source (`format`, `path`, `options`) or a SQL query."""

    table: str | None = None
    format: str | None = None
    path: str | None = None
    options: tuple[tuple[str, str], ...] = ()
    sql: str | None = None
    schema: str | None = None  # a Spark schema as JSON, as the user gave it
    # The schema its rows had when the pipeline was built (JSON): the Beam schema's source.
    expected: str | None = None
    # A stream (`spark.readStream`), read by sparkbeam's streaming engine only; its elements'
    # timestamps come from `timestamp_column` (else the micro-batch's processing time), and
    # its watermark trails the latest timestamp read by `watermark_delay_micros`.
    stream: bool = False
    timestamp_column: str | None = None
    watermark_delay_micros: int = 0

    def __post_init__(self) -> None:
        given = [k for k in ("table", "format", "sql") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError("ReadFromSpark reads one of: a table name, format= (with path= "
                             "and options=) or sql=; got "
                             + (", ".join(f"{k}=" for k in given) or "none"))
        if self.path and not self.format:
            raise ValueError("ReadFromSpark: path= needs format= (e.g. format='parquet')")
        if self.stream and self.sql:
            raise ValueError("ReadFromSpark: a stream reads a table or format= (Spark's "
                             "readStream); sql= is a batch query")
        if self.timestamp_column and not self.stream:
            raise ValueError("ReadFromSpark: timestamp_column= is for streams (a bounded "
                             "read's elements are at the minimum timestamp); timestamp the "
                             "rows with beam.Map(lambda r: TimestampedValue(r, ...))")
        if self.watermark_delay_micros < 0:
            raise ValueError("ReadFromSpark: watermark_delay must not be negative")

    def describe(self) -> str:
        what = "a stream of " if self.stream else ""
        if self.table:
            return f"{what}table {self.table}"
        if self.sql:
            return f"SQL query {self.sql!r}"
        return f"{what}{self.format} data" + (f" at {self.path}" if self.path else "")

    def stream_dataframe(self, spark: Any, limits: Mapping[str, str] | None = None) -> Any:
        """The stream's DataFrame on `spark` (`spark.readStream`), with the source options
        `limits` besides the user's (the work budget's, `streaming/spark_streams.py`). File
        sources read with the schema the pipeline was built with (Spark does not infer one
        for a stream)."""
        options = dict(self.options) | dict(limits or {})
        if self.table:
            df = spark.readStream.options(**options).table(self.table)
        else:
            reader = spark.readStream.format(self.format).options(**options)
            schema = self.schema or (self.expected if self.format in FILE_FORMATS else None)
            if schema:
                reader = reader.schema(_struct(schema))
            df = reader.load(self.path) if self.path else reader.load()
        if self.expected and _shape(df.schema) != _shape(_struct(self.expected)):
            raise ValueError(f"{self.describe()} has columns {df.schema.simpleString()}, not "
                             "the schema it had when the pipeline was built: "
                             f"{_struct(self.expected).simpleString()}")
        return df

    def stream_schema(self, spark: Any) -> Any:
        """The stream's Spark schema, asked when the pipeline is built: a file source's from
        the files already there (Spark's batch reader), since a stream infers none."""
        if self.schema:
            return _struct(self.schema)
        try:
            return self.stream_dataframe(spark).schema
        except Exception as exc:  # noqa: BLE001 - Spark's analysis errors
            if self.format not in FILE_FORMATS or not self.path:
                raise ValueError(f"ReadFromSpark of {self.describe()}: Spark gives no schema "
                                 f"({type(exc).__name__}: {exc}); pass schema=") from exc
        try:
            return spark.read.format(self.format).options(**dict(self.options)).load(
                self.path).schema
        except Exception as exc:  # noqa: BLE001 - e.g. an empty landing directory
            raise ValueError(f"ReadFromSpark of {self.describe()}: no files to infer a schema "
                             f"from ({type(exc).__name__}); pass schema=") from exc

    def dataframe(self, spark: Any) -> Any:
        """The query's DataFrame on `spark`, its columns checked against the schema given
        and the one the pipeline was built with (the data may have changed since)."""
        given = _struct(self.schema) if self.schema else None
        if self.table:
            df = spark.read.table(self.table)
        elif self.sql:
            df = spark.sql(self.sql)
        else:
            reader = spark.read.format(self.format).options(**dict(self.options))
            if given is not None:
                reader = reader.schema(given)
            df = reader.load(self.path) if self.path else reader.load()
        for what, want in (("the schema given", self.schema),
                           ("the schema it had when the pipeline was built", self.expected)):
            if want and _shape(df.schema) != _shape(_struct(want)):
                raise ValueError(f"{self.describe()} has columns {df.schema.simpleString()}, "
                                 f"not {what}: {_struct(want).simpleString()}")
        return df


def _struct(json_text: str) -> Any:
    from pyspark.sql import types as T

    return T._parse_datatype_json_string(json_text)  # noqa: SLF001 - Spark's own reader


def _shape(dt: Any) -> Any:
    """A Spark type without nullability: file sources read with a schema make every column
    nullable, and Beam's rows do not care until a null arrives (which its coder refuses)."""
    from pyspark.sql import types as T

    if isinstance(dt, T.StructType):
        return tuple((f.name, _shape(f.dataType)) for f in dt.fields)
    if isinstance(dt, T.ArrayType):
        return ("array", _shape(dt.elementType))
    if isinstance(dt, T.MapType):
        return ("map", _shape(dt.keyType), _shape(dt.valueType))
    return dt.simpleString()


def spark_session(pipeline: beam.Pipeline | None = None) -> Any:
    """The SparkSession to use: the one `pipeline`'s runner runs on, if it says (sparkbeam:
    made from the pipeline's options, so `--spark_master` or `--spark_remote` hold), else the
    process's active one, else a new local one."""
    for_pipeline = getattr(getattr(pipeline, "runner", None), "spark_session", None)
    if callable(for_pipeline):
        return for_pipeline(pipeline.options)  # type: ignore[union-attr]
    from pyspark.sql import SparkSession

    return SparkSession.builder.getOrCreate()


class SparkSource(iobase.BoundedSource):  # type: ignore[misc]
    """A query's rows as a Beam source. sparkbeam recognises it by `sparkbeam_spark_query`
    (the planner imports nothing from this package) and reads it with Spark instead."""

    def __init__(self, query: SparkQuery, schema: schema_pb2.Schema) -> None:
        self.query = query
        self._schema = schema.SerializeToString()  # protos do not pickle by value

    @property
    def schema(self) -> schema_pb2.Schema:
        return schema_pb2.Schema.FromString(self._schema)

    @property
    def sparkbeam_spark_query(self) -> SparkQuery:
        return self.query

    def to_beam(self) -> Any:
        """Arrow batch of the query's rows -> Beam rows (for the planner's executor)."""
        return to_beam(self.schema)

    def estimate_size(self) -> int | None:
        return None

    def split(self, desired_bundle_size: int, start_position: Any = None,
              stop_position: Any = None) -> Iterator[iobase.SourceBundle]:
        yield iobase.SourceBundle(1, self, 0, 1)  # one reader: Spark's plan is the parallelism

    def get_range_tracker(self, start_position: Any, stop_position: Any) -> OffsetRangeTracker:
        return OffsetRangeTracker(start_position or 0, 1 if stop_position is None
                                  else stop_position)

    def read(self, range_tracker: OffsetRangeTracker) -> Iterator[Any]:
        if not range_tracker.try_claim(0):
            return
        if self.query.expected is None:
            raise ValueError("this SparkSource was not made by ReadFromSpark.expand")
        if self.query.stream:
            raise ValueError(_STREAM_ELSEWHERE.format(self.query.describe()))
        rows = self.to_beam()
        table = self.query.dataframe(spark_session()).toArrow()
        for batch in table.to_batches():
            yield from rows(batch)

    def default_output_coder(self) -> RowCoder:
        return RowCoder(self.schema)


_STREAM_ELSEWHERE = ("ReadFromSpark of {} runs on sparkbeam's streaming engine only (Spark's "
                     "readStream is part of its query); on other runners read a snapshot "
                     "with streaming=False")


def _runs_elsewhere(pipeline: beam.Pipeline) -> bool:
    """Whether `pipeline` is known to run on a runner other than sparkbeam (a portable
    runner may submit to sparkbeam's job server: not known)."""
    from apache_beam.runners.portability.portable_runner import PortableRunner

    runner = getattr(pipeline, "runner", None)
    return (runner is not None and not callable(getattr(runner, "spark_session", None))
            and not isinstance(runner, PortableRunner))


class ReadFromSpark(beam.PTransform):  # type: ignore[misc]
    """Rows of a Spark table, data source or SQL query as a schema'd PCollection.

    `ReadFromSpark("db.events")`, `ReadFromSpark(format="parquet", path="/data/events")`,
    `ReadFromSpark(sql="SELECT ...")`. Elements are Beam rows (named tuples, read by
    attribute like `beam.Row`). The schema is `schema=` (a StructType or DDL) or asked of
    Spark when the transform is applied, on the session the pipeline's runner uses (see
    `session`); a column Beam has no type for is refused then, naming it.

    In a streaming pipeline (or with `streaming=True`) it reads `spark.readStream`: a table,
    or a source such as files landing in a directory (`format="json", path=...`), Spark's
    rate source or Kafka through Spark's connector; only sparkbeam's streaming engine runs
    it. Elements are timestamped by `timestamp_column` (a timestamp column), else by the
    micro-batch's processing time. The watermark trails the latest timestamp read by
    `watermark_delay` seconds (a row older than that is late, as in Spark's
    `withWatermark`); under processing time no row is ever late."""

    def __init__(self, table: str | None = None, *, format: str | None = None,
                 path: str | None = None, options: Mapping[str, Any] | None = None,
                 sql: str | None = None, schema: Any = None, streaming: bool | None = None,
                 timestamp_column: str | None = None, watermark_delay: float = 0.0) -> None:
        super().__init__()
        self._streaming = streaming
        self._timestamp_column = timestamp_column
        self._delay = int(round(watermark_delay * 1_000_000))
        from pyspark.sql import types as T

        if schema is not None and not isinstance(schema, (str, T.StructType)):
            raise TypeError(f"ReadFromSpark: schema= takes a Spark StructType or a DDL string, "
                            f"not {type(schema).__name__}")
        # A DDL string is parsed by Spark, in expand (when there is a session to ask).
        self._ddl = schema if isinstance(schema, str) else None
        self.query = SparkQuery(table, format, path, tuple(sorted(
            (str(k), str(v)) for k, v in (options or {}).items())), sql,
            schema.json() if isinstance(schema, T.StructType) else None)

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        from pyspark.sql import types as T

        from apache_beam.options.pipeline_options import StandardOptions

        stream = (self._streaming if self._streaming is not None
                  else bool(pbegin.pipeline.options.view_as(StandardOptions).streaming))
        query = dataclasses.replace(self.query, stream=stream,
                                    timestamp_column=self._timestamp_column,
                                    watermark_delay_micros=self._delay)
        if stream and _runs_elsewhere(pbegin.pipeline):
            raise ValueError(_STREAM_ELSEWHERE.format(query.describe()))
        if self._ddl is not None:
            spark_session(pbegin.pipeline)  # DDL is parsed by Spark
            query = dataclasses.replace(query, schema=T._parse_datatype_string(  # noqa: SLF001
                self._ddl).json())
        given = query.schema
        if given:
            spark_type = cast(T.StructType, _struct(given))
        elif stream:
            spark_type = query.stream_schema(spark_session(pbegin.pipeline))
        else:
            spark_type = query.dataframe(spark_session(pbegin.pipeline)).schema
        try:
            schema = beam_schema(spark_type)
        except UnsupportedSparkType as exc:
            raise UnsupportedSparkType(f"ReadFromSpark of {query.describe()}: {exc}"
                                       ) from None
        column = query.timestamp_column
        if column is not None and not any(
                f.name == column and isinstance(f.dataType, (T.TimestampType, T.TimestampNTZType))
                for f in spark_type.fields):
            raise ValueError(f"ReadFromSpark of {query.describe()}: timestamp_column={column!r} "
                             f"is not a timestamp column of {spark_type.simpleString()}")
        query = dataclasses.replace(query, expected=spark_type.json())
        rows = pbegin | beam.io.Read(SparkSource(query, schema))
        # Read says Any; consumers need the schema.
        rows.element_type = schemas.named_tuple_from_schema(schema)
        if stream:
            rows.is_bounded = False  # Beam's windowing checks apply as to any stream
        return rows


@dataclass(frozen=True)
class SparkWrite:
    """Where to write: a table (`mode`), or a data source at a path (`format`, `path`); with
    the Beam schema of the rows once the input is known."""

    table: str | None = None
    format: str | None = None
    path: str | None = None
    mode: str = "error"
    options: tuple[tuple[str, str], ...] = ()
    partition_by: tuple[str, ...] = ()
    schema: bytes = b""  # Beam's schema of the rows, serialized (protos do not pickle)

    def __post_init__(self) -> None:
        if bool(self.table) == bool(self.format):
            raise ValueError("WriteToSpark writes to a table name or to format= (with path=), "
                             "not both and not neither")
        if self.mode not in MODES:
            raise ValueError(f"WriteToSpark: mode={self.mode!r}; one of {', '.join(MODES)}")

    def describe(self) -> str:
        if self.table:
            return f"table {self.table}"
        return f"{self.format} data" + (f" at {self.path}" if self.path else "")

    def beam_schema(self) -> schema_pb2.Schema:
        return schema_pb2.Schema.FromString(self.schema)

    def struct(self) -> Any:
        """The Spark schema the rows are written with."""
        return spark_schema(self.beam_schema())

    def to_arrow(self, rows: list[Any]) -> Any:
        """Beam rows as an Arrow batch of `struct()`."""
        return to_arrow(self.beam_schema(), self.struct(), rows)

    def write(self, df: Any) -> None:
        writer = df.write.mode(self.mode).options(**dict(self.options))
        if self.partition_by:
            writer = writer.partitionBy(*self.partition_by)
        if self.table:
            writer.saveAsTable(self.table)
        elif self.path:
            writer.format(self.format).save(self.path)
        else:
            writer.format(self.format).save()


def _refuse(row: Any, what: str) -> None:
    raise ValueError(f"{what} runs on sparkbeam's streaming engine only")


class _WriteRows(beam.DoFn):  # type: ignore[misc]
    """The general path: all rows, gathered in one element, written by a session here."""

    def __init__(self, target: SparkWrite) -> None:
        self.target = target

    def process(self, rows: list[Any]) -> Iterator[Any]:
        import pyarrow as pa

        spark = spark_session()
        batch = self.target.to_arrow(rows)
        self.target.write(spark.createDataFrame(pa.Table.from_batches([batch]),
                                                self.target.struct()))
        return iter(())


class WriteToSpark(beam.PTransform):  # type: ignore[misc]
    """A schema'd PCollection written by Spark: `WriteToSpark("db.out", mode="append")` or
    `WriteToSpark(format="parquet", path="/out", mode="overwrite")`."""

    def __init__(self, table: str | None = None, *, format: str | None = None,
                 path: str | None = None, mode: str = "error",
                 options: Mapping[str, Any] | None = None,
                 partition_by: tuple[str, ...] | list[str] = ()) -> None:
        super().__init__()
        self.target = SparkWrite(table, format, path, mode, tuple(sorted(
            (str(k), str(v)) for k, v in (options or {}).items())), tuple(partition_by))

    def expand(self, pcoll: beam.PCollection) -> beam.pvalue.PDone:
        try:
            schema = schemas.schema_from_element_type(pcoll.element_type)  # type: ignore[arg-type]
            spark_schema(schema)
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"WriteToSpark to {self.target.describe()} needs a schema'd PCollection "
                f"(beam.Row, a NamedTuple type or ReadFromSpark's output); "
                f"{pcoll.producer.full_label if pcoll.producer else 'its input'} gives "
                f"{pcoll.element_type}: {exc}") from exc
        missing = [c for c in self.target.partition_by
                   if c not in [f.name for f in schema.fields]]
        if missing:
            raise ValueError(f"WriteToSpark to {self.target.describe()}: partition_by column(s) "
                             f"{', '.join(missing)} are not fields of its input "
                             f"({', '.join(f.name for f in schema.fields)})")
        self.target = dataclasses.replace(self.target, schema=schema.SerializeToString())
        if not pcoll.is_bounded:
            # A stream: sparkbeam's streaming engine writes each micro-batch; nothing here
            # could gather a stream's rows for one write.
            what = f"WriteToSpark of a stream to {self.target.describe()}"
            if _runs_elsewhere(pcoll.pipeline):
                raise ValueError(f"{what} runs on sparkbeam's streaming engine only")
            pcoll | "Write" >> beam.Map(_refuse, what)
            return beam.pvalue.PDone(pcoll.pipeline)
        # One write of every row, whatever the windows (sparkbeam writes them all too).
        gathered = (pcoll | "Rewindow" >> beam.WindowInto(GlobalWindows())
                    | "Gather" >> beam.combiners.ToList())
        gathered | "Write" >> beam.ParDo(_WriteRows(self.target))
        return beam.pvalue.PDone(pcoll.pipeline)

    def to_runner_api_parameter(self, context: Any) -> tuple[str, Any]:
        # The URN marks the composite for sparkbeam, which writes the input's DataFrame with
        # Spark instead of running the expansion; other runners run the expansion.
        from apache_beam.internal import pickler

        return urns.WRITE_TO_SPARK, bytes(pickler.dumps(self.target))

    @staticmethod
    @beam.PTransform.register_urn(urns.WRITE_TO_SPARK, None)
    def from_runner_api_parameter(unused_transform: Any, payload: bytes,
                                  unused_context: Any) -> WriteToSpark:
        from apache_beam.internal import pickler

        write = WriteToSpark.__new__(WriteToSpark)
        beam.PTransform.__init__(write)
        write.target = pickler.loads(payload)
        return write
