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


def _refused_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_collect_that_cannot_reach_its_result_says_why_not_sockfile() -> None:
    """PySpark 4.x's `_load_from_socket` hides a failed connect to the JVM's result socket
    under UnboundLocalError('sockfile'); the job's error carries the connect error instead."""
    from pyspark.serializers import CPickleSerializer
    from pyspark.util import _load_from_socket

    from sparkbeam.engine.task_errors import stage_error

    port = _refused_port()
    # PySpark's own function, as a DataFrame's collect calls it. If a PySpark release stops
    # raising UnboundLocalError here, this fails and the workaround can go.
    with pytest.raises(UnboundLocalError, match="sockfile") as info:
        with _load_from_socket((port, "secret"), CPickleSerializer()):
            pass
    stage = Stage(index=3, name="s", label="stage-003", description="Write/WriteImpl",
                  transforms=("Write/WriteImpl",), descriptor=b"", inputs=(), outputs=())
    message = str(stage_error(stage, info.value))
    assert "reading the action's result from Spark's JVM" in message
    assert f"'127.0.0.1', {port}" in message and "sockfile" not in message
    assert message.count("CANNOT_OPEN_SOCKET") == 1  # a short text is not repeated
    assert message.startswith(f"Spark failed while running {stage.display}: PySparkRuntimeError")
    # DataFrame.toArrow asks the JVM's serving thread for its result in a finally of its own
    # (pyspark/sql/pandas/conversion.py `_collect_as_arrow`), whose error hides ours in turn.
    with pytest.raises(RuntimeError) as wrapped:
        try:
            with _load_from_socket((port, "secret"), CPickleSerializer()):
                pass
        finally:
            raise RuntimeError("java.net.SocketTimeoutException: Accept timed out\n\tat ...")
    message = str(stage_error(stage, wrapped.value))
    assert "reading the action's result from Spark's JVM" in message
    assert f"'127.0.0.1', {port}" in message and "sockfile" not in message
    assert "(then RuntimeError: java.net.SocketTimeoutException: Accept timed out)" in message
    # An UnboundLocalError of anyone else's is reported as it is.
    def unbound() -> int:
        if port:
            del port_again  # noqa: F821 - deliberately unbound
        port_again = 1
        return port_again

    with pytest.raises(UnboundLocalError) as own:
        unbound()
    assert "UnboundLocalError: cannot access local variable 'port_again'" in str(
        stage_error(stage, own.value))
