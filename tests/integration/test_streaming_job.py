"""The real streaming job (Spark local[2] in a subprocess) on real tansu, with a recording controller.

Events make broker 1 master at epoch 1 in three broker sets; brokers 1-3 heartbeat every
0.3 s (timeout 2 s). Broker 1 of one set stops: exactly one ElectMaster proposal with
expectedMasterEpoch=1 and a snapshot in which brokers 2 and 3 are alive. The recording
controller answers 200 and publishes the resulting ElectMaster event (broker 2, epoch 2),
as the real controller's events publisher would. Bad records land in the DLQ, liveness
records appear, and a restart from the checkpoint does not propose again.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from stream_helpers import FakeController, HeartbeatWorld, TopicReader, now_ms, wait_for

from electra.streaming import kafka_io, records
from electra.streaming.embedded_kafka import EmbeddedKafka

pytestmark = pytest.mark.integration

SETS = ["bs-0", "bs-1", "bs-2"]
VICTIM = "bs-0"
TIMEOUT_MS = 2000
STARTUP_S = 180  # Spark start + first batch: ~30 s on an idle 2-core box, far more when it is shared


def start_job(bootstrap: str, controller: str, checkpoint: str, log_path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "electra.streaming.job", "--bootstrap", bootstrap, "--controllers", controller,
           "--checkpoint", checkpoint, "--trigger-ms", "500", "--shuffle-partitions", "2", "--source", "auto"]
    log = open(log_path, "ab")  # noqa: SIM115 - owned by the process
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            start_new_session=True)


def stop_job(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
        raise


def test_streaming_job_end_to_end(tmp_path):
    t_start = time.monotonic()
    kafka = EmbeddedKafka(log_file=tmp_path / "tansu.log").start()
    world = None
    controller = None
    job = None
    readers = contextlib.ExitStack()
    try:
        kafka_io.ensure_topics(kafka.bootstrap, records.Topics().partitions())
        world = HeartbeatWorld(kafka.bootstrap, SETS, TIMEOUT_MS)

        def on_proposal(name: str, body: dict) -> None:  # the controller elects broker 2 and publishes it
            world.event(name, 2, body["expectedMasterEpoch"] + 1)

        controller = FakeController(on_proposal=on_proposal).start()
        for name in SETS:
            world.event(name, 1, 1)
        bad = [b"{not json", b'{"clusterName":"c1","brokerName":"bs-1","brokerAddr":"a","brokerId":0}']
        for raw in bad:
            world.producer.send(records.HEARTBEATS, key=b"bs-1", value=raw)
        world.thread.start()

        checkpoint = str(tmp_path / "checkpoint")
        log_path = tmp_path / "job.log"
        job = start_job(kafka.bootstrap, controller.address, checkpoint, log_path)
        liveness = readers.enter_context(TopicReader(kafka.bootstrap, records.LIVENESS, split=records.liveness_sets))
        ready = wait_for(lambda: {v["brokerName"] for v in liveness.poll()} >= set(SETS) or job.poll() is not None,
                         STARTUP_S)
        assert ready and job.poll() is None, log_path.read_text()[-3000:]
        t_ready = time.monotonic()
        rec = next(v for v in reversed(liveness.values) if v["brokerName"] == "bs-1")
        assert rec["clusterName"] == "c1" and [b["broker_id"] for b in rec["brokers"]] == [1, 2, 3]
        assert all(b["timeout_ms"] == TIMEOUT_MS and b["max_offset"] == 1000 for b in rec["brokers"])
        assert not controller.posts

        # The master of one set stops heartbeating.
        world.stopped.add((VICTIM, 1))
        time.sleep(0.35)
        last_master_hb = world.last_hb[(VICTIM, 1)]
        assert wait_for(lambda: controller.posts, 40), log_path.read_text()[-3000:]
        detect_s = controller.posts[0][0] - last_master_hb / 1000
        time.sleep(2.5 * TIMEOUT_MS / 1000)  # longer than the retry interval (2 x timeout)
        assert len(controller.posts) == 1, controller.posts
        _, name, body = controller.posts[0]
        assert name == VICTIM and body["brokerName"] == VICTIM and body["clusterName"] == "c1"
        assert body["expectedMasterEpoch"] == 1
        at = body["proposedAtMs"]
        alive = {b["broker_id"] for b in body["live"] if b["last_update_ms"] + b["timeout_ms"] >= at}
        assert alive == {2, 3}
        assert {b["broker_id"] for b in body["live"]} == {1, 2, 3}

        # Dead letters.
        dlq = readers.enter_context(TopicReader(kafka.bootstrap, records.DEAD_LETTERS))
        assert wait_for(lambda: len(dlq.poll()) >= 2, 10)
        assert len(dlq.values) == 2
        assert {d["raw"] for d in dlq.values} == {b.decode() for b in bad}
        assert all(d["topic"] == records.HEARTBEATS and d["error"] for d in dlq.values)

        # One report per batch on the job-stats topic (the controllers' dashboards read it).
        stats = readers.enter_context(TopicReader(kafka.bootstrap, records.JOB_STATS))
        # A batch's report follows the batch: wait for the one that has counted both (batches are slow when shared).
        assert wait_for(lambda: any(s["deadLettersTotal"] >= 2 and s["proposalsTotal"] >= 1 for s in stats.poll()),
                        30), stats.values[-3:]
        last = stats.values[-1]
        assert last["batchId"] >= 1 and last["batchMs"] > 0 and last["rows"] >= 0 and last["proposalsTotal"] == 1
        assert any(k.startswith(records.HEARTBEATS + ":") for k in last["consumed"]), last

        # Stop cleanly and restart from the checkpoint: no second proposal.
        assert stop_job(job) == 0
        t_restart = time.monotonic()
        restarted_ms = now_ms()
        job = start_job(kafka.bootstrap, controller.address, checkpoint, log_path)
        assert wait_for(lambda: any(v["ts"] > restarted_ms for v in liveness.poll()) or job.poll() is not None,
                        STARTUP_S) and job.poll() is None, log_path.read_text()[-3000:]
        t_back = time.monotonic()
        time.sleep(2.5 * TIMEOUT_MS / 1000)
        assert len(controller.posts) == 1, controller.posts
        assert stop_job(job) == 0
        job = None

        text = log_path.read_text()
        assert "using the Python data source" in text  # source=auto fell back cleanly
        batch_ms = [int(m) for m in re.findall(r"batch=\d+ rows=\d+ .*?batch_ms=(\d+)", text)]
        print(f"\nready after {t_ready - t_start:.1f}s, detection {detect_s:.2f}s after the master's last heartbeat, "
              f"restart to first batch {t_back - t_restart:.1f}s, batches={len(batch_ms)} "
              f"batch_ms median={sorted(batch_ms)[len(batch_ms) // 2]} max={max(batch_ms)}")
        assert detect_s < 20  # timeout 2 s + one or two micro-batches (seconds each under load)
    finally:
        if job is not None and job.poll() is None:
            job.kill()
            job.wait(timeout=10)
        readers.close()
        if world is not None:
            world.close()
        if controller is not None:
            controller.stop()
        kafka.stop()
