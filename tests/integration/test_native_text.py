"""ReadFromText through Spark's text source reads exactly Beam's lines: differential tests
against FnApiRunner on the same pipeline, with generated files, in both bundle shapes."""
from __future__ import annotations

import os
import tempfile

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkbeam import SparkRunner
from sparkbeam.errors import UserCodeError
from sparkbeam.runner import prepare
from tests.integration.conftest import run_and_collect

SHAPES = {"default": [], "one-per-bundle": ["--bundle_size=1", "--parallelism=1"]}

# Any text but '\n' inside a line ('\r' included: Beam keeps a lone one), some lines long
# enough for two- and three-byte length prefixes.
_CHARS = st.characters(blacklist_categories=("Cs",), blacklist_characters="\n")
_LINE = st.one_of(st.text(_CHARS, max_size=12),
                  st.builds(lambda c, n: c * n, st.sampled_from(["x", "é", "\u2603", "\r"]),
                            st.integers(40, 6000)))


def _render(parts: tuple[list[tuple[str, str]], bool]) -> bytes:
    lines, final_newline = parts
    text = "".join(line + sep for line, sep in lines)
    if lines and not final_newline:
        text = text[: -len(lines[-1][1])]
    return text.encode("utf-8")


_FILE = st.tuples(st.lists(st.tuples(_LINE, st.sampled_from(["\n", "\r\n"])), max_size=10),
                  st.booleans()).map(_render)


def _write(contents: list[bytes]) -> str:
    directory = tempfile.mkdtemp(prefix="sparkbeam-text-")
    for i, content in enumerate(contents):
        with open(os.path.join(directory, f"in-{i}.txt"), "wb") as f:
            f.write(content)
    return os.path.join(directory, "in-*.txt")


def _lines(pattern: str, **kwargs):  # type: ignore[no-untyped-def]
    def build(p):  # type: ignore[no-untyped-def]
        return (p | "ReadLines" >> beam.io.ReadFromText(pattern, **kwargs)
                | beam.Map(lambda line: (line, len(line))))
    return build


def _decisions(build, args: list[str] | None = None) -> tuple[str, ...]:  # type: ignore[no-untyped-def]
    p = beam.Pipeline(options=PipelineOptions(args or []))
    build(p)
    return tuple(d for d in prepare(p.to_runner_api(), p.options).decisions
                 if "Spark's text source" in d or "Beam's reader" in d)  # the reads' lines


@pytest.mark.parametrize("shape", SHAPES)
@settings(max_examples=4, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(contents=st.lists(_FILE, min_size=1, max_size=3))
def test_spark_reads_beams_lines(shape: str, contents: list[bytes]) -> None:
    pattern = _write(contents)
    build = _lines(pattern)
    # Spark's source unless a file is one it would read otherwise (a final lone '\r').
    native = not any(c.endswith(b"\r") for c in contents)
    (decision,) = _decisions(build)
    assert ("Spark's text source" in decision) == native, decision
    assert run_and_collect(build, SparkRunner(), SHAPES[shape]) == run_and_collect(
        build, FnApiRunner())


def test_line_ends_a_byte_order_mark_and_a_lone_cr_are_beams() -> None:
    pattern = _write([b"a\r\nb\n\nc\rd\r\n\r\n" + b"z" * 20_000 + b"\nlast",
                      b"", b"\xef\xbb\xbfbom\n", b"x\ny\r"])
    build = _lines(pattern)
    assert "Beam's reader" in _decisions(build)[0]  # the BOM and the final '\r'
    expected = run_and_collect(build, FnApiRunner())
    assert run_and_collect(build, SparkRunner()) == expected
    plain = _write([b"a\r\nb\n\nc\rd\r\n\r\n" + b"z" * 20_000 + b"\nlast", b""])
    build = _lines(plain)
    assert "Spark's text source (1 file(s)" in _decisions(build)[0]
    assert run_and_collect(build, SparkRunner()) == run_and_collect(build, FnApiRunner())


def test_options_outside_the_translation_take_beams_reader_with_the_same_output() -> None:
    pattern = _write([b"header\none\ntwo\n", b"header\nthree"])
    build = _lines(pattern, skip_header_lines=1)
    (decision,) = _decisions(build)
    assert decision == ("ReadLines/Read: Beam's reader (skip_header_lines=1 has no Spark "
                        "equivalent)")
    expected = run_and_collect(build, FnApiRunner())
    assert expected == sorted(repr((w, len(w))) for w in ("one", "two", "three"))
    assert run_and_collect(build, SparkRunner()) == expected


def test_spark_native_off_keeps_beams_reader() -> None:
    pattern = _write([b"one\ntwo\n"])
    build = _lines(pattern)
    assert _decisions(build, ["--spark_native=off"]) == ()
    assert (run_and_collect(build, SparkRunner(), ["--spark_native=off"])
            == run_and_collect(build, FnApiRunner()))


def test_invalid_utf8_fails_like_beams_read_naming_the_stage_and_the_read() -> None:
    pattern = _write([b"fine\n\xff\xfe broken\n"])
    build = _lines(pattern)
    with pytest.raises(Exception, match="utf-8"):
        run_and_collect(build, FnApiRunner())
    with pytest.raises(UserCodeError, match=r"(?s)stage-\d+ .*in step ReadLines/Read.*'utf-8' "
                       r"codec can't decode byte 0xff"):
        run_and_collect(build, SparkRunner())


# Each byte count's edges: the lengths whose varint grows a byte, and Spark's largest string.
_EDGES = sorted({0, 1, 2**31 - 1} | {2**(7 * k) + d for k in range(1, 5) for d in (-1, 0)})


@settings(max_examples=5, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=200))
def test_the_length_prefix_is_beams_varint(spark, lengths: list[int]) -> None:  # type: ignore[no-untyped-def]
    # The prefix each line's bytes get before the bundle processor decodes them
    # (`dataset._varint`), against Beam's own encoding of the same numbers.
    from apache_beam.coders.coder_impl import create_OutputStream
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from sparkbeam.execute.dataset import _varint

    def beams(n: int) -> bytes:
        out = create_OutputStream()
        out.write_var_int64(n)
        return out.get()

    numbers = _EDGES + lengths
    schema = T.StructType([T.StructField("n", T.IntegerType())])
    df = spark.createDataFrame([(n,) for n in numbers], schema)
    got = [bytes(r.v) for r in df.select(_varint(F.col("n")).alias("v")).collect()]
    assert got == [beams(n) for n in numbers]


def test_a_large_file_is_read_in_even_halves_as_the_executor_expects(spark) -> None:  # type: ignore[no-untyped-def]
    # Spark's split of one file on two cores is half of its bytes plus half a file's open
    # cost: at Spark's 4 MB a 12 MB file's two tasks read 8 and 4 MB, at sparkbeam's 1 MB
    # (`session.FILE_OPEN_COST`) 6.5 and 5.5. The executor's count of a read's tasks
    # (`native_text.spark_splits`) is Spark's, for one file and for many packed together.
    from pyspark.sql import functions as F

    from sparkbeam.execute.dataset import Datasets

    folder = tempfile.mkdtemp(prefix="sparkbeam-split-")
    line = b"x" * 99 + b"\n"

    def tasks(name: str, files: int, lines: int) -> list[int]:
        paths = []
        for i in range(files):
            paths.append(os.path.join(folder, f"{name}-{i}.txt"))
            with open(paths[-1], "wb") as f:
                f.write(line * lines)
        counts = sorted(r["count"] for r in ds.raw_lines(paths).groupBy(
            F.spark_partition_id()).count().collect())
        assert sum(counts) == files * lines
        assert len(counts) == ds.file_partitions([os.path.getsize(p) for p in paths]), name
        return counts

    ds = Datasets(spark, parallelism=2)
    halves = tasks("big", 1, 120_000)  # 12 MB
    assert len(halves) == 2 and halves[0] / halves[1] > 0.8, halves
    assert len(tasks("small", 1, 5_000)) == 1  # 0.5 MB
    assert len(tasks("many", 12, 3_000)) == 2  # 0.3 MB each, six a task
    assert len(tasks("few", 3, 30_000)) == 3  # 3 MB each, one a task
