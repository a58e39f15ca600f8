"""SparkRunner's promises beyond outputs: errors, metrics, bundle bounds, cancel, sessions."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import time

import apache_beam as beam
import pytest
from apache_beam.metrics import Metrics, MetricsFilter
from apache_beam.options.pipeline_options import DebugOptions, PipelineOptions
from apache_beam.runners.runner import PipelineState
from apache_beam.testing.util import assert_that, equal_to

from sparkbeam import SparkRunner
from sparkbeam.errors import UnsupportedFeatureError, UserCodeError


def _pipeline(*args: str) -> beam.Pipeline:
    return beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(list(args)))


def test_user_exception_names_transform_type_message_and_traceback() -> None:
    def explode(x):  # type: ignore[no-untyped-def]
        if x == 3:
            raise ValueError("boom")
        return x

    with pytest.raises(UserCodeError, match=r"(?s)'ExplodeOnThree'.*ValueError: boom") as info:
        with _pipeline() as p:
            _ = p | beam.Create([1, 2, 3]) | "ExplodeOnThree" >> beam.Map(explode)
    err = info.value
    assert err.transform == "ExplodeOnThree"
    assert err.exc_type == "ValueError"
    assert "stage-" in err.stage
    assert "in explode" in err.user_traceback  # the user's own frame
    assert "Py4J" not in str(err) and "Python worker exited" not in str(err)


class _FailsToSetUp(beam.DoFn):
    def setup(self) -> None:
        raise ValueError("cannot load the lookup table")

    def process(self, x):  # type: ignore[no-untyped-def]
        yield x


def test_a_dofn_whose_setup_fails_is_a_user_error_naming_its_transform() -> None:
    # Raised while Beam's bundle processor is built for the task, before any bundle (it was
    # a bare PythonException until 2026-12-02).
    with pytest.raises(UserCodeError, match=r"(?s)'LoadTable'.*ValueError: cannot load") as info:
        with _pipeline() as p:
            _ = p | beam.Create([1, 2, 3]) | "LoadTable" >> beam.ParDo(_FailsToSetUp())
    assert info.value.transform == "LoadTable"
    assert "in setup" in info.value.user_traceback


def test_a_stage_run_in_the_driver_reports_errors_and_metrics_like_a_spark_task(
        caplog) -> None:  # type: ignore[no-untyped-def]
    """Create([None]) | Map(...) read only as a side input runs in the driver (no Spark job):
    its counter is committed once, its failure names the transform and the user's frame."""
    caplog.set_level(logging.INFO, logger="sparkbeam.runner")
    made = Metrics.counter("driver", "made")

    def make(_):  # type: ignore[no-untyped-def]
        made.inc()
        return 10

    p = _pipeline()
    side = p | "One" >> beam.Create([None]) | "Make" >> beam.Map(make)
    out = (p | beam.Create([1, 2])
           | "Add" >> beam.Map(lambda x, n: x + n, beam.pvalue.AsSingleton(side)))
    assert_that(out, equal_to([11, 12]))
    result = p.run()
    assert result.wait_until_finish() == PipelineState.DONE
    (c,) = result.metrics().query(MetricsFilter().with_name("made"))["counters"]
    assert (c.committed, c.attempted) == (1, 1)
    assert any("[One/FlatMap" in r.message and "Make] in the driver" in r.message
               for r in caplog.records), [r.message for r in caplog.records]

    def explode(_):  # type: ignore[no-untyped-def]
        raise ValueError("no side for you")

    with pytest.raises(UserCodeError, match=r"(?s)'ExplodeInDriver'.*ValueError: no side") as info:
        with _pipeline() as p:
            side = p | "One" >> beam.Create([None]) | "ExplodeInDriver" >> beam.Map(explode)
            _ = p | beam.Create([1]) | beam.Map(lambda x, n: x, beam.pvalue.AsSingleton(side))
    assert "in explode" in info.value.user_traceback


def test_every_unsupported_feature_is_listed_at_once() -> None:
    from apache_beam.testing.test_stream import TestStream

    p = _pipeline()  # batch, kept so by Dataflow's experiment (else a TestStream streams)
    _ = p | TestStream().add_elements([1]) | beam.Map(lambda x: x)
    p._options.view_as(DebugOptions).experiments = [
        "beam_fn_api", "unsafely_attempt_to_process_unbounded_data_in_batch_mode"]
    proto = p.to_runner_api()
    proto.requirements.append("beam:requirement:made_up:v1")
    with pytest.raises(UnsupportedFeatureError) as info:
        SparkRunner().run_portable_pipeline(proto, p._options)
    text = str(info.value)
    assert ("TestStream in batch in transform 'TestStream' (a TestStream runs as a stream; "
            "drop the experiment unsafely_attempt_to_process_unbounded_data_in_batch_mode)"
            in text)
    assert "pipeline requirement beam:requirement:made_up:v1" in text
    assert len(info.value.features) == 2


def test_bundles_never_exceed_bundle_size() -> None:
    class BundleSizes(beam.DoFn):
        def start_bundle(self) -> None:
            self.n = 0

        def process(self, x):  # type: ignore[no-untyped-def]
            self.n += 1
            yield x

        def finish_bundle(self) -> None:
            Metrics.distribution("test", "bundle_elements").update(self.n)

    # Each of the 10k groups is one element fed to the bundle processor of the stage after
    # the GroupByKey (a Reshuffle would fan each group out into many elements downstream).
    # (100k took ~170 s here: ~8 ms per bundle of 10.)
    p = _pipeline("--bundle_size=10", "--parallelism=2")
    _ = (p | beam.Create(range(10_000)) | beam.Map(lambda x: (x, x)) | beam.GroupByKey()
         | beam.ParDo(BundleSizes()))
    result = p.run()
    result.wait_until_finish()
    (dist,) = result.metrics().query(MetricsFilter().with_name("bundle_elements"))[
        "distributions"
    ]
    assert dist.committed.sum == 10_000
    assert dist.committed.max == 10
    assert dist.committed.count >= 1_000


def test_metrics_counters_distributions_gauges_and_element_counts() -> None:
    counter = Metrics.counter("ns", "seen")
    dist = Metrics.distribution("ns", "len")
    gauge = Metrics.gauge("ns", "last")

    def observe(x):  # type: ignore[no-untyped-def]
        counter.inc()
        dist.update(len(x))
        gauge.set(7)
        return x

    p = _pipeline()
    _ = p | beam.Create(["a", "bb", "ccc"]) | "Observe" >> beam.Map(observe)
    result = p.run()
    assert result.wait_until_finish() == PipelineState.DONE
    metrics = result.metrics().query(MetricsFilter().with_namespace("ns"))
    (c,) = metrics["counters"]
    assert (c.committed, c.attempted) == (3, 3)
    assert c.key.step == "Observe"
    (d,) = metrics["distributions"]
    assert (d.committed.sum, d.committed.count, d.committed.min, d.committed.max) == (6, 3, 1, 3)
    (g,) = metrics["gauges"]
    assert g.committed.value == 7
    from sparkbeam.metrics import element_counts

    counts = element_counts(result.monitoring_infos())
    assert 3 in counts.values()


def test_wait_until_finish_honours_duration_and_cancel_stops_the_job() -> None:
    def slow(x):  # type: ignore[no-untyped-def]
        time.sleep(0.5)
        return x

    p = _pipeline("--parallelism=2")
    _ = p | beam.Create(range(400)) | beam.Map(slow)
    result = p.run()
    started = time.monotonic()
    state = result.wait_until_finish(duration=1500)
    waited = time.monotonic() - started
    assert state in (PipelineState.STARTING, PipelineState.RUNNING)
    assert 1.0 <= waited < 30
    assert result.cancel() == PipelineState.CANCELLED
    assert result.wait_until_finish() == PipelineState.CANCELLED


def test_reuses_the_active_spark_session(spark) -> None:  # type: ignore[no-untyped-def]
    from pyspark.sql import SparkSession

    with _pipeline() as p:
        assert_that(p | beam.Create([1, 2]) | beam.Map(lambda x: x * 2), equal_to([2, 4]))
    assert SparkSession.getActiveSession() is spark


def test_a_job_keeps_the_settings_of_the_session_it_runs_on(spark) -> None:  # type: ignore[no-untyped-def]
    # The job runs in a thread of its own, where PySpark sees no active session: it used to
    # ask for a new one with sparkbeam's settings, which getOrCreate applied to this one.
    keys = ("spark.sql.shuffle.partitions", "spark.sql.adaptive.enabled")
    saved = {k: spark.conf.get(k) for k in keys}
    spark.conf.set("spark.sql.shuffle.partitions", "5")
    spark.conf.set("spark.sql.adaptive.enabled", "true")
    try:
        with _pipeline() as p:
            assert_that(p | beam.Create([1, 2]) | beam.Map(lambda x: x * 2), equal_to([2, 4]))
        assert {k: spark.conf.get(k) for k in keys} == {
            "spark.sql.shuffle.partitions": "5", "spark.sql.adaptive.enabled": "true"}
    finally:
        for k, v in saved.items():
            spark.conf.set(k, v)


def _spark_home_failing(tmp_path, failures: int):  # type: ignore[no-untyped-def]
    """A SPARK_HOME whose spark-submit exits at once `failures` times, then runs PySpark's own
    (what a gateway JVM that dies at launch looks like to PySpark); and its call log."""
    from pyspark.find_spark_home import _find_spark_home

    real = _find_spark_home()
    calls = tmp_path / "calls"
    (tmp_path / "bin").mkdir()
    submit = tmp_path / "bin" / "spark-submit"
    submit.write_text(textwrap.dedent(f"""\
        #!/usr/bin/env bash
        echo call >> {str(calls)!r}
        if [ "$(wc -l < {str(calls)!r})" -le {failures} ]; then exit 1; fi
        SPARK_HOME={real!r} exec {real!r}/bin/spark-submit "$@"
    """))
    submit.chmod(0o755)
    return tmp_path, calls


_START = textwrap.dedent("""
    import logging
    from apache_beam.options.pipeline_options import PipelineOptions
    from sparkbeam.execute.session import get_session
    from sparkbeam.options import SparkOptions

    logging.basicConfig(level=logging.INFO)
    spark = get_session(PipelineOptions(["--spark_master=local[1]"]).view_as(SparkOptions))
    print("ROWS", spark.range(3).count())
    spark.stop()
""")


def _start_with(home) -> subprocess.CompletedProcess:  # type: ignore[no-untyped-def]
    env = dict(os.environ, SPARK_HOME=str(home), PYSPARK_PYTHON=sys.executable)
    return subprocess.run([sys.executable, "-c", _START], capture_output=True, text=True,
                          timeout=120, env=env)


def test_a_gateway_jvm_that_exits_at_launch_is_launched_again(tmp_path) -> None:  # type: ignore[no-untyped-def]
    home, calls = _spark_home_failing(tmp_path, failures=1)
    out = _start_with(home)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ROWS 3" in out.stdout
    assert calls.read_text().count("call") == 2
    assert "JAVA_GATEWAY_EXITED, attempt 1 of 3); launching it again" in out.stderr


def test_a_gateway_that_never_starts_fails_naming_the_master_after_three_launches(
        tmp_path) -> None:  # type: ignore[no-untyped-def]
    home, calls = _spark_home_failing(tmp_path, failures=99)
    out = _start_with(home)
    assert out.returncode != 0
    assert calls.read_text().count("call") == 3
    assert ("ExecutionError: the SparkSession could not start on master local[1]: "
            "PySparkRuntimeError: [JAVA_GATEWAY_EXITED]") in out.stderr


def test_task_retries_do_not_double_count_committed_metrics(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A task that fails once and is retried (local[2,3] allows retries) counts once."""
    script = tmp_path / "retry.py"
    marker = tmp_path / "failed-once"
    script.write_text(textwrap.dedent(f"""
        import os, sys
        import apache_beam as beam
        from apache_beam.metrics import Metrics, MetricsFilter
        from apache_beam.options.pipeline_options import PipelineOptions
        from sparkbeam import SparkRunner

        def flaky(x):
            Metrics.counter("ns", "processed").inc()
            if x == 7 and not os.path.exists({str(marker)!r}):
                open({str(marker)!r}, "w").close()
                raise RuntimeError("transient")
            return x

        p = beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(
            ["--spark_master=local[2,3]", "--parallelism=2"]))
        _ = p | beam.Create(range(20)) | beam.Map(flaky)
        result = p.run()
        result.wait_until_finish()
        (c,) = result.metrics().query(MetricsFilter().with_name("processed"))["counters"]
        print("COMMITTED", c.committed, "ATTEMPTED", c.attempted)

        # A stateful stage handed to the plain stage after it, in the same tasks: the
        # consumer's retry runs the stateful part again, and each counts once.
        from apache_beam.coders import VarIntCoder
        from apache_beam.transforms import userstate

        class Tally(beam.DoFn):
            SEEN = userstate.ReadModifyWriteStateSpec("seen", VarIntCoder())

            def process(self, kv, seen=beam.DoFn.StateParam(SEEN)):
                Metrics.counter("ns", "tallied").inc()
                seen.write((seen.read() or 0) + 1)
                yield kv[1]

        def flaky_after(x):
            Metrics.counter("ns", "after").inc()
            if x == 7 and not os.path.exists({str(marker)!r} + "-after"):
                open({str(marker)!r} + "-after", "w").close()
                raise RuntimeError("transient")
            return x

        p = beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(
            ["--spark_master=local[2,3]", "--parallelism=2"]))
        _ = (p | beam.Create(range(20)) | beam.Map(lambda x: (x % 3, x))
             | beam.ParDo(Tally()) | beam.Map(flaky_after))
        result = p.run()
        result.wait_until_finish()
        for name in ("tallied", "after"):
            (c,) = result.metrics().query(MetricsFilter().with_name(name))["counters"]
            print(name.upper(), c.committed, "ATTEMPTED", c.attempted)
    """))
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=240, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert marker.exists(), "the flaky task never failed, so the test proved nothing"
    assert "COMMITTED 20 ATTEMPTED" in out.stdout
    attempted = int(out.stdout.split("ATTEMPTED")[1].split()[0])
    assert attempted > 20, "the failed attempt's work must count as attempted"
    assert os.path.exists(f"{marker}-after"), "the consumer never failed: nothing proved"
    assert "TALLIED 20 ATTEMPTED" in out.stdout and "AFTER 20 ATTEMPTED" in out.stdout, out.stdout


def test_a_stage_output_read_by_two_stages_is_computed_once(tmp_path) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "processed.log"

    def side_effect(x):  # type: ignore[no-untyped-def]
        with open(log, "a") as f:  # one line per time user code sees the element
            f.write(f"{x}\n")
        return (x % 3, x)

    p = _pipeline("--parallelism=2")
    keyed = p | beam.Create(range(60)) | "SideEffect" >> beam.Map(side_effect)
    sums = keyed | "Sum" >> beam.CombinePerKey(sum)
    counts = keyed | "Group" >> beam.GroupByKey() | beam.MapTuple(lambda k, vs: (k, len(list(vs))))
    assert_that(sums, equal_to([(0, 570), (1, 590), (2, 610)]), label="sums")
    assert_that(counts, equal_to([(0, 20), (1, 20), (2, 20)]), label="counts")
    p.run().wait_until_finish()
    seen = log.read_text().split()
    assert sorted(map(int, seen)) == list(range(60))  # each element processed exactly once


class _SetupLog(beam.DoFn):
    """Appends this process's pid on setup and on each bundle start."""

    def __init__(self, directory: str) -> None:
        self._dir = directory

    def _log(self, name: str) -> None:
        with open(os.path.join(self._dir, name), "a") as f:
            f.write(f"{os.getpid()}\n")

    def setup(self) -> None:
        self._log("setups")

    def start_bundle(self) -> None:
        self._log("bundles")

    def process(self, x):  # type: ignore[no-untyped-def]
        yield x


def test_a_descriptor_is_set_up_once_per_python_worker_not_per_bundle(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """8 tasks of 250 bundles: the stage's descriptor (and its DoFns) is built once in each
    Python worker process, then reused by every later task and bundle there."""
    p = _pipeline("--parallelism=8", "--bundle_size=8")
    out = p | beam.Create(range(2000)) | beam.Reshuffle() | beam.ParDo(_SetupLog(str(tmp_path)))
    assert_that(out, equal_to(list(range(2000))))
    p.run().wait_until_finish()
    setups = (tmp_path / "setups").read_text().split()
    bundles = (tmp_path / "bundles").read_text().split()
    assert len(bundles) >= 250
    assert len(setups) == len(set(setups)), f"set up twice in one process: {setups}"
    assert set(setups) == set(bundles)  # every process that ran bundles set up once
    assert len(setups) < 8, f"{len(setups)} setups for 8 tasks: workers were not reused"


def test_stage_dataframes_are_named_after_their_stage_in_the_spark_ui(spark) -> None:  # type: ignore[no-untyped-def]
    from sparkbeam.execute.dataset import Datasets

    ds = Datasets(spark, 2)
    df = ds.map_stage(ds.impulse(b"x"), lambda rows, attempt: iter(()),
                      "stage-003 [Count/CombinePerKey]")
    plan = df._jdf.queryExecution().analyzed().toString()  # what the SQL tab draws
    assert "stage_003_Count_CombinePerKey" in plan, plan
    ds.release(df)


def test_an_impulse_is_made_by_the_jvm_without_a_python_worker(spark) -> None:  # type: ignore[no-untyped-def]
    """A classic session's createDataFrame of local rows runs a Python RDD: each task reading
    it would take a Python worker, and a session's first job a second worker daemon."""
    from sparkbeam.execute.dataset import Datasets

    ds = Datasets(spark, 2)
    impulse, empty = ds.impulse(b"\x00\xffimpulse"), ds.empty()
    for df in (impulse, empty):
        plan = df._jdf.queryExecution().executedPlan().toString()
        assert "Python" not in plan and "ExternalRDD" not in plan, plan
    assert impulse._jdf.rdd().getNumPartitions() == 1
    assert [tuple(r) for r in impulse.collect()] == [(0, None, bytearray(b"\x00\xffimpulse"))]
    assert empty.collect() == []
    assert [f.name for f in impulse.schema.fields] == ["input", "key", "value"]


def test_python_workers_import_the_installed_pyspark_not_sparks_zip_of_it(spark) -> None:
    """Workers forked from sparkbeam's daemon run PySpark from the installed package (cached
    bytecode), not from $SPARK_HOME/python/lib/pyspark.zip, which Spark puts first on their
    path and which Python would compile again in every daemon."""
    import pyarrow as pa
    import pyspark

    def where(batches):  # type: ignore[no-untyped-def]
        import sys

        import pyspark as worker_pyspark
        for _ in batches:
            yield pa.RecordBatch.from_pydict({"file": [worker_pyspark.__file__],
                                              "zip_on_path": [str([p for p in sys.path
                                                                   if p.endswith(".zip")])]})

    (row,) = spark.range(1).coalesce(1).mapInArrow(where, "file string, zip_on_path string"
                                                   ).collect()
    assert "pyspark.zip" in row.zip_on_path, row  # Spark did put the zip on the path
    assert row.file == pyspark.__file__, row
