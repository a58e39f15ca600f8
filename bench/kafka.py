"""Kafka benchmark: Kafka -> per-key count -> Kafka on sparkbeam against the same count as a
plain Structured Streaming query with Spark's own Kafka connector, in one process, one broker.

    make kafka build/spark-kafka/.fetched && python -m bench.kafka [--records N] [--quick]

Throughput, per key count K (1k and 100k): N records (CreateTime in one 60 s window) in a
4-partition topic, counted per key and written to a topic. sparkbeam: ReadFromKafka ->
FixedWindows(60) -> Count.PerElement -> WriteToKafka (at least once, and exactly once), done
when the output topic holds the K counts. Spark: readStream kafka -> groupBy(key).count() ->
writeStream kafka (update mode), done when its progress has counted N rows. Records/s is N over
the seconds from the query's start to done; each side first runs once on a small topic
(untimed) so Python workers are warm. The counts read back are checked against the input.

Latency at a 1 s trigger: Kafka -> Map -> Kafka, records produced at a steady rate carrying
their send time; the latency of a record is when a `read_committed` consumer of the output
topic receives it, minus its send time (p50 / p95), after a warm-up record has come through.

Writes bench/KAFKA.md (included in RESULTS.md), bench/kafka.json and bench/kafka.png
(`--report-only` renders the last two again from kafka.json).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import window
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from bench.report import write_extra
from sparkbeam.io import ReadFromKafka, WriteToKafka
from tests.support.kafka import ROOT, KafkaBroker

HERE = os.path.dirname(os.path.abspath(__file__))
JARS = os.path.join(ROOT, "build", "spark-kafka", "jars")
_CONNECTOR = ("spark-sql-kafka", "spark-token-provider-kafka", "kafka-clients", "commons-pool2")
PARTITIONS = 4


def _topic(bootstrap: str, partitions: int) -> str:
    name = f"bench-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        future.result(30)
    return name


def _fill(bootstrap: str, topic: str, records: int, keys: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for i in range(records):
        while True:
            try:
                producer.produce(topic, key=f"k{i % keys}".encode(), value=b"1",
                                 partition=i % PARTITIONS, timestamp=1_000 + i % 50_000)
                break
            except BufferError:
                producer.poll(0.2)
    assert producer.flush(60) == 0


def _read(bootstrap: str, topic: str, partitions: int, done: Callable[[list[Any]], bool],
          timeout_s: float) -> list[tuple[bytes, bytes]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got: list[tuple[bytes, bytes]] = []
    deadline = time.monotonic() + timeout_s
    while not done(got) and time.monotonic() < deadline:
        got += [(m.key(), m.value()) for m in consumer.consume(1000, 0.2) if m.error() is None]
    consumer.close()
    return got


# -- throughput ----------------------------------------------------------------------------


def sparkbeam_count(bootstrap: str, records: int, keys: int, exactly_once: bool
                    ) -> dict[str, Any]:
    from sparkbeam import SparkRunner

    source, sink = _topic(bootstrap, PARTITIONS), _topic(bootstrap, 2)
    _fill(bootstrap, source, records, keys)
    ckpt = tempfile.mkdtemp(prefix="bench-kafka-ckpt-")
    p = beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(
        [f"--checkpoint_dir={ckpt}", "--parallelism=2", "--bundle_size=10000"]))
    _ = (p | ReadFromKafka({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"},
                           [source], timestamp_policy="CreateTime",
                           consumer_polling_timeout=0.5)
         | beam.WindowInto(window.FixedWindows(60)) | beam.Map(lambda kv: kv[0])
         | beam.combiners.Count.PerElement()
         | beam.Map(lambda kc: (kc[0], str(kc[1]).encode()))
         | WriteToKafka({"bootstrap.servers": bootstrap}, sink, exactly_once=exactly_once,
                        sink_group_id=f"bench-{sink}"))
    started = time.monotonic()
    result = p.run()
    try:
        got = _read(bootstrap, sink, 2, lambda g: len(g) >= min(keys, records), 600)
        seconds = time.monotonic() - started
    finally:
        result.drain()
        result.wait_until_finish()
    return {"seconds": seconds, "records_per_s": records / seconds,
            "correct": _correct(got, records, keys)}


def spark_count(spark: Any, bootstrap: str, records: int, keys: int) -> dict[str, Any]:
    from pyspark.sql import functions as F

    source, sink = _topic(bootstrap, PARTITIONS), _topic(bootstrap, 2)
    _fill(bootstrap, source, records, keys)
    ckpt = tempfile.mkdtemp(prefix="bench-kafka-spark-ckpt-")
    frame = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
             .option("subscribe", source).option("startingOffsets", "earliest").load()
             .groupBy("key").count()
             .select(F.col("key"), F.col("count").cast("string").alias("value")))
    started = time.monotonic()
    query = (frame.writeStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
             .option("topic", sink).option("checkpointLocation", ckpt).outputMode("update")
             .trigger(processingTime="0 seconds").start())
    try:
        while True:
            time.sleep(0.1)
            if query.exception() is not None:
                raise RuntimeError(str(query.exception()))
            if sum(p.numInputRows for p in query.recentProgress) >= records:
                break
        seconds = time.monotonic() - started
    finally:
        query.stop()
    # Update mode writes a key's count in every batch that changed it: the last one counts.
    latest: dict[bytes, bytes] = {}
    for key, value in _read(bootstrap, sink, 2, lambda g: False, 10):
        latest[key] = value
    return {"seconds": seconds, "records_per_s": records / seconds,
            "correct": _correct(list(latest.items()), records, keys)}


def _correct(got: list[tuple[bytes, bytes]], records: int, keys: int) -> bool:
    expected = {f"k{k}".encode(): records // keys + (1 if k < records % keys else 0)
                for k in range(min(keys, records))}
    return len(got) == len(expected) and {k: int(v) for k, v in got} == expected


# -- latency ---------------------------------------------------------------------------------


def _latencies(bootstrap: str, source: str, sink: str, rate: int, seconds: float
               ) -> list[float]:
    """Produces `rate` records/s for `seconds` after a warm-up record came through; returns
    each record's seconds from send to receipt at a read_committed consumer."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    producer.produce(source, value=b"warm-up")
    producer.flush(10)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    consumer.assign([TopicPartition(sink, 0, 0)])
    deadline = time.monotonic() + 300
    while not any(m.error() is None and m.value() == b"warm-up"
                  for m in consumer.consume(100, 0.2)):
        if time.monotonic() > deadline:
            raise RuntimeError("the warm-up record never came through")
    stop = threading.Event()

    def send() -> None:
        n, start = 0, time.time()
        while not stop.is_set() and n < rate * seconds:
            producer.produce(source, value=repr(time.time()).encode())
            producer.poll(0)
            n += 1
            time.sleep(max(0.0, start + n / rate - time.time()))
        producer.flush(10)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    delays: list[float] = []
    expected = int(rate * seconds)
    deadline = time.monotonic() + seconds + 120
    while len(delays) < expected and time.monotonic() < deadline:
        for m in consumer.consume(500, 0.1):
            if m.error() is None and m.value() != b"warm-up":
                delays.append(time.time() - float(m.value()))
    stop.set()
    sender.join(10)
    consumer.close()
    return delays


def sparkbeam_latency(bootstrap: str, rate: int, seconds: float, exactly_once: bool
                      ) -> list[float]:
    from sparkbeam import SparkRunner

    source, sink = _topic(bootstrap, 1), _topic(bootstrap, 1)
    ckpt = tempfile.mkdtemp(prefix="bench-kafka-lat-")
    p = beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(
        [f"--checkpoint_dir={ckpt}", "--parallelism=2", "--trigger_interval=1 second"]))
    _ = (p | ReadFromKafka({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"},
                           [source], consumer_polling_timeout=0.2)
         | beam.Map(lambda kv: kv)
         | WriteToKafka({"bootstrap.servers": bootstrap}, sink, exactly_once=exactly_once,
                        sink_group_id=f"bench-{sink}"))
    result = p.run()
    try:
        return _latencies(bootstrap, source, sink, rate, seconds)
    finally:
        result.drain()
        result.wait_until_finish()


def spark_latency(spark: Any, bootstrap: str, rate: int, seconds: float) -> list[float]:
    source, sink = _topic(bootstrap, 1), _topic(bootstrap, 1)
    ckpt = tempfile.mkdtemp(prefix="bench-kafka-spark-lat-")
    query = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
             .option("subscribe", source).option("startingOffsets", "earliest").load()
             .select("key", "value").writeStream.format("kafka")
             .option("kafka.bootstrap.servers", bootstrap).option("topic", sink)
             .option("checkpointLocation", ckpt).trigger(processingTime="1 second").start())
    try:
        return _latencies(bootstrap, source, sink, rate, seconds)
    finally:
        query.stop()


def _summary(delays: list[float]) -> dict[str, Any]:
    delays = sorted(delays)
    return {"records": len(delays),
            "p50_s": statistics.median(delays) if delays else float("nan"),
            "p95_s": delays[int(0.95 * (len(delays) - 1))] if delays else float("nan")}


# -- report ----------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--keys", default="1000,100000")
    parser.add_argument("--quick", action="store_true", help="small sizes, a few minutes")
    parser.add_argument("--report-only", action="store_true",
                        help="render KAFKA.md and kafka.png again from kafka.json")
    args = parser.parse_args()
    if args.report_only:
        with open(os.path.join(HERE, "kafka.json")) as f:
            text = report(json.load(f))
        with open(os.path.join(HERE, "KAFKA.md"), "w") as f:
            f.write(text)
        return
    jars = [j for j in glob.glob(os.path.join(JARS, "*.jar"))
            if os.path.basename(j).startswith(_CONNECTOR)]
    if len(jars) != len(_CONNECTOR):
        raise SystemExit(f"Spark's Kafka connector is not in {JARS}: "
                         "make build/spark-kafka/.fetched")
    from sparkbeam.execute.session import get_session
    from sparkbeam.options import SparkOptions

    spark = get_session(SparkOptions(["--spark_master=local[2]", "--parallelism=2",
                                      f"--spark_conf=spark.jars={','.join(jars)}"]))
    spark.sparkContext.setLogLevel("ERROR")
    records = args.records // (10 if args.quick else 1)
    broker = KafkaBroker().start()
    try:
        bootstrap = broker.bootstrap
        # Warm-up (untimed): Python workers, the connector's classes, the broker's groups.
        sparkbeam_count(bootstrap, 1_000, 10, exactly_once=True)
        spark_count(spark, bootstrap, 1_000, 10)
        rows = []
        for keys in [int(k) for k in args.keys.split(",")]:
            row: dict[str, Any] = {"keys": keys, "records": records}
            row["spark"] = spark_count(spark, bootstrap, records, keys)
            row["sparkbeam"] = sparkbeam_count(bootstrap, records, keys, exactly_once=False)
            row["sparkbeam_eos"] = sparkbeam_count(bootstrap, records, keys, exactly_once=True)
            rows.append(row)
            print(json.dumps(row), flush=True)
        rate, seconds = 200, (10 if args.quick else 30)
        latency = {
            "rate": rate, "seconds": seconds,
            "spark": _summary(spark_latency(spark, bootstrap, rate, seconds)),
            "sparkbeam": _summary(sparkbeam_latency(bootstrap, rate, seconds, False)),
            "sparkbeam_eos": _summary(sparkbeam_latency(bootstrap, rate, seconds, True)),
        }
        print(json.dumps(latency), flush=True)
    finally:
        broker.stop()
    write_extra("kafka", {"rows": rows, "latency": latency, "quick": args.quick}, report)


def report(results: dict[str, Any]) -> str:
    """KAFKA.md's text; draws kafka.png beside it."""
    chart(results, os.path.join(HERE, "kafka.png"))
    return markdown(results)


def chart(results: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.4))
    names = [("spark", "Spark's query"), ("sparkbeam", "sparkbeam"),
             ("sparkbeam_eos", "sparkbeam EOS")]
    width = 0.27
    for n, (key, label) in enumerate(names):
        left.bar([i + n * width for i in range(len(results["rows"]))],
                 [r[key]["records_per_s"] for r in results["rows"]], width, label=label)
    left.set_xticks([i + width for i in range(len(results["rows"]))],
                    [f"{r['keys']:,} keys" for r in results["rows"]])
    left.set_yscale("log")
    left.set_ylabel("records/s (higher is better)")
    left.legend(fontsize=8)
    lat = results["latency"]
    right.bar([label for _, label in names], [lat[k]["p95_s"] for k, _ in names],
              color="#c44e52", label="p95")
    right.bar([label for _, label in names], [lat[k]["p50_s"] for k, _ in names],
              color="#4c72b0", label="p50")
    right.set_ylabel("seconds, 1 s trigger")
    right.legend(fontsize=8)
    fig.suptitle(f"Kafka -> per-key count -> Kafka ({results['date']})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def markdown(results: dict[str, Any]) -> str:
    lines = [
        "## Kafka: Kafka -> per-key count -> Kafka, sparkbeam vs Spark's own Kafka query",
        "",
        f"{results['date']}, {results['machine']}, local[2], one broker (KRaft, 127.0.0.1); "
        "one process, same SparkSession; `python -m bench.kafka`. Records/s from the query's "
        "start until every count is out (sparkbeam) or every record is counted (Spark). Spark: "
        "`readStream.format(\"kafka\")` -> `groupBy(key).count()` -> Kafka sink (update mode; "
        "the 4.2.0 connector on pyspark 4.3.0).",
        "",
        "| keys | records | Spark rec/s | sparkbeam rec/s | ratio | sparkbeam exactly-once rec/s "
        "| ratio | correct (Spark / ours / ours EOS) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results["rows"]:
        spark, ours, eos = r["spark"], r["sparkbeam"], r["sparkbeam_eos"]
        limit = spark["records_per_s"]
        lines.append(
            f"| {r['keys']:,} | {r['records']:,} | {limit:,.0f} "
            f"| {ours['records_per_s']:,.0f} | {ours['records_per_s'] / limit:.2f}x "
            f"| {eos['records_per_s']:,.0f} | {eos['records_per_s'] / limit:.2f}x "
            f"| {spark['correct']} / {ours['correct']} / {eos['correct']} |")
    lat = results["latency"]
    lines += [
        "",
        f"End-to-end latency at a 1 s trigger (Kafka -> Map -> Kafka, {lat['rate']} records/s "
        f"for {lat['seconds']} s, send -> receipt by a read_committed consumer):",
        "",
        "| query | records | p50 s | p95 s |",
        "|---|---|---|---|",
    ]
    for name, label in (("spark", "Spark (Kafka source -> Kafka sink)"),
                        ("sparkbeam", "sparkbeam, at least once"),
                        ("sparkbeam_eos", "sparkbeam, exactly once")):
        s = lat[name]
        lines.append(f"| {label} | {s['records']} | {s['p50_s']:.2f} | {s['p95_s']:.2f} |")
    lines += ["", "![Kafka throughput and latency](kafka.png)"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
