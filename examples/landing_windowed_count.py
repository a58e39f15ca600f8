"""Files landing in a directory -> per-user count in 10 s event-time windows -> Parquet, as a
stream on Spark.

    python examples/landing_windowed_count.py --landing DIR --output DIR \\
        [--checkpoint_dir DIR] [--watermark_delay SECONDS]

Each JSON-lines file that appears in the landing directory (write it aside, then rename it
in) holds events {"user": ..., "ts": "2026-01-01T00:00:07Z", ...}. Spark's file source reads
the new files each micro-batch; Beam counts per user and window in the event time of `ts`,
and each window's count is written once it is final (the watermark trails the latest `ts`
read by --watermark_delay) as Parquet rows (user, window start in seconds, count). Each
count is in the output once, whatever restarts the job goes through on its checkpoint.
Ctrl-C, or a file named `drain` in the checkpoint directory, drains it: every open window
is written, then the job ends.
"""
from __future__ import annotations

import argparse
import typing

import sparkbeam  # noqa: F401 - first: it quiets Beam's harmless import warnings

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import window

from sparkbeam.io import ReadFromSpark, WriteToSpark

UserCount = typing.NamedTuple(  # noqa: UP014 - Beam reads the fields' types from it
    "UserCount", [("user", str), ("start", int), ("count", int)])
beam.coders.registry.register_coder(UserCount, beam.coders.RowCoder)


def per_window(user_count: tuple[str, int], w: typing.Any = beam.DoFn.WindowParam) -> UserCount:
    return UserCount(user_count[0], int(w.start), user_count[1])


def build(p: beam.Pipeline, landing: str, output: str, delay: float) -> None:
    _ = (p
         | "Events" >> ReadFromSpark(format="json", path=landing,
                                     schema="user string, ts timestamp",
                                     timestamp_column="ts", watermark_delay=delay)
         | beam.WindowInto(window.FixedWindows(10))
         | beam.Map(lambda event: event.user)
         | beam.combiners.Count.PerElement()
         | beam.Map(per_window).with_output_types(UserCount)
         | WriteToSpark(format="parquet", path=output, mode="append"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--landing", required=True, help="directory the files land in")
    parser.add_argument("--output", required=True, help="where the counts go (Parquet)")
    parser.add_argument("--watermark_delay", type=float, default=15.0,
                        help="seconds the watermark trails the latest event time read")
    args, beam_args = parser.parse_known_args(argv)
    options = PipelineOptions(["--runner=sparkbeam.SparkRunner", "--streaming", *beam_args])
    p = beam.Pipeline(options=options)
    build(p, args.landing, args.output, args.watermark_delay)
    result = p.run()
    try:
        result.wait_until_finish()
    except KeyboardInterrupt:
        result.drain()
        result.wait_until_finish()
    print(f"window counts written as Parquet to {args.output}")


if __name__ == "__main__":
    main()
