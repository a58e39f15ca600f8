"""The job server under load: concurrent first jobs, flat memory, a client that goes away.

Every server here is a real `sparkbeam job-server` (a child process on 127.0.0.1, its own
SparkSession) or an in-process JobServer on the shared session; every client is Beam's own
PortableRunner with LOOPBACK. Bounded in jobs and time; the servers stop at the end.
The full load (20 concurrent jobs three times, 100 sequential jobs) is `make test-slow`.
"""
from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import apache_beam as beam
import grpc
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.portability.api import beam_job_api_pb2, beam_job_api_pb2_grpc
from apache_beam.testing.util import assert_that, equal_to

from sparkbeam.jobservice import JobServer
from sparkbeam.spark_executor import SparkJobExecutor

pb = beam_job_api_pb2
CLIENTS = Path(__file__).parent / "clients"


@contextmanager
def fresh_server(tmp_path: Path, *flags: str) -> Iterator[tuple[subprocess.Popen, str]]:
    """`sparkbeam job-server --port 0` in a child process: (process, endpoint)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "sparkbeam.cli", "job-server", "--port", "0",
         "--artifacts-dir", str(tmp_path / "artifacts"), *flags],
        stderr=subprocess.PIPE, text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stderr is not None
    threading.Thread(target=lambda: [lines.put(ln) for ln in proc.stderr],  # type: ignore[union-attr]
                     daemon=True).start()
    try:
        deadline = time.monotonic() + 60
        while True:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            match = re.search(r"listening on (\S+)", line)
            if match:
                break
        yield proc, match.group(1)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        # The server's log (and its JVM's) for the report of a failed test.
        while not lines.empty():
            sys.stderr.write(f"[server] {lines.get()}")


def word_count_job(endpoint: str, n: int) -> None:
    """A small word count whose input (and so its expected output) differs per job."""
    words = [f"w{i % 7}" for i in range(40 + n)]
    expected = sorted((w, words.count(w)) for w in set(words))
    with beam.Pipeline(options=PipelineOptions([
        "--runner=PortableRunner", f"--job_endpoint={endpoint}",
        # Beam's client makes this its deadline for the whole job (state and message
        # streams); twenty first jobs at once on two cores may take longer than its 60 s.
        "--environment_type=LOOPBACK", "--job_server_timeout=600",
    ])) as p:
        counts = p | beam.Create(words) | beam.combiners.Count.PerElement()
        assert_that(counts, equal_to(expected))


def concurrent_jobs(endpoint: str, n: int) -> dict[int, str]:
    """Runs n word counts at once; job number -> 'ok' or the error it ended with."""
    outcomes: dict[int, str] = {}

    def one(i: int) -> None:
        try:
            word_count_job(endpoint, i)
            outcomes[i] = "ok"
        except Exception as exc:  # noqa: BLE001 - the assertion lists every failure
            outcomes[i] = f"{type(exc).__name__}: {str(exc)[:500]}"

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    return outcomes


def tree_rss(pid: int) -> int:
    """Resident bytes of a process and all its descendants (the JVM, Spark's Python workers)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(parent, []).append(int(entry))
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        todo.extend(children.get(current, []))
        try:
            with open(f"/proc/{current}/status") as f:
                total += next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("VmRSS:"))
        except (OSError, StopIteration):
            continue
    return total


@pytest.mark.timeout(600)  # a fresh JVM and eight LOOPBACK jobs on a loaded machine
def test_jobs_arriving_together_at_a_fresh_server_all_run(tmp_path: Path) -> None:
    """They wait for the one SparkSession start instead of racing to launch a JVM each."""
    with fresh_server(tmp_path) as (_, endpoint):
        outcomes = concurrent_jobs(endpoint, 8)
    assert outcomes == {i: "ok" for i in range(8)}


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("round_", [1, 2, 3])
def test_twenty_concurrent_first_jobs_three_times(tmp_path: Path, round_: int) -> None:
    with fresh_server(tmp_path) as (_, endpoint):
        outcomes = concurrent_jobs(endpoint, 20)
    assert outcomes == {i: "ok" for i in range(20)}


def settled_rss(pid: int) -> int:
    """The server's resident memory once it has been idle for a while: the driver JVM's
    periodic collection (the job server's session settings) has run and given back the heap
    that only held garbage; the least of a few samples."""
    time.sleep(20)
    samples = []
    for _ in range(5):
        samples.append(tree_rss(pid))
        time.sleep(1)
    return min(samples)


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_server_memory_is_flat_over_a_hundred_sequential_jobs(tmp_path: Path) -> None:
    with fresh_server(tmp_path) as (proc, endpoint):
        rss = {}
        for n in range(1, 101):
            word_count_job(endpoint, n % 5)
            if n in (20, 60, 100):
                rss[n] = settled_rss(proc.pid)
    print({n: f"{v / 1e9:.2f} GB" for n, v in rss.items()})
    assert rss[100] <= 1.10 * rss[20], rss


@pytest.mark.timeout(240)
def test_a_loopback_client_that_disconnects_fails_its_job_and_only_its_job(
    tmp_path: Path, spark
) -> None:
    server = JobServer(SparkJobExecutor(), artifacts_dir=str(tmp_path / "artifacts"))
    server.start()
    client = subprocess.Popen(
        [sys.executable, str(CLIENTS / "slow_loopback.py"), server.endpoint],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    try:
        assert client.stdout is not None and client.stdout.readline().strip() == "SUBMITTED"
        with grpc.insecure_channel(server.endpoint) as channel:
            stub = beam_job_api_pb2_grpc.JobServiceStub(channel)
            state = lambda: stub.GetState(  # noqa: E731
                pb.GetJobStateRequest(job_id="job-001"), timeout=10).state
            deadline = time.monotonic() + 120
            while state() != pb.JobState.RUNNING:
                assert time.monotonic() < deadline, "the slow job never ran"
                time.sleep(0.2)
            time.sleep(3)  # its bundle is inside the client's SDK worker now
            neighbour = threading.Thread(target=word_count_job, args=(server.endpoint, 3))
            client.send_signal(signal.SIGKILL)
            gone = time.monotonic()
            neighbour.start()
            while state() not in (pb.JobState.FAILED, pb.JobState.DONE, pb.JobState.CANCELLED):
                assert time.monotonic() - gone < 60, "the job outlived its client's worker"
                time.sleep(0.2)
            assert state() == pb.JobState.FAILED
            errors = [m.message_response.message_text for m in stub.GetMessageStream(
                pb.JobMessagesRequest(job_id="job-001"), timeout=10)
                if m.HasField("message_response")
                and m.message_response.importance == pb.JobMessage.JOB_MESSAGE_ERROR]
            neighbour.join(120)
            neighbour_state = stub.GetState(pb.GetJobStateRequest(job_id="job-002"), timeout=10)
        assert len(errors) == 1
        assert re.search(r"environment 'beam:env:external:v1 url=localhost:\d+'", errors[0])
        assert neighbour_state.state == pb.JobState.DONE
    finally:
        client.kill()
        client.wait(10)
        server.stop()
