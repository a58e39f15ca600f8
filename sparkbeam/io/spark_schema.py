"""Spark's schemas and values as Beam's, both ways, through Arrow.

A Spark type maps to one Beam field type; anything else is refused, naming the column, before
a pipeline runs:

| Spark | Beam |
|---|---|
| byte, short, int, long | INT16 (Beam Python's BYTE is unsigned), INT16, INT32, INT64 |
| float, double, boolean, string, binary | FLOAT, DOUBLE, BOOLEAN, STRING, BYTES |
| decimal(p, s) | logical type `decimal` (Python `Decimal`; values of more than 28 digits fail) |
| timestamp | logical type `micros_instant` (Beam `Timestamp`, both count microseconds) |
| date | logical type `date` (Python `datetime.date`) |
| array, map, struct | array, map, row (nested), with Spark's nullability |

Beam's decimal has no precision or scale and its Python types forget the width of ints, so a
field read from Spark records its Spark type as a field option (`SPARK_TYPE`), and writing it
back to Spark uses it; fields without one (a schema from Python types) take the table's reverse
(`decimal` as decimal(38, 18), INT16 as short, `micros_instant` and `millis_instant` as
timestamp).
"""
from __future__ import annotations

import datetime
import decimal
import hashlib
import keyword
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa
from apache_beam.portability import common_urns
from apache_beam.portability.api import schema_pb2
from pyspark.sql import types as T

SPARK_TYPE = "sparkbeam:spark_type"  # a field option: the Spark type's JSON
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_MICRO = datetime.timedelta(microseconds=1)
_BEAM_DECIMAL_DIGITS = decimal.Context().prec  # 28: what Beam's DecimalCoderImpl keeps

_ATOMIC: dict[type[T.DataType], Any] = {
    # Beam Python's BYTE is written as an unsigned byte (its coder refuses -1); Spark's byte
    # is signed. INT16 holds it, and the recorded Spark type writes it back as a byte.
    T.ByteType: schema_pb2.INT16,
    T.ShortType: schema_pb2.INT16,
    T.IntegerType: schema_pb2.INT32,
    T.LongType: schema_pb2.INT64,
    T.FloatType: schema_pb2.FLOAT,
    T.DoubleType: schema_pb2.DOUBLE,
    T.BooleanType: schema_pb2.BOOLEAN,
    T.StringType: schema_pb2.STRING,
    T.BinaryType: schema_pb2.BYTES,
}
_SPARK_OF_ATOMIC = {atomic: spark() for spark, atomic in _ATOMIC.items()
                    if spark is not T.ByteType}
_SPARK_OF_ATOMIC[schema_pb2.BYTE] = T.ByteType()
_DECIMAL = common_urns.decimal.urn
_MICROS = common_urns.micros_instant.urn
_MILLIS = common_urns.millis_instant.urn
_DATE = common_urns.date.urn


class UnsupportedSparkType(TypeError):
    """A column whose Spark type has no Beam schema type, or the reverse."""


# -- types ---------------------------------------------------------------------------------

def beam_schema(spark: T.StructType) -> schema_pb2.Schema:
    """Beam's schema of rows of `spark`; each top-level field records its Spark type."""
    schema = _beam_struct(spark, "")
    for field, sfield in zip(schema.fields, spark.fields, strict=True):
        field.options.add(name=SPARK_TYPE, type=schema_pb2.FieldType(
            atomic_type=schema_pb2.STRING)).value.atomic_value.string = sfield.dataType.json()
    return _with_id(schema)


def _beam_struct(spark: T.StructType, where: str) -> schema_pb2.Schema:
    fields = []
    names = [f.name for f in spark.fields]
    for f in spark.fields:
        path = f"{where}.{f.name}" if where else f.name
        if names.count(f.name) > 1:
            raise UnsupportedSparkType(f"column {path!r} appears {names.count(f.name)} times; "
                                       f"Beam's rows need each name once (alias them apart)")
        if not f.name.isidentifier() or keyword.iskeyword(f.name) or f.name.startswith("_"):
            raise UnsupportedSparkType(
                f"column {path!r} is not a name Beam's rows can have (they are Python named "
                f"tuples: an identifier, not a keyword, not starting with '_'); rename it, "
                f"e.g. with sql=\"SELECT `{f.name}` AS ... \"")
        fields.append(schema_pb2.Field(name=f.name, type=_beam_type(f.dataType, f.nullable,
                                                                    path)))
    return schema_pb2.Schema(fields=fields)


def _beam_type(dt: T.DataType, nullable: bool, where: str) -> schema_pb2.FieldType:
    if type(dt) in _ATOMIC:
        return schema_pb2.FieldType(nullable=nullable, atomic_type=_ATOMIC[type(dt)])
    if isinstance(dt, T.DecimalType):
        return _logical(_DECIMAL, schema_pb2.FieldType(atomic_type=schema_pb2.BYTES), nullable)
    if isinstance(dt, T.TimestampType):
        rep = schema_pb2.Schema(fields=[
            schema_pb2.Field(name="seconds", type=schema_pb2.FieldType(
                atomic_type=schema_pb2.INT64)),
            schema_pb2.Field(name="micros", type=schema_pb2.FieldType(
                atomic_type=schema_pb2.INT64))])
        return _logical(_MICROS, schema_pb2.FieldType(
            row_type=schema_pb2.RowType(schema=_with_id(rep))), nullable)
    if isinstance(dt, T.DateType):
        return _logical(_DATE, schema_pb2.FieldType(atomic_type=schema_pb2.INT64), nullable)
    if isinstance(dt, T.ArrayType):
        return schema_pb2.FieldType(nullable=nullable, array_type=schema_pb2.ArrayType(
            element_type=_beam_type(dt.elementType, dt.containsNull, f"{where}[]")))
    if isinstance(dt, T.MapType):
        return schema_pb2.FieldType(nullable=nullable, map_type=schema_pb2.MapType(
            key_type=_beam_type(dt.keyType, False, f"{where}{{key}}"),
            value_type=_beam_type(dt.valueType, dt.valueContainsNull, f"{where}{{value}}")))
    if isinstance(dt, T.StructType):
        return schema_pb2.FieldType(nullable=nullable, row_type=schema_pb2.RowType(
            schema=_with_id(_beam_struct(dt, where))))
    hint = " (cast it to timestamp)" if isinstance(dt, T.TimestampNTZType) else ""
    raise UnsupportedSparkType(
        f"column {where!r} has Spark type {dt.simpleString()}, which has no Beam schema "
        f"type{hint}; supported: numbers, booleans, strings, binary, decimals, timestamps, "
        f"dates, and arrays, maps and structs of them")


def _logical(urn: str, rep: schema_pb2.FieldType, nullable: bool) -> schema_pb2.FieldType:
    return schema_pb2.FieldType(nullable=nullable, logical_type=schema_pb2.LogicalType(
        urn=urn, representation=rep))


def _with_id(schema: schema_pb2.Schema) -> schema_pb2.Schema:
    """`schema` with an id made from its content: the same Spark schema gets the same id in
    every process (Beam caches row types by id)."""
    schema.id = ""
    schema.id = "sparkbeam-" + hashlib.sha256(
        schema.SerializeToString(deterministic=True)).hexdigest()[:24]
    return schema


def spark_schema(schema: schema_pb2.Schema) -> T.StructType:
    """The Spark schema rows of Beam's `schema` are written as."""
    fields = []
    for f in schema.fields:
        recorded = [o for o in f.options if o.name == SPARK_TYPE]
        if recorded:
            dt = T._parse_datatype_json_string(  # noqa: SLF001 - Spark's own JSON reader
                recorded[0].value.atomic_value.string)
        else:
            dt = _spark_type(f.type, f.name)
        fields.append(T.StructField(f.name, dt, f.type.nullable))
    return T.StructType(fields)


def _spark_type(ft: schema_pb2.FieldType, where: str) -> T.DataType:
    kind = ft.WhichOneof("type_info")
    if kind == "atomic_type" and ft.atomic_type in _SPARK_OF_ATOMIC:
        return _SPARK_OF_ATOMIC[ft.atomic_type]
    if kind == "array_type" or kind == "iterable_type":
        elem = (ft.array_type if kind == "array_type" else ft.iterable_type).element_type
        return T.ArrayType(_spark_type(elem, f"{where}[]"), elem.nullable)
    if kind == "map_type":
        return T.MapType(_spark_type(ft.map_type.key_type, f"{where}{{key}}"),
                         _spark_type(ft.map_type.value_type, f"{where}{{value}}"),
                         ft.map_type.value_type.nullable)
    if kind == "row_type":
        return T.StructType([
            T.StructField(f.name, _spark_type(f.type, f"{where}.{f.name}"), f.type.nullable)
            for f in ft.row_type.schema.fields])
    if kind == "logical_type":
        urn = ft.logical_type.urn
        if urn == _DECIMAL:
            return T.DecimalType(38, 18)
        if urn in (_MICROS, _MILLIS):
            return T.TimestampType()
        if urn == _DATE:
            return T.DateType()
    what = ft.logical_type.urn if kind == "logical_type" else kind
    raise UnsupportedSparkType(f"field {where!r} of Beam type {what} has no Spark type")


# -- values --------------------------------------------------------------------------------

Convert = Callable[[Any], Any]


def to_beam(schema: schema_pb2.Schema) -> Callable[[pa.RecordBatch], Iterator[Any]]:
    """Turns Arrow batches of Spark rows (columns in `schema`'s order) into Beam rows: the
    named tuples Beam's `RowCoder` decodes to."""
    from apache_beam.typehints.schemas import named_tuple_from_schema

    row_type: Any = named_tuple_from_schema(schema)
    converts = [_to_beam(f.type, f.name) for f in schema.fields]

    def rows(batch: pa.RecordBatch) -> Iterator[Any]:
        columns = [
            [convert(v) for v in batch.column(i).to_pylist()] if convert is not None
            else batch.column(i).to_pylist()
            for i, convert in enumerate(converts)]
        # `_make`: a generated row type's __new__ costs ~1 us a row, tuple's ~0.15.
        return map(row_type._make, zip(*columns, strict=True))

    return rows


def _to_beam(ft: schema_pb2.FieldType, where: str) -> Convert | None:
    """How one Arrow value (as `to_pylist` gives it) becomes Beam's; None: as it is."""
    kind = ft.WhichOneof("type_info")
    inner: Convert | None
    if kind == "logical_type" and ft.logical_type.urn == _MICROS:
        from apache_beam.utils.timestamp import Timestamp

        return _nullable(lambda v: Timestamp(micros=_micros(v)))
    if kind == "logical_type" and ft.logical_type.urn == _DECIMAL:
        return _nullable(lambda v: _exact_decimal(v, where))
    if kind == "array_type":
        inner = _to_beam(ft.array_type.element_type, f"{where}[]")
        return None if inner is None else _nullable(lambda v: [inner(x) for x in v])
    if kind == "map_type":
        key = _to_beam(ft.map_type.key_type, f"{where}{{key}}") or _same
        value = _to_beam(ft.map_type.value_type, f"{where}{{value}}") or _same
        return _nullable(lambda v: {key(k): value(x) for k, x in v})
    if kind == "row_type":
        from apache_beam.typehints.schemas import named_tuple_from_schema

        row_type: Any = named_tuple_from_schema(ft.row_type.schema)
        fields = [(f.name, _to_beam(f.type, f"{where}.{f.name}") or _same)
                  for f in ft.row_type.schema.fields]
        return _nullable(lambda v: row_type._make(c(v[name]) for name, c in fields))
    return None  # atomic values and dates are Beam's types already


def _exact_decimal(value: decimal.Decimal, where: str) -> decimal.Decimal:
    """`value`, if Beam's Python decimal coder keeps it: it scales in the default decimal
    context, which rounds to 28 significant digits (Spark's decimals have up to 38). A value
    it would round fails here, loudly, instead of changing on its way through the pipeline;
    trailing zeros it drops are no change."""
    digits = value.as_tuple().digits
    if len(digits) > _BEAM_DECIMAL_DIGITS and any(digits[_BEAM_DECIMAL_DIGITS:]):
        raise UnsupportedSparkType(
            f"column {where!r}: {value} has {len(digits)} significant digits; Beam's Python "
            f"decimal coder keeps {_BEAM_DECIMAL_DIGITS} (it would round it); cast the "
            f"column to a narrower decimal or to a string")
    return value


def _micros(value: datetime.datetime) -> int:
    if value.tzinfo is None:  # Spark's Arrow timestamps are UTC
        value = value.replace(tzinfo=datetime.UTC)
    return (value - _EPOCH) // _MICRO


def to_arrow(schema: schema_pb2.Schema, spark: T.StructType, rows: Sequence[Any],
             ) -> pa.RecordBatch:
    """Beam rows (anything with `schema`'s fields as attributes) as an Arrow batch of
    `spark`'s schema."""
    from pyspark.sql.pandas.types import to_arrow_schema

    arrow = to_arrow_schema(spark, timezone="UTC")
    arrays = []
    for i, f in enumerate(schema.fields):
        convert = _to_arrow(f.type) or _same
        values = [convert(getattr(row, f.name)) for row in rows]
        try:
            arrays.append(pa.array(values, type=arrow.field(i).type))
        except (pa.ArrowException, TypeError, ValueError) as exc:
            raise UnsupportedSparkType(
                f"field {f.name!r}: a value does not fit Spark type "
                f"{spark.fields[i].dataType.simpleString()}: {exc}") from exc
    return pa.RecordBatch.from_arrays(arrays, schema=arrow)


def _to_arrow(ft: schema_pb2.FieldType) -> Convert | None:
    kind = ft.WhichOneof("type_info")
    inner: Convert | None
    if kind == "logical_type" and ft.logical_type.urn in (_MICROS, _MILLIS):
        return _nullable(lambda v: _EPOCH + v.micros * _MICRO)
    if kind in ("array_type", "iterable_type"):
        elem = (ft.array_type if kind == "array_type" else ft.iterable_type).element_type
        inner = _to_arrow(elem) or _same
        return _nullable(lambda v: [inner(x) for x in v])
    if kind == "map_type":
        key = _to_arrow(ft.map_type.key_type) or _same
        value = _to_arrow(ft.map_type.value_type) or _same
        return _nullable(lambda v: [(key(k), value(x)) for k, x in v.items()])
    if kind == "row_type":
        fields = [(f.name, _to_arrow(f.type) or _same) for f in ft.row_type.schema.fields]
        return _nullable(lambda v: {name: c(getattr(v, name)) for name, c in fields})
    return None


def _same(value: Any) -> Any:
    return value


def _nullable(convert: Convert) -> Convert:
    return lambda v: None if v is None else convert(v)
