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

    def __post_init__(self) -> None:
        given = [k for k in ("table", "format", "sql") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError("ReadFromSpark reads one of: a table name, format= (with path= "
                             "and options=) or sql=; got "
                             + (", ".join(f"{k}=" for k in given) or "none"))
        if self.path and not self.format:
            raise ValueError("ReadFromSpark: path= needs format= (e.g. format='parquet')")

    def describe(self) -> str:
        if self.table:
            return f"table {self.table}"
        if self.sql:
            return f"SQL query {self.sql!r}"
        return f"{self.format} data" + (f" at {self.path}" if self.path else "")

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
        rows = self.to_beam()
        table = self.query.dataframe(spark_session()).toArrow()
        for batch in table.to_batches():
            yield from rows(batch)

    def default_output_coder(self) -> RowCoder:
        return RowCoder(self.schema)


class ReadFromSpark(beam.PTransform):  # type: ignore[misc]
    """Rows of a Spark table, data source or SQL query as a schema'd PCollection.

    `ReadFromSpark("db.events")`, `ReadFromSpark(format="parquet", path="/data/events")`,
    `ReadFromSpark(sql="SELECT ...")`. Elements are Beam rows (named tuples, read by
    attribute like `beam.Row`). The schema is `schema=` (a StructType or DDL) or asked of
    Spark when the transform is applied, on the session the pipeline's runner uses (see
    `session`); a column Beam has no type for is refused then, naming it."""

    def __init__(self, table: str | None = None, *, format: str | None = None,
                 path: str | None = None, options: Mapping[str, Any] | None = None,
                 sql: str | None = None, schema: Any = None) -> None:
        super().__init__()
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

        query = self.query
        if self._ddl is not None:
            spark_session(pbegin.pipeline)  # DDL is parsed by Spark
            query = dataclasses.replace(query, schema=T._parse_datatype_string(  # noqa: SLF001
                self._ddl).json())
        given = query.schema
        spark_type = cast(T.StructType, _struct(given) if given else query.dataframe(
            spark_session(pbegin.pipeline)).schema)
        try:
            schema = beam_schema(spark_type)
        except UnsupportedSparkType as exc:
            raise UnsupportedSparkType(f"ReadFromSpark of {query.describe()}: {exc}"
                                       ) from None
        query = dataclasses.replace(query, expected=spark_type.json())
        rows = pbegin | beam.io.Read(SparkSource(query, schema))
        # Read says Any; consumers need the schema.
        rows.element_type = schemas.named_tuple_from_schema(schema)
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
