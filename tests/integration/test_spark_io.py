"""ReadFromSpark and WriteToSpark: Spark's tables and data sources as Beam sources and sinks,
on sparkbeam (part of the Spark plan) and on FnApiRunner (a SparkSession in the process that
reads or writes), with the same results."""
from __future__ import annotations

import datetime
import decimal
import re
import typing
import uuid

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing import test_stream
from apache_beam.transforms import window
from apache_beam.utils.timestamp import Timestamp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import types as T

from sparkbeam import SparkRunner
from sparkbeam.errors import ExecutionError, UnsupportedFeatureError, UserCodeError
from sparkbeam.io import ReadFromSpark, UnsupportedSparkType, WriteToSpark
from sparkbeam.runner import prepare

SHAPES = {"default": [], "one-per-bundle": ["--bundle_size=1", "--parallelism=1"]}
RUNNERS = {"sparkbeam": lambda: SparkRunner(), "fnapi": lambda: FnApiRunner()}

ALL_TYPES = T.StructType([
    T.StructField("id", T.LongType(), False),
    T.StructField("small", T.ByteType()), T.StructField("short", T.ShortType()),
    T.StructField("i", T.IntegerType()), T.StructField("f", T.FloatType()),
    T.StructField("d", T.DoubleType()), T.StructField("ok", T.BooleanType()),
    T.StructField("s", T.StringType()), T.StructField("b", T.BinaryType()),
    T.StructField("price", T.DecimalType(12, 3)), T.StructField("at", T.TimestampType()),
    T.StructField("day", T.DateType()),
    T.StructField("tags", T.ArrayType(T.StringType())),
    T.StructField("scores", T.MapType(T.StringType(), T.DoubleType())),
    T.StructField("inner", T.StructType([
        T.StructField("x", T.IntegerType()),
        T.StructField("when", T.ArrayType(T.TimestampType()))])),
])
ALL_ROWS = [
    (1, -128, -32768, -(2**31), 1.5, -0.0, True, "é\u2603", b"\x00\xff",
     decimal.Decimal("-123456789.123"),
     datetime.datetime(1969, 12, 31, 23, 59, 59, 999_999),
     datetime.date(1, 1, 1), ["a", None, ""], {"k": None, "l": 2.5},
     (7, [datetime.datetime(2024, 2, 29, 12, 0, 0, 1)])),
    (2, None, None, None, None, None, None, None, None, None, None, None, [], {}, (None, [])),
    (3, 127, 32767, 2**31 - 1, float("inf"), 1e308, False, "", b"", decimal.Decimal("0.001"),
     datetime.datetime(9999, 12, 31, 23, 59, 59, 999_999), datetime.date(9999, 12, 31), None,
     None, None),
]


def _path(tmp_path, name: str) -> str:
    return str(tmp_path / f"{name}-{uuid.uuid4().hex[:8]}")


def _run(build, runner, args: list[str] | None = None) -> None:  # type: ignore[no-untyped-def]
    p = beam.Pipeline(runner=runner, options=PipelineOptions(args or []))
    build(p)
    p.run().wait_until_finish()


@pytest.mark.parametrize("runner", RUNNERS)
def test_every_supported_type_round_trips_spark_to_beam_to_spark(spark, tmp_path,
                                                                  runner: str) -> None:
    source, out = _path(tmp_path, "in"), _path(tmp_path, "out")
    original = spark.createDataFrame(ALL_ROWS, ALL_TYPES)
    original.write.parquet(source)

    def build(p):  # type: ignore[no-untyped-def]
        _ = (p | ReadFromSpark(format="parquet", path=source)
             | WriteToSpark(format="parquet", path=out))

    _run(build, RUNNERS[runner]())
    back = spark.read.parquet(out)
    assert back.schema == spark.read.parquet(source).schema
    assert sorted(back.collect()) == sorted(original.collect())


_SALES = T.StructType([T.StructField("shop", T.StringType()),
                       T.StructField("units", T.LongType(), False),
                       T.StructField("price", T.DecimalType(10, 2)),
                       T.StructField("at", T.TimestampType(), False)])
_SALE = st.tuples(
    st.sampled_from(["north", "south", "east", None]), st.integers(-(2**40), 2**40),
    st.one_of(st.none(), st.decimals(-(10**7), 10**7, places=2, allow_nan=False,
                                     allow_infinity=False)),
    st.datetimes(datetime.datetime(1900, 1, 1), datetime.datetime(2100, 1, 1)))


# The functional form: this module's annotations are strings, which Beam reads as Any.
ShopTotal = typing.NamedTuple("ShopTotal", [  # noqa: UP014
    ("shop", str), ("sales", int), ("units", int), ("last", Timestamp)])
beam.coders.registry.register_coder(ShopTotal, beam.coders.RowCoder)


def _per_shop(table: str, out: str):  # type: ignore[no-untyped-def]
    def total(shop_rows):  # type: ignore[no-untyped-def]
        shop, rows = shop_rows
        rows = list(rows)
        return ShopTotal(shop or "", len(rows), sum(r.units for r in rows),
                         max(r.at for r in rows))

    def build(p):  # type: ignore[no-untyped-def]
        _ = (p | ReadFromSpark(table)
             | beam.Map(lambda r: (r.shop, r)) | beam.GroupByKey()
             | beam.Map(total).with_output_types(ShopTotal)
             | WriteToSpark(format="json", path=out))
    return build


@pytest.mark.parametrize("shape", SHAPES)
@settings(max_examples=3, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(sales=st.lists(_SALE, max_size=40))
def test_a_table_transformed_by_beam_equals_fnapi_runners_result(spark, tmp_path, shape: str,
                                                                sales: list[tuple]) -> None:
    table = f"sales_{uuid.uuid4().hex[:8]}"
    spark.createDataFrame(sales, _SALES).write.option(
        "path", _path(tmp_path, table)).saveAsTable(table)
    try:
        outs = {}
        for name, runner in (("sparkbeam", SparkRunner()), ("fnapi", FnApiRunner())):
            outs[name] = _path(tmp_path, name)
            _run(_per_shop(table, outs[name]), runner, SHAPES[shape] if name == "sparkbeam"
                 else [])
        got = {name: sorted(spark.read.json(path).collect()) for name, path in outs.items()}
        assert got["sparkbeam"] == got["fnapi"]
        assert sum(r.sales for r in got["sparkbeam"]) == len(sales)
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {table}")


def test_a_query_is_read_and_the_write_modes_are_sparks(spark, tmp_path) -> None:
    out = _path(tmp_path, "out")

    def build(mode: str):  # type: ignore[no-untyped-def]
        def inner(p):  # type: ignore[no-untyped-def]
            _ = (p | ReadFromSpark(sql="SELECT id, CAST(id % 3 AS INT) AS k FROM range(100)")
                 | beam.Filter(lambda r: r.k != 1)
                 | "Save" >> WriteToSpark(format="json", path=out, mode=mode))
        return inner

    _run(build("error"), SparkRunner())
    assert spark.read.json(out).count() == 67
    with pytest.raises(ExecutionError, match=r"Save \(Spark's write\).*already exists"):
        _run(build("error"), SparkRunner())
    _run(build("append"), SparkRunner())
    assert spark.read.json(out).count() == 134
    _run(build("overwrite"), SparkRunner())
    assert sorted(r.id for r in spark.read.json(out).collect()) == [
        i for i in range(100) if i % 3 != 1]


def test_the_plan_reads_and_writes_through_spark_and_says_so(tmp_path) -> None:
    p = beam.Pipeline(options=PipelineOptions([]))
    _ = (p | "Events" >> ReadFromSpark(sql="SELECT id FROM range(10)")
         | "Even" >> beam.Filter(lambda r: r.id % 2 == 0)
         | "Out" >> WriteToSpark(format="parquet", path=_path(tmp_path, "o")))
    plan = prepare(p.to_runner_api(), p.options)
    assert plan.decisions[:2] == (
        "Events/Read: Spark reads SQL query 'SELECT id FROM range(10)' into the plan",
        "Out: Spark writes the input's rows (no gathering)")
    # One stage, the user's: the query is its input, the write reads its output.
    assert [s.transforms for s in plan.stages] == [("Even",)]
    assert [i.buffer_id for i in plan.stages[0].inputs] == list(plan.spark_reads)
    assert [w.transform for w in plan.spark_writes] == ["Out"]
    # Rows of a bounded read travel as rows alone: their window, timestamp and pane are the
    # coder's parameters (and Beam's row coder needs no length prefix).
    comps = beam_runner_api_pb2.Components.FromString(plan.components)
    wire = comps.coders[plan.stages[0].inputs[0].coder_id]
    assert wire.spec.urn == "beam:coder:param_windowed_value:v1"
    assert comps.coders[wire.component_coder_ids[0]].spec.urn == "beam:coder:row:v1"


def test_a_column_without_a_beam_type_is_refused_when_the_pipeline_is_built() -> None:
    with pytest.raises(UnsupportedSparkType, match=r"ReadFromSpark of SQL query .*: column "
                                                   r"'gap' has Spark type interval day"):
        _ = beam.Pipeline() | ReadFromSpark(sql="SELECT INTERVAL '1' DAY AS gap, 1 AS n")


def test_writing_rows_without_a_schema_is_refused_when_the_pipeline_is_built() -> None:
    p = beam.Pipeline()
    with pytest.raises(TypeError, match="WriteToSpark to table t needs a schema'd PCollection"):
        _ = p | beam.Create([1, 2]) | WriteToSpark("t")


def test_spark_reads_in_a_streaming_pipeline_are_refused_at_prepare(tmp_path) -> None:
    p = beam.Pipeline(options=PipelineOptions([]))
    rows = p | ReadFromSpark(sql="SELECT id FROM range(3)")
    events = p | test_stream.TestStream().add_elements([1]).advance_watermark_to_infinity()
    _ = ((rows | beam.Map(lambda r: r.id)), events) | beam.Flatten()
    with pytest.raises(UnsupportedFeatureError,
                       match="a bounded ReadFromSpark of SQL query .* in a streaming pipeline "
                             r"\(build it with --streaming.*ReadFromSpark/Read"):
        prepare(p.to_runner_api(), p.options)


def test_the_readme_example_runs_as_a_script(spark, tmp_path, monkeypatch, capsys) -> None:
    import pathlib
    import runpy
    import sys

    import pyarrow.parquet as pq

    # Run as `python examples/spark_tables.py --target ...` would run it, in this process
    # (its SparkRunner takes the test session's Spark, as a script's takes the one it starts):
    # a driver of its own would add ~15 s and test no more of the example.
    script = pathlib.Path(__file__).resolve().parents[2] / "examples" / "spark_tables.py"
    target = _path(tmp_path, "totals")
    monkeypatch.setattr(sys, "argv", [str(script), "--target", target])
    runpy.run_path(str(script), run_name="__main__")
    assert f"shop totals written as Parquet to {target}" in capsys.readouterr().out
    # Its sample: 1,000 sales, shop by id % 3, units id % 7.
    expected = {shop: sum(i % 7 for i in range(1000) if i % 3 == n)
                for n, shop in enumerate(["north", "south", "east"])}
    got = {r["shop"]: r["units"] for r in pq.read_table(target).to_pylist()}
    assert got == expected


def test_data_that_changed_since_the_pipeline_was_built_fails_naming_the_read(
        spark, tmp_path) -> None:
    source = _path(tmp_path, "in")
    spark.sql("SELECT id, CAST(id AS STRING) AS name FROM range(5)").write.parquet(source)
    p = beam.Pipeline(runner=SparkRunner(), options=PipelineOptions([]))
    _ = (p | "Names" >> ReadFromSpark(format="parquet", path=source)
         | WriteToSpark(format="json", path=_path(tmp_path, "out")))
    spark.sql("SELECT id FROM range(5)").write.mode("overwrite").parquet(source)
    with pytest.raises(ExecutionError, match=re.escape(
            f"Names/Read: Spark cannot read parquet data at {source}: ValueError: parquet data "
            f"at {source} has columns struct<id:bigint>, not the schema it had when the "
            "pipeline was built: struct<id:bigint,name:string>")):
        p.run().wait_until_finish()


def test_a_portable_runner_client_reads_and_writes_through_the_job_servers_spark(
        spark, tmp_path) -> None:
    from sparkbeam.jobservice.server import JobServer
    from sparkbeam.spark_executor import SparkJobExecutor

    out = _path(tmp_path, "out")
    server = JobServer(SparkJobExecutor(), artifacts_dir=str(tmp_path / "artifacts"))
    server.start()
    try:
        options = PipelineOptions(["--runner=PortableRunner",
                                   f"--job_endpoint={server.endpoint}",
                                   "--environment_type=LOOPBACK",
                                   "--job_server_timeout=600"])
        with beam.Pipeline(options=options) as p:
            _ = (p | ReadFromSpark(sql="SELECT id, CAST(id AS STRING) AS name FROM range(50)",
                                   schema="id BIGINT, name STRING")
                 | beam.Filter(lambda r: r.id % 5 == 0)
                 | WriteToSpark(format="json", path=out))
    finally:
        server.stop()
    assert sorted((r.id, r.name) for r in spark.read.json(out).collect()) == [
        (i, str(i)) for i in range(0, 50, 5)]


def test_a_null_the_given_schema_forbids_fails_naming_the_read(tmp_path) -> None:
    source = tmp_path / "ids"
    source.mkdir()
    (source / "a.json").write_text('{"id": 1}\n{"id": null}\n')
    p = beam.Pipeline(runner=SparkRunner(), options=PipelineOptions([]))
    _ = (p | "Ids" >> ReadFromSpark(format="json", path=str(source), schema="id BIGINT NOT NULL")
         | WriteToSpark(format="json", path=_path(tmp_path, "out")))
    with pytest.raises(UserCodeError, match=re.escape(
            f"Ids/Read: a row of json data at {source} does not fit the Beam schema the "
            "pipeline was built with: ValueError: Attempted to encode null for non-nullable "
            'field "id"')):
        p.run().wait_until_finish()


@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.parametrize("windowing,rows,copies", [
    ("fixed", 20, 1),  # each row in one window
    ("sliding", 6, 2),  # each row in two windows: two elements in Beam's model
])
def test_windowed_rows_are_written_once_per_window(spark, tmp_path, runner: str,
                                                   windowing: str, rows: int,
                                                   copies: int) -> None:
    out = _path(tmp_path, "out")
    windowfn = window.FixedWindows(5) if windowing == "fixed" else window.SlidingWindows(4, 2)

    def build(p):  # type: ignore[no-untyped-def]
        read = p | ReadFromSpark(sql=f"SELECT id FROM range({rows})")
        _ = (read
             | beam.Map(lambda r: window.TimestampedValue(r, r.id)).with_output_types(
                 read.element_type)
             | beam.WindowInto(windowfn)
             | WriteToSpark(format="json", path=out))

    _run(build, RUNNERS[runner]())
    assert sorted(r.id for r in spark.read.json(out).collect()) == sorted(
        list(range(rows)) * copies)


def test_overwriting_what_the_pipeline_reads_is_refused_at_prepare(spark, tmp_path) -> None:
    source = _path(tmp_path, "in")
    spark.sql("SELECT id FROM range(10)").write.parquet(source)
    p = beam.Pipeline(options=PipelineOptions([]))
    _ = (p | "Load" >> ReadFromSpark(format="parquet", path=source)
         | beam.Filter(lambda r: r.id < 5)
         | "Save" >> WriteToSpark(format="parquet", path=f"file://{source}", mode="overwrite"))
    with pytest.raises(UnsupportedFeatureError, match=re.escape(
            f"overwriting the path {source} that Load/Read reads in transform 'Save'")):
        prepare(p.to_runner_api(), p.options)
    assert spark.read.parquet(source).count() == 10


def test_a_decimal_beams_coder_keeps_is_read_a_rounded_one_fails_naming_the_read(
        spark, tmp_path) -> None:
    out = _path(tmp_path, "out")

    def build(value: str):  # type: ignore[no-untyped-def]
        def inner(p):  # type: ignore[no-untyped-def]
            _ = (p | "Amounts" >> ReadFromSpark(sql=f"SELECT CAST({value} AS DECIMAL(38,18)) AS a")
                 | WriteToSpark(format="parquet", path=out, mode="overwrite"))
        return inner

    # 29 digits with the scale's trailing zeros: Beam's coder drops only zeros.
    _run(build("12345678901.5"), SparkRunner())
    assert [r.a for r in spark.read.parquet(out).collect()] == [
        decimal.Decimal("12345678901.500000000000000000")]
    with pytest.raises(UserCodeError, match=re.escape(
            "Amounts/Read: a row of SQL query") + ".*" + re.escape(
            "has 30 significant digits; Beam's Python decimal coder keeps 28")):
        _run(build("123456789012.123456789012345678"), SparkRunner())


def test_write_mistakes_known_when_the_pipeline_is_built_are_refused_then() -> None:
    p = beam.Pipeline()
    rows = p | ReadFromSpark(sql="SELECT 1 AS id", schema=T.StructType(
        [T.StructField("id", T.IntegerType())]))
    with pytest.raises(ValueError, match=r"partition_by column\(s\) day are not fields of its "
                                         r"input \(id\)"):
        _ = rows | WriteToSpark(format="parquet", path="/tmp/never", partition_by=["day"])
    with pytest.raises(UnsupportedSparkType, match="column 'id' appears 2 times"):
        _ = p | "Twice" >> ReadFromSpark(sql="SELECT 1 AS id, 2 AS id")
