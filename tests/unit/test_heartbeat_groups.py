"""Grouped heartbeats-topic records: the ingest producer writes them, the job's parser splits them.

`HeartbeatProducer` (with a stand-in for kafka-python's producer) sends what it accepted for one
partition within its linger window as one record, in order, and a `disconnected` record at once
together with the heartbeats before it; a group never exceeds its byte bound; stopping sends what
waits; a send that fails loses its group and opens the circuit. `parsing.parse_records` splits
groups into their records with the group's offset, reads the one-record form as before, and turns
a group that does not decode into a dead letter.
"""

from __future__ import annotations

import json
import time

import pytest

from electra.api.ingest import HeartbeatProducer, KafkaUnavailable
from electra.streaming import records
from electra.streaming.parsing import parse_records

TOPIC = "hb"


class _Future:
    def __init__(self) -> None:
        self.callbacks, self.errbacks = [], []

    def add_callback(self, fn) -> None:
        self.callbacks.append(fn)

    def add_errback(self, fn) -> None:
        self.errbacks.append(fn)


class _Kafka:
    """kafka-python's producer as the HeartbeatProducer uses it: send, partitions_for, close."""

    def __init__(self, partitions: int = 4, fail: bool = False) -> None:
        self.partitions, self.fail = partitions, fail
        self.sent: list[tuple[int, bytes, _Future]] = []

    def partitions_for(self, _topic):
        return set(range(self.partitions))

    def send(self, topic, key=None, value=None, partition=None):
        assert topic == TOPIC and key is None
        if self.fail:
            raise RuntimeError("buffer full")
        fut = _Future()
        self.sent.append((partition, value, fut))
        return fut

    def close(self, timeout=None) -> None:
        pass

    def deliver_all(self) -> None:
        for _, _, fut in self.sent:
            for cb in fut.callbacks:
                cb(None)


def _producer(kafka: _Kafka, **kw) -> HeartbeatProducer:
    p = HeartbeatProducer("k:9092", TOPIC, **kw)
    p._producer, p._healthy = kafka, True  # connected (no thread: the tests flush by hand)
    return p


def _hb(name: str, broker: int, ts: int = 1) -> dict:
    return {"clusterName": "c", "brokerName": name, "brokerAddr": f"10.0.0.{broker}:10911", "brokerId": broker,
            "epoch": 1, "maxOffset": 5, "confirmOffset": 5, "heartbeatTimeoutMillis": 10_000,
            "electionPriority": 1, "ts": ts}


def _items(value: bytes) -> list[dict]:
    return [json.loads(v) for v in records.heartbeat_group_items(value)]


def test_one_record_per_partition_holds_the_window_s_heartbeats_in_order():
    kafka = _Kafka()
    p = _producer(kafka)
    names = [f"set-{i}" for i in range(12)]
    for round_ in range(2):
        for name in names:
            p.submit(_hb(name, 1, ts=round_ + 1))
    assert kafka.sent == []  # waiting for the linger window
    p.flush_groups()
    by_part = {part: _items(value) for part, value, _ in kafka.sent}
    assert len(kafka.sent) == len(by_part) == len({p._partition(n.encode()) for n in names})
    for part, items in by_part.items():
        mine = [n for n in names if p._partition(n.encode()) == part]
        assert [(i["brokerName"], i["ts"]) for i in items] == [(n, 1) for n in mine] + [(n, 2) for n in mine]
    kafka.deliver_all()
    assert p.stats["accepted"] == p.stats["delivered"] == 24 and p.stats["records_sent"] == len(by_part)


def _sent_within(kafka: _Kafka, n: int, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while len(kafka.sent) < n and time.monotonic() < deadline:  # bounded: `seconds`
        time.sleep(0.005)
    return len(kafka.sent) >= n


def test_a_disconnected_record_goes_at_once_with_the_heartbeats_before_it():
    kafka = _Kafka(partitions=1)
    p = _producer(kafka, linger_ms=60_000)  # only a ready group can leave before the test ends
    p._flusher.start()
    try:
        p.submit(_hb("a", 1))
        p.submit(_hb("b", 2))
        p.submit(records.disconnected_record(_hb("a", 1), records.CONNECTION_LOST, 7))
        assert _sent_within(kafka, 1)
        assert [(i["brokerName"], i.get("type")) for i in _items(kafka.sent[0][1])] == [
            ("a", None), ("b", None), ("a", records.DISCONNECTED)]
        p.submit(_hb("c", 3))
        time.sleep(0.2)
        assert len(kafka.sent) == 1  # "c" lingers
    finally:
        p.close()
    assert [i["brokerName"] for i in _items(kafka.sent[1][1])] == ["c"]


def test_requests_never_wait_for_a_send_that_blocks_on_a_stalled_kafka():
    """kafka-python's `send()` blocks up to `max_block_ms` when its buffer is full; only the flusher waits."""
    import threading

    class _Stalled(_Kafka):
        def __init__(self) -> None:
            super().__init__(partitions=4)
            self.entered, self.release = threading.Event(), threading.Event()

        def send(self, topic, key=None, value=None, partition=None):
            self.entered.set()
            self.release.wait(10)
            return super().send(topic, key, value, partition)

    kafka = _Stalled()
    p = _producer(kafka, linger_ms=1)
    p._flusher.start()
    try:
        p.submit(_hb("s-0", 1))
        assert kafka.entered.wait(5), "the flusher never sent"
        # the flusher is stuck in send(); requests for every partition, a `disconnected` one included, go on
        submitter = threading.Thread(target=lambda: [
            p.submit(_hb(f"s-{i}", 1, ts=2)) for i in range(20)] + [
            p.submit(records.disconnected_record(_hb("s-1", 1), records.CONNECTION_LOST, 7))], daemon=True)
        submitter.start()
        submitter.join(5)
        assert not submitter.is_alive(), "a request waited for the stalled send"
    finally:
        kafka.release.set()
        p.close()
    sent = [(i["brokerName"], i["ts"]) for _, v, _ in kafka.sent for i in _items(v)]
    assert len(sent) == 22 and sent[0] == ("s-0", 1)
    for name in {n for n, _ in sent}:  # a set's records stay in order
        mine = [ts for n, ts in sent if n == name]
        assert mine == sorted(mine)


def test_a_group_never_exceeds_its_byte_bound():
    kafka = _Kafka(partitions=1)
    one = len(records.encode(_hb("s", 1))) + 1
    p = _producer(kafka, group_bytes=5 * one)
    for i in range(12):
        p.submit(_hb("s", 1, ts=i + 1))
    p.flush_groups()
    sizes = [len(_items(v)) for _, v, _ in kafka.sent]
    assert sizes == [5, 5, 2]
    assert [i["ts"] for _, v, _ in kafka.sent for i in _items(v)] == list(range(1, 13))


def test_the_flusher_thread_sends_within_the_linger_window_and_close_sends_the_rest():
    kafka = _Kafka(partitions=1)
    p = _producer(kafka, linger_ms=20)
    p._flusher.start()
    try:
        p.submit(_hb("s", 1))
        deadline = time.monotonic() + 2.0
        while not kafka.sent and time.monotonic() < deadline:  # bounded: 2 s
            time.sleep(0.005)
        assert len(kafka.sent) == 1
        p._pending.clear()  # hold the thread off: what comes now is sent by close()
    finally:
        p._closed = True
    p.submit(_hb("s", 1, ts=2))
    p.close()
    assert [i["ts"] for _, v, _ in kafka.sent for i in _items(v)] == [1, 2]


def test_a_failed_send_loses_its_group_and_opens_the_circuit():
    kafka = _Kafka(partitions=1, fail=True)
    p = _producer(kafka)
    p.submit(_hb("s", 1))
    p.flush_groups()
    assert p.stats["dropped"] == 1 and not p.healthy
    with pytest.raises(KafkaUnavailable):  # the probe went out a moment ago
        p._last_probe = time.monotonic()
        p.submit(_hb("s", 1))


def _raw(values: list[bytes]) -> list[tuple]:
    return [("hb", 0, off, v.decode(), 1000 + off) for off, v in enumerate(values)]


def _rows(raw: list[tuple]) -> list[dict]:
    out = []
    for batch in parse_records(iter(raw), "hb", "ev", 2):
        out += batch.to_pylist()
    return out


def test_the_parser_splits_groups_with_the_group_s_offset_and_reads_single_records_too():
    group = records.heartbeat_group([records.encode(_hb("a", 1, ts=5)), records.encode(_hb("b", 1, ts=6)),
                                     records.encode(records.disconnected_record(_hb("b", 1), "shutdown", 9))])
    single = records.encode(_hb("c", 2, ts=7))
    rows = _rows(_raw([group, single]))
    got = sorted((r["group"], r["kind"], r["offset"]) for r in rows)
    assert got == [("a", "hb", 0), ("b", "dc", 0), ("b", "hb", 0), ("c", "hb", 1)]
    assert {r["group"]: json.loads(r["payload"])["ts"] for r in rows if r["kind"] == "hb"} == {"a": 5, "b": 6, "c": 7}


def test_a_group_that_does_not_decode_is_a_dead_letter():
    bad = [b'{"heartbeats":[{"brokerName":', b'{"heartbeats":"x"}', b'{"heartbeats":[1,2]}']
    rows = _rows(_raw(bad))
    assert [r["kind"] for r in rows] == ["dlq"] * 4  # a group of two non-objects: two dead letters
    errors = [json.loads(r["payload"])["error"] for r in rows]
    assert "invalid JSON" in errors[0] and "group" in errors[1], errors
    assert [json.loads(r["payload"])["raw"] for r in rows[2:]] == ["1", "2"]
    # an item of a good group that is not a heartbeat is a dead letter of its own; the others go on
    mixed = records.heartbeat_group([b'{"brokerName":"x"}', records.encode(_hb("a", 1))])
    kinds = sorted(r["kind"] for r in _rows(_raw([mixed])))
    assert kinds == ["dlq", "hb"]


def test_a_group_of_heartbeats_decodes_in_one_call_exactly_as_record_by_record():
    hbs = [_hb(f"s{i}", 1 + i % 3, ts=i + 1) for i in range(20)]
    del hbs[3]["ts"]  # no ingest stamp: the Kafka record's time stands in, on both ways
    hbs[5]["extra"] = "ignored"
    hbs[7]["brokerAddr"] = "caf\u00e9:1"
    group = records.heartbeat_group([records.encode(h) for h in hbs])
    one_by_one = [records.fast_heartbeat(item) for item in records.heartbeat_group_items(group)]
    assert records.fast_heartbeat_group(group) == one_by_one and None not in one_by_one
    assert records.fast_heartbeat_group(group.decode()) == one_by_one
    as_group = _rows([("hb", 0, 0, group.decode(), 1000)])  # the same Kafka time for every record
    as_singles = _rows([("hb", 0, off, records.encode(h).decode(), 1000) for off, h in enumerate(hbs)])
    assert [(r["group"], r["kind"], r["payload"]) for r in as_group] == \
        [(r["group"], r["kind"], r["payload"]) for r in as_singles]
    # what one call cannot take goes record by record: a disconnected record, an invalid heartbeat
    dc = records.encode(records.disconnected_record(hbs[0], "shutdown", 9))
    assert records.fast_heartbeat_group(records.heartbeat_group([records.encode(hbs[0]), dc])) is None
    bad = records.encode({**hbs[0], "brokerId": 0})
    assert records.fast_heartbeat_group(records.heartbeat_group([records.encode(hbs[0]), bad])) is None
