"""Deployment modes on one machine: word count on local[2], a two-worker standalone cluster
and a Spark Connect server, in one run.

    python -m bench.modes [--mb 20]

Each mode runs in a child driver (its own Spark session): a warm-up run, then a timed run of
the same pipeline; the outputs of all modes must be equal. Writes bench/MODES.md (included in
RESULTS.md) and bench/modes.json. The clusters are started with the cluster tests' helpers
(127.0.0.1 only, stopped at the end).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))


def _write_input(directory: str, mb: int) -> str:
    rng = random.Random(7)
    vocab = ["".join(rng.choice("abcdefghij") for _ in range(rng.randint(3, 8)))
             for _ in range(5000)]
    weights = [1.0 / (i + 1) for i in range(len(vocab))]
    for shard in range(4):
        with open(os.path.join(directory, f"input-{shard}.txt"), "w") as f:
            written = 0
            while written < mb * 250_000:
                line = " ".join(rng.choices(vocab, weights, k=12)) + "\n"
                f.write(line)
                written += len(line)
    return os.path.join(directory, "input-*.txt")


def child(pattern: str, out: str, args: list[str]) -> dict[str, Any]:
    """Runs word count twice in this process (warm-up, timed); returns seconds and a digest."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from sparkbeam import SparkRunner

    seconds = 0.0
    for run in range(2):
        prefix = f"{out}-{run}"
        started = time.perf_counter()
        with beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(args)) as p:
            _ = (p | beam.io.ReadFromText(pattern)
                 | beam.FlatMap(str.split)
                 | beam.combiners.Count.PerElement()
                 | beam.MapTuple(lambda w, n: f"{w}\t{n}")
                 | beam.io.WriteToText(prefix))
        seconds = time.perf_counter() - started
    lines: list[str] = []
    directory = os.path.dirname(out)
    for name in sorted(os.listdir(directory)):
        if name.startswith(os.path.basename(out) + "-1"):
            with open(os.path.join(directory, name)) as f:
                lines.extend(f.read().splitlines())
    digest = hashlib.sha256("\n".join(sorted(lines)).encode()).hexdigest()[:16]
    return {"seconds": seconds, "digest": digest, "words": len(lines)}


def _run_child(pattern: str, work: str, mode: str, args: list[str]) -> dict[str, Any]:
    from tests.cluster.conftest import ROOT, child_env

    slug = "".join(c if c.isalnum() else "-" for c in mode)  # no glob characters in paths
    out = os.path.join(work, f"out-{slug}", "counts")
    os.makedirs(os.path.dirname(out))
    proc = subprocess.run(
        [sys.executable, "-m", "bench.modes", "--child", pattern, out, "--", *args],
        capture_output=True, text=True, cwd=ROOT, env=child_env(), timeout=900,
    )
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return dict(json.loads(line[7:]), mode=mode)
    return {"mode": mode, "error": proc.stderr[-2000:]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.modes", description=__doc__)
    parser.add_argument("--mb", type=int, default=20, help="input size in MB")
    parser.add_argument("--child", nargs=2, metavar=("PATTERN", "OUT"))
    args, rest = parser.parse_known_args(argv)
    rest = [a for a in rest if a != "--"]
    if args.child:
        result = child(args.child[0], args.child[1], rest)
        print("RESULT " + json.dumps(result), flush=True)
        return 0

    from tests.cluster import conftest as cluster

    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="sparkbeam-modes-") as work:
        pattern = _write_input(work, args.mb)
        results.append(_run_child(pattern, work, "local[2]",
                                  ["--spark_master=local[2]", "--parallelism=4"]))
        with cluster.standalone_cluster(work) as url:
            results.append(_run_child(pattern, work, "standalone (2 workers x 1 core)",
                                      ["--parallelism=4", *cluster.standalone_args(url, 2)]))
        with cluster.connect_cluster(work) as remote:
            results.append(_run_child(pattern, work, "Spark Connect (local[2] server)",
                                      [f"--spark_remote={remote}", "--parallelism=4"]))
    record = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}",
        "mb": args.mb, "results": results,
    }
    with open(os.path.join(HERE, "modes.json"), "w") as f:
        json.dump(record, f, indent=2)
    with open(os.path.join(HERE, "MODES.md"), "w") as f:
        f.write(_markdown(record))
    print(_markdown(record))
    return 0


def _markdown(r: dict[str, Any]) -> str:
    base = next((x["seconds"] for x in r["results"] if "seconds" in x), None)
    digests = {x.get("digest") for x in r["results"] if "digest" in x}
    rows = []
    for x in r["results"]:
        if "seconds" in x:
            ratio = f"{x['seconds'] / base:.2f}x" if base else "-"
            rows.append(f"| {x['mode']} | {x['seconds']:.1f} | {ratio} | {x['words']:,} |")
        else:
            rows.append(f"| {x['mode']} | failed | - | - |")
    same = "all modes gave the same counts" if len(digests) == 1 else "OUTPUTS DIFFER"
    return (
        "## Deployment modes (word count)\n\n"
        f"`python -m bench.modes` on {r['date']}, {r['machine']}: word count over {r['mb']} MB "
        "of text, `--parallelism=4`, each mode in its own driver; second (warm) run timed; "
        f"{same}.\n\n"
        "| mode | seconds | vs local[2] | distinct words |\n|---|---|---|---|\n"
        + "\n".join(rows) + "\n"
    )


if __name__ == "__main__":
    raise SystemExit(main())
