"""Kafka -> per-key count in 10 s windows -> Kafka, as a stream on Spark.

    make kafka && python -m tests.support.kafka        # a local broker, prints its address
    python examples/kafka_windowed_count.py --bootstrap 127.0.0.1:PORT \\
        --input events --output counts [--exactly_once] [--checkpoint_dir /tmp/counts-ckpt]

The read is unbounded, so the job runs as a stream by itself (no --streaming); Ctrl-C drains
it. Records are counted by key in the event time Kafka gave them (CreateTime); each window's
count goes to the output topic as key -> b"<window start>:<count>": at least once, or with
--exactly_once in Kafka transactions (each count once for a read_committed consumer, whatever
restarts the job goes through; one micro-batch later).
"""
from __future__ import annotations

import argparse

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import window

from sparkbeam.io import ReadFromKafka, WriteToKafka


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", required=True, help="bootstrap.servers")
    parser.add_argument("--input", required=True, help="topic to count")
    parser.add_argument("--output", required=True, help="topic the counts go to")
    parser.add_argument("--exactly_once", action="store_true",
                        help="write in Kafka transactions, each count once")
    args, beam_args = parser.parse_known_args()
    options = PipelineOptions(["--runner=sparkbeam.SparkRunner", *beam_args])
    p = beam.Pipeline(options=options)
    _ = (p
         | ReadFromKafka({"bootstrap.servers": args.bootstrap, "auto.offset.reset": "earliest"},
                         [args.input], timestamp_policy="CreateTime")
         | beam.WindowInto(window.FixedWindows(10))
         | beam.Map(lambda kv: kv[0])
         | beam.combiners.Count.PerElement()
         | beam.Map(lambda kc, w=beam.DoFn.WindowParam: (kc[0], f"{int(w.start)}:{kc[1]}".encode()))
         | WriteToKafka({"bootstrap.servers": args.bootstrap}, args.output,
                        exactly_once=args.exactly_once,
                        sink_group_id=f"windowed-count-{args.output}"))
    result = p.run()
    try:
        result.wait_until_finish()
    except KeyboardInterrupt:
        result.drain()
        result.wait_until_finish()


if __name__ == "__main__":
    main()
