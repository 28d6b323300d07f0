"""The local stack as real processes: Kafka-compatible broker, controller nodes, ingest workers, Spark job.

`electra up`, the end-to-end tests and `electra bench failover` all start the same
thing through this class, so what the tests prove is what operators run. Every
process listens on loopback; logs go to `<data_dir>/logs/<name>.log`. The stack is
secure by default: a local CA, node certificates and one token per role live in
`<data_dir>/certs` (kept across restarts, so the cluster id stays), the nodes talk
mutual TLS, every HTTP listener serves HTTPS, and each process gets the credential
of its role (the job `pipeline`, the simulated brokers `broker`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from electra.interrupts import die_with_parent
from electra.security.local import LocalCredentials, ensure_local_credentials
from electra.streaming.embedded_kafka import EmbeddedKafka
from electra.streaming.kafka_io import ensure_topics
from electra.streaming.records import Topics


@dataclass
class StackConfig:
    data_dir: Path
    nodes: int = 3
    raft_port: int = 7101
    http_port: int = 7301
    ingest_port: int = 7401
    ingest_workers: int = 1
    kafka_bootstrap: str | None = None  # None: start the embedded broker
    kafka_port: int = 0  # 0: any free port
    topic_prefix: str = ""
    spark_master: str = "local[2]"
    tier_uri: str | None = "default"  # "default": <data_dir>/tier; None: no Delta tiering
    trigger_ms: int = 1000
    tick_ms: int = 100
    log_level: str = "INFO"
    job_args: list[str] = field(default_factory=list)
    secure: bool = True  # False: every process runs --insecure (plaintext, no credentials)
    architecture: str = "new"  # "legacy": RocketMQ 5's design for comparisons (no Kafka, ingest or Spark job)
    accept_new_peers: bool = False  # nodes take a member list other than their data dirs recorded (a resize)

    @property
    def legacy(self) -> bool:
        return self.architecture == "legacy"


class LocalStack:
    def __init__(self, cfg: StackConfig) -> None:
        self.cfg = cfg
        self.logs = Path(cfg.data_dir) / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.topics = Topics.prefixed(cfg.topic_prefix)
        n = cfg.nodes
        self.raft_peers = ",".join(f"{i}=127.0.0.1:{cfg.raft_port + i - 1}" for i in range(1, n + 1))
        self.endpoints = {i: f"127.0.0.1:{cfg.http_port + i - 1}" for i in range(1, n + 1)}
        self.ingest_endpoints = {i: f"127.0.0.1:{cfg.ingest_port + i - 1}" for i in range(1, n + 1)}
        self.kafka: EmbeddedKafka | None = None
        self.bootstrap = cfg.kafka_bootstrap or ""
        self.procs: dict[str, subprocess.Popen] = {}
        self._order: list[str] = []
        self.creds: LocalCredentials | None = (
            ensure_local_credentials(Path(cfg.data_dir) / "certs", range(1, n + 1)) if cfg.secure else None)

    def role_env(self, role: str) -> dict[str, str]:
        """Environment of a process acting as `role` (empty when the stack is insecure)."""
        return self.creds.env(role) if self.creds else {}

    def _security_args(self, i: int | None = None) -> list[str]:
        if self.creds is None:
            return ["--insecure"]
        return ["--certs-dir", str(self.creds.certs_dir), *([] if i is None else ["--node-id", str(i)])]

    # ------------------------------------------------------------------ processes
    def _py(self) -> list[str]:
        return [sys.executable, "-m", "electra.cli", "--log-level", self.cfg.log_level]

    def spawn(self, name: str, cmd: list[str], *, log_to_file: bool = True, stdin=None,
              role: str | None = None, env_extra: dict[str, str] | None = None) -> subprocess.Popen:
        """Start a process; with `role`, it gets that role's credential in its environment."""
        out = open(self.logs / f"{name}.log", "ab") if log_to_file else None  # noqa: SIM115 - owned by the child
        # Each child leads its own process group: a Ctrl-C reaches only `electra up`, which stops the
        # children in order, and `stop()` can also end what a child started (Spark's JVM).
        env = {**stack_env(), **(self.role_env(role) if role else {}), **(env_extra or {})}
        # `die_with_parent`: a SIGKILLed `electra up` (or benchmark) leaves no process behind either.
        proc = subprocess.Popen(die_with_parent(cmd), stdout=out, stderr=subprocess.STDOUT if out else None,
                                stdin=stdin if stdin is not None else subprocess.DEVNULL, env=env,
                                start_new_session=True)
        self.procs[name] = proc
        if name not in self._order:
            self._order.append(name)
        return proc

    def start_kafka(self) -> str:
        if not self.cfg.kafka_bootstrap:
            self.kafka = EmbeddedKafka(port=self.cfg.kafka_port, log_file=self.logs / "kafka.log").start()
            self.bootstrap = self.kafka.bootstrap
        ensure_topics(self.bootstrap, self.topics.partitions())
        return self.bootstrap

    def restart_kafka(self) -> None:
        """Stop and start the embedded broker on the same port (it comes back empty)."""
        assert self.kafka is not None, "only the embedded broker can be restarted"
        self.kafka.restart()
        ensure_topics(self.bootstrap, self.topics.partitions())

    # Hooks for `electra chaos` (electra/chaos/cluster.py): per-node peer addresses (its fault proxies),
    # extra arguments and environment (libfaketime). The plain stack gives every node the same view.
    def node_peers(self, i: int) -> str:
        return self.raft_peers

    def node_args(self, i: int) -> list[str]:
        return []

    def node_env(self, i: int) -> dict[str, str]:
        return {}

    def start_node(self, i: int) -> subprocess.Popen:
        http_peers = ",".join(f"{k}={ep}" for k, ep in self.endpoints.items())
        return self.spawn(f"node{i}", [*self._py(), "node", "--id", str(i), "--peers", self.node_peers(i),
                                       "--http-addr", self.endpoints[i], "--http-peers", http_peers,
                                       "--data-dir", str(Path(self.cfg.data_dir) / f"node{i}"),
                                       "--tick-ms", str(self.cfg.tick_ms), "--state-machine", "controller",
                                       *self._liveness_args(),
                                       *(["--tier-uri", self.tier_uri] if self.tier_uri else []),
                                       *self._security_args(), *self.node_args(i),
                                       *(["--accept-new-peers"] if self.cfg.accept_new_peers else [])],
                          role="observer",  # the dashboard reads its peers' metadata as an observer
                          env_extra=self.node_env(i))

    def _liveness_args(self) -> list[str]:
        """Where a node's liveness comes from: Kafka (the pipeline), or its own heartbeats (legacy)."""
        if self.cfg.legacy:
            return ["--architecture", "legacy"]
        # Given even when empty (no Kafka started: electra chaos without --pipeline): an empty value means none,
        # and it overrides an ELECTRA_KAFKA_BOOTSTRAP the caller's environment may hold.
        return ["--kafka-bootstrap", self.bootstrap, "--topic-prefix", self.cfg.topic_prefix]

    def start_ingest(self, i: int) -> subprocess.Popen:
        return self.spawn(f"ingest{i}", [*self._py(), "ingest", "--listen", self.ingest_endpoints[i],
                                         "--kafka-bootstrap", self.bootstrap, "--workers",
                                         str(self.cfg.ingest_workers), "--topic-prefix", self.cfg.topic_prefix,
                                         *self._security_args(i)])

    def start_job(self) -> subprocess.Popen:
        return self.spawn("streaming", [sys.executable, "-m", "electra.streaming.job", "--bootstrap", self.bootstrap,
                                        "--controllers", ",".join(self.endpoints.values()), "--checkpoint",
                                        str(self.checkpoint), "--spark-master", self.cfg.spark_master,
                                        "--trigger-ms", str(self.cfg.trigger_ms), "--topic-prefix",
                                        self.cfg.topic_prefix, "--log-level", self.cfg.log_level,
                                        *self.cfg.job_args], role="pipeline")

    @property
    def tier_uri(self) -> str | None:
        """Where the leader tiers snapshots and events (Delta tables); shared by every node."""
        if self.cfg.tier_uri == "default":
            return str(Path(self.cfg.data_dir) / "tier")
        return self.cfg.tier_uri

    @property
    def checkpoint(self) -> Path:
        return Path(self.cfg.data_dir) / "streaming-checkpoint"

    def start_controllers(self) -> None:
        for i in self.endpoints:
            self.start_node(i)
            if not self.cfg.legacy:  # the legacy architecture takes heartbeats on the controllers themselves
                self.start_ingest(i)

    def stop(self, name: str, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int | None:
        proc = self.procs.get(name)
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        _kill_group(proc.pid)
        return proc.returncode

    def restart(self, name: str) -> bool:
        """Start `name` again if it is one of the stack's restartable processes (a controller node, an ingest
        process, the streaming job: each recovers its state from its data dir, checkpoint or Kafka); False
        for the others (the demo's brokers, whose terminal input is gone)."""
        self._kill_leftovers(name)
        if name.startswith("node") and name[4:].isdigit():
            self.start_node(int(name[4:]))
        elif name.startswith("ingest") and name[6:].isdigit():
            self.start_ingest(int(name[6:]))
        elif name == "streaming":
            self.start_job()
        else:
            return False
        return True

    def _kill_leftovers(self, name: str) -> None:
        """What an ended process started in its group (Spark's JVM, a node's front-ends) ends with it."""
        proc = self.procs.get(name)
        if proc is not None:
            _kill_group(proc.pid)

    def exited(self) -> list[str]:
        """The stack's processes that ended, the embedded Kafka broker included (its death stopped every
        failover without a word: nothing reached the streaming job any more)."""
        gone = [f"{name} (exit {p.returncode}{self.why_exited(name)})" for name, p in self.procs.items()
                if p.poll() is not None]
        kafka = self.kafka.proc if self.kafka is not None else None
        if kafka is not None and kafka.poll() is not None:
            gone.append(f"the embedded Kafka broker, tansu (exit {kafka.returncode})")
        return gone

    def why_exited(self, name: str) -> str:
        """The last `error:` or `FATAL:` line of a process's log (a node refusing its data dir says why there)."""
        try:
            with open(self.logs / f"{name}.log", "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 8192))
                tail = f.read().decode(errors="replace").splitlines()
        except OSError:
            return ""
        said = [ln for ln in tail if ln.startswith(("error:", "FATAL:"))]
        return f": {said[-1]}" if said else ""

    def stop_all(self) -> None:
        try:
            for name in reversed(self._order):
                p = self.procs.get(name)
                if p is not None and p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            for name in reversed(self._order):
                self.stop(name, timeout=20)
        finally:  # the embedded broker is stopped whatever happened above
            if self.kafka is not None:
                self.kafka.stop()

    # ------------------------------------------------------------------ waiting
    def log_tail(self, name: str, lines: int = 30) -> str:
        try:
            return "\n".join((self.logs / f"{name}.log").read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def wait_log(self, name: str, text: str, timeout: float) -> None:
        """Wait until `text` appears in a process's log (bounded)."""
        deadline = time.monotonic() + timeout
        path = self.logs / f"{name}.log"
        while time.monotonic() < deadline:
            try:
                if text in path.read_text(errors="replace"):
                    return
            except OSError:
                pass
            proc = self.procs.get(name)
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"{name} exited ({proc.returncode}):\n{self.log_tail(name)}")
            time.sleep(0.2)
        raise TimeoutError(f"{name} did not log {text!r} within {timeout}s:\n{self.log_tail(name)}")


def stack_env() -> dict[str, str]:
    """This process's environment without the variables that set `electra node` options (electra.cli.NODE_ENV:
    ELECTRA_CERTS_DIR, ELECTRA_TOKENS_FILE, ELECTRA_CLUSTER_ID, ELECTRA_UNSAFE_NO_FSYNC, ...). The stack configures
    its processes on their command lines; an operator's shell exporting these for a node of a real cluster silently
    overrode or contradicted that (ELECTRA_CERTS_DIR with `up --insecure`: every node refused to start), and
    `electra ingest` reads some of them too. The rest stays: ELECTRA_LOG_LEVEL, the Kafka client settings
    (ELECTRA_KAFKA_SECURITY_PROTOCOL, ...), ELECTRA_TANSU_BIN, test hooks (ELECTRA_TEST_*)."""
    from electra.cli import NODE_ENV

    return {k: v for k, v in os.environ.items() if k not in NODE_ENV}


def _kill_group(pgid: int) -> None:
    """SIGKILL whatever is left in a stopped child's process group (processes it started)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
