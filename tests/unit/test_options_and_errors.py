from __future__ import annotations

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from sparkbeam.errors import SparkBeamError
from sparkbeam.engine.task_errors import error_payload, parse_error_payload
from sparkbeam.options import SparkOptions, parse_spark_conf, positive_or_none
from sparkbeam.plan.model import Stage


def test_spark_options_parse_and_share_parallelism_with_flink_options() -> None:
    opts = PipelineOptions([
        "--spark_master=local[3]", "--spark_conf", "a.b=1", "--spark_conf=c=x=y",
        "--parallelism=5", "--bundle_size=7", "--bundle_bytes=99",
    ]).view_as(SparkOptions)
    assert opts.spark_master == "local[3]"
    assert parse_spark_conf(opts.spark_conf) == {"a.b": "1", "c": "x=y"}
    assert (opts.parallelism, opts.bundle_size, opts.bundle_bytes) == (5, 7, 99)
    # every options class at once (as Pipeline.run does) must not clash on --parallelism
    PipelineOptions(["--parallelism=2"]).get_all_options()


def test_defaults() -> None:
    opts = PipelineOptions([]).view_as(SparkOptions)
    assert opts.spark_master is None  # local[*], or what spark-submit was given
    assert positive_or_none(opts.parallelism) is None


def test_malformed_spark_conf_is_a_clear_error() -> None:
    with pytest.raises(SparkBeamError, match=r"--spark_conf expects key=value, got 'novalue'"):
        parse_spark_conf(["novalue"])


def test_task_error_payload_survives_any_wrapping() -> None:
    stage = Stage(index=3, name="s", label="stage-003", description="Parse, Count",
                  transforms=("Parse", "Count"), descriptor=b"", inputs=(), outputs=())
    try:
        raise ValueError("bad row 17 [while running 'Parse']")
    except ValueError as exc:
        text = error_payload(stage, exc)
    wrapped = f"py4j.protocol.Py4JJavaError: ... PythonException: RuntimeError: {text}\n at ..."
    payload = parse_error_payload(wrapped)
    assert payload is not None
    assert payload["transform"] == "Parse"
    assert payload["type"] == "ValueError"
    assert payload["message"] == "bad row 17"
    assert payload["stage"] == "stage-003 [Parse, Count]"
    assert "raise ValueError" in payload["traceback"]
    assert parse_error_payload("no payload here") is None
