"""The wire between tasks and the driver's Rebalancer: one JSON request and answer per line.

Driver side `RebalanceServer` (a small threaded TCP server, 127.0.0.1 unless the driver is
reached from elsewhere); task side `RebalanceClient`, one connection per task attempt.
A task that loses the connection stops asking (and fails if it had split: its residual
might not run), so rebalancing never costs correctness.
"""
from __future__ import annotations

import contextlib
import json
import logging
import socket
import socketserver
import threading
import time
from typing import Any

from sparkbeam.control.rebalance import Rebalancer, WorkItem

_LOG = logging.getLogger(__name__)
_METHODS = frozenset(["hello", "busy", "split_result", "bundle_done", "want_work", "finished"])
_TIMED = frozenset(["busy", "want_work"])


class RebalanceServer:
    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.rebalancer = Rebalancer()
        self._lock = threading.Lock()
        owner = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                for line in self.rfile:
                    try:
                        request = json.loads(line)
                        answer = owner.answer(request)
                    except Exception as exc:  # noqa: BLE001 - a bad request ends the session
                        _LOG.warning("bad rebalance request: %s", exc)
                        return
                    self.wfile.write(json.dumps(answer).encode() + b"\n")

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = Server((host, port), Handler)
        self.address = f"{host}:{self._server.server_address[1]}"
        threading.Thread(
            target=self._server.serve_forever, name="sparkbeam-rebalance", daemon=True
        ).start()

    def answer(self, request: dict[str, Any]) -> dict[str, Any]:
        method = request.pop("method")
        if method not in _METHODS:
            raise ValueError(f"unknown method {method!r}")
        if method in _TIMED:
            request["now"] = time.monotonic()
        with self._lock:
            result: dict[str, Any] = getattr(self.rebalancer, method)(**request)
            return result

    def stats(self, job: str, stage: str) -> dict[str, int]:
        with self._lock:
            return self.rebalancer.stats(job, stage)

    def history(self, job: str, stage: str) -> list[str]:
        with self._lock:
            return self.rebalancer.history(job, stage)

    def forget(self, job: str) -> None:
        with self._lock:
            self.rebalancer.forget(job)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


_SHARED: list[RebalanceServer] = []
_SHARED_LOCK = threading.Lock()


def shared_rebalancer(host: str = "127.0.0.1") -> RebalanceServer:
    """The driver process's rebalancing server, started on first use."""
    with _SHARED_LOCK:
        if not _SHARED:
            _SHARED.append(RebalanceServer(host))
        return _SHARED[0]


class RebalanceClient:
    """A task attempt's end of the wire. Thread-safe (the task and its split monitor)."""

    def __init__(self, address: str, job: str, stage: str, partition: int) -> None:
        self._ident = {"job": job, "stage": stage, "partition": partition}
        host, port = address.rsplit(":", 1)
        self._sock = socket.create_connection((host, int(port)), timeout=30)
        self._file = self._sock.makefile("rwb")
        self._lock = threading.Lock()

    def _call(self, method: str, **args: Any) -> dict[str, Any]:
        line = json.dumps({"method": method, **self._ident, **args}).encode() + b"\n"
        with self._lock:
            self._file.write(line)
            self._file.flush()
            answer = self._file.readline()
        if not answer:
            raise ConnectionError("the driver's rebalancing server closed the connection")
        result: dict[str, Any] = json.loads(answer)
        return result

    def hello(self, partitions: int) -> dict[str, Any]:
        return self._call("hello", partitions=partitions)

    def busy(self, seq: int) -> dict[str, Any]:
        return self._call("busy", seq=seq)

    def split_result(
        self, seq: int, record: dict[str, Any] | None, items: list[WorkItem]
    ) -> None:
        self._call("split_result", seq=seq, record=record, items=items)

    def bundle_done(self, seq: int) -> None:
        self._call("bundle_done", seq=seq)

    def want_work(self) -> dict[str, Any]:
        return self._call("want_work")

    def finished(self) -> None:
        with contextlib.suppress(OSError, ConnectionError):
            self._call("finished")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._file.close()
            self._sock.close()
