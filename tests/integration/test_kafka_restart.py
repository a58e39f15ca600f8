"""Killing the driver (kill -9, with its JVM and Python workers) of a Kafka -> windowed count
-> Kafka job three times at random micro-batches: each restart resumes from the checkpoint,
and the output topic, read `read_committed`, holds each window's count exactly once, equal to
what an uninterrupted run computes (the exactly-once WriteToKafka, `io/kafka_write.py`)."""
from __future__ import annotations

import collections
import os
import random
import signal
import subprocess
import sys
import time

import pytest
from confluent_kafka import Consumer, TopicPartition

from tests.integration.test_kafka import _produce, _read_all, _topic
from tests.integration.test_streaming_restart import _wait_for_batch

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples",
                       "kafka_windowed_count.py")
RECORDS = 2_000


def _start(broker, source: str, sink: str, ckpt: str, log) -> subprocess.Popen:  # type: ignore[no-untyped-def]
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    return subprocess.Popen(
        [sys.executable, EXAMPLE, "--bootstrap", broker.bootstrap, "--input", source,
         "--output", sink, "--exactly_once", f"--checkpoint_dir={ckpt}", "--parallelism=2",
         "--spark_master=local[2]", "--max_items_per_batch=150"],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


@pytest.mark.slow  # ~4 min (four driver starts): `make test-slow`, not in `make test`
@pytest.mark.timeout(600)
def test_kill_9_three_times_then_each_window_count_exactly_once(kafka, tmp_path) -> None:  # type: ignore[no-untyped-def]
    source, sink = _topic(kafka, 4), _topic(kafka, 2)
    # Event times rise with the offset, so windows fire one after another as the read (150
    # records a micro-batch) advances, and the kills fall among writes.
    _produce(kafka, source, [(i % 4, f"k{i % 3}".encode(), b"v", 1 + 250 * i)
                             for i in range(RECORDS)])
    counts = collections.Counter((f"k{i % 3}".encode(), (1 + 250 * i) // 10_000 * 10)
                                 for i in range(RECORDS))
    expected = sorted((k, f"{start}:{n}".encode()) for (k, start), n in counts.items())
    ckpt = str(tmp_path / "ckpt")
    rng = random.Random(11)
    kill_at = sorted(rng.sample(range(2, 14), 3))
    with open(tmp_path / "driver.log", "w") as log:
        for batch in kill_at:
            proc = _start(kafka, source, sink, ckpt, log)
            try:
                assert _wait_for_batch(ckpt, batch, proc, 240), (
                    f"batch {batch} never started; see {tmp_path / 'driver.log'}")
                # The moment that matters: records are in Kafka (maybe not yet committed) and
                # Spark has not committed the batch; a replay must not write them again.
                grew = _wait_for_growth(kafka, sink, proc, 30)
                time.sleep(rng.uniform(0, 0.3))
            finally:
                os.killpg(proc.pid, signal.SIGKILL)  # driver, its JVM and Python workers
                proc.wait(30)
            log.write(f"\n===== killed in batch {batch} "
                      f"({'after' if grew else 'with no'} output growth) =====\n")
            log.flush()
        proc = _start(kafka, source, sink, ckpt, log)
        try:
            _read_all(kafka, sink, 2, expected=len(expected), timeout_s=300)
            time.sleep(5)  # a duplicate would come by now
            # Everything the topic holds (reading until the time is up).
            got = _read_all(kafka, sink, 2, expected=10 * len(expected), timeout_s=10)
        finally:
            with open(os.path.join(ckpt, "drain"), "w") as f:
                f.write("test")
            code = proc.wait(180)
    assert code == 0, (tmp_path / "driver.log").read_text()[-3000:]
    assert len(got) == len(set(got)), "a window's count was written twice"
    assert sorted(got) == expected, (tmp_path / "driver.log").read_text()[-3000:]



def _wait_for_growth(kafka, topic: str, proc: subprocess.Popen, timeout_s: float) -> bool:  # type: ignore[no-untyped-def]
    """Until the topic's log grows (transactional records count before their commit), the
    driver dies, or the time is up; whether it grew."""
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": "watch"})

    def end() -> int:
        return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=5,
                                                  cached=False)[1] for p in (0, 1))

    try:
        start, deadline = end(), time.monotonic() + timeout_s
        while time.monotonic() < deadline and proc.poll() is None:
            if end() != start:
                return True
            time.sleep(0.05)
        return False
    finally:
        consumer.close()
