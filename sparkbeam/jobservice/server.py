"""`sparkbeam job-server`: the Job API and artifact services on one gRPC server.

    server = JobServer(executor)          # any JobExecutor; the CLI injects the Spark one
    port = server.start()                 # 127.0.0.1, a free port unless one is given
    ...                                   # clients: --runner=PortableRunner
    server.stop()                         #   --job_endpoint=localhost:<port>
"""
from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import re
import shutil
import signal
import socket
import tempfile
import threading
from collections.abc import Callable, Sequence
from concurrent import futures
from types import FrameType, TracebackType
from typing import Any

import grpc
from apache_beam.portability.api import beam_artifact_api_pb2, beam_job_api_pb2

from sparkbeam.errors import SparkBeamError
from sparkbeam.jobservice.manager import STAGING_GRACE_SECONDS, JobManager, Retention
from sparkbeam.jobservice.protocol import JobExecutor
from sparkbeam.jobservice.servicer import JobService
from sparkbeam.jobservice.staging import new_artifact_services
from sparkbeam.jobservice.wire import add_service

_LOGGER = logging.getLogger(__name__)

# Each open state or message stream holds a worker thread for as long as its job runs.
DEFAULT_MAX_WORKERS = 64
# The largest request a client may send (a pipeline proto can pass gRPC's 4 MB default; a
# bigger one is refused with RESOURCE_EXHAUSTED before it is read into memory).
DEFAULT_MAX_REQUEST_BYTES = 128 << 20
# The artifact bytes one job may stage (--max-staged-bytes).
DEFAULT_MAX_STAGED_BYTES = 2 << 30

_GRPC_OPTIONS = [
    ("grpc.max_send_message_length", -1),
    ("grpc.http2.max_pings_without_data", 0),  # long streams with keep-alive pings
    ("grpc.http2.max_ping_strikes", 0),
    ("grpc.so_reuseport", 0),  # a second server on a busy port must fail, not share it
]

_WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]"})

REMOTE_WARNING = (
    "the Job API on %s is reachable from other hosts: it runs any pipeline sent to it, "
    "with this server's rights, and Beam's clients have no authentication; put it behind "
    "an authenticating proxy or a tunnel (README: 'The job server on a network')"
)


class JobServer:
    """JobService + ArtifactStagingService + ArtifactRetrievalService on one gRPC server."""

    def __init__(
        self,
        executor: JobExecutor,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        artifacts_dir: str | None = None,
        max_workers: int = DEFAULT_MAX_WORKERS,
        staging_grace: float = STAGING_GRACE_SECONDS,
        retention: Retention | None = None,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        max_staged_bytes: int | None = DEFAULT_MAX_STAGED_BYTES,
        allow_remote: bool = False,
    ) -> None:
        if not allow_remote and not is_loopback(host):
            raise SparkBeamError(
                f"the job server would listen on {host!r}, which other hosts can reach: the "
                "Job API runs any pipeline sent to it with this server's rights and has no "
                "authentication; bind 127.0.0.1 (the default), or pass --allow-remote "
                "(allow_remote=True) behind an authenticating proxy or tunnel"
            )
        if not is_loopback(host):
            _LOGGER.warning(REMOTE_WARNING, host)
        self._executor = executor
        self._staging_grace = staging_grace
        self._retention = retention or Retention()
        self._max_request_bytes = max_request_bytes
        self._max_staged_bytes = max_staged_bytes
        self._allow_remote = allow_remote
        self._stop_sweeping = threading.Event()
        self._host = host
        self._port = port
        self._artifacts_dir = artifacts_dir
        self._max_workers = max_workers
        self._own_artifacts_dir = False
        self._server: grpc.Server | None = None
        self._close_artifacts: Callable[[], None] = lambda: None
        self.jobs: JobManager | None = None
        self.port: int | None = None

    @property
    def endpoint(self) -> str:
        """'host:port' for clients' --job_endpoint (after start)."""
        if self.port is None:
            raise SparkBeamError("the job server has no endpoint: it was not started")
        return f"{_advertised(self._host)}:{self.port}"

    @property
    def artifacts_dir(self) -> str | None:
        """Where staged artifacts are kept (a temporary directory unless one was given)."""
        return self._artifacts_dir

    def start(self) -> int:
        """Binds, starts serving and returns the port."""
        if self._server is not None:
            raise SparkBeamError(f"the job server on {self.endpoint} is already started")
        if self._artifacts_dir is None:
            self._artifacts_dir = tempfile.mkdtemp(prefix="sparkbeam-artifacts-")
            self._own_artifacts_dir = True
        if "://" not in self._artifacts_dir:  # URLs go to an fsspec destination
            os.makedirs(self._artifacts_dir, exist_ok=True)
        server = grpc.server(
            futures.ThreadPoolExecutor(
                max_workers=self._max_workers, thread_name_prefix="sparkbeam-jobserver"
            ),
            options=[*_GRPC_OPTIONS,
                     ("grpc.max_receive_message_length", self._max_request_bytes)],
        )
        address = f"{_bracketed(self._host)}:{self._port}"
        cause: RuntimeError | None = None
        try:
            port = server.add_insecure_port(address)
        except RuntimeError as exc:  # newer grpcio raises, older ones return 0
            port, cause = 0, exc
        if port == 0:
            if self._own_artifacts_dir:
                shutil.rmtree(self._artifacts_dir, ignore_errors=True)
                self._artifacts_dir, self._own_artifacts_dir = None, False
            raise SparkBeamError(
                f"the job server cannot listen on {address}: {cause or 'the port is taken'}"
            ) from cause
        self.port = port
        # Staging milestones go to the job's message stream; the manager comes second.
        artifacts = new_artifact_services(
            self._artifacts_dir, on_message=lambda token, text: self._note_staging(token, text),
            max_staged_bytes=self._max_staged_bytes,
        )
        self._close_artifacts = artifacts.close
        self.jobs = JobManager(
            self._executor, artifacts.staging, self.endpoint, staging_grace=self._staging_grace,
            retention=self._retention,
        )
        services = {**beam_job_api_pb2.DESCRIPTOR.services_by_name,
                    **beam_artifact_api_pb2.DESCRIPTOR.services_by_name}
        add_service(server, services["JobService"], JobService(self.jobs))
        add_service(server, services["ArtifactStagingService"], artifacts.staging_servicer)
        add_service(server, services["ArtifactRetrievalService"], artifacts.retrieval_servicer)
        server.start()
        self._server = server
        threading.Thread(
            target=self._sweep, args=(self.jobs,), name="sparkbeam-jobserver-retention",
            daemon=True,
        ).start()
        _LOGGER.info(
            "job server listening on %s (bound to %s, artifacts in %s; jobs kept %s)",
            self.endpoint, address, self._artifacts_dir, self._retention.describe(),
        )
        return port

    def _sweep(self, jobs: JobManager) -> None:
        """Evicts expired jobs even while no request comes in."""
        interval = min(60.0, max(0.05, self._retention.seconds / 4))
        while not self._stop_sweeping.wait(interval):
            try:
                jobs.evict_expired()
            except Exception:  # noqa: BLE001 - the sweep tries again next time
                _LOGGER.exception("evicting expired jobs failed")

    def stop(self, grace: float = 1.0) -> None:
        """Cancels running jobs, ends every stream and stops serving. Safe to call twice."""
        server, self._server = self._server, None
        if server is None:
            return
        self._stop_sweeping.set()
        if self.jobs is not None:
            self.jobs.shutdown()
        server.stop(grace).wait()
        self._close_artifacts()
        if self._own_artifacts_dir and self._artifacts_dir:
            shutil.rmtree(self._artifacts_dir, ignore_errors=True)
        _LOGGER.info("job server on port %s stopped", self.port)

    def _note_staging(self, staging_token: str, text: str) -> None:
        if self.jobs is not None:
            self.jobs.note_staging(staging_token, text)

    def __enter__(self) -> JobServer:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def build_parser(prog: str = "sparkbeam job-server") -> argparse.ArgumentParser:
    """The job server's command line; callers may add their own (executor) options."""
    parser = argparse.ArgumentParser(
        prog=prog, description="Serve the Beam Job API; jobs run on Apache Spark."
    )
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default 127.0.0.1; 0.0.0.0 for every interface)")
    parser.add_argument("--port", type=int, default=8099,
                        help="port to bind (default 8099; 0 picks a free one)")
    parser.add_argument("--artifacts-dir", default=None,
                        help="where staged artifacts are kept (default: a temporary directory)")
    parser.add_argument("--allow-remote", action="store_true",
                        help="allow a --host other hosts can reach (the Job API has no "
                        "authentication: put it behind an authenticating proxy or tunnel)")
    parser.add_argument("--job-retention", type=parse_duration, default=3600.0,
                        metavar="DURATION",
                        help="how long ended jobs (and prepared jobs that never ran) are kept: "
                        "state, messages, metrics, staged artifacts (e.g. 3600, 90s, 30m, 1h; "
                        "default 1h)")
    parser.add_argument("--job-retention-count", type=int, default=100, metavar="N",
                        help="how many ended jobs are kept at most (default 100)")
    parser.add_argument("--max-staged-bytes", type=int, default=DEFAULT_MAX_STAGED_BYTES,
                        help="the artifact bytes one job may stage "
                        f"(default {DEFAULT_MAX_STAGED_BYTES})")
    parser.add_argument("--max-request-bytes", type=int, default=DEFAULT_MAX_REQUEST_BYTES,
                        help="the largest request (e.g. a pipeline proto) the server reads "
                        f"(default {DEFAULT_MAX_REQUEST_BYTES})")
    return parser


def parse_duration(text: str) -> float:
    """Seconds from '3600', '90s', '30m' or '1h'."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|m|min|h)?\s*", text)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"expected a duration such as 3600, 90s, 30m or 1h, got {text!r}")
    scale = {"s": 1, "m": 60, "min": 60, "h": 3600}[match.group(2) or "s"]
    return float(match.group(1)) * scale


def is_loopback(host: str) -> bool:
    """Whether `host` names this machine's loopback interface only (no wildcard, no LAN)."""
    name = host.strip("[]")
    if name in _WILDCARD_HOSTS:
        return False
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(name, None)
    except OSError:
        return False
    return bool(infos) and all(
        ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback for info in infos
    )


def main(
    argv: Sequence[str] | None,
    executor_factory: Callable[[argparse.Namespace], JobExecutor],
    *,
    parser: argparse.ArgumentParser | None = None,
    stop: threading.Event | None = None,
) -> int:
    """Runs a job server until SIGINT/SIGTERM (or `stop` is set); returns the exit status.

    `executor_factory` gets the parsed arguments (so a caller's `parser` may carry executor
    options) and returns the executor the jobs run on.
    """
    args = (parser or build_parser()).parse_args(argv)
    # force: importing Beam may already have configured the root logger at WARNING (it warns
    # when optional GCP libraries are missing), which would hide the "listening" milestone.
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True
    )
    stop = stop or threading.Event()
    previous: list[tuple[int, Any]] = []
    if threading.current_thread() is threading.main_thread():
        def on_signal(signum: int, frame: FrameType | None) -> None:
            _LOGGER.info("received signal %d, stopping", signum)
            stop.set()

        for ours in (signal.SIGINT, signal.SIGTERM):
            previous.append((ours, signal.signal(ours, on_signal)))
    try:
        return _serve(args, executor_factory, stop)
    finally:
        # A program (or a test) that runs the server in its own process gets its own handlers
        # back: after `main` returns, its SIGTERM and Ctrl-C would otherwise only set an Event
        # nobody waits on. None: a handler not installed from Python, which cannot be restored.
        for signum, handler in previous:
            if handler is not None:
                signal.signal(signum, handler)


def _serve(args: argparse.Namespace,
           executor_factory: Callable[[argparse.Namespace], JobExecutor],
           stop: threading.Event) -> int:
    try:
        server = JobServer(
            executor_factory(args), host=args.host, port=args.port,
            artifacts_dir=args.artifacts_dir, allow_remote=args.allow_remote,
            retention=Retention(args.job_retention, args.job_retention_count),
            max_staged_bytes=args.max_staged_bytes, max_request_bytes=args.max_request_bytes,
        )
        server.start()
    except (SparkBeamError, ValueError) as exc:
        _LOGGER.error("%s", exc)
        return 1
    try:
        while not stop.wait(1.0):
            pass
    finally:
        server.stop()
    return 0


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _advertised(host: str) -> str:
    """The host name clients should use: the bound address unless it is a wildcard."""
    return socket.gethostname() if host in _WILDCARD_HOSTS else _bracketed(host)
