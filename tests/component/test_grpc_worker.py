"""The gRPC worker against real SDK harness processes on 127.0.0.1 (no mocks, no Spark)."""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import stat
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from concurrent import futures
from typing import Any

import apache_beam as beam
import grpc
import pytest
from apache_beam.portability import common_urns
from apache_beam.portability.api import (
    beam_fn_api_pb2,
    beam_fn_api_pb2_grpc,
    beam_runner_api_pb2,
    endpoints_pb2,
)
from apache_beam.transforms.window import GlobalWindows

from sparkbeam.engine import context as worker_context
from tests.conftest import beam_worker_pool
from sparkbeam.control import boot
from sparkbeam.control.embedded import EmbeddedWorker
from sparkbeam.control.grpc_worker import GrpcWorkers
from sparkbeam.plan.fuse import plan_pipeline
from sparkbeam.errors import SdkWorkerError
from sparkbeam.plan.model import Stage

pytestmark = pytest.mark.timeout(120)  # some tests start two SDK workers or a pool
PYTHON = sys.executable
SLOW_FLAG = "SPARKBEAM_TEST_SLOW"


class LogsAndFails(beam.DoFn):
    """Logs each value; fails on 13; sleeps on 99 (to kill the worker mid-bundle) and 50."""

    def process(self, kv):  # type: ignore[no-untyped-def]
        key, values = kv
        for x in values:
            logging.getLogger("user.dofn").warning("hello from the DoFn: %s", x)
            if x == 13:
                raise ValueError(f"user code rejected {x}")
            if x == 99:
                time.sleep(30)
            if x == 50:
                time.sleep(0.5)
            yield (key, x * 10)


def _grouped_stage() -> tuple[Stage, Any]:
    """The stage after a GroupByKey: it reads grouped elements, as most stages do."""
    p = beam.Pipeline()
    _ = (p | beam.Create([(0, 0)], reshuffle=False).with_output_types(tuple[int, int])
         | "Group" >> beam.GroupByKey()
         | beam.ParDo(LogsAndFails()).with_output_types(tuple[int, int])
         | "Regroup" >> beam.GroupByKey())
    plan = plan_pipeline(p.to_runner_api())
    stage = next(s for s in plan.stages if s.inputs[0].transform_id.startswith("Group/"))
    coder = worker_context.pipeline_context(plan.components).coders[stage.inputs[0].coder_id]
    return stage, coder.get_impl()


STAGE, INPUT_CODER = _grouped_stage()


def _inputs(values: list[int]) -> list[beam_fn_api_pb2.Elements.Data]:
    """One data chunk holding one grouped element per value, as the engine's bundles build them."""
    data = b"".join(
        INPUT_CODER.encode_nested(GlobalWindows.windowed_value((v, [v]))) for v in values)
    return [beam_fn_api_pb2.Elements.Data(transform_id=STAGE.inputs[0].transform_id, data=data)]


def _embedded(values: list[int]) -> list[tuple[str, bytes]]:
    worker = EmbeddedWorker(beam_fn_api_pb2.ProcessBundleDescriptor.FromString(STAGE.descriptor))
    try:
        return worker.process(_inputs(values)).outputs
    finally:
        worker.shutdown()


def _process_env(command: str) -> beam_runner_api_pb2.Environment:
    return beam_runner_api_pb2.Environment(
        urn=common_urns.environments.PROCESS.urn,
        payload=beam_runner_api_pb2.ProcessPayload(command=command).SerializeToString(),
    )


def _script(path: Path, body: str) -> str:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.fixture
def workers() -> Iterator[GrpcWorkers]:
    pool = GrpcWorkers()
    yield pool
    pool.shutdown()


@pytest.fixture
def boot_env(tmp_path: Path) -> beam_runner_api_pb2.Environment:
    return _process_env(_script(tmp_path / "boot.sh",
                                f'exec {PYTHON} -m sparkbeam.control.boot "$@"'))



@pytest.fixture
def worker_pool(tmp_path: Path) -> Iterator[str]:
    """Beam's worker pool, starting each worker through our boot program."""
    boot = _script(tmp_path / "pool_boot.sh", f'exec {PYTHON} -m sparkbeam.control.boot "$@"')
    with beam_worker_pool(str(boot)) as url:
        yield url


def test_process_worker_outputs_match_the_embedded_worker(workers, boot_env) -> None:  # type: ignore[no-untyped-def]
    values = [1, 2, 3, 4, 5]
    with workers.lease(STAGE.descriptor, boot_env, {}) as worker:
        result = worker.process(_inputs(values))
    assert result.outputs == _embedded(values)
    assert len(result.outputs) == 5  # one entry per element, not per data chunk
    assert result.monitoring_infos


def test_descriptor_is_fetched_once_per_worker_not_per_bundle(workers, boot_env) -> None:  # type: ignore[no-untyped-def]
    values = [1, 2]
    expected = _embedded(values)
    for _ in range(4):
        with workers.lease(STAGE.descriptor, boot_env, {}) as worker:
            for _ in range(5):
                assert worker.process(_inputs(values)).outputs == expected
    server = workers.server(boot_env)
    assert server is not None
    assert list(server.descriptor_fetches.values()) == [1]


def test_user_logs_reach_sparkbeam_sdk_with_worker_and_transform(workers, boot_env, caplog) -> None:  # type: ignore[no-untyped-def]
    values = [7]
    with caplog.at_level(logging.INFO, logger="sparkbeam.sdk"):
        with workers.lease(STAGE.descriptor, boot_env, {}) as worker:
            worker.process(_inputs(values))
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                hits = [r for r in caplog.records
                        if r.name == "sparkbeam.sdk" and "hello from the DoFn: 7" in r.getMessage()]
                if hits:
                    break
                time.sleep(0.1)
    assert hits, "the DoFn's log line never reached sparkbeam.sdk"
    message = hits[0].getMessage()
    assert message.startswith(f"[worker {worker.sdk.worker_id} transform ")
    assert "LogsAndFails" in message
    assert hits[0].levelno == logging.WARNING


def test_user_exception_surfaces_with_its_message(workers, boot_env) -> None:  # type: ignore[no-untyped-def]
    values = [1, 13]
    with workers.lease(STAGE.descriptor, boot_env, {}) as worker:
        with pytest.raises(RuntimeError, match="user code rejected 13") as info:
            worker.process(_inputs(values))
    assert "while running" in str(info.value)
    # The worker survives a user error and runs the next bundle.
    ok = [2]
    with workers.lease(STAGE.descriptor, boot_env, {}) as worker:
        assert worker.process(_inputs(ok)).outputs == _embedded(ok)


# Beam's data servicer logs the broken stream from a reader thread of its own.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_killed_process_worker_fails_the_bundle_and_is_replaced(workers, boot_env) -> None:  # type: ignore[no-untyped-def]
    slow = [99]
    with workers.lease(STAGE.descriptor, boot_env, {}) as worker:
        assert worker.sdk.popen is not None
        pid = worker.sdk.popen.pid
        threading.Timer(2.0, os.kill, (pid, signal.SIGKILL)).start()
        started = time.monotonic()
        with pytest.raises(RuntimeError, match="died"):
            worker.process(_inputs(slow))
        assert time.monotonic() - started < 10
        dead_id = worker.sdk.worker_id
    ok = [4]
    with workers.lease(STAGE.descriptor, boot_env, {}) as worker:
        assert worker.sdk.worker_id != dead_id
        assert worker.process(_inputs(ok)).outputs == _embedded(ok)


def test_worker_that_never_connects_times_out_naming_the_environment(workers, tmp_path) -> None:  # type: ignore[no-untyped-def]
    command = _script(tmp_path / "silent.sh", "exec sleep 30")
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"beam:env:process:v1 command=.*silent\.sh.* 2s"):
        with workers.lease(STAGE.descriptor, _process_env(command), {}, connect_timeout_s=2):
            pass
    assert time.monotonic() - started < 10


def test_external_worker_pool_gives_the_same_outputs(workers, worker_pool) -> None:  # type: ignore[no-untyped-def]
    env = beam_runner_api_pb2.Environment(
        urn=common_urns.environments.EXTERNAL.urn,
        payload=beam_runner_api_pb2.ExternalPayload(
            endpoint=endpoints_pb2.ApiServiceDescriptor(url=worker_pool)
        ).SerializeToString(),
    )
    values = [1, 2, 3]
    with workers.lease(STAGE.descriptor, env, {}) as worker:
        assert worker.process(_inputs(values)).outputs == _embedded(values)


def _external(url: str) -> beam_runner_api_pb2.Environment:
    return beam_runner_api_pb2.Environment(
        urn=common_urns.environments.EXTERNAL.urn,
        payload=beam_runner_api_pb2.ExternalPayload(
            endpoint=endpoints_pb2.ApiServiceDescriptor(url=url)).SerializeToString())


class _SlowPool(beam_fn_api_pb2_grpc.BeamFnExternalWorkerPoolServicer):
    """A worker pool that takes 5 s to answer StartWorker (Beam's pool builds the harness
    inside that call, waiting for the runner's control channel)."""

    def StartWorker(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        time.sleep(5)
        return beam_fn_api_pb2.StartWorkerResponse()


def test_a_worker_pool_that_does_not_answer_in_time_is_named_as_slow_not_gone(
        workers, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(boot, "START_WORKER_TIMEOUT_S", 1.0)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    beam_fn_api_pb2_grpc.add_BeamFnExternalWorkerPoolServicer_to_server(_SlowPool(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with pytest.raises(SdkWorkerError, match=(
                rf"environment 'beam:env:external:v1 url=127.0.0.1:{port}' did not start SDK "
                r"worker .*: DEADLINE_EXCEEDED: .*\(it did not answer within 1 s\)$")):
            with workers.lease(STAGE.descriptor, _external(f"127.0.0.1:{port}"), {}):
                pass
    finally:
        server.stop(0)


def test_a_worker_pool_that_is_gone_is_named_as_gone(workers) -> None:  # type: ignore[no-untyped-def]
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(SdkWorkerError, match=(
            r"did not start SDK worker .*: UNAVAILABLE: .*\(for a LOOPBACK job: the client "
            r"that submitted it has gone\)$")):
        with workers.lease(STAGE.descriptor, _external(f"127.0.0.1:{port}"), {}):
            pass


def test_try_split_from_another_thread_shortens_the_running_bundle(workers, boot_env) -> None:  # type: ignore[no-untyped-def]
    values = [50] * 6
    input_id = STAGE.inputs[0].transform_id
    with workers.lease(STAGE.descriptor, boot_env, {}) as worker:
        splits: list[beam_fn_api_pb2.ProcessBundleSplitResponse] = []
        done = threading.Event()

        def split() -> None:
            # Asked again until the bundle runs in the SDK: before that there is no bundle to
            # name, or the SDK has none running (an error or an empty answer). A fixed one
            # second's wait was not always enough for a new worker's first bundle under load.
            request = beam_fn_api_pb2.ProcessBundleSplitRequest(desired_splits={
                input_id: beam_fn_api_pb2.ProcessBundleSplitRequest.DesiredSplit(
                    fraction_of_remainder=0.5, estimated_input_elements=len(values))})
            deadline = time.monotonic() + 30
            while not done.is_set() and time.monotonic() < deadline:
                with contextlib.suppress(RuntimeError):
                    answer = worker.try_split(request)
                    if answer.channel_splits:
                        splits.append(answer)
                        return
                time.sleep(0.05)

        splitter = threading.Thread(target=split)
        splitter.start()
        try:
            result = worker.process(_inputs(values))
        finally:
            done.set()
            splitter.join(10)
    assert splits and splits[0].channel_splits
    last_primary = splits[0].channel_splits[0].last_primary_element
    assert len(result.outputs) == last_primary + 1 < len(values)
