"""Live metrics from task attempts to the driver: the source of *attempted* metrics.

Committed metrics travel with a task's output rows, so Spark keeps only those of successful
attempts. Attempted metrics must also count attempts that failed or are still running, so each
task attempt sends its cumulative monitoring infos here (rate-limited, and once more when it
ends, successfully or not). The latest report of each attempt counts once. The same reports
feed the job's progress lines (`sparkbeam.control.progress`).

Wire format (loopback/cluster TCP, no pickle): 4-byte big-endian length, then a JSON header
line (the attempt's key, plus `final`: the attempt's last report, and `ok`: whether the attempt
succeeded, meaningful when final), then length-prefixed serialized MonitoringInfo messages.
"""
from __future__ import annotations

import contextlib
import json
import logging
import socket
import socketserver
import struct
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

from apache_beam.metrics import monitoring_infos
from apache_beam.portability.api import metrics_pb2

_LOG = logging.getLogger(__name__)
_LEN = struct.Struct(">I")
_MAX_MESSAGE = 64 << 20


@dataclass(frozen=True)
class AttemptKey:
    """One attempt of one task of one stage of one job."""

    job: str
    stage: str
    spark_stage: int
    partition: int
    attempt: int


def decode_attempt_key(encoded: bytes) -> AttemptKey:
    """An AttemptKey from its JSON form (the key metric rows of committed attempts carry)."""
    return AttemptKey(**json.loads(encoded))


@dataclass(frozen=True)
class AttemptReport:
    """The latest report of one attempt: its cumulative infos and whether it has ended."""

    key: AttemptKey
    infos: list[metrics_pb2.MonitoringInfo]
    final: bool = False  # the attempt's last report: it has ended
    ok: bool = True  # with final: the attempt succeeded (False: it failed)

    @property
    def failed(self) -> bool:
        return self.final and not self.ok

    @property
    def succeeded(self) -> bool:
        return self.final and self.ok


def encode_report(
    key: AttemptKey,
    infos: Iterable[metrics_pb2.MonitoringInfo],
    *,
    final: bool = False,
    ok: bool = True,
) -> bytes:
    """One framed report: length, JSON header line, length-prefixed MonitoringInfos."""
    header = json.dumps({**key.__dict__, "final": final, "ok": ok}).encode() + b"\n"
    body = b"".join(_LEN.pack(len(b)) + b for b in (i.SerializeToString() for i in infos))
    payload = header + body
    return _LEN.pack(len(payload)) + payload


def decode_report(payload: bytes) -> AttemptReport:
    """The report in `payload` (a frame without its length prefix)."""
    header_line, _, body = payload.partition(b"\n")
    header = json.loads(header_line)
    final = bool(header.pop("final", False))
    ok = bool(header.pop("ok", True))
    key = AttemptKey(**header)
    infos, pos = [], 0
    while pos < len(body):
        (n,) = _LEN.unpack_from(body, pos)
        pos += _LEN.size
        infos.append(metrics_pb2.MonitoringInfo.FromString(body[pos:pos + n]))
        pos += n
    return AttemptReport(key, infos, final=final, ok=ok)


class MetricsCollector:
    """Driver side: a small TCP server keeping the latest report of every attempt."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._latest: dict[AttemptKey, AttemptReport] = {}
        self._lock = threading.Lock()
        collector = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                while True:
                    head = self.rfile.read(_LEN.size)
                    if len(head) < _LEN.size:
                        return
                    (n,) = _LEN.unpack(head)
                    if n > _MAX_MESSAGE:
                        _LOG.warning("dropping a metrics report of %d bytes", n)
                        return
                    data = self.rfile.read(n)
                    if len(data) < n:
                        return
                    try:
                        report = decode_report(data)
                    except (ValueError, TypeError, KeyError) as exc:
                        _LOG.warning("malformed metrics report: %s", exc)
                        return
                    collector._store(report)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = Server((host, port), Handler)
        self.address = f"{host}:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="sparkbeam-metrics", daemon=True
        )
        self._thread.start()

    def _store(self, report: AttemptReport) -> None:
        with self._lock:
            self._latest[report.key] = report

    def reports(self, job: str) -> dict[AttemptKey, list[metrics_pb2.MonitoringInfo]]:
        """The latest infos of every attempt of `job` reported so far."""
        with self._lock:
            return {key: r.infos for key, r in self._latest.items() if key.job == job}

    def attempt_reports(self, job: str) -> dict[AttemptKey, AttemptReport]:
        """The latest report of every attempt of `job`, with whether the attempt has ended."""
        with self._lock:
            return {key: r for key, r in self._latest.items() if key.job == job}

    def forget(self, job: str) -> None:
        with self._lock:
            for key in [k for k in self._latest if k.job == job]:
                del self._latest[key]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


_SHARED: list[MetricsCollector] = []
_SHARED_LOCK = threading.Lock()


def shared_collector(host: str = "127.0.0.1") -> MetricsCollector:
    """The driver process's collector, started on first use."""
    with _SHARED_LOCK:
        if not _SHARED:
            _SHARED.append(MetricsCollector(host))
        return _SHARED[0]


class MetricsReporter:
    """Task side: sends this attempt's cumulative infos, at most every `interval` seconds."""

    def __init__(self, address: str, key: AttemptKey, interval: float = 1.0) -> None:
        self._address = address
        self._key = key
        self._interval = interval
        self._last = 0.0
        self._sock: socket.socket | None = None
        self._broken = False

    def report(
        self, infos: list[metrics_pb2.MonitoringInfo], *, final: bool = False, ok: bool = True
    ) -> None:
        """Sends `infos` (cumulative) unless the last report was under `interval` ago; a
        `final` report (the attempt has ended; `ok`: it succeeded) is always sent."""
        now = time.monotonic()
        if self._broken or (not final and now - self._last < self._interval):
            return
        self._last = now
        try:
            if self._sock is None:
                host, port = self._address.rsplit(":", 1)
                self._sock = socket.create_connection((host, int(port)), timeout=5)
            merged = list(monitoring_infos.consolidate(infos))
            self._sock.sendall(encode_report(self._key, merged, final=final, ok=ok))
        except OSError as exc:
            # Live metrics are best effort: committed metrics still travel with the rows.
            _LOG.warning("cannot report metrics to %s: %s", self._address, exc)
            self._broken = True
        if final:
            self.close()

    def close(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None
