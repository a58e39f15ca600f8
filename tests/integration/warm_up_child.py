"""Run by test_warm_up.py in a process of its own: a fresh local session's first pipeline
(sparkbeam makes the session), then a second one. Prints what the status store says of the
warm-up job after each, and each pipeline's Spark job count, as JSON."""
from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from pyspark import SparkContext

from sparkbeam.execute.session import active_session
from sparkbeam.execute.warm_up import WARM_UP_GROUP


def _warm_up_jobs() -> list[str]:
    sc = SparkContext._active_spark_context  # made in the job's thread, not this one
    assert sc is not None
    deadline = time.monotonic() + 30
    while True:
        with contextlib.suppress(Exception):  # the status store learns of jobs asynchronously
            sc._jsc.sc().listenerBus().waitUntilEmpty(5000)
        tracker = sc.statusTracker()
        infos = [tracker.getJobInfo(j) for j in tracker.getJobIdsForGroup(WARM_UP_GROUP)]
        states = [str(i.status) if i is not None else "unknown" for i in infos]
        if (states and all(s == "SUCCEEDED" for s in states)) or time.monotonic() > deadline:
            return states
        time.sleep(0.2)


def main() -> None:
    out = tempfile.mkdtemp()
    before = active_session() is not None or SparkContext._active_spark_context is not None
    report: dict[str, object] = {"session_before": before}
    for run in ("first", "second"):
        p = beam.Pipeline(options=PipelineOptions([
            "--runner=sparkbeam.SparkRunner", "--spark_master=local[2]", "--parallelism=2"]))
        _ = (p | beam.Create([1, 2, 3]) | beam.Map(lambda x: str(x * 2))
             | beam.io.WriteToText(os.path.join(out, run)))
        result = p.run()
        result.wait_until_finish()
        report[run] = {"spark_jobs": result.spark_jobs, "warm_up_jobs": _warm_up_jobs()}
    print(json.dumps(report))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
