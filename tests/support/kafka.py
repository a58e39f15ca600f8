"""A real one-node Kafka broker (KRaft: broker and controller in one JVM) on 127.0.0.1.

Started from Apache Kafka's own jars, which `make kafka` fetches once with Maven into
`build/kafka/jars` (or `$SPARKBEAM_KAFKA_JARS`). Tests use it through the `kafka` fixture;
by hand, `python -m tests.support.kafka` starts one and prints its bootstrap address until
interrupted. The broker's directory is a fresh temporary one; stopping kills the JVM.
"""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field

from tests.support.jvm import TEST_JIT

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JARS = os.environ.get("SPARKBEAM_KAFKA_JARS", os.path.join(ROOT, "build", "kafka", "jars"))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _classpath() -> str:
    if not glob.glob(os.path.join(JARS, "kafka_2.13-*.jar")):
        raise RuntimeError(f"no Kafka jars in {JARS}: run `make kafka` (Maven fetches them)")
    return os.path.join(JARS, "*")


@dataclass
class KafkaBroker:
    """One broker; `bootstrap` is its client address."""

    port: int = field(default_factory=_free_port)
    controller_port: int = field(default_factory=_free_port)
    directory: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="sparkbeam-kafka-"))
    process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _properties(self) -> str:
        path = os.path.join(self.directory, "server.properties")
        with open(path, "w") as f:
            f.write("\n".join([
                "process.roles=broker,controller",
                "node.id=1",
                f"controller.quorum.voters=1@127.0.0.1:{self.controller_port}",
                f"listeners=PLAINTEXT://127.0.0.1:{self.port},"
                f"CONTROLLER://127.0.0.1:{self.controller_port}",
                f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
                "controller.listener.names=CONTROLLER",
                "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
                f"log.dirs={os.path.join(self.directory, 'data')}",
                "offsets.topic.replication.factor=1",
                "transaction.state.log.replication.factor=1",
                "transaction.state.log.min.isr=1",
                "group.initial.rebalance.delay.ms=0",
                "num.partitions=1",
                # Tests write records with old event times: keep them whatever their age.
                "log.retention.ms=-1",
                "",
            ]))
        return path

    def start(self, timeout_s: float = 60.0) -> KafkaBroker:
        properties = self._properties()
        subprocess.run(["java", "-Xmx512m", TEST_JIT, "-cp", _classpath(),
                        "kafka.tools.StorageTool",
                        "format", "-t", uuid.uuid4().hex[:22], "-c", properties],
                       check=True, capture_output=True, timeout=timeout_s)
        return self._launch(timeout_s)

    def _launch(self, timeout_s: float) -> KafkaBroker:
        properties = os.path.join(self.directory, "server.properties")
        log = open(os.path.join(self.directory, "broker.log"), "ab")  # noqa: SIM115 - kept
        self.process = subprocess.Popen(
            ["java", "-Xmx512m", TEST_JIT, "-cp", _classpath(), "kafka.Kafka", properties],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the Kafka broker exited: {self.log_tail()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return self
            except OSError:
                time.sleep(0.2)
        self.kill()
        raise RuntimeError(f"the Kafka broker did not listen within {timeout_s} s")

    def log_tail(self, lines: int = 20) -> str:
        try:
            with open(os.path.join(self.directory, "broker.log"), errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def kill(self) -> None:
        """Kills the JVM at once (the data stays: `start_again` resumes it)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)

    def start_again(self, timeout_s: float = 60.0) -> KafkaBroker:
        """Starts a killed broker again on its data and ports."""
        return self._launch(timeout_s)

    def stop(self) -> None:
        self.kill()
        shutil.rmtree(self.directory, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.parse_args()
    broker = KafkaBroker().start()
    print(f"Kafka broker on {broker.bootstrap} (Ctrl-C stops it)", flush=True)
    try:
        while broker.process is not None and broker.process.poll() is None:
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        broker.stop()


if __name__ == "__main__":
    main()
