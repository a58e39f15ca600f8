"""Child-process driver of the cluster tests: runs catalogue pipelines on FnApiRunner and on
SparkRunner (with the given pipeline arguments) and writes both outputs as JSON.

    python -m tests.cluster.run_pipelines OUT.json NAME[,NAME...] -- SPARKRUNNER_ARGS...

One process per Spark driver: the test session's own local[2] SparkContext stays untouched.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
import typing

from apache_beam.options.pipeline_options import PipelineOptions

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def main(argv: list[str]) -> int:
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    from sparkbeam import SparkRunner
    from sparkbeam.execute.session import active_session as _active_session
    from tests.integration.conftest import run_and_collect
    from tests.integration.pipelines import PIPELINES

    out_path, names = argv[0], argv[1].split(",")
    args = argv[argv.index("--") + 1:] if "--" in argv else []
    results: dict[str, dict] = {}
    for name in names:
        entry: dict = {}
        if name in CHECKS:
            try:
                entry = CHECKS[name](args)
            except Exception as exc:  # noqa: BLE001 - reported to the parent test
                entry["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
            results[name] = entry
            continue
        build = PIPELINES[name]
        for _attempt in range(2):
            # A failed or different first run is retried once and reported with the result
            # (a warning in the parent test), so a flake under load shows without failing.
            if entry:
                entry = {"first_attempt": _summary(entry)}
            try:
                entry["expected"] = run_and_collect(build, FnApiRunner())
                started = time.monotonic()
                entry["actual"] = run_and_collect(build, SparkRunner(), args)
                entry["seconds"] = round(time.monotonic() - started, 1)
                entry["session"] = _describe(_active_session())
            except Exception as exc:  # noqa: BLE001 - reported to the parent test
                entry["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
            if "error" not in entry and entry["actual"] == entry["expected"]:
                break
        results[name] = entry
        with open(out_path, "w") as f:
            json.dump(results, f)
    session = _active_session()
    described = [r["session"] for r in results.values() if "session" in r]
    results["_session"] = {
        **_describe(session),
        "sessions": len({d["id"] for d in described}),
    }
    with open(out_path, "w") as f:
        json.dump(results, f)
    if session is not None:
        session.stop()
    else:
        from pyspark import SparkContext

        if SparkContext._active_spark_context is not None:
            SparkContext._active_spark_context.stop()
    return 0


def check_user_error(args: list[str]) -> dict:
    """A failing DoFn: which error the driver gets, with which fields."""
    import apache_beam as beam

    from sparkbeam import SparkRunner

    def explode(x):  # type: ignore[no-untyped-def]
        if x == 3:
            raise ValueError("boom")
        return x

    try:
        with beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(args)) as p:
            _ = p | beam.Create([1, 2, 3]) | "ExplodeOnThree" >> beam.Map(explode)
    except Exception as exc:  # noqa: BLE001 - what is raised is the result
        return {
            "type": type(exc).__name__,
            "transform": getattr(exc, "transform", None),
            "exc_type": getattr(exc, "exc_type", None),
            "traceback": getattr(exc, "user_traceback", None),
            "text": str(exc)[:4000],
        }
    return {"type": None}


def check_cancel(args: list[str]) -> dict:
    """A slow job cancelled while running: the final state and how long cancel() took."""
    import apache_beam as beam

    from sparkbeam import SparkRunner

    def slow(x):  # type: ignore[no-untyped-def]
        time.sleep(0.5)
        return x

    p = beam.Pipeline(runner=SparkRunner(), options=PipelineOptions([*args, "--parallelism=2"]))
    _ = p | beam.Create(range(400)) | beam.Map(slow)
    result = p.run()
    result.wait_until_finish(duration=4000)
    running = result.state
    started = time.monotonic()
    state = result.cancel()
    return {"running": running, "state": state,
            "cancel_seconds": round(time.monotonic() - started, 1)}


def check_metrics(args: list[str]) -> dict:
    """A user counter: its committed value."""
    import apache_beam as beam
    from apache_beam.metrics import Metrics
    from apache_beam.metrics.metric import MetricsFilter

    from sparkbeam import SparkRunner

    class Count(beam.DoFn):
        def __init__(self) -> None:
            self.seen = Metrics.counter("cluster", "seen")

        def process(self, x):  # type: ignore[no-untyped-def]
            self.seen.inc()
            yield x

    p = beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(args))
    _ = p | beam.Create(range(50)) | beam.ParDo(Count())
    result = p.run()
    result.wait_until_finish()
    counters = result.metrics().query(MetricsFilter().with_name("seen"))["counters"]
    return {"committed": sum(c.committed for c in counters)}


def check_py_file(args: list[str]) -> dict:
    """A zip shipped with Datasets.add_py_file is importable in the tasks."""
    import zipfile

    from sparkbeam.execute.dataset import Datasets
    from sparkbeam.execute.session import get_session
    from sparkbeam.options import SparkOptions

    module = f"sparkbeam_cluster_probe_{os.getpid()}"
    path = os.path.join(os.environ.get("SPARKBEAM_TEST_TMP", "/tmp"), f"{module}.zip")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{module}.py", "VALUE = 42\n")
    ds = Datasets(get_session(PipelineOptions(args).view_as(SparkOptions)))
    ds.add_py_file(path)

    def task(rows, attempt):  # type: ignore[no-untyped-def]
        import importlib

        value = importlib.import_module(module).VALUE
        for _ in rows:
            yield (0, None, str(value).encode())

    out = ds.map_stage(ds.impulse(b"x"), task)
    values = [v.decode() for _, v in ds.collect_tag(out, 0)]
    ds.release(out)
    return {"values": values}


def check_sparkbeam_shipped(args: list[str]) -> dict:
    """Where the executors import sparkbeam from: the zip the job shipped (so nodes without
    sparkbeam installed run it too)."""
    import apache_beam as beam

    from sparkbeam import SparkRunner

    out = os.path.join(os.environ.get("SPARKBEAM_TEST_TMP", "/tmp"), f"where-{os.getpid()}.txt")

    def where(_):  # type: ignore[no-untyped-def]
        import sparkbeam

        with open(out, "a") as f:
            f.write(sparkbeam.__file__ + "\n")
        return 0

    p = beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(args))
    _ = p | beam.Create(range(4)) | beam.Map(where)
    p.run().wait_until_finish()
    with open(out) as f:
        return {"files": sorted(set(f.read().split()))}


# At module level: Beam resolves the type hints of MapTuple(Total) in this module's globals.
Total = typing.NamedTuple("Total", [("k", int), ("total", int)])  # noqa: UP014


def check_spark_io(args: list[str]) -> dict:
    """Parquet read by ReadFromSpark, summed per key by Beam, written by WriteToSpark as JSON,
    all on the mode's session; the totals as Spark reads them back."""
    import apache_beam as beam

    from sparkbeam import SparkRunner
    from sparkbeam.io import ReadFromSpark, WriteToSpark, spark_session

    base = os.path.join(os.environ.get("SPARKBEAM_TEST_TMP", "/tmp"), f"spark-io-{os.getpid()}")
    source, target = f"{base}-in", f"{base}-out"
    p = beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(args))
    spark = spark_session(p)
    spark.sql("SELECT CAST(id % 5 AS INT) AS k, id AS v FROM range(1000)").write.parquet(source)
    beam.coders.registry.register_coder(Total, beam.coders.RowCoder)
    _ = (p | ReadFromSpark(format="parquet", path=source)
         | beam.Map(lambda r: (r.k, r.v)) | beam.CombinePerKey(sum)
         | beam.MapTuple(Total).with_output_types(Total)
         | WriteToSpark(format="json", path=target))
    p.run().wait_until_finish()
    return {"totals": sorted([r.k, r.total] for r in spark.read.json(target).collect())}


def check_spark_stream(args: list[str]) -> dict:
    """JSON files landed in a directory, streamed by ReadFromSpark, written by the streaming
    WriteToSpark as Parquet, on the mode's session; drained once every row is written; the
    rows as Spark reads them back."""
    import json as json_module

    import apache_beam as beam

    from sparkbeam import SparkRunner
    from sparkbeam.io import ReadFromSpark, WriteToSpark, spark_session

    base = os.path.join(os.environ.get("SPARKBEAM_TEST_TMP", "/tmp"),
                        f"spark-stream-{os.getpid()}")
    landing, target = f"{base}-in", f"{base}-out"
    os.makedirs(landing)
    for n in range(3):
        with open(f"{landing}/.part-{n}", "w") as f:
            f.writelines(json_module.dumps({"k": i % 5, "total": i}) + "\n"
                         for i in range(20 * n, 20 * n + 20))
        os.rename(f"{landing}/.part-{n}", f"{landing}/part-{n}.json")
    p = beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(
        [*args, "--streaming", f"--checkpoint_dir={base}-ckpt"]))
    spark = spark_session(p)
    beam.coders.registry.register_coder(Total, beam.coders.RowCoder)
    _ = (p | ReadFromSpark(format="json", path=landing, schema="k int, total long")
         | beam.Map(lambda r: Total(r.k, r.total)).with_output_types(Total)
         | WriteToSpark(format="parquet", path=target, mode="append"))
    result = p.run()  # over Connect: refused at Prepare, reported as this check's error
    deadline = time.monotonic() + 120
    rows: list = []
    while time.monotonic() < deadline and len(rows) < 60:
        time.sleep(1)
        if os.path.isdir(target) and any(n.startswith("part-") for n in os.listdir(target)):
            rows = spark.read.parquet(target).collect()
    result.drain()
    result.wait_until_finish(120_000)
    return {"rows": sorted([r.k, r.total] for r in spark.read.parquet(target).collect())}


CHECKS = {"check_user_error": check_user_error, "check_cancel": check_cancel,
          "check_metrics": check_metrics, "check_py_file": check_py_file,
          "check_sparkbeam_shipped": check_sparkbeam_shipped, "check_spark_io": check_spark_io,
          "check_spark_stream": check_spark_stream}


def _summary(entry: dict) -> str:
    if "error" in entry:
        return str(entry["error"])[-3000:]
    missing = sorted(set(entry["expected"]) - set(entry["actual"]))[:5]
    extra = sorted(set(entry["actual"]) - set(entry["expected"]))[:5]
    return (f"outputs differ: {len(entry['actual'])} lines vs {len(entry['expected'])} expected; "
            f"missing {missing}; unexpected {extra}")


def _describe(session) -> dict:  # type: ignore[no-untyped-def]
    from pyspark import SparkContext

    from sparkbeam.execute.session import is_connect

    kind = f"{type(session).__module__}.{type(session).__name__}"
    if is_connect(session):
        return {"type": kind, "id": session.session_id, "master": None}
    # A classic session made in a job's thread is not active in this one: ask the context.
    sc = SparkContext._active_spark_context
    if sc is None:
        return {"type": kind, "id": None, "master": None}
    return {"type": kind, "id": sc.applicationId, "master": sc.master}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
