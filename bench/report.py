"""Renders ``results.json`` as ``RESULTS.md`` (tables) and ``results.png``
(bar chart of run-time ratios to the hand-written limit + log-log scaling).
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from bench.workloads import WORKLOADS

Run = dict[str, Any]
#: The reference runners of the ratio columns (see bench.runners).
LIMIT, FNAPI = "pyspark-handwritten", "fnapi"

RUNNER_NOTES = {
    "pyspark-handwritten": (
        "the computation hand-written as PySpark RDD code "
        "(textFile -> ... -> saveAsTextFile) on a `local[2]` session: the limit."
    ),
    "pyspark-dataframe": (
        "word count and combine only, as PySpark DataFrame code (`spark.read.text` -> `split` "
        "-> `groupBy().agg()` -> `write.text`) on a `local[2]` session: Spark's own operators "
        "with no Python per record, the engine's own limit."
    ),
    "sparkbeam": (
        "`--runner=sparkbeam.SparkRunner --spark_master=local[2]`; the harness creates the "
        "`local[2]` session first (timed as start-up) and the runner picks it up via "
        "`getOrCreate()`."
    ),
    "sparkbeam-beam-only": (
        "sparkbeam with `--spark_native=off`: Beam's transforms everywhere (its text reader "
        "in Python instead of Spark's text source), to show what the native translations are "
        "worth."
    ),
    "sparkbeam-rows": (
        "sparkbeam with `--arrow_batch_bytes=rows`: Spark cuts the Arrow batches it hands "
        "Python workers by row count alone (no per-row size check), as a user whose elements "
        "are small may choose."
    ),
    "fnapi": "Beam's `FnApiRunner()`, in process, one worker.",
    "fnapi-mp": (
        "`FnApiRunner()` with `--direct_num_workers=2 --direct_running_mode=multi_processing` "
        "(SDK workers start inside the run, so start-up is ~0)."
    ),
    "dask": (
        "Beam's `DaskRunner` on `LocalCluster(n_workers=2, threads_per_worker=1)` via "
        "`--dask_client_address`. Beam 2.77's DaskRunner cannot run `ReadFromText` (no "
        "translation for `Read`: downstream gets `None`) nor `WriteToText` (side inputs are "
        "recomputed per task, the finalize step sees another temp dir and writes an empty "
        "shard), so its pipelines read with `Create(files) | FlatMap(read lines)` and write "
        "with a per-bundle file-writing DoFn; everything in between is the same pipeline. "
        "`dask-beamio` runs the unmodified pipelines."
    ),
    "dask-beamio": "DaskRunner with the unmodified ReadFromText/WriteToText pipelines.",
    "beam-pyspark-runner": (
        "`beam_pyspark_runner.pyspark_runner.PySparkRunner()` 0.0.3 (installed `--no-deps`); "
        "it has no master option and calls `SparkSession.builder.getOrCreate()`, so it runs "
        "on the `local[2]` session the harness creates first."
    ),
}
HOW_TO_READ = [
    "- *start-up*: runner construction (Spark session / Dask cluster creation); *run*: building "
    "and running the pipeline until its output is written; *wall* = start-up + run. One session "
    "per runner and workload runs every size in ascending order, so the sizes share a start-up.",
    "- *first job*: with warm-up (the default), each session first runs the workload once on a "
    "tiny data set (20 kB / 1k elements), untimed, because the first job in a fresh session pays "
    "one-off costs (e.g. starting Spark's Python workers); its time is shown here and every "
    "*run* is a warm run. Without warm-up (`--no-warmup`) the first size's *run* includes them.",
    "- *÷ limit* and *÷ fnapi*: run time over the hand-written PySpark run time / the "
    "in-process FnApiRunner run time at the same size (lower is better).",
    "- *driver RSS*: peak RSS of the driver process (`getrusage`; the process-lifetime peak, so "
    "it also covers the warm-up and smaller sizes). *workers RSS*: peak summed RSS of the Python "
    "worker processes (Spark Python workers, Dask workers, FnApi SDK workers; psutil, sampled "
    "every 0.2 s; pages shared by forked workers count once per process). *JVM RSS*: the same "
    "for the Spark JVM.",
    "- *check*: the output lines compared with the answer computed directly in Python.",
]
QUICK_NOTE = (
    "> Quick scale: inputs are tiny, so fixed per-job overheads dominate and the ratios say "
    "little about throughput. Use `--scale full` for the issue's sizes."
)
SCALING_NOTE = (
    "Run time (s) per size and the fitted log-log exponent (slope of log run time against log "
    "size; 1.0 = linear; fixed overheads pull it below 1). Only correct runs count."
)
HEADER = [
    "size",
    "runner",
    "check",
    "start-up s",
    "first job s",
    "run s",
    "wall s",
    "÷ limit",
    "÷ fnapi",
    "driver RSS MB",
    "workers RSS MB",
    "JVM RSS MB",
]
COLORS = {
    "pyspark-handwritten": "#444444",
    "pyspark-dataframe": "#9467bd",
    "sparkbeam": "#d62728",
    "sparkbeam-beam-only": "#ff9896",
    "sparkbeam-rows": "#8c564b",
    "fnapi": "#1f77b4",
    "fnapi-mp": "#17becf",
    "dask": "#ff7f0e",
    "dask-beamio": "#ffbb78",
    "beam-pyspark-runner": "#2ca02c",
}


def write_extra(name: str, results: dict[str, Any],
                markdown_of: Callable[[dict[str, Any]], str]) -> None:
    """Writes a side benchmark's `<name>.json` and `<NAME>.md` (included in RESULTS.md) next to
    this file, stamping `results` with the date and the machine first."""
    import json
    import platform
    from datetime import UTC, datetime

    results = {"date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
               "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}",
               **results}
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, f"{name}.json"), "w") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(here, f"{name.upper()}.md"), "w") as f:
        f.write(markdown_of(results))


def verdict(run: Run) -> str:
    """``correct`` / ``WRONG`` / ``FAILED`` / ``TIMEOUT`` / ``CRASHED`` / ..."""
    if run["status"] != "OK":
        return run["status"]
    if run.get("correct") is None:
        return "unchecked"
    return "correct" if run["correct"] else "WRONG"


def _index(runs: list[Run]) -> dict[tuple[str, int, str], Run]:
    return {(r["workload"], r["size"], r["runner"]): r for r in runs}


def _ratio(run: Run, ref: Run | None) -> float | None:
    if ref is None or run.get("run_s") is None or not ref.get("run_s") or ref["status"] != "OK":
        return None
    return run["run_s"] / ref["run_s"]


def fit_exponent(points: list[tuple[int, float]]) -> float | None:
    """Least-squares slope of log(run time) against log(size)."""
    pts = [(math.log(s), math.log(t)) for s, t in points if t and t > 0]
    if len(pts) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sxx if sxx else None


def scaling_points(runs: list[Run]) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """``{workload: {runner: [(size, run_s), ...]}}`` over correct runs."""
    out: dict[str, dict[str, list[tuple[int, float]]]] = defaultdict(lambda: defaultdict(list))
    for r in sorted(runs, key=lambda r: r["size"]):
        if verdict(r) == "correct" and r.get("run_s"):
            out[r["workload"]][r["runner"]].append((r["size"], r["run_s"]))
    return out


def _fmt(value: float | None, digits: int = 2, suffix: str = "") -> str:
    return "–" if value is None else f"{value:.{digits}f}{suffix}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _runner_order(runs: list[Run]) -> list[str]:
    names = {r["runner"] for r in runs}
    return [n for n in RUNNER_NOTES if n in names] + sorted(names - set(RUNNER_NOTES))


def _result_row(r: Run, idx: dict[tuple[str, int, str], Run]) -> list[str]:
    key = (r["workload"], r["size"])
    wall = r["startup_s"] + r["run_s"] if r.get("run_s") is not None else None
    return [
        WORKLOADS[r["workload"]].size_label(r["size"]),
        r["runner"],
        verdict(r),
        _fmt(r.get("startup_s"), 1),
        _fmt(r.get("warmup_s"), 1),
        _fmt(r.get("run_s")),
        _fmt(wall, 1),
        _fmt(_ratio(r, idx.get((*key, LIMIT))), 2, "x"),
        _fmt(_ratio(r, idx.get((*key, FNAPI))), 2, "x"),
        _fmt(r.get("driver_peak_mb"), 0),
        _fmt(r.get("pyworkers_peak_mb"), 0),
        _fmt(r.get("jvm_peak_mb"), 0),
    ]


def _header_section(results: dict[str, Any], order: list[str]) -> list[str]:
    invs = results["invocations"]
    last = invs[-1]
    out = [
        "# sparkbeam benchmark results",
        "",
        "Generated by `bench/run.py`; raw numbers in `results.json`, chart in `results.png`.",
        "",
    ]
    for inv in invs:
        warm = "with" if inv.get("warmup") else "without"
        out.append(
            f"- {inv['date']}: `python -m bench.run {' '.join(inv['argv'])}` "
            f"(scale `{inv['scale']}`, seed {inv['seed']}, timeout {inv['timeout_s']:g} s "
            f"per size, {warm} warm-up) took {inv['harness_wall_s'] / 60:.1f} min"
            + (
                " (1-min load average at start/end: {:.1f}/{:.1f})".format(*inv["loadavg_1min"])
                if "loadavg_1min" in inv
                else ""
            )
        )
    if results.get("notes"):
        out += ["", "## Notes", "", *(f"- {note}" for note in results["notes"])]
    out += ["", "## Machine", "", f"- `nproc`: {last['nproc']}"]
    out += [f"- CPU: {last['cpu']}; kernel {last['kernel']}", "- `free -m`:", ""]
    out += ["```", last["free"], "```", "", "## Versions", ""]
    out += _table(["component", "version"], [[k, v] for k, v in last["versions"].items()])
    out += ["", "## Runners", ""]
    out += [f"- **{name}**: {RUNNER_NOTES.get(name, '')}" for name in order]
    out += ["", "## How to read the tables", "", *HOW_TO_READ, ""]
    if any(inv["scale"] == "quick" for inv in invs):
        out += [QUICK_NOTE, ""]
    return out


def _scaling_section(runs: list[Run], order: list[str]) -> list[str]:
    idx = _index(runs)
    pts = scaling_points(runs)
    multi = [w for w in WORKLOADS if w in pts and any(len(v) >= 2 for v in pts[w].values())]
    if not multi:
        return []
    out = ["## Scaling", "", SCALING_NOTE, ""]
    for wname in multi:
        wl = WORKLOADS[wname]
        sizes = sorted({r["size"] for r in runs if r["workload"] == wname})
        rows = []
        for name in order:
            if not any((wname, s, name) in idx for s in sizes):
                continue
            series = dict(pts[wname].get(name, []))
            cells = [
                _fmt(series[s])
                if s in series
                else verdict(idx[(wname, s, name)])
                if (wname, s, name) in idx
                else "–"
                for s in sizes
            ]
            rows.append([name, *cells, _fmt(fit_exponent(list(series.items())))])
        header = ["runner", *(wl.size_label(s) for s in sizes), "exponent"]
        out += [f"### {wname}", "", *_table(header, rows), ""]
    return out


def _spark_jobs_section(runs: list[Run]) -> list[str]:
    """How many Spark jobs each timed sparkbeam run took (recorded since 2026-11-24)."""
    counted = [r for r in runs if r.get("spark_jobs") is not None]
    if not counted:
        return []
    rows = [[r["workload"], WORKLOADS[r["workload"]].size_label(r["size"]), str(r["spark_jobs"])]
            for r in sorted(counted, key=lambda r: (r["workload"], r["size"]))]
    return ["## Spark jobs per sparkbeam run", "",
            *_table(["workload", "size", "Spark jobs"], rows), ""]


def markdown(results: dict[str, Any]) -> str:
    """The full RESULTS.md text."""
    runs: list[Run] = results["runs"]
    idx = _index(runs)
    order = _runner_order(runs)
    out = _header_section(results, order)
    out += ["## Results", ""]
    for wname in [w for w in WORKLOADS if any(r["workload"] == w for r in runs)]:
        rows = [
            _result_row(idx[(wname, size, name)], idx)
            for size in sorted({r["size"] for r in runs if r["workload"] == wname})
            for name in order
            if (wname, size, name) in idx
        ]
        out += [f"### {wname}: {WORKLOADS[wname].title}", "", *_table(HEADER, rows), ""]
    out += _scaling_section(runs, order)
    out += _spark_jobs_section(runs)
    bad = [r for r in runs if verdict(r) != "correct"]
    if bad:
        rank = {name: i for i, name in enumerate(order)}
        bad.sort(key=lambda r: (rank.get(r["runner"], 99), r["workload"], r["size"]))
        rows = [
            [
                r["workload"],
                WORKLOADS[r["workload"]].size_label(r["size"]),
                r["runner"],
                verdict(r),
                (r.get("error") or r.get("check") or "").replace("|", "\\|"),
            ]
            for r in bad
        ]
        header = ["workload", "size", "runner", "status", "detail"]
        out += ["## Failures and wrong answers", "", *_table(header, rows), ""]
    analysis = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ANALYSIS.md")
    if os.path.exists(analysis):
        # Hand-written: targets met or missed and what the profile says; kept across runs.
        with open(analysis) as f:
            out += [f.read().rstrip(), ""]
    for extra in ("SPLITS.md", "MODES.md", "STREAMING.md", "SPARK_IO.md", "KAFKA.md"):
        # Written by `python -m bench.splits` (dynamic splitting off vs on),
        # `python -m bench.modes` (local vs standalone vs Connect), `bench.streaming`,
        # `bench.spark_io` (ReadFromSpark vs ReadFromParquet) and `bench.kafka`.
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), extra)
        if os.path.exists(path):
            with open(path) as f:
                out += [f.read().rstrip(), ""]
    out += ["## Chart", "", "![run time ratios and scaling](results.png)", ""]
    return "\n".join(out)


def _bar_chart(ax: Any, runs: list[Run], order: list[str]) -> None:
    idx = _index(runs)
    wnames = [w for w in WORKLOADS if any(r["workload"] == w for r in runs)]
    width = 0.8 / max(1, len(order))
    labels = []
    for wi, wname in enumerate(wnames):
        size = max(r["size"] for r in runs if r["workload"] == wname)
        labels.append(f"{wname}\n{WORKLOADS[wname].size_label(size)}")
        for ri, name in enumerate(order):
            r = idx.get((wname, size, name))
            if r is None:
                continue
            x = wi + (ri - (len(order) - 1) / 2) * width
            ratio = _ratio(r, idx.get((wname, size, LIMIT)))
            ok = verdict(r) == "correct"
            if ratio is None:
                mark = "?" if ok else "✗"
                ax.text(x, 1.0, mark, ha="center", va="bottom", color=COLORS.get(name, "k"))
                continue
            ax.bar(
                x,
                ratio,
                width,
                color=COLORS.get(name),
                hatch=None if ok else "//",
                edgecolor="white" if ok else "black",
            )
            ax.text(x, ratio, f"{ratio:.1f}", ha="center", va="bottom", fontsize=7)
    for name in order:
        ax.bar(0, 0, 0, color=COLORS.get(name), label=name)
    ax.axhline(1.0, color=COLORS[LIMIT], linestyle="--", linewidth=1, label="hand-written (limit)")
    ax.set_yscale("log")
    ax.set_xticks(range(len(wnames)), labels)
    ax.set_ylabel("run time ÷ hand-written PySpark")
    ax.set_title(
        "Run time relative to the hand-written PySpark limit "
        "(largest size; hatched = WRONG, ✗ = failed)"
    )
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.005, 1.0))


def _scaling_chart(
    ax: Any, wname: str, series_by_runner: dict[str, list[tuple[int, float]]], order: list[str]
) -> None:
    for name in order:
        series = series_by_runner.get(name)
        if not series or len(series) < 2:
            continue
        xs, ys = zip(*series, strict=True)
        k = fit_exponent(series)
        ax.plot(xs, ys, "o-", color=COLORS.get(name), label=f"{name} (k={k:.2f})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(f"size ({WORKLOADS[wname].unit})")
    ax.set_ylabel("run time (s)")
    ax.set_title(f"{wname}: scaling")
    ax.legend(fontsize=7)


def plot(results: dict[str, Any], path: str) -> None:
    """Bar chart of run time ÷ limit at each workload's largest size, and
    log-log run time against size for workloads with several sizes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs: list[Run] = results["runs"]
    order = _runner_order(runs)
    pts = scaling_points(runs)
    multi = [w for w in WORKLOADS if w in pts and any(len(v) >= 2 for v in pts[w].values())]
    ncols = 3
    nrows = 1 + math.ceil(len(multi) / ncols)
    fig = plt.figure(figsize=(15, 4.8 * nrows))
    grid = fig.add_gridspec(nrows, ncols)
    _bar_chart(fig.add_subplot(grid[0, :]), runs, [n for n in order if n != LIMIT])
    for i, wname in enumerate(multi):
        ax = fig.add_subplot(grid[1 + i // ncols, i % ncols])
        _scaling_chart(ax, wname, pts[wname], order)
    inv = results["invocations"][-1]
    fig.suptitle(f"sparkbeam benchmark, scale {inv['scale']}, {inv['date']}, nproc={inv['nproc']}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write_all(results: dict[str, Any], out_dir: str) -> None:
    """Writes RESULTS.md and results.png into ``out_dir``."""
    with open(os.path.join(out_dir, "RESULTS.md"), "w") as f:
        f.write(markdown(results))
    plot(results, os.path.join(out_dir, "results.png"))
