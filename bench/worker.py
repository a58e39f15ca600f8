"""One timed run of one runner on one workload, in its own process.

``python -m bench.worker --runner R --workload W --size N --data-dir D
--seed S --out-dir O --result result.json``

Measures start-up (runner construction), run time, driver peak RSS
(``getrusage``) and the peak summed RSS of child processes (JVM and Python
workers, sampled with psutil), then checks the output against the expected
answer and writes a JSON record. Never raises: failures are recorded.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import resource
import shutil
import sys
import threading
import time
import traceback
from typing import Any

import psutil

from bench import workloads

SAMPLE_INTERVAL_S = 0.2


class ChildRssSampler(threading.Thread):
    """Samples the summed RSS of all descendant processes, keeping peaks.

    Processes named ``java`` count as JVM, everything else as Python workers.
    RSS counts pages shared between forked workers once per process.
    """

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self._halt = threading.Event()
        self.peak_jvm = 0
        self.peak_py = 0
        self.peak_total = 0
        self.max_py_procs = 0

    def sample(self) -> None:
        jvm = py = n_py = 0
        for child in psutil.Process().children(recursive=True):
            try:
                rss = child.memory_info().rss
                name = child.name()
            except psutil.Error:
                continue
            if "java" in name:
                jvm += rss
            else:
                py += rss
                n_py += 1
        self.peak_jvm = max(self.peak_jvm, jvm)
        self.peak_py = max(self.peak_py, py)
        self.peak_total = max(self.peak_total, jvm + py)
        self.max_py_procs = max(self.max_py_procs, n_py)

    def run(self) -> None:
        while not self._halt.wait(SAMPLE_INTERVAL_S):
            self.sample()

    def stop(self) -> None:
        self._halt.set()
        self.join()


def first_line(exc: BaseException) -> str:
    """``Type: first line of the message`` (at most 300 characters)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    text = f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    return text[:300]


def check_output(pattern: str, expected: dict[str, str]) -> tuple[bool, str]:
    """Compares the ``KEY<TAB>VALUE`` lines of the files matching ``pattern``
    with ``expected``; returns (correct, short explanation)."""
    got: dict[str, str] = {}
    dupes = 0
    files = [f for f in glob.glob(pattern) if os.path.isfile(f) and not os.path.basename(f).startswith((".", "_"))]
    if not files:
        return False, f"no output files match {os.path.basename(pattern)}"
    for path in files:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                line = line.rstrip("\n")
                if not line:
                    continue
                key, _, value = line.partition("\t")
                if key in got:
                    dupes += 1
                got[key] = value
    missing = [k for k in expected if k not in got]
    extra = [k for k in got if k not in expected]
    differ = [k for k in expected if k in got and got[k] != expected[k]]
    if not (missing or extra or differ or dupes):
        return True, f"{len(got)} keys match"
    parts = [f"{n} {what}" for n, what in ((len(missing), "missing"), (len(extra), "extra"),
                                           (len(differ), "differ"), (dupes, "duplicated")) if n]
    example = ""
    if differ:
        k = differ[0]
        example = f"; e.g. {k!r}: got {got[k]!r}, want {expected[k]!r}"
    elif extra:
        example = f"; e.g. extra {extra[0]!r}: {got[extra[0]]!r}"
    elif missing:
        example = f"; e.g. missing {missing[0]!r}"
    return False, (", ".join(parts) + f" of {len(expected)} keys" + example)[:300]


def measure(runner_name: str, ds: workloads.Dataset, out_dir: str) -> dict[str, Any]:
    """Starts the runner, runs the workload, stops it; returns the record."""
    rec: dict[str, Any] = {"status": "OK", "error": None, "correct": None, "check": None,
                           "startup_s": None, "run_s": None, "teardown_s": None}
    sampler = ChildRssSampler()
    sampler.start()
    out_prefix = os.path.join(out_dir, "result")
    runner = None
    phase = "startup"
    try:
        from bench.runners import RUNNERS

        t0 = time.perf_counter()
        runner = RUNNERS[runner_name]()
        t1 = time.perf_counter()
        rec["startup_s"] = t1 - t0
        phase = "run"
        pattern = runner.run(ds, out_prefix)
        rec["run_s"] = time.perf_counter() - t1
    except BaseException as exc:  # noqa: BLE001 - every failure is reported
        traceback.print_exc()
        rec.update(status="FAILED", error=f"[{phase}] {first_line(exc)}")
        pattern = ""
    sampler.sample()
    sampler.stop()
    rec["driver_peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    rec["pyworkers_peak_mb"] = sampler.peak_py / 2**20
    rec["jvm_peak_mb"] = sampler.peak_jvm / 2**20
    rec["children_peak_mb"] = sampler.peak_total / 2**20
    rec["max_worker_procs"] = sampler.max_py_procs
    if runner is not None:
        t2 = time.perf_counter()
        try:
            runner.stop()
        except Exception:  # noqa: BLE001 - teardown problems do not void the run
            traceback.print_exc()
        rec["teardown_s"] = time.perf_counter() - t2
    if rec["status"] == "OK":
        rec["correct"], rec["check"] = check_output(pattern, ds.load_expected())
    return rec


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runner", required=True)
    parser.add_argument("--workload", required=True)
    parser.add_argument("--size", type=int, required=True)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--result", required=True)
    args = parser.parse_args(argv)

    ds = workloads.dataset(args.workload, args.size, args.data_dir, args.seed)
    shutil.rmtree(args.out_dir, ignore_errors=True)
    os.makedirs(args.out_dir)
    rec = {"runner": args.runner, "workload": args.workload, "size": args.size}
    try:
        rec.update(measure(args.runner, ds, args.out_dir))
    finally:
        shutil.rmtree(args.out_dir, ignore_errors=True)
        with open(args.result, "w") as f:
            json.dump(rec, f, indent=1)
    sys.stdout.flush()
    # Skip interpreter teardown: lingering runner threads must not hang us.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
