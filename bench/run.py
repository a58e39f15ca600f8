"""Benchmark harness: times the same Beam pipelines on every runner, back to
back, in one invocation, and writes ``results.json``, ``RESULTS.md`` and
``results.png``.

    python -m bench.run --scale quick|full [--workloads W ...] [--runners R ...]

Each (runner, workload) pair runs in its own subprocess (``bench.worker``):
one session, all of the workload's sizes in ascending order, a timeout per
size. A crash, timeout or failure is recorded for that runner and the
harness goes on.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from importlib import metadata
from typing import Any

from bench import workloads
from bench.worker import check_output

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
#: Runners in the order they run; the first is the hand-written limit.
DEFAULT_RUNNERS = [
    "pyspark-handwritten",
    "pyspark-dataframe",  # word count and combine only (ONLY)
    "sparkbeam",
    "fnapi",
    "fnapi-mp",
    "dask",
    "beam-pyspark-runner",
]
EXTRA_RUNNERS = ["dask-beamio", "sparkbeam-beam-only", "sparkbeam-rows"]
#: Runners that run only some workloads (the others are not run, and have no row).
ONLY: dict[str, frozenset[str]] = {"pyspark-dataframe": frozenset(["wordcount", "combine"])}
DEFAULT_TIMEOUT = {"quick": 180, "full": 1800}
POLL_S = 0.5


def _split(values: list[str] | None) -> list[str] | None:
    """Accepts ``a b`` as well as ``a,b``."""
    if not values:
        return None
    return [v for item in values for v in item.split(",") if v]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--scale", choices=("quick", "full"), default="quick")
    parser.add_argument(
        "--workloads", nargs="+", help=f"default: all of {', '.join(workloads.WORKLOADS)}"
    )
    parser.add_argument(
        "--runners",
        nargs="+",
        help=f"default: {', '.join(DEFAULT_RUNNERS)}; also: {', '.join(EXTRA_RUNNERS)}",
    )
    parser.add_argument(
        "--sizes", type=int, default=None,
        help="run only the first N sizes of each workload's series (e.g. 2: full scale's 1x "
        "and 10x)",
    )
    parser.add_argument(
        "--size-index", type=int, default=None,
        help="run only the K-th size (0-based) of each workload's series (e.g. 2: full scale's "
        "100x), to add a size to an earlier run with --append",
    )
    parser.add_argument(
        "--timeout", type=float, help="seconds per size (default: quick 180, full 1800)"
    )
    parser.add_argument(
        "--warmup",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run each workload once on a tiny data set, untimed, in every session before the "
        "timed runs (default: on)",
    )
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument(
        "--work-dir",
        default=os.path.join(tempfile.gettempdir(), "sparkbeam-bench"),
        help="generated data (kept and reused), outputs and logs (default: %(default)s)",
    )
    parser.add_argument(
        "--output-dir",
        default=HERE,
        help="where results.json, RESULTS.md, results.png go (default: bench/)",
    )
    parser.add_argument(
        "--append",
        action="store_true",
        help="merge into an existing results.json instead of replacing it",
    )
    parser.add_argument(
        "--note", action="append", default=[], help="a note to show in RESULTS.md (repeatable)"
    )
    parser.add_argument(
        "--report-only", action="store_true", help="only re-render RESULTS.md/png from results.json"
    )
    args = parser.parse_args(argv)
    args.workloads = _split(args.workloads) or list(workloads.WORKLOADS)
    args.runners = _split(args.runners) or list(DEFAULT_RUNNERS)
    unknown = [w for w in args.workloads if w not in workloads.WORKLOADS]
    unknown += [r for r in args.runners if r not in DEFAULT_RUNNERS + EXTRA_RUNNERS]
    if unknown:
        parser.error(f"unknown workload/runner: {', '.join(unknown)}")
    args.timeout = args.timeout or DEFAULT_TIMEOUT[args.scale]
    return args


def _command_output(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        return (out.stdout + out.stderr).strip("\n")
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unavailable ({exc})"


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def environment() -> dict[str, Any]:
    """Machine facts and component versions for the report."""
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(
                (ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu
            )
    except OSError:
        pass
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "nproc": _command_output(["nproc"]),
        "free": _command_output(["free", "-m"]),
        "cpu": cpu,
        "kernel": platform.release(),
        "versions": {
            "python": platform.python_version(),
            "java": _command_output(["java", "-version"]).splitlines()[0],
            **{
                d: _version(d)
                for d in (
                    "apache-beam",
                    "pyspark",
                    "sparkbeam",
                    "dask",
                    "distributed",
                    "beam-pyspark-runner",
                    "pyarrow",
                    "numpy",
                    "psutil",
                )
            },
        },
    }


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _kill_group(proc: subprocess.Popen[bytes], grace_s: float = 5.0) -> None:
    """Ends the worker and everything it started (its own process group):
    SIGTERM first, so a JVM can run its shutdown hooks, then SIGKILL."""
    if not _group_alive(proc.pid):
        return
    os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if proc.poll() is not None and not _group_alive(proc.pid):
            return
        time.sleep(0.1)
    if _group_alive(proc.pid):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _read_records(path: str) -> list[dict[str, Any]]:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return []


def _last_error_line(log_path: str) -> str:
    try:
        with open(log_path, errors="replace") as f:
            lines = [ln.strip() for ln in f if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


def _progress(rec: dict[str, Any], wl: workloads.Workload, index: int, total: int) -> None:
    """Prints the line for a finished (or failed) timed run."""
    if rec.get("run_s") is not None:
        outcome = f"start-up {rec['startup_s']:6.1f}s  run {rec['run_s']:8.2f}s"
    else:
        outcome = f"{rec['status']}: {rec.get('error') or ''}"
    label = f"{wl.name:<10} {wl.size_label(rec['size']):>8}  {rec['runner']:<20}"
    print(f"[{index:3d}/{total}] {label} {outcome}", flush=True)


def _check_line(rec: dict[str, Any], wl: workloads.Workload) -> None:
    """Prints the correctness verdict of a run that completed."""
    verdict = {True: "correct", False: "WRONG"}.get(rec.get("correct"), "unchecked")  # type: ignore[arg-type]
    label = f"{wl.name:<10} {wl.size_label(rec['size']):>8}  {rec['runner']:<20}"
    print(f"{'':10}{label} check: {verdict} ({rec.get('check')})", flush=True)


def run_pair(
    args: argparse.Namespace,
    runner: str,
    wl: workloads.Workload,
    sizes: list[int],
    counter: list[int],
    total: int,
) -> list[dict[str, Any]]:
    """Runs one runner on one workload's sizes in a worker subprocess."""
    tag = f"{wl.name}-{runner}"
    log_path = os.path.join(args.work_dir, "logs", f"{tag}.log")
    result_path = os.path.join(args.work_dir, "results", f"{tag}.json")
    if os.path.exists(result_path):
        os.remove(result_path)
    cmd = [
        sys.executable,
        "-m",
        "bench.worker",
        "--runner",
        runner,
        "--workload",
        wl.name,
        "--sizes",
        *map(str, sizes),
        "--data-dir",
        os.path.join(args.work_dir, "data"),
        "--seed",
        str(args.seed),
        "--out-dir",
        os.path.join(args.work_dir, "out", tag),
        "--result",
        result_path,
        "--warmup-size",
        str(wl.warmup_size if args.warmup else 0),
    ]
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])),
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        PYTHONUNBUFFERED="1",
    )
    printed: set[int] = set()

    def report_new(records: list[dict[str, Any]]) -> None:
        for rec in records:
            if rec["size"] not in printed:
                printed.add(rec["size"])
                counter[0] += 1
                _progress(rec, wl, counter[0], total)

    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + args.timeout
        timed_out = False
        while proc.poll() is None:
            time.sleep(POLL_S)
            before = len(printed)
            report_new(_read_records(result_path))
            if len(printed) > before:
                deadline = time.monotonic() + args.timeout
            if time.monotonic() > deadline:
                timed_out = True
                break
        _kill_group(proc)
    records = _read_records(result_path)  # final: the checks run after the last size
    report_new(records)
    done = {r["size"]: r for r in records}
    out: list[dict[str, Any]] = []
    for size in sizes:
        rec = done.get(size)
        if rec is None:
            if not timed_out:
                status, error = (
                    "CRASHED",
                    f"worker exited {proc.returncode}: {_last_error_line(log_path)}",
                )
            elif any(r["status"] == "TIMEOUT" for r in out):
                status, error = "SKIPPED", "not run: an earlier size timed out"
            else:
                status, error = "TIMEOUT", f"no result within {args.timeout:g} s"
            rec = {
                "runner": runner,
                "workload": wl.name,
                "size": size,
                "status": status,
                "error": error,
                "correct": None,
                "check": None,
                "startup_s": None,
                "run_s": None,
            }
            report_new([rec])
        elif rec["status"] == "OK":
            if rec.get("correct") is None:  # killed before its checks: check here
                ds = workloads.dataset(
                    wl.name, size, os.path.join(args.work_dir, "data"), args.seed
                )
                rec["correct"], rec["check"] = check_output(
                    rec.get("output") or "", ds.load_expected()
                )
            _check_line(rec, wl)
        rec["log"] = log_path
        out.append(rec)
    shutil.rmtree(os.path.join(args.work_dir, "out", tag), ignore_errors=True)
    return out


def _runs(runner: str, workload: str) -> bool:
    """Whether `runner` runs `workload` at all (`ONLY`)."""
    return workload in ONLY.get(runner, frozenset([workload]))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from bench import report

    results_path = os.path.join(args.output_dir, "results.json")
    if args.report_only:
        with open(results_path) as f:
            saved: dict[str, Any] = json.load(f)
        if args.note:
            saved["notes"] = saved.get("notes", []) + args.note
            with open(results_path, "w") as f:
                json.dump(saved, f, indent=1)
        report.write_all(saved, args.output_dir)
        return 0

    for sub in ("data", "logs", "results", "out"):
        os.makedirs(os.path.join(args.work_dir, sub), exist_ok=True)
    started = time.monotonic()
    load_start = os.getloadavg()[0]
    chosen = [workloads.WORKLOADS[name] for name in args.workloads]
    picked = (slice(None, args.sizes) if args.size_index is None
              else slice(args.size_index, args.size_index + 1))
    plan = [(wl, list(wl.sizes[args.scale])[picked]) for wl in chosen]
    total = sum(len(sizes) for wl, sizes in plan for runner in args.runners
                if _runs(runner, wl.name))
    print(
        f"sparkbeam bench: scale={args.scale}, {len(plan)} workloads x {len(args.runners)} "
        f"runners, {total} timed runs; timeout {args.timeout:g} s per size; "
        f"work dir {args.work_dir}",
        flush=True,
    )
    for wl, sizes in plan:
        for size in ([wl.warmup_size] if args.warmup else []) + sizes:
            t = time.monotonic()
            workloads.dataset(wl.name, size, os.path.join(args.work_dir, "data"), args.seed)
            print(
                f"data: {wl.name} {wl.size_label(size)} ready ({time.monotonic() - t:.1f} s)",
                flush=True,
            )

    runs: list[dict[str, Any]] = []
    counter = [0]
    for wl, sizes in plan:
        for runner in args.runners:
            if _runs(runner, wl.name):
                runs.extend(run_pair(args, runner, wl, sizes, counter, total))

    invocation = {
        "argv": sys.argv[1:],
        "scale": args.scale,
        "seed": args.seed,
        "timeout_s": args.timeout,
        "warmup": args.warmup,
        "runners": args.runners,
        "workloads": args.workloads,
        "harness_wall_s": time.monotonic() - started,
        "loadavg_1min": [load_start, os.getloadavg()[0]],
        **environment(),
    }
    results: dict[str, Any] = {"invocations": [invocation], "runs": runs, "notes": args.note}
    if args.append and os.path.exists(results_path):
        with open(results_path) as f:
            old = json.load(f)
        keys = {(r["runner"], r["workload"], r["size"]) for r in runs}
        kept = [
            r for r in old.get("runs", []) if (r["runner"], r["workload"], r["size"]) not in keys
        ]
        results = {
            "invocations": old.get("invocations", []) + [invocation],
            "runs": kept + runs,
            "notes": old.get("notes", []) + args.note,
        }
    os.makedirs(args.output_dir, exist_ok=True)
    with open(results_path, "w") as f:
        json.dump(results, f, indent=1)
    report.write_all(results, args.output_dir)
    written = ", ".join(os.path.join(args.output_dir, n) for n in ("RESULTS.md", "results.png"))
    minutes = invocation["harness_wall_s"] / 60
    print(f"done in {minutes:.1f} min; wrote {results_path}, {written}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
