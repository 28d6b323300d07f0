"""The streaming job on a real Spark cluster manager: a standalone master and one worker started with pyspark's
own `spark-class` on loopback, the job submitted with deploy/spark-submit.sh (`MASTER=spark://...`, client
deploy mode) so its tasks run in an executor the worker launches, on real tansu, with a recording controller.

Brokers 1-3 of three sets heartbeat; the master of one set stops: exactly one ElectMaster proposal (fenced
by epoch 1, brokers 2 and 3 alive). SIGTERM to spark-submit.sh stops the job cleanly (exit 0); submitted
again, it resumes from the checkpoint on the same cluster and does not propose again. CPU-heavy on a small
machine: one worker with 2 task slots, 512 MiB executor, every wait bounded.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from pyspark.find_spark_home import _find_spark_home
from stream_helpers import FakeController, HeartbeatWorld, TopicReader, now_ms, wait_for

from electra.local_ports import free_ports
from electra.streaming import kafka_io, records
from electra.streaming.embedded_kafka import EmbeddedKafka, wait_for_port

pytestmark = pytest.mark.integration

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
SETS = ["sa-0", "sa-1", "sa-2"]
VICTIM = "sa-0"
TIMEOUT_MS = 2000
STARTUP_S = 240  # driver + executor JVMs + Python workers + first batch, on a shared 2-core machine


class StandaloneCluster:
    """`spark-class ...Master` and `...Worker` from the pyspark package, loopback only."""

    def __init__(self, tmp: Path) -> None:
        self.home = _find_spark_home()
        self.port, self.ui, self.worker_ui = free_ports(3)
        self.tmp = tmp
        self.procs: list[subprocess.Popen] = []
        self.env = {**os.environ, "SPARK_HOME": self.home, "SPARK_LOCAL_IP": "127.0.0.1",
                    "SPARK_LOCAL_DIRS": str(tmp / "local"), "PYSPARK_PYTHON": sys.executable}

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _start(self, name: str, args: list[str]) -> None:
        log = open(self.tmp / f"{name}.log", "ab")  # noqa: SIM115 - owned by the process
        self.procs.append(subprocess.Popen([f"{self.home}/bin/spark-class", *args], env=self.env, stdout=log,
                                           stderr=subprocess.STDOUT, start_new_session=True))

    def start(self) -> StandaloneCluster:
        self._start("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                               "--port", str(self.port), "--webui-port", str(self.ui)])
        assert wait_for_port("127.0.0.1", self.port, 90), self.log("master")
        (self.tmp / "work").mkdir()
        self._start("worker", ["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", "2",
                               "--memory", "1g", "--webui-port", str(self.worker_ui),
                               "--work-dir", str(self.tmp / "work"), self.url])
        assert wait_for(lambda: [w for w in self.state().get("workers", []) if w["state"] == "ALIVE"], 90), \
            self.log("worker")
        return self

    def state(self) -> dict:
        """The master's JSON status page: workers, active and completed applications."""
        url = f"http://127.0.0.1:{self.ui}/json/"
        with contextlib.suppress(OSError, ValueError), urllib.request.urlopen(url, timeout=5) as r:
            return json.loads(r.read())
        return {}

    def executor_logs(self) -> list[Path]:
        return sorted((self.tmp / "work").glob("app-*/*/stderr"))

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text()[-3000:]

    def stop(self) -> None:
        for p in reversed(self.procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)


def submit(cluster: StandaloneCluster, bootstrap: str, controller: str, checkpoint: str, log_path: Path):
    """deploy/spark-submit.sh against the standalone master (its own process group, for cleanup)."""
    env = {**cluster.env, "MASTER": cluster.url, "BOOTSTRAP": bootstrap, "CONTROLLERS": controller,
           "CHECKPOINT": checkpoint, "TRIGGER_MS": "500", "SHUFFLE_PARTITIONS": "2", "HWM_FIX": "true",
           "SPARK_SUBMIT": f"{cluster.home}/bin/spark-submit", "PYTHONUNBUFFERED": "1",
           "EXTRA_ARGS": " ".join(f"--conf {kv}" for kv in (
               "spark.driver.host=127.0.0.1", "spark.driver.bindAddress=127.0.0.1", "spark.ui.enabled=false",
               "spark.executor.memory=512m", "spark.executor.cores=2", "spark.cores.max=2"))}
    log = open(log_path, "ab")  # noqa: SIM115 - owned by the process
    return subprocess.Popen(["bash", str(DEPLOY / "spark-submit.sh")], env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)


def stop_job(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)  # the script forwards it to the Python driver
    try:
        return proc.wait(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        raise


def test_streaming_job_on_a_standalone_cluster(tmp_path):
    kafka = EmbeddedKafka(log_file=tmp_path / "tansu.log").start()
    cluster = brokers = controller = job = None
    log_path = tmp_path / "job.log"
    readers = contextlib.ExitStack()
    try:
        kafka_io.ensure_topics(kafka.bootstrap, records.Topics().partitions())
        brokers = HeartbeatWorld(kafka.bootstrap, SETS, TIMEOUT_MS)

        def on_proposal(name: str, body: dict) -> None:  # the controller elects broker 2 and publishes it
            brokers.event(name, 2, body["expectedMasterEpoch"] + 1)

        controller = FakeController(on_proposal=on_proposal).start()
        for name in SETS:
            brokers.event(name, 1, 1)
        brokers.thread.start()
        cluster = StandaloneCluster(tmp_path).start()
        checkpoint = str(tmp_path / "checkpoint")

        def job_log() -> str:
            return log_path.read_text()[-3000:] + "\n--- executors:\n" + "\n".join(
                p.read_text()[-1500:] for p in cluster.executor_logs())

        job = submit(cluster, kafka.bootstrap, controller.address, checkpoint, log_path)
        liveness = readers.enter_context(TopicReader(kafka.bootstrap, records.LIVENESS, split=records.liveness_sets))
        ready = wait_for(lambda: {v["brokerName"] for v in liveness.poll()} >= set(SETS) or job.poll() is not None,
                         STARTUP_S)
        assert ready and job.poll() is None, job_log()
        # The job runs on the cluster: one application on the master, its executor on the worker.
        apps = cluster.state()["activeapps"]
        assert [a["name"] for a in apps] == ["electra-streaming"], apps
        assert len(cluster.executor_logs()) == 1, job_log()
        assert "local[" not in log_path.read_text() and f"master {cluster.url}" in log_path.read_text()

        brokers.stopped.add((VICTIM, 1))
        assert wait_for(lambda: controller.posts, 60), job_log()
        time.sleep(2.5 * TIMEOUT_MS / 1000)  # longer than the retry interval (2 x timeout)
        assert len(controller.posts) == 1, controller.posts
        _, name, body = controller.posts[0]
        assert name == VICTIM and body["expectedMasterEpoch"] == 1
        at = body["proposedAtMs"]
        assert {b["broker_id"] for b in body["live"] if b["last_update_ms"] + b["timeout_ms"] >= at} == {2, 3}

        assert stop_job(job) == 0, job_log()
        job = None
        assert wait_for(lambda: not cluster.state().get("activeapps") and cluster.state().get("completedapps"), 60)

        # Submitted again: resumes from the checkpoint on the cluster, no second proposal for the same epoch.
        restarted_ms = now_ms()
        job = submit(cluster, kafka.bootstrap, controller.address, checkpoint, log_path)
        assert wait_for(lambda: any(v["ts"] > restarted_ms for v in liveness.poll()) or job.poll() is not None,
                        STARTUP_S) and job.poll() is None, job_log()
        assert len(cluster.state()["activeapps"]) == 1 and len(cluster.executor_logs()) == 2
        time.sleep(2.5 * TIMEOUT_MS / 1000)
        assert len(controller.posts) == 1, controller.posts
        assert stop_job(job) == 0, job_log()
        job = None
    finally:
        if job is not None and job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(timeout=10)
        readers.close()
        if brokers is not None:
            brokers.close()
        if controller is not None:
            controller.stop()
        if cluster is not None:
            cluster.stop()
        kafka.stop()
