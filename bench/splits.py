"""Dynamic work rebalancing benchmark: a skewed splittable read with splitting off and on.

    python -m bench.splits [--unit N] [--repeats R] [--master local[2]]

Eight restrictions, one of them 20x the others, read by a splittable DoFn that burns CPU per
position; `--parallelism` equals the cores, so without splitting one task holds the big
restriction while the others finish and sit idle. Off and on alternate in one process on one
SparkSession, so both see the same machine; the outputs are checked (every position exactly
once). Writes bench/SPLITS.md (included in RESULTS.md) and bench/splits.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import apache_beam as beam
from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms.core import RestrictionProvider

HERE = os.path.dirname(os.path.abspath(__file__))
SKEW = 20
SMALL = 7
BURN = 20_000  # loop iterations per position (about 1 ms of CPU)


def burn(n: int) -> int:
    x = 0
    for i in range(n):
        x += i * i
    return x


class WholeRestriction(RestrictionProvider):
    """One restriction per element, never split up front: the skew stays for the runner."""

    def initial_restriction(self, element: tuple[str, int]) -> OffsetRange:
        return OffsetRange(0, element[1])

    def create_tracker(self, restriction: OffsetRange) -> OffsetRestrictionTracker:
        return OffsetRestrictionTracker(restriction)

    def restriction_size(self, element: tuple[str, int], restriction: OffsetRange) -> int:
        return int(restriction.size())

    def split(self, element: tuple[str, int], restriction: OffsetRange) -> Iterator[OffsetRange]:
        yield restriction


class ReadPositions(beam.DoFn):
    """Emits (name, position) for every position of the element's range, burning CPU each."""

    def process(  # type: ignore[no-untyped-def]
        self, element, tracker=beam.DoFn.RestrictionParam(WholeRestriction())
    ):
        pos = tracker.current_restriction().start
        while tracker.try_claim(pos):
            burn(BURN)
            yield element[0], pos
            pos += 1


def sources(unit: int) -> list[tuple[str, int]]:
    return [("big", SKEW * unit)] + [(f"small{i}", unit) for i in range(SMALL)]


def expected(unit: int) -> list[tuple[str, int]]:
    return sorted((name, pos) for name, size in sources(unit) for pos in range(size))


def skewed_read(p: beam.Pipeline, unit: int) -> beam.PCollection:
    return p | beam.Create(sources(unit)) | beam.ParDo(ReadPositions())


def run_once(mode: str, unit: int, parallelism: int) -> tuple[float, int]:
    """Seconds for one run with splitting `mode`, and how many splits it made."""
    from sparkbeam import SparkRunner

    options = PipelineOptions(
        [f"--dynamic_splitting={mode}", f"--parallelism={parallelism}"]
    )
    seen: list[Any] = []
    p = beam.Pipeline(runner=SparkRunner(), options=options)
    positions = skewed_read(p, unit)
    _ = (positions | beam.combiners.ToList() | beam.Map(seen.append))
    started = time.perf_counter()
    result = p.run()
    result.wait_until_finish()
    elapsed = time.perf_counter() - started
    splits = sum(s["splits"] for s in result.split_stats.values())  # type: ignore[attr-defined]
    return elapsed, splits


def check(mode: str, unit: int, parallelism: int) -> None:
    """Outputs of a run equal the expected positions, each exactly once."""
    from apache_beam.testing.util import assert_that, equal_to

    from sparkbeam import SparkRunner

    options = PipelineOptions([f"--dynamic_splitting={mode}", f"--parallelism={parallelism}"])
    with beam.Pipeline(runner=SparkRunner(), options=options) as p:
        assert_that(skewed_read(p, unit), equal_to(expected(unit)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.splits", description=__doc__)
    parser.add_argument("--unit", type=int, default=800, help="positions of a small restriction")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", os.sys.executable)  # type: ignore[attr-defined]
    from pyspark.sql import SparkSession

    from sparkbeam.execute.session import session_config

    builder = SparkSession.builder.master(args.master).appName("bench-splits")
    for key, value in session_config().items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    parallelism = spark.sparkContext.defaultParallelism
    for mode in ("off", "on"):
        check(mode, max(2, args.unit // 10), parallelism)
    run_once("on", max(2, args.unit // 10), parallelism)  # warm the Python workers
    times: dict[str, list[float]] = {"off": [], "on": []}
    splits: list[int] = []
    for _ in range(args.repeats):
        for mode in ("off", "on"):
            elapsed, n = run_once(mode, args.unit, parallelism)
            times[mode].append(elapsed)
            if mode == "on":
                splits.append(n)
            print(f"{mode}: {elapsed:.2f}s splits={n}", flush=True)
    spark.stop()
    off, on = statistics.median(times["off"]), statistics.median(times["on"])
    record = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}",
        "master": args.master, "unit": args.unit, "skew": SKEW, "small": SMALL,
        "seconds_off": times["off"], "seconds_on": times["on"], "splits_on": splits,
        "speedup": off / on,
    }
    with open(os.path.join(HERE, "splits.json"), "w") as f:
        json.dump(record, f, indent=2)
    with open(os.path.join(HERE, "SPLITS.md"), "w") as f:
        f.write(_markdown(record))
    print(f"speedup (median off / median on): {off / on:.2f}x")
    return 0


def _markdown(r: dict[str, Any]) -> str:
    def fmt(xs: list[float]) -> str:
        return ", ".join(f"{x:.2f}" for x in xs)

    return (
        "## Dynamic work rebalancing (runner-initiated splits)\n\n"
        f"`python -m bench.splits` on {r['date']}, {r['machine']}, `{r['master']}`: a splittable "
        f"read of {r['small'] + 1} restrictions, one {r['skew']}x the others "
        f"({r['unit']} positions of ~1 ms CPU each per small one), parallelism = cores; "
        "off and on alternate in one process. Outputs checked (every position once).\n\n"
        "| splitting | runs (s) | median (s) |\n|---|---|---|\n"
        f"| off | {fmt(r['seconds_off'])} | {statistics.median(r['seconds_off']):.2f} |\n"
        f"| on | {fmt(r['seconds_on'])} | {statistics.median(r['seconds_on']):.2f} |\n\n"
        f"Speed-up with splitting on: **{r['speedup']:.2f}x** (target >= 1.5x); "
        f"splits per run: {r['splits_on']}.\n"
    )


if __name__ == "__main__":
    raise SystemExit(main())
