"""Parquet into a Beam pipeline that sums a column per key (issue 20), in one invocation:

    python -m bench.spark_io [--rows 10000000] [--keys 1000]

- sparkbeam, `ReadFromSpark` (Spark's Parquet reader, part of the plan);
- sparkbeam, Beam's `ReadFromParquet` (pyarrow in Python, a splittable read);
- FnApiRunner in-process, `ReadFromParquet`; FnApiRunner, `ReadFromSpark` (a local session's
  rows collected into the reading process: the simplest correct way);
- hand-written PySpark: `groupBy(k).sum(v)` (Spark's JVM aggregation: the engine's limit).
Every Beam variant ends in `WriteToSpark` of the 1,000 totals; all totals are checked equal.
Wall time per run, warm (a small run of each first), on one SparkSession (local[2]).
Writes bench/SPARK_IO.md (included in RESULTS.md), bench/spark_io.json, bench/spark_io.png.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import time
import typing
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

HERE = os.path.dirname(os.path.abspath(__file__))

Total = typing.NamedTuple("Total", [("k", int), ("total", int)])  # noqa: UP014
beam.coders.registry.register_coder(Total, beam.coders.RowCoder)


def _beam_sum(read: Callable[[], beam.PTransform], out: str) -> Callable[[beam.Pipeline], None]:
    from sparkbeam.io import WriteToSpark

    def build(p: beam.Pipeline) -> None:
        _ = (p | "Read" >> read()
             | beam.Map(lambda r: (r["k"], r["v"]) if isinstance(r, dict) else (r.k, r.v))
             | beam.CombinePerKey(sum)
             | beam.MapTuple(Total).with_output_types(Total)
             | WriteToSpark(format="parquet", path=out, mode="overwrite"))
    return build


def _variants(source: str) -> dict[str, tuple[str, Callable[[], beam.PTransform]]]:
    from sparkbeam.io import ReadFromSpark

    return {
        "sparkbeam, ReadFromSpark": (
            "sparkbeam", lambda: ReadFromSpark(format="parquet", path=source)),
        "sparkbeam, ReadFromParquet": (
            "sparkbeam", lambda: beam.io.ReadFromParquet(f"{source}/*.parquet")),
        "FnApiRunner, ReadFromParquet": (
            "fnapi", lambda: beam.io.ReadFromParquet(f"{source}/*.parquet")),
        "FnApiRunner, ReadFromSpark": (
            "fnapi", lambda: ReadFromSpark(format="parquet", path=source)),
    }


def _runner(name: str) -> Any:
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    from sparkbeam import SparkRunner

    return SparkRunner() if name == "sparkbeam" else FnApiRunner()


def _timed(build: Callable[[beam.Pipeline], None], runner: str) -> float:
    started = time.perf_counter()
    with beam.Pipeline(runner=_runner(runner), options=PipelineOptions(
            ["--spark_master=local[2]", "--parallelism=2"])) as p:
        build(p)
    return time.perf_counter() - started


def _totals(spark: Any, path: str) -> list[tuple[int, int]]:
    return sorted((r["k"], r["total"]) for r in spark.read.parquet(path).collect())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--skip", nargs="*", default=[], help="variants to leave out")
    args = parser.parse_args(argv)

    from sparkbeam.execute.session import get_session
    from sparkbeam.options import SparkOptions

    spark = get_session(SparkOptions(["--spark_master=local[2]", "--parallelism=2",
                                      "--spark_conf=spark.driver.memory=4g"]))
    work = tempfile.mkdtemp(prefix="sparkbeam-bench-spark-io-")
    rows: list[dict[str, Any]] = []
    try:
        sources = {}
        for n in (10_000, args.rows):  # the small one warms every path first
            sources[n] = os.path.join(work, f"in-{n}")
            spark.sql(f"SELECT CAST(id % {args.keys} AS INT) AS k, id AS v, "
                      f"uuid() AS note FROM range({n})").write.parquet(sources[n])
        t0 = time.perf_counter()
        hand_out = os.path.join(work, "hand")
        (spark.read.parquet(sources[args.rows]).groupBy("k").sum("v")
         .withColumnRenamed("sum(v)", "total").write.mode("overwrite").parquet(hand_out))
        hand = time.perf_counter() - t0
        expected = _totals(spark, hand_out)
        rows.append({"variant": "hand-written PySpark", "seconds": hand, "correct": True})
        print(json.dumps(rows[-1]), flush=True)
        for name, (runner, read) in _variants(sources[args.rows]).items():
            if name in args.skip:
                continue
            warm_out = os.path.join(work, "warm")
            _timed(_beam_sum(_variants(sources[10_000])[name][1], warm_out), runner)
            out = os.path.join(work, name.replace(", ", "-").replace(" ", ""))
            seconds = _timed(_beam_sum(read, out), runner)
            rows.append({"variant": name, "seconds": seconds,
                         "correct": _totals(spark, out) == expected})
            print(json.dumps(rows[-1]), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results = {"date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
               "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}",
               "rows_read": args.rows, "keys": args.keys, "runs": rows}
    with open(os.path.join(HERE, "spark_io.json"), "w") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(HERE, "SPARK_IO.md"), "w") as f:
        f.write(markdown(results))
    chart(results, os.path.join(HERE, "spark_io.png"))


def markdown(results: dict[str, Any]) -> str:
    hand = next(r["seconds"] for r in results["runs"] if r["variant"] == "hand-written PySpark")
    ours = {r["variant"]: r["seconds"] for r in results["runs"]}
    lines = [
        "## Spark tables into Beam: ReadFromSpark vs ReadFromParquet (issue 20)",
        "",
        f"{results['date']}, {results['machine']}, local[2]; `python -m bench.spark_io`: "
        f"{results['rows_read']:,} rows of Parquet (int key of {results['keys']:,}, long "
        "value, a uuid string column not read by the sum), summed per key by a Beam pipeline "
        "ending in WriteToSpark; warm, one run each, one invocation.",
        "",
        "| variant | seconds | vs hand-written | vs sparkbeam ReadFromSpark | correct |",
        "|---|---|---|---|---|",
    ]
    base = ours.get("sparkbeam, ReadFromSpark")
    for r in results["runs"]:
        vs_ours = f"{r['seconds'] / base:.2f}x" if base else "-"
        lines.append(f"| {r['variant']} | {r['seconds']:.1f} | {r['seconds'] / hand:.2f}x | "
                     f"{vs_ours} | {'yes' if r['correct'] else 'NO'} |")
    lines += ["", "![ReadFromSpark vs ReadFromParquet](spark_io.png)", ""]
    return "\n".join(lines)


def chart(results: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = results["runs"]
    fig, ax = plt.subplots(figsize=(8, 3.2))
    ax.barh([r["variant"] for r in runs], [r["seconds"] for r in runs], color="#4c72b0")
    ax.invert_yaxis()
    ax.set_xlabel("seconds (lower is better)")
    ax.set_title(f"{results['rows_read']:,} Parquet rows summed per key ({results['date']})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
