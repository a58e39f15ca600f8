"""Both sides of the SDK worker boot contract (`--id`, `--*_endpoint` flags).

Runner side: `SdkWorkerProcess` starts a worker for a PROCESS environment (its command with those
flags) or asks an EXTERNAL worker pool to (`StartWorker`), and tells whether it still runs.

Worker side: a boot program, the Python counterpart of Beam's container `boot`:

    python -m sparkbeam.control.boot --id=W --provision_endpoint=H:P --control_endpoint=H:P \
        --logging_endpoint=H:P [--artifact_endpoint=H:P]

It fetches the ProvisionInfo, sets the environment variables `sdk_worker_main` reads (as Beam's
boot and `SubprocessSdkWorker` do) and execs the SDK harness in a fresh interpreter: the same pid
(so the runner's process handle stays valid), and Beam modules that read WORKER_ID at import time
see it. Staged artifacts are
not installed here: the environment's interpreter is expected to have the job's dependencies.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
import uuid
from typing import TYPE_CHECKING

import grpc
from apache_beam.portability import common_urns
from apache_beam.portability.api import (
    beam_fn_api_pb2,
    beam_fn_api_pb2_grpc,
    beam_provision_api_pb2,
    beam_provision_api_pb2_grpc,
    beam_runner_api_pb2,
    endpoints_pb2,
)
from apache_beam.utils import proto_utils
from google.protobuf import json_format, text_format

from sparkbeam.errors import SdkWorkerError, SdkWorkerTimeout

if TYPE_CHECKING:
    from sparkbeam.control.grpc_server import ControlConnection, FnApiServer

_PROCESS = common_urns.environments.PROCESS.urn
_EXTERNAL = common_urns.environments.EXTERNAL.urn
_POLL_S = 0.5
# How long an EXTERNAL worker pool may take to answer StartWorker. Beam's pool builds the
# SdkHarness inside that call, and the harness waits up to 60 s for this runner's control
# channel to be ready; a LOOPBACK client busy with other jobs' workers took over 30 s in a test
# run. A pool that is gone fails at once (UNAVAILABLE), not at this deadline.
START_WORKER_TIMEOUT_S = 90.0


def describe_environment(env: beam_runner_api_pb2.Environment) -> str:
    """A readable name for an environment: urn plus command or worker pool url."""
    if env.urn == _PROCESS:
        payload = proto_utils.parse_Bytes(env.payload, beam_runner_api_pb2.ProcessPayload)
        return f"{env.urn} command={payload.command}"
    if env.urn == _EXTERNAL:
        ext = proto_utils.parse_Bytes(env.payload, beam_runner_api_pb2.ExternalPayload)
        return f"{env.urn} url={ext.endpoint.url}"
    return env.urn


class SdkWorkerProcess:
    """One SDK worker started for an environment, and how to tell whether it still runs."""

    def __init__(self, server: FnApiServer, env: beam_runner_api_pb2.Environment) -> None:
        self.server = server
        self.environment = describe_environment(env)
        self.worker_id = f"sdk-{uuid.uuid4().hex[:8]}"
        self.conn: ControlConnection = server.control.expect(self.worker_id, self.environment)
        self.popen: subprocess.Popen[bytes] | None = None
        self._pool: beam_fn_api_pb2_grpc.BeamFnExternalWorkerPoolStub | None = None
        self._channel: grpc.Channel | None = None
        url = server.address
        if env.urn == _PROCESS:
            payload = proto_utils.parse_Bytes(env.payload, beam_runner_api_pb2.ProcessPayload)
            args = [payload.command, f"--id={self.worker_id}"] + [
                f"--{name}_endpoint={url}"
                for name in ("provision", "control", "logging", "artifact")
            ]
            self.popen = subprocess.Popen(args, env={**os.environ, **payload.env})
        elif env.urn == _EXTERNAL:
            ext = proto_utils.parse_Bytes(env.payload, beam_runner_api_pb2.ExternalPayload)
            self._channel = grpc.insecure_channel(ext.endpoint.url)
            self._pool = beam_fn_api_pb2_grpc.BeamFnExternalWorkerPoolStub(self._channel)
            endpoint = server.endpoint()
            try:
                response = self._pool.StartWorker(
                    beam_fn_api_pb2.StartWorkerRequest(
                        worker_id=self.worker_id, control_endpoint=endpoint,
                        logging_endpoint=endpoint, artifact_endpoint=endpoint,
                        provision_endpoint=endpoint, params=dict(ext.params),
                    ),
                    timeout=START_WORKER_TIMEOUT_S,
                )
            except grpc.RpcError as exc:
                self.stop()
                why = (f"it did not answer within {START_WORKER_TIMEOUT_S:.0f} s"
                       if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED else
                       "for a LOOPBACK job: the client that submitted it has gone")
                raise SdkWorkerError(
                    f"the worker pool of environment '{self.environment}' did not start SDK "
                    f"worker {self.worker_id}: {exc.code().name}: {exc.details()} ({why})"
                ) from None
            if response.error:
                raise SdkWorkerError(
                    f"worker pool of environment '{self.environment}' could not start "
                    f"SDK worker {self.worker_id}: {response.error}"
                )
        else:
            raise ValueError(f"environment {env.urn} is not run by the gRPC worker")

    def death(self) -> str | None:
        """Why this worker cannot run bundles any more, or None while it can."""
        if self.popen is not None and self.popen.poll() is not None:
            return f"exited with code {self.popen.returncode}"
        if self.conn.lost is not None:
            return str(self.conn.lost)
        return None

    def wait_connected(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.conn.connected.wait(min(_POLL_S, max(deadline - time.monotonic(), 0))):
            death = self.death()
            if death is not None or time.monotonic() >= deadline:
                self.stop()
                what = f" ({death})" if death else ""
                raise SdkWorkerTimeout(
                    f"SDK worker {self.worker_id} for environment '{self.environment}' did "
                    f"not connect to {self.server.address} within {timeout_s:g}s{what}"
                )

    def stop(self) -> None:
        self.conn.lose("was stopped")
        self.server.data.release(self.worker_id)
        if self._pool is not None:
            with contextlib.suppress(Exception):
                self._pool.StopWorker(
                    beam_fn_api_pb2.StopWorkerRequest(worker_id=self.worker_id), timeout=10
                )
        if self._channel is not None:
            self._channel.close()
        if self.popen is not None and self.popen.poll() is None:
            # The control stream just ended: a healthy harness exits on its own, closing its
            # data streams cleanly; one that does not is terminated, then killed.
            for step in (lambda: None, self.popen.terminate, self.popen.kill):
                step()
                try:
                    self.popen.wait(3)
                    break
                except subprocess.TimeoutExpired:
                    continue



def _descriptor(url: str) -> str:
    return text_format.MessageToString(endpoints_pb2.ApiServiceDescriptor(url=url))


def provision(worker_id: str, endpoint: str, timeout_s: float = 60.0
              ) -> beam_provision_api_pb2.ProvisionInfo:
    """Fetches this worker's ProvisionInfo (the runner knows the worker by its id)."""
    with grpc.insecure_channel(endpoint) as channel:
        stub = beam_provision_api_pb2_grpc.ProvisionServiceStub(channel)
        response = stub.GetProvisionInfo(
            beam_provision_api_pb2.GetProvisionInfoRequest(),
            metadata=[("worker_id", worker_id)],
            timeout=timeout_s,
        )
    return response.info


def harness_environment(args: argparse.Namespace, info: beam_provision_api_pb2.ProvisionInfo,
                        semi_persistent_dir: str) -> dict[str, str]:
    """The variables `sdk_worker_main.create_harness` reads."""
    env = {
        "WORKER_ID": args.id,
        "CONTROL_API_SERVICE_DESCRIPTOR": _descriptor(
            info.control_endpoint.url or args.control_endpoint),
        "LOGGING_API_SERVICE_DESCRIPTOR": _descriptor(
            info.logging_endpoint.url or args.logging_endpoint),
        "PIPELINE_OPTIONS": json_format.MessageToJson(info.pipeline_options),
        "SEMI_PERSISTENT_DIRECTORY": semi_persistent_dir,
    }
    if info.runner_capabilities:
        env["RUNNER_CAPABILITIES"] = " ".join(info.runner_capabilities)
    return env


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sparkbeam.control.boot")
    parser.add_argument("--id", required=True, help="worker id given by the runner")
    parser.add_argument("--provision_endpoint", required=True)
    parser.add_argument("--control_endpoint", required=True)
    parser.add_argument("--logging_endpoint", required=True)
    parser.add_argument("--artifact_endpoint", default="")
    parser.add_argument("--semi_persistent_directory", default="")
    args, _unknown = parser.parse_known_args(argv)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    info = provision(args.id, args.provision_endpoint)
    semi = args.semi_persistent_directory or tempfile.mkdtemp(prefix=f"sparkbeam-{args.id}-")
    env = {**os.environ, **harness_environment(args, info, semi)}
    command = [sys.executable, "-m", "apache_beam.runners.worker.sdk_worker_main"]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, command, env)


if __name__ == "__main__":
    main()
