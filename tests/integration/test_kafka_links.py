"""The controller's Kafka links against a real Kafka-compatible broker (tansu): heartbeats in,
events out (in order, across a leader change, with no gap and no repeat), liveness in; and the
ingest worker processes' answers (200, 422, 503 + Retry-After while Kafka is down)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from inprocess_cluster import start_cluster, wait_leader
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from electra.api.client import ControllerClient
from electra.local_ports import free_ports
from electra.state.codes import Code
from electra.streaming import records
from electra.streaming.embedded_kafka import EmbeddedKafka
from electra.streaming.kafka_io import end_offsets, ensure_topics, topic_partitions

pytestmark = pytest.mark.integration


def _heartbeats(bootstrap: str) -> list[dict]:
    """Every heartbeats-topic record, with the groups ingest writes split into their heartbeats."""
    return [h for m in read_topic(bootstrap, records.HEARTBEATS) for h in records.heartbeat_records(m.value)]


def read_topic(bootstrap: str, topic: str, timeout_s: float = 10.0) -> list:
    """Every record of `topic` (all partitions), up to the real end offsets."""
    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        tps = topic_partitions(c, topic)
        ends = end_offsets(c, tps)
        c.assign(tps)
        c.seek_to_beginning(*tps)
        out: list = []
        deadline = time.monotonic() + timeout_s
        while any(c.position(tp) < ends[tp] for tp in tps) and time.monotonic() < deadline:
            for msgs in c.poll(timeout_ms=200).values():
                out.extend(m for m in msgs if m.offset < ends[TopicPartition(m.topic, m.partition)])
        return out
    finally:
        c.close()


async def _cluster(tmp_path, bootstrap: str):
    return await start_cluster(tmp_path, scan_interval_s=0, kafka_bootstrap=bootstrap)


async def _until(pred, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def _liveness_record(name: str, ids: list[int], now_ms: int) -> bytes:
    return records.encode({"clusterName": "c", "brokerName": name, "ts": now_ms, "brokers": [
        {"broker_id": i, "broker_addr": f"10.0.0.{i}:10911", "last_update_ms": now_ms, "timeout_ms": 10_000,
         "epoch": 1, "max_offset": 100 * i, "confirm_offset": -1, "priority": 5} for i in ids]})


def test_heartbeats_events_and_liveness_through_kafka_across_a_leader_change(tmp_path):
    async def main(bootstrap: str):
        nodes, http = await _cluster(tmp_path, bootstrap)
        client = ControllerClient(list(http.values()), ingest_endpoints=[http[2], http[3]])
        producer = KafkaProducer(bootstrap_servers=bootstrap)
        try:
            for name in ("a", "b"):
                for bid in (1, 2, 3):
                    addr = f"10.0.0.{bid}:10911"
                    assert (await client.apply_broker_id("c", name, bid, f"{addr};{bid}"))["code"] == 0
                    r = await client.heartbeat("c", name, bid, addr, epoch=1, maxOffset=100 * bid)
                    assert r["code"] == 0, r
                    assert (await client.register("c", name, bid, addr))["code"] == 0
                assert (await client.elect_master("c", name, 1))["header"]["masterEpoch"] == 1
            # Liveness comes from the streaming job's topic: without it the replicas are not alive here.
            r = await client.alter_sync_state_set("a", 1, 1, [1, 2, 3], 1)
            assert r["code"] == Code.CONTROLLER_BROKER_NOT_ALIVE, r
            producer.send(records.LIVENESS, key=b"a", value=_liveness_record("a", [1, 2, 3], int(time.time() * 1000)))
            producer.flush()
            await _until(lambda: all(len(n.service.liveness.group("c", "a")) == 3 for n in nodes.values()), 15,
                         "liveness records on every node")
            assert (await client.alter_sync_state_set("a", 1, 1, [1, 2, 3], 1))["code"] == 0

            # Kill the leader mid-stream; the next leader resumes from the topic's last index.
            old = await wait_leader(nodes)
            await nodes.pop(old).stop()
            await wait_leader(nodes)
            # The job's records hold many sets (the one above is the one-set form of earlier versions).
            now_ms = int(time.time() * 1000)
            grouped = records.liveness_records([_liveness_record(n, [1, 2], now_ms).decode() for n in ("b", "x")])
            assert len(grouped) == 1
            producer.send(records.LIVENESS, value=grouped[0])
            producer.flush()
            await _until(lambda: all(len(n.service.liveness.group("c", "b")) == 2 for n in nodes.values()), 15,
                         "liveness of b")
            r = await client.alter_sync_state_set("b", 1, 1, [1, 2], 1)
            assert r["code"] == 0, r
            leader = nodes[await wait_leader(nodes)]
            last_event = leader.service.journal.since(0)[-1].index
            await _until(lambda: leader.service.events_publisher.published_index >= last_event, 15,
                         "the new leader to publish")
            expected = [(e.index, e.event["type"]) for e in leader.service.journal.since(0)]
        finally:
            producer.close()
            await client.close()
            for n in nodes.values():
                await n.stop()
        return expected

    with EmbeddedKafka() as kafka:
        ensure_topics(kafka.bootstrap, records.Topics().partitions())
        expected = asyncio.run(main(kafka.bootstrap))
        events = [json.loads(m.value) for m in read_topic(kafka.bootstrap, records.EVENTS)]
        heartbeats = _heartbeats(kafka.bootstrap)
    got = [(e["index"], e["type"]) for e in events]
    assert got == expected  # every applied event, once, in index order, across the leader change
    assert [t for _, t in got].count("ElectMaster") == 2 and [t for _, t in got].count("AlterSyncStateSet") == 2
    last_a = [e for e in events if e["brokerName"] == "a"][-1]
    assert last_a["state"]["syncStateSet"] == [1, 2, 3] and last_a["state"]["masterBrokerId"] == 1
    assert all(e["term"] >= 1 and e["ts"] > 0 for e in events)
    assert len(heartbeats) == 6 and all(h["ts"] > 0 and h["brokerName"] in ("a", "b") for h in heartbeats)


def _post(url: str, body: bytes) -> tuple[int, dict, dict]:
    req = urllib.request.Request(url, data=body, method="POST", headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, json.loads(r.read()), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read()), dict(e.headers)


def test_ingest_workers_answer_200_422_and_503_while_kafka_is_down():
    port = free_ports(1)[0]
    url = f"http://127.0.0.1:{port}/v1/heartbeat"
    hb = {"clusterName": "c", "brokerName": "b", "brokerId": 1, "brokerAddr": "10.0.0.1:10911", "epoch": 1}
    with EmbeddedKafka() as kafka:
        ensure_topics(kafka.bootstrap, records.Topics().partitions())
        proc = subprocess.Popen([sys.executable, "-m", "electra.cli", "--log-level", "WARNING", "ingest", "--listen",
                                 f"127.0.0.1:{port}", "--kafka-bootstrap", kafka.bootstrap, "--workers", "2",
                                 "--insecure"])
        try:
            deadline = time.monotonic() + 20
            status = 0
            while status != 200:
                assert time.monotonic() < deadline, "ingest workers never accepted a heartbeat"
                with contextlib.suppress(OSError):
                    status = _post(url, json.dumps(hb).encode())[0]
                time.sleep(0.1)
            # the node API's answers: its 422 shape, its name rule, RocketMQ's decimal text read as the number
            status, body, _ = _post(url, json.dumps({**hb, "brokerId": 0}).encode())
            assert status == 422 and body["code"] == 2005 and body["errors"][0]["field"] == "body.brokerId"
            assert body["remark"].startswith("invalid request: body.brokerId: ")
            status, body, _ = _post(url, json.dumps({**hb, "brokerName": ".."}).encode())
            assert status == 422 and [e["field"] for e in body["errors"]] == ["body.brokerName"]
            status, body, _ = _post(url, b"{not json")
            assert status == 422 and body["errors"][0]["field"] == "body"
            def accepted(body: dict) -> int:
                """200, or 503 while a slow first delivery holds the circuit open (bounded: 20 s)."""
                deadline = time.monotonic() + 20
                while (status := _post(url, json.dumps(body).encode())[0]) == 503 and time.monotonic() < deadline:
                    time.sleep(0.2)
                return status

            assert accepted({**hb, "brokerId": "1", "maxOffset": 19.0}) == 200
            for i in range(19):
                assert accepted({**hb, "maxOffset": i}) == 200
            # 200 means accepted by the producer (delivery is asynchronous, after up to linger_ms).
            deadline = time.monotonic() + 10
            while True:
                got = _heartbeats(kafka.bootstrap)
                if len(got) >= 21 or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert len(got) >= 21 and {g["maxOffset"] for g in got} >= set(range(20))
            assert all(g["brokerName"] == "b" and g["brokerId"] == 1 and type(g["maxOffset"]) is int and g["ts"] > 0
                       for g in got)
            # Kafka goes away: within the delivery timeout the workers answer 503 with Retry-After.
            kafka.stop()
            deadline = time.monotonic() + 30
            while True:
                assert time.monotonic() < deadline, "no 503 after Kafka stopped"
                status, body, headers = _post(url, json.dumps(hb).encode())
                if status == 503:
                    break
                time.sleep(0.2)
            assert headers.get("retry-after") == "1" and "Kafka" in body["remark"]
            # It comes back (empty: tansu keeps nothing): the workers recover on their own.
            kafka.start()
            ensure_topics(kafka.bootstrap, records.Topics().partitions())
            deadline = time.monotonic() + 30
            while _post(url, json.dumps(hb).encode())[0] != 200:
                assert time.monotonic() < deadline, "ingest did not recover after Kafka came back"
                time.sleep(0.3)
        finally:
            proc.terminate()
            proc.wait(timeout=10)
