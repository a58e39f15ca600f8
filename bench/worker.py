"""Timed runs of one runner on one workload, in their own process.

``python -m bench.worker --runner R --workload W --sizes N [N ...]
--data-dir D --seed S --out-dir O --result result.json``

Starts the runner once (timed as start-up: session/cluster creation), runs
the workload once on a tiny data set as a warm-up (``--warmup-size``; its
time is kept as ``warmup_s``), then
the workload at each size in ascending order on that session, stops the
runner, and checks every output against its expected answer. After each
size the records so far are written to ``--result`` (atomically), which is
how the harness sees progress. Failures are recorded, never raised.

Memory: the driver's peak RSS comes from ``getrusage`` (it is the process's
peak so far, so for the 2nd+ size it covers the smaller sizes too); the
child processes' summed RSS (JVM / Python workers) is sampled with psutil
and its peak is reset for each size.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
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
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.peak_jvm = self.peak_py = self.max_py_procs = 0

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
        with self._lock:
            self.peak_jvm = max(self.peak_jvm, jvm)
            self.peak_py = max(self.peak_py, py)
            self.max_py_procs = max(self.max_py_procs, n_py)

    def snapshot(self) -> dict[str, float]:
        """Peaks since the last reset, plus the driver's own peak RSS so far."""
        self.sample()
        with self._lock:
            return {
                "driver_peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "pyworkers_peak_mb": self.peak_py / 2**20,
                "jvm_peak_mb": self.peak_jvm / 2**20,
                "max_worker_procs": self.max_py_procs,
            }

    def run(self) -> None:
        while not self._halt.wait(SAMPLE_INTERVAL_S):
            self.sample()

    def stop(self) -> None:
        self._halt.set()
        self.join()


def first_line(exc: BaseException) -> str:
    """``Type: first line of the message`` (at most 300 characters).

    A message-less exception gets the innermost frame's file, line and source.
    When the message embeds a remote Python traceback (e.g. PySpark's
    ``PythonException``), its last ``...Error: ...`` line is appended as the
    cause, since the first line alone rarely says what went wrong.
    """
    message = str(exc)
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    head = lines[0] if lines else ""
    text = f"{type(exc).__name__}: {head}".rstrip(": ")
    if not head and exc.__traceback__ is not None:  # e.g. a bare AssertionError
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        where = os.path.join(*frame.filename.split(os.sep)[-3:])
        text += f" at {where}:{frame.lineno}: {frame.line}"
    if "Traceback (most recent call last)" in message:
        causes = [ln for ln in lines if _CAUSE.match(ln)]
        if causes and causes[-1] not in head:
            text += f" [cause: {causes[-1]}]"
    return text[:300]


_CAUSE = re.compile(r"^[\w.]*(Error|Exception|Exit)\b.*:")


def check_output(pattern: str, expected: dict[str, str]) -> tuple[bool, str]:
    """Compares the ``KEY<TAB>VALUE`` lines of the files matching ``pattern``
    with ``expected``; returns (correct, short explanation)."""
    got: dict[str, str] = {}
    dupes = 0
    files = [
        f
        for f in glob.glob(pattern)
        if os.path.isfile(f) and not os.path.basename(f).startswith((".", "_"))
    ]
    if not files:
        return False, "no output files"
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
    counts = (
        (len(missing), "missing"),
        (len(extra), "extra"),
        (len(differ), "differ"),
        (dupes, "duplicated"),
    )
    text = ", ".join(f"{n} {what}" for n, what in counts if n) + f" of {len(expected)} keys"
    if differ:
        text += f"; e.g. {differ[0]!r}: got {got[differ[0]]!r}, want {expected[differ[0]]!r}"
    elif extra:
        text += f"; e.g. extra {extra[0]!r}: {got[extra[0]]!r}"
    elif missing:
        text += f"; e.g. missing {missing[0]!r}"
    return False, text[:300]


class Session:
    """Runs one runner over the sizes of one workload, writing records."""

    def __init__(self, runner_name: str, workload: str, result_path: str) -> None:
        self.runner_name = runner_name
        self.workload = workload
        self.result_path = result_path
        self.records: list[dict[str, Any]] = []

    def save(self) -> None:
        tmp = self.result_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.records, f, indent=1)
        os.replace(tmp, self.result_path)

    def record(self, size: int, **fields: Any) -> dict[str, Any]:
        rec: dict[str, Any] = {
            "runner": self.runner_name,
            "workload": self.workload,
            "size": size,
            "status": "OK",
            "error": None,
            "correct": None,
            "check": None,
            "startup_s": None,
            "run_s": None,
            "teardown_s": None,
        }
        rec.update(fields)
        self.records.append(rec)
        self.save()
        return rec

    @staticmethod
    def warm_up(runner: Any, ds: workloads.Dataset, out_dir: str) -> dict[str, Any]:
        """Runs the workload once on a tiny data set, untimed for the tables, so
        that every timed run sees a warm session (the first job pays one-off
        costs such as starting Python workers; reported as ``warmup_s``)."""
        print(f"--- warm-up {ds.workload} size={ds.size}", file=sys.stderr, flush=True)
        t = time.perf_counter()
        try:
            runner.run(ds, os.path.join(out_dir, "warmup", "result"))
            return {"warmup_s": time.perf_counter() - t, "warmup_error": None}
        except BaseException as exc:  # noqa: BLE001
            traceback.print_exc()
            return {"warmup_s": None, "warmup_error": first_line(exc)}
        finally:
            shutil.rmtree(os.path.join(out_dir, "warmup"), ignore_errors=True)

    def run(
        self, datasets: list[workloads.Dataset], out_dir: str, warm: workloads.Dataset | None
    ) -> None:
        sampler = ChildRssSampler()
        sampler.start()
        try:
            from bench.runners import RUNNERS

            t0 = time.perf_counter()
            runner = RUNNERS[self.runner_name]()
            startup_s = time.perf_counter() - t0
        except BaseException as exc:  # noqa: BLE001 - every failure is reported
            traceback.print_exc()
            for ds in datasets:
                self.record(
                    ds.size,
                    status="FAILED",
                    error=f"[startup] {first_line(exc)}",
                    **sampler.snapshot(),
                )
            return
        warmup = (
            self.warm_up(runner, warm, out_dir)
            if warm
            else {"warmup_s": None, "warmup_error": None}
        )
        outputs: list[tuple[dict[str, Any], workloads.Dataset, str]] = []
        for ds in datasets:
            if warmup["warmup_error"]:  # the same pipeline: it would fail again
                self.record(
                    ds.size,
                    status="FAILED",
                    startup_s=startup_s,
                    error=f"[warm-up] {warmup['warmup_error']}",
                    **warmup,
                    **sampler.snapshot(),
                )
                continue
            sampler.reset()
            out_prefix = os.path.join(out_dir, f"size{ds.size}", "result")
            os.makedirs(os.path.dirname(out_prefix))
            print(
                f"--- running {self.runner_name} {ds.workload} size={ds.size}",
                file=sys.stderr,
                flush=True,
            )
            t1 = time.perf_counter()
            try:
                pattern = runner.run(ds, out_prefix)
                fields: dict[str, Any] = {"run_s": time.perf_counter() - t1}
                if runner.spark_jobs is not None:
                    fields["spark_jobs"] = runner.spark_jobs
            except BaseException as exc:  # noqa: BLE001
                traceback.print_exc()
                fields, pattern = {"status": "FAILED", "error": f"[run] {first_line(exc)}"}, ""
            fields["output"] = pattern
            fields.update(sampler.snapshot())
            outputs.append(
                (self.record(ds.size, startup_s=startup_s, **warmup, **fields), ds, pattern)
            )
        sampler.stop()
        t2 = time.perf_counter()
        try:
            runner.stop()
        except Exception:  # noqa: BLE001 - teardown problems do not void the runs
            traceback.print_exc()
        teardown_s = time.perf_counter() - t2
        for rec, ds, pattern in outputs:
            rec["teardown_s"] = teardown_s
            if rec["status"] == "OK":
                rec["correct"], rec["check"] = check_output(pattern, ds.load_expected())
        self.save()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runner", required=True)
    parser.add_argument("--workload", required=True)
    parser.add_argument("--sizes", type=int, nargs="+", required=True)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--result", required=True)
    parser.add_argument(
        "--warmup-size",
        type=int,
        default=0,
        help="run the workload once at this size, untimed, before the timed runs (0: no warm-up)",
    )
    args = parser.parse_args(argv)

    datasets = [
        workloads.dataset(args.workload, size, args.data_dir, args.seed)
        for size in sorted(args.sizes)
    ]
    warm = (
        workloads.dataset(args.workload, args.warmup_size, args.data_dir, args.seed)
        if args.warmup_size
        else None
    )
    shutil.rmtree(args.out_dir, ignore_errors=True)
    os.makedirs(args.out_dir)
    try:
        Session(args.runner, args.workload, args.result).run(datasets, args.out_dir, warm)
    finally:
        shutil.rmtree(args.out_dir, ignore_errors=True)
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: lingering runner threads must not hang us.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
