"""A LOOPBACK client whose DoFn sleeps: submits, prints SUBMITTED, waits (a test kills it)."""
from __future__ import annotations

import sys
import time

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions


def _slow(x: int) -> int:
    time.sleep(300)
    return x


if __name__ == "__main__":
    p = beam.Pipeline(options=PipelineOptions([
        "--runner=PortableRunner", f"--job_endpoint={sys.argv[1]}",
        "--environment_type=LOOPBACK",
    ]))
    _ = p | beam.Create([1, 2]) | "Sleep" >> beam.Map(_slow)
    result = p.run()
    print("SUBMITTED", flush=True)
    result.wait_until_finish()
