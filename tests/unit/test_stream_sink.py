"""The job's sink against real HTTP servers on 127.0.0.1: leader discovery, 307, 503 retry, final answers."""

from __future__ import annotations

import json
import time

import pytest
from stream_helpers import FakeController

from electra.local_ports import free_port
from electra.streaming.job import BatchSink, JobConfig
from electra.streaming.sink import ControllerClient


def proposal(name: str = "bs", epoch: int = 1) -> dict:
    return {"brokerName": name, "clusterName": "c1", "expectedMasterEpoch": epoch, "proposedAtMs": 1,
            "live": [{"broker_id": 2, "broker_addr": "a2", "last_update_ms": 1, "timeout_ms": 2000, "epoch": 1,
                      "max_offset": 1, "confirm_offset": 1, "priority": 1}]}


@pytest.fixture
def cluster():
    leader = FakeController().start()
    follower = FakeController(leader_address=leader.address).start()
    yield follower, leader
    follower.stop()
    leader.stop()


def test_discovers_leader_from_follower_metadata(cluster):
    follower, leader = cluster
    c = ControllerClient([follower.address, leader.address], deadline_s=5)
    assert c.discover_leader() == leader.address
    out = c.propose(proposal())
    assert (out.result, out.status, out.code, out.endpoint) == ("ok", 200, 0, leader.address)
    assert [p[1] for p in leader.posts] == ["bs"] and not follower.posts
    assert leader.posts[0][2]["expectedMasterEpoch"] == 1


def test_follows_307_from_a_stale_leader(cluster):
    follower, leader = cluster
    c = ControllerClient([follower.address, leader.address], deadline_s=5)
    c.leader = follower.address  # stale cache: the follower redirects
    out = c.propose(proposal())
    assert out.result == "ok" and out.attempts == 2 and out.endpoint == leader.address
    assert len(follower.posts) == 1 and len(leader.posts) == 1
    assert c.leader == leader.address


def test_retries_503_then_succeeds(cluster):
    _, leader = cluster
    leader.script["bs"] = [(503, {"code": 2007, "remark": "no leader"})] * 2
    c = ControllerClient([leader.address], deadline_s=5, backoff_s=0.05)
    t0 = time.monotonic()
    out = c.propose(proposal())
    assert out.result == "ok" and out.attempts == 3 and len(leader.posts) == 3
    assert time.monotonic() - t0 < 3


@pytest.mark.parametrize(("status", "code", "result"), [
    (409, 2000, "fenced"), (409, 2011, "master_still_alive"), (409, 2004, "no_candidate"),
    (404, 2008, "not_found"), (409, 2002, "rejected"), (422, None, "rejected")])
def test_final_answers_are_not_retried(cluster, status, code, result):
    _, leader = cluster
    leader.script["bs"] = [(status, {"code": code, "remark": "x"})]
    out = ControllerClient([leader.address], deadline_s=5).propose(proposal())
    assert (out.result, out.status, out.code, out.final) == (result, status, code, True)
    assert len(leader.posts) == 1


def test_gives_up_at_the_deadline():
    dead = f"127.0.0.1:{free_port()}"
    c = ControllerClient([dead], deadline_s=1.0, backoff_s=0.05, max_backoff_s=0.2)
    t0 = time.monotonic()
    out = c.propose(proposal())
    took = time.monotonic() - t0
    assert out.result == "gave_up" and not out.final and out.attempts >= 3
    assert took < 2.5
    # A controller stuck at 503 is bounded the same way.
    busy = FakeController().start()
    try:
        busy.script["bs"] = [(503, {"code": 2007})] * 1000
        out = ControllerClient([busy.address], deadline_s=1.0, backoff_s=0.05, max_backoff_s=0.2).propose(proposal())
        assert out.result == "gave_up" and 3 <= len(busy.posts) <= 20
    finally:
        busy.stop()


class RecordingOutput:
    def __init__(self) -> None:
        self.liveness: list[tuple[str, str]] = []
        self.dead: list[str] = []

    def send(self, liveness, dead_letters, timeout_s: float = 10.0) -> int:
        self.liveness += liveness
        self.dead += dead_letters
        return 0

    def close(self) -> None:
        pass


def test_batch_sink_routes_rows(cluster):
    _, leader = cluster
    out = RecordingOutput()
    cfg = JobConfig(bootstrap="unused:1", controllers=[leader.address], checkpoint="unused")
    sink = BatchSink(cfg, client=ControllerClient([leader.address], deadline_s=5), output=out)
    rows = [("liveness", "bs", json.dumps({"brokerName": "bs", "brokers": []})),
            ("dlq", "", json.dumps({"error": "invalid JSON", "raw": "{"})),
            ("proposal", "bs", json.dumps(proposal())),
            ("proposal", "bs2", json.dumps(proposal("bs2", 4)))]
    st = sink.handle_rows(rows, batch_id=7)
    assert (st["proposals"], st["dead_letters"], st["liveness"]) == (2, 1, 1)
    assert st["outcomes"] == ["ok", "ok"]
    assert sorted(p[1] for p in leader.posts) == ["bs", "bs2"]
    assert out.liveness[0][0] == "bs" and json.loads(out.dead[0])["error"] == "invalid JSON"
    assert sink.dead_letters_total == 1 and sink.take(7) == st and sink.take(7) is None


def test_bucket_count_is_pinned_by_the_checkpoint(tmp_path):
    """Sets are hashed into buckets: a restart with another --buckets must keep the checkpoint's count."""
    from electra.streaming.job import BUCKETS_FILE, LEGACY_BUCKETS, pinned_buckets

    new = tmp_path / "new"
    assert pinned_buckets(str(new), 8) == 8 and (new / BUCKETS_FILE).read_text().strip() == "8"
    assert pinned_buckets(str(new), 64) == 8
    old = tmp_path / "old"  # made before the pin file existed
    (old / "offsets").mkdir(parents=True)
    assert pinned_buckets(str(old), 8) == LEGACY_BUCKETS and pinned_buckets(f"file://{old}", 8) == LEGACY_BUCKETS
    assert pinned_buckets("s3a://bucket/ckpt", 16) == 16


def _decide_a_proposal(proposer) -> list[tuple[str, str, str]]:
    """The operator (with `proposer`) in a batch where master 1 of "bs" is stale: its output rows."""
    import pandas as pd
    from test_stream_processor import BUCKET, TV, FakeHandle, ev, hb

    from electra.streaming.parsing import PARSED_COLUMNS
    from electra.streaming.processor import MasterWatchProcessor

    def batch(rows, now):
        frames = iter([pd.DataFrame(rows, columns=PARSED_COLUMNS)])
        return pd.concat(list(p.handleInputRows((BUCKET,), frames, TV(now))))

    p = MasterWatchProcessor(proposer=proposer)
    p.init(FakeHandle())
    batch([ev(1, 1, 1)] + [hb(b, 1_000, b) for b in (1, 2, 3)], 1_000)
    out = batch([hb(b, 1_000 + t, 10 + t // 100 + b) for t in range(500, 2501, 500) for b in (2, 3)], 3_600)
    return list(zip(out["kind"], out["brokerName"], out["payload"], strict=True))


def test_the_operator_sends_its_proposal_and_the_sink_does_not_send_it_again(cluster):
    from electra.streaming.sink import SENT_FIELD, OperatorProposer

    follower, leader = cluster
    rows = _decide_a_proposal(OperatorProposer([follower.address]))
    [(_, _, payload)] = [r for r in rows if r[0] == "proposal"]
    assert [p[1] for p in leader.posts] == ["bs"]  # sent while the operator ran, before its rows left it
    assert json.loads(payload)[SENT_FIELD]["result"] == "ok"
    sink = BatchSink(JobConfig(bootstrap="unused:1", controllers=[leader.address], checkpoint="unused"),
                     client=ControllerClient([leader.address], deadline_s=5), output=RecordingOutput())
    st = sink.handle_rows(rows, batch_id=3)
    assert st["outcomes"] == ["ok"] and len(leader.posts) == 1


def test_a_proposal_the_operator_could_not_settle_is_sent_by_the_sink_without_its_mark(cluster):
    from electra.streaming.sink import SENT_FIELD, OperatorProposer

    _, leader = cluster
    leader.script["bs"] = [(503, {"code": 2007})] * 1000  # no leader for now
    rows = _decide_a_proposal(OperatorProposer([leader.address], deadline_s=0.3))
    [(_, _, payload)] = [r for r in rows if r[0] == "proposal"]
    assert json.loads(payload)[SENT_FIELD]["result"] == "gave_up"
    leader.script["bs"] = []
    tried = len(leader.posts)
    sink = BatchSink(JobConfig(bootstrap="unused:1", controllers=[leader.address], checkpoint="unused"),
                     client=ControllerClient([leader.address], deadline_s=5), output=RecordingOutput())
    assert sink.handle_rows(rows, batch_id=4)["outcomes"] == ["ok"]
    assert len(leader.posts) == tried + 1 and SENT_FIELD not in leader.posts[-1][2]


def test_a_worker_without_the_drivers_credential_leaves_proposals_to_the_sink(cluster, monkeypatch):
    from electra.streaming.sink import SENT_FIELD, OperatorProposer

    _, leader = cluster
    for var in ("ELECTRA_TOKEN", "ELECTRA_TOKEN_FILE", "ELECTRA_CA_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("ELECTRA_TOKEN", "t0k3n")  # a token, but not the CA the driver speaks HTTPS with
    rows = _decide_a_proposal(OperatorProposer([leader.address], driver_has=(True, True)))
    [(_, _, payload)] = [r for r in rows if r[0] == "proposal"]
    assert SENT_FIELD not in json.loads(payload) and leader.posts == []


def test_a_job_stopped_while_spark_starts_does_not_build_its_query(monkeypatch):
    """Probe: SIGTERM to `electra up` while the job's Spark started took 16-19 s: the job went on to set up its
    Kafka source and start the query (10 s and more on this machine) before it looked at its stop flag."""
    import threading

    from electra.streaming import job

    stop = threading.Event()
    calls: list[str] = []

    class FakeSpark:
        version = "test"
        sparkContext = type("Ctx", (), {"master": "local[1]"})()

        def stop(self):
            calls.append("spark.stop")

    def build_spark(_cfg):
        stop.set()  # the signal arrives while the JVM starts
        return FakeSpark()

    class FakeSink:
        def __init__(self, _cfg):
            pass

        def close(self):
            calls.append("sink.close")

    monkeypatch.setattr(job, "build_spark", build_spark)
    monkeypatch.setattr(job, "BatchSink", FakeSink)
    monkeypatch.setattr(job, "ProgressLog", lambda *a: None)
    monkeypatch.setattr(job, "build_query", lambda *a: calls.append("build_query"))
    cfg = JobConfig(bootstrap="127.0.0.1:1", controllers=["127.0.0.1:1"], checkpoint="/nonexistent")
    assert job.run_job(cfg, stop) == 0
    assert calls == ["sink.close", "spark.stop"], calls
