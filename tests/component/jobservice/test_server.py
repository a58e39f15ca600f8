"""JobServer's life cycle and the `sparkbeam job-server` entry point."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import grpc
import pytest
from apache_beam.portability.api import beam_job_api_pb2, beam_job_api_pb2_grpc

from sparkbeam.errors import SparkBeamError
from sparkbeam.jobservice import JobServer, main
from tests.unit.jobservice.fakes import FakeExecutor

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[3]


def describe(port: int) -> list[str]:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = beam_job_api_pb2_grpc.JobServiceStub(channel)
        reply = stub.DescribePipelineOptions(
            beam_job_api_pb2.DescribePipelineOptionsRequest(), timeout=10, wait_for_ready=True
        )
    return [o.name for o in reply.options]


def test_start_stop_and_the_temporary_artifacts_dir() -> None:
    server = JobServer(FakeExecutor())
    port = server.start()
    assert port > 0 and server.endpoint == f"127.0.0.1:{port}"
    assert describe(port) == ["fake_bundle_size"]
    artifacts = server.artifacts_dir
    assert artifacts is not None and os.path.isdir(artifacts)
    with pytest.raises(SparkBeamError, match="already started"):
        server.start()
    server.stop()
    server.stop()  # twice is fine
    assert not os.path.exists(artifacts)


def test_a_given_artifacts_dir_is_created_and_kept(tmp_path: Path) -> None:
    with JobServer(FakeExecutor(), artifacts_dir=str(tmp_path / "a" / "b")) as server:
        assert server.artifacts_dir == str(tmp_path / "a" / "b")
    assert (tmp_path / "a" / "b").is_dir()


def test_a_busy_port_is_an_error() -> None:
    with JobServer(FakeExecutor()) as first:
        with pytest.raises(SparkBeamError, match=f"cannot listen on 127.0.0.1:{first.port}"):
            JobServer(FakeExecutor(), port=first.port).start()
        assert main(["--port", str(first.port)], lambda args: FakeExecutor()) == 1


def test_main_serves_until_stopped() -> None:
    stop = threading.Event()
    made: list[object] = []

    def factory(args) -> FakeExecutor:
        made.append(args)
        stop.set()  # stop right away: main must still start and stop cleanly
        return FakeExecutor()

    assert main(["--port", "0", "--host", "127.0.0.1"], factory, stop=stop) == 0
    assert made[0].port == 0 and made[0].artifacts_dir is None


def test_main_gives_the_process_its_signal_handlers_back() -> None:
    def mine(signum, frame) -> None:  # type: ignore[no-untyped-def]
        pass

    before = {s: signal.signal(s, mine) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        stop = threading.Event()
        stop.set()
        assert main(["--port", "0"], lambda args: FakeExecutor(), stop=stop) == 0
        assert signal.getsignal(signal.SIGINT) is mine
        assert signal.getsignal(signal.SIGTERM) is mine
        with JobServer(FakeExecutor()) as busy:  # and when the server cannot start
            assert main(["--port", str(busy.port)], lambda args: FakeExecutor()) == 1
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def test_the_command_serves_until_sigterm() -> None:
    code = (
        "import sys\n"
        "from sparkbeam.jobservice.server import main\n"
        "from tests.unit.jobservice.fakes import FakeExecutor\n"
        "sys.exit(main(sys.argv[1:], lambda args: FakeExecutor()))\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "--port", "0"], cwd=REPO, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stderr is not None
        port = 0
        for line in proc.stderr:  # bounded by the test timeout
            found = re.search(r"job server listening on 127\.0\.0\.1:(\d+)", line)
            if found:
                port = int(found.group(1))
                break
        assert port, "the server never said where it listens"
        assert describe(port) == ["fake_bundle_size"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
