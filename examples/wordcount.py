"""Word count on Spark with sparkbeam: `python examples/wordcount.py [--input F] --output PREFIX`.

Without --input it counts the words of a small generated text (the Zen of Python, repeated).
"""
from __future__ import annotations

import argparse
import codecs
import contextlib
import io
import logging
import os
import re
import tempfile
import time

import sparkbeam  # noqa: F401 - first: it quiets Beam's harmless import warnings

import apache_beam as beam
from apache_beam.io import ReadFromText, WriteToText
from apache_beam.options.pipeline_options import PipelineOptions


def sample_text() -> str:
    with contextlib.redirect_stdout(io.StringIO()):  # importing `this` prints the Zen
        import this

    return codecs.decode(this.s, "rot13")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--input", help="text file(s) to read; default: a generated sample")
    parser.add_argument("--output", default="out/wordcount", help="output file prefix")
    args, beam_args = parser.parse_known_args(argv)
    source = args.input
    if source is None:
        fd, source = tempfile.mkstemp(prefix="sparkbeam-wordcount-", suffix=".txt")
        with os.fdopen(fd, "w") as f:
            for _ in range(200):
                f.write(sample_text() + "\n")
    options = PipelineOptions(["--runner=sparkbeam.SparkRunner", *beam_args])
    started = time.monotonic()
    with beam.Pipeline(options=options) as p:
        (
            p
            | "Read" >> ReadFromText(source)
            | "Split" >> beam.FlatMap(lambda line: re.findall(r"[A-Za-z']+", line))
            | "Lower" >> beam.Map(str.lower)
            | "Count" >> beam.combiners.Count.PerElement()
            | "Format" >> beam.MapTuple(lambda word, n: f"{word}: {n}")
            | "Write" >> WriteToText(args.output)
        )
    written = sorted(
        os.path.join(os.path.dirname(os.path.abspath(args.output)), name)
        for name in os.listdir(os.path.dirname(os.path.abspath(args.output)) or ".")
        if name.startswith(os.path.basename(args.output))
    )
    master = options.view_as(sparkbeam.SparkOptions).spark_master or "local[*]"
    print(f"counted the words of {source} on Spark ({master}) in "
          f"{time.monotonic() - started:.1f} s; word counts written to:")
    for path in written:
        print(f"  {path}")


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    main()
