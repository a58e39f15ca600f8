"""Spark schemas and values as Beam's and back (`io/spark_schema.py`): property tests on Spark's
types and Arrow batches, no SparkSession."""
from __future__ import annotations

import datetime
import decimal
import keyword
import re
import typing

import pyarrow as pa
import pytest
from apache_beam.coders import RowCoder
from apache_beam.typehints import schemas
from apache_beam.utils.timestamp import Timestamp
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from sparkbeam.io.spark_schema import (
    SPARK_TYPE,
    UnsupportedSparkType,
    beam_schema,
    spark_schema,
    to_arrow,
    to_beam,
)

_NAMES = st.from_regex(r"[a-z][a-z_0-9]{0,5}", fullmatch=True).filter(
    lambda n: not keyword.iskeyword(n))
_ATOMIC = st.sampled_from([T.ByteType(), T.ShortType(), T.IntegerType(), T.LongType(),
                           T.FloatType(), T.DoubleType(), T.BooleanType(), T.StringType(),
                           T.BinaryType(), T.DateType(), T.TimestampType()])
_DECIMAL = st.integers(1, 38).flatmap(
    lambda p: st.integers(0, p).map(lambda s: T.DecimalType(p, s)))


def _struct(children: st.SearchStrategy[T.DataType]) -> st.SearchStrategy[T.StructType]:
    return st.lists(st.tuples(_NAMES, children, st.booleans()), min_size=1, max_size=4,
                    unique_by=lambda f: f[0]).map(
        lambda fs: T.StructType([T.StructField(n, t, nullable) for n, t, nullable in fs]))


_TYPES = st.recursive(
    st.one_of(_ATOMIC, _DECIMAL),
    lambda inner: st.one_of(
        st.builds(T.ArrayType, inner, st.booleans()),
        st.builds(T.MapType, st.one_of(_ATOMIC, _DECIMAL), inner, st.booleans()),
        _struct(inner)),
    max_leaves=6)
_SCHEMAS = _struct(_TYPES)


@settings(max_examples=150, deadline=None)
@given(_SCHEMAS)
def test_a_spark_schema_round_trips_through_beams(spark: T.StructType) -> None:
    beam = beam_schema(spark)
    assert spark_schema(beam) == spark
    # Without the recorded Spark types (a schema from Python types), Beam's own types give
    # back the same schema but for decimals' precision and scale, and bytes as shorts.
    for field in beam.fields:
        del field.options[:]
    derived = spark_schema(beam).json().replace('"decimal(38,18)"', "D")
    assert derived == re.sub(r'"decimal\(\d+,\d+\)"', "D", spark.json()).replace(
        '"byte"', '"short"')


def _value(dt: T.DataType, nullable: bool) -> st.SearchStrategy[typing.Any]:
    inner: st.SearchStrategy[typing.Any]
    if isinstance(dt, T.ByteType):
        inner = st.integers(-(2**7), 2**7 - 1)
    elif isinstance(dt, T.ShortType):
        inner = st.integers(-(2**15), 2**15 - 1)
    elif isinstance(dt, T.IntegerType):
        inner = st.integers(-(2**31), 2**31 - 1)
    elif isinstance(dt, T.LongType):
        inner = st.integers(-(2**63), 2**63 - 1)
    elif isinstance(dt, T.FloatType):
        inner = st.floats(width=32, allow_nan=False)
    elif isinstance(dt, T.DoubleType):
        inner = st.floats(allow_nan=False)
    elif isinstance(dt, T.BooleanType):
        inner = st.booleans()
    elif isinstance(dt, T.StringType):
        inner = st.text(st.characters(blacklist_categories=("Cs",)), max_size=8)
    elif isinstance(dt, T.BinaryType):
        inner = st.binary(max_size=8)
    elif isinstance(dt, T.DateType):
        inner = st.dates()
    elif isinstance(dt, T.TimestampType):
        # Microseconds matter: Beam's micros_instant keeps them.
        inner = st.datetimes(min_value=datetime.datetime(1, 1, 2),
                             max_value=datetime.datetime(9999, 12, 30),
                             timezones=st.just(datetime.UTC))
    elif isinstance(dt, T.DecimalType):
        # At most 28 significant digits: what Beam's decimal coder keeps (tested below).
        digits = min(dt.precision, 28)
        inner = st.integers(-(10**digits) + 1, 10**digits - 1).map(
            lambda n: decimal.Decimal(n).scaleb(-dt.scale))
    elif isinstance(dt, T.ArrayType):
        inner = st.lists(_value(dt.elementType, dt.containsNull), max_size=3)
    elif isinstance(dt, T.MapType):
        inner = st.lists(st.tuples(_value(dt.keyType, False),
                                   _value(dt.valueType, dt.valueContainsNull)),
                         max_size=3, unique_by=lambda kv: kv[0])
    else:
        assert isinstance(dt, T.StructType)
        inner = st.fixed_dictionaries({f.name: _value(f.dataType, f.nullable)
                                       for f in dt.fields})
    return st.one_of(st.none(), inner) if nullable else inner


@st.composite
def _batches(draw: st.DrawFn) -> tuple[T.StructType, pa.RecordBatch]:
    spark = draw(_SCHEMAS)
    rows = draw(st.lists(_value(spark, False), max_size=5))
    arrow = to_arrow_schema(spark, timezone="UTC")
    return spark, pa.RecordBatch.from_pylist(rows, schema=arrow)


@settings(max_examples=150, deadline=None)
@given(_batches())
def test_spark_rows_round_trip_through_beam_rows_and_their_encoding(
        drawn: tuple[T.StructType, pa.RecordBatch]) -> None:
    spark, batch = drawn
    beam = beam_schema(spark)
    coder = RowCoder(beam)
    rows = [coder.decode(coder.encode(row)) for row in to_beam(beam)(batch)]
    assert to_arrow(beam, spark, rows).equals(batch)


def test_values_are_beams_types() -> None:
    spark = T.StructType([
        T.StructField("when", T.TimestampType()), T.StructField("day", T.DateType()),
        T.StructField("amount", T.DecimalType(10, 2)),
        T.StructField("tags", T.MapType(T.StringType(), T.IntegerType())),
        T.StructField("inner", T.StructType([T.StructField("x", T.LongType())]))])
    when = datetime.datetime(1969, 12, 31, 23, 59, 59, 999_999, tzinfo=datetime.UTC)
    batch = pa.RecordBatch.from_pylist(
        [{"when": when, "day": datetime.date(2020, 2, 29), "amount": decimal.Decimal("1.50"),
          "tags": [("a", 1)], "inner": {"x": 7}}],
        schema=to_arrow_schema(spark, timezone="UTC"))
    (row,) = to_beam(beam_schema(spark))(batch)
    assert row.when == Timestamp(micros=-1)
    assert row.day == datetime.date(2020, 2, 29)
    assert row.amount == decimal.Decimal("1.50")
    assert row.tags == {"a": 1}
    assert row.inner.x == 7
    assert [o.name for o in beam_schema(spark).fields[0].options] == [SPARK_TYPE]


@pytest.mark.parametrize("spark,column", [
    (T.StructType([T.StructField("gap", T.DayTimeIntervalType())]), "gap"),
    (T.StructType([T.StructField("events", T.ArrayType(T.StructType([
        T.StructField("when", T.TimestampNTZType())])))]), "events[].when"),
    (T.StructType([T.StructField("m", T.MapType(T.StringType(), T.NullType()))]),
     "m{value}"),
])
def test_a_column_without_a_beam_type_is_refused_by_name(spark: T.StructType,
                                                        column: str) -> None:
    with pytest.raises(UnsupportedSparkType, match=re.escape(f"column '{column}' has Spark type")):
        beam_schema(spark)


@pytest.mark.parametrize("name", ["user-id", "class", "_hidden", "a b"])
def test_a_column_name_beam_rows_cannot_have_is_refused(name: str) -> None:
    spark = T.StructType([T.StructField("s", T.StructType([T.StructField(name, T.LongType())]))])
    with pytest.raises(UnsupportedSparkType, match=re.escape(f"column 's.{name}' is not a name")):
        beam_schema(spark)


def test_a_schema_from_python_types_is_written_with_spark_types() -> None:
    # The functional form: this module's annotations are strings, which Beam reads as Any.
    Sale = typing.NamedTuple("Sale", [  # noqa: UP014
        ("shop", str), ("units", int), ("price", typing.Optional[float]),  # noqa: UP045
        ("at", Timestamp), ("total", decimal.Decimal), ("tags", typing.Sequence[str])])

    assert spark_schema(schemas.schema_from_element_type(Sale)).simpleString() == (
        "struct<shop:string,units:bigint,price:double,at:timestamp,"
        "total:decimal(38,18),tags:array<string>>")


def test_a_decimal_beams_coder_would_round_fails_naming_the_column() -> None:
    spark = T.StructType([T.StructField("big", T.ArrayType(T.DecimalType(38, 0)))])
    batch = pa.RecordBatch.from_pylist([{"big": [decimal.Decimal(10**29 + 1)]}],
                                       schema=to_arrow_schema(spark))
    with pytest.raises(UnsupportedSparkType, match=re.escape(
            "column 'big[]': 100000000000000000000000000001 has 30 significant digits; "
            "Beam's Python decimal coder keeps 28")):
        list(to_beam(beam_schema(spark))(batch))


def test_a_value_spark_cannot_hold_names_the_field() -> None:
    spark = T.StructType([T.StructField("price", T.DecimalType(4, 2))])
    beam = beam_schema(spark)
    row = schemas.named_tuple_from_schema(beam)(decimal.Decimal("123.456"))
    with pytest.raises(UnsupportedSparkType, match="field 'price': a value does not fit "
                                                   r"Spark type decimal\(4,2\)"):
        to_arrow(beam, spark, [row])
