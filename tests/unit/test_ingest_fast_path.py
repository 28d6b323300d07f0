"""The ingest server's C fast path (msgspec) accepts no heartbeat `records.validate_heartbeat` refuses, and
produces what the slow way would (the job and the ingest server must accept exactly the same records)."""

from __future__ import annotations

import json
import random

import msgspec
import pytest

from electra.api.ingest import accept_fast, fast_heartbeat
from electra.streaming import records

BASE = {"clusterName": "c", "brokerName": "set-1", "brokerId": 1, "brokerAddr": "10.0.0.1:10911", "epoch": 3,
        "maxOffset": 100, "confirmOffset": 90, "heartbeatTimeoutMillis": 3000, "electionPriority": 5}
ODD_VALUES = [None, True, False, 0, 1, -1, 1.0, 2.5, 1e3, "", "x", "1", "+2", "-3", " 1", "1_0", "2.0", ".", "..",
              "...", "a b", "a/b", "sét", "é" * 255, "é" * 256, "x" * 255, "x" * 256,
              "\U0001F600" * 255, [], {}, [1], 2**31 - 1, 2**31, -2**31, -2**31 - 1, 2**63 - 1, 2**63, -2**63,
              -2**63 - 1, 2**64, 10**30, 99, 100, 3_600_000, 3_600_001, 2**62, 2**62 + 1]
FIELDS = [*BASE, "ts", "extra"]


def slow(raw: bytes) -> dict | None:
    try:
        return records.validate_heartbeat(json.loads(raw))
    except (ValueError, records.InvalidHeartbeat):
        return None


def check(raw: bytes) -> None:
    want, got = slow(raw), fast_heartbeat(raw)
    if got is None:
        return  # the slow way answers it (and names the problem)
    assert want is not None, f"fast path accepted what validate_heartbeat refuses: {raw[:200]!r}"
    as_dict = {k: v for k, v in msgspec.structs.asdict(got).items() if v is not msgspec.UNSET}
    assert as_dict == want and list(as_dict) == list(want), raw[:200]


class Producer:
    def __init__(self) -> None:
        self.sent: list[tuple[bytes, bytes]] = []

    def submit_encoded(self, key: bytes, value: bytes) -> None:
        self.sent.append((key, value))


CONTROL_IN_ADDRESS = [b'{"clusterName":"c","brokerName":"s","brokerId":1,"brokerAddr":"a\\u0000b"}',
                      b'{"clusterName":"c","brokerName":"s","brokerId":1,"brokerAddr":"a:1\\n"}',
                      b'{"clusterName":"c","brokerName":"s","brokerId":1,"brokerAddr":"a\x7f"}']


def test_fast_path_matches_validate_heartbeat_on_odd_and_random_bodies():
    raws = [json.dumps(BASE).encode(), json.dumps({k: BASE[k] for k in ("clusterName", "brokerName", "brokerId",
                                                                        "brokerAddr")}).encode(),
            b"", b"null", b"[]", b"{", b'"x"', b"1", json.dumps([BASE]).encode(),
            b'{"clusterName":"c","brokerName":"s","brokerId":1,"brokerAddr":"a","brokerId":2}',  # duplicate key
            b'{"clusterName":"c","brokerName":"s","brokerId":1,"brokerAddr":"a","ts":null}',
            b'{"clusterName":"c","brokerName":"\\ud800","brokerId":1,"brokerAddr":"a"}',  # a lone surrogate
            b'{"clusterName":"c","brokerName":"s","brokerId":1,"brokerAddr":"a","epoch":1.0}',
            b'{"clusterName":"c","brokerName":"s","brokerId":1,"brokerAddr":"a","epoch":1e2}',
            b'{"clusterName":"c","brokerName":"s","brokerId":1,"brokerAddr":"a","epoch":-0}',
            b'{"clusterName":"c","brokerName":"s","brokerId":1,"brokerAddr":"a","epoch":NaN}', *CONTROL_IN_ADDRESS]
    for field in FIELDS:
        for v in ODD_VALUES:
            raws.append(json.dumps({**BASE, field: v}).encode())
        raws.append(json.dumps({k: x for k, x in BASE.items() if k != field}).encode())
    rng = random.Random(7)
    for _ in range(3000):
        body = dict(BASE)
        for field in rng.sample(FIELDS, rng.randint(1, 3)):
            if rng.random() < 0.2:
                body.pop(field, None)
            else:
                body[field] = rng.choice(ODD_VALUES)
        raws.append(json.dumps(body).encode())
    accepted = 0
    for raw in raws:
        check(raw)
        accepted += fast_heartbeat(raw) is not None
    assert accepted > 100  # the fast path is taken, not only refused
    for raw in CONTROL_IN_ADDRESS:  # refused: an address is handed to other brokers
        with pytest.raises(records.InvalidHeartbeat, match="brokerAddr"):
            records.validate_heartbeat(json.loads(raw))


def test_fast_path_produces_the_heartbeat_stamped_with_the_ingest_clock():
    producer = Producer()
    raw = json.dumps({**BASE, "brokerName": "set-1", "ts": 5, "extra": 1}).encode()
    assert accept_fast(producer, fast_heartbeat(raw), 1234) == (200, b'{"code": 0, "remark": "Heart beat success"}')
    [(key, value)] = producer.sent
    assert key == b"set-1"
    assert json.loads(value) == {**slow(raw), "ts": 1234}
    assert list(json.loads(value)) == list(records.validate_heartbeat(json.loads(raw)))


def test_the_heartbeat_rule_takes_names_and_integers_as_the_node_api_does():
    """The node's API refuses a name outside the name rule and reads "2" and 2.0 as 2 (RocketMQ's Java fields):
    the ingest workers and the job took every name (even "..", "a/b", a NUL) and refused "2", so one broker body
    got two verdicts, and names no controller route could reach went into Kafka."""
    for name in (".", "..", "a b", "a/b", "sét", "a\x00b", "x\n", "\u202e"):
        for key in ("clusterName", "brokerName"):
            with pytest.raises(records.InvalidHeartbeat, match=key):
                records.validate_heartbeat({**BASE, key: name})
    assert records.validate_heartbeat({**BASE, "brokerName": "..."})["brokerName"] == "..."
    read = records.validate_heartbeat({**BASE, "brokerId": "2", "epoch": "+3", "maxOffset": 7.0, "confirmOffset": "-1"})
    assert (read["brokerId"], read["epoch"], read["maxOffset"], read["confirmOffset"]) == (2, 3, 7, -1)
    assert all(type(read[k]) is int for k in ("brokerId", "epoch", "maxOffset", "confirmOffset"))
    for bad in (" 1", "1_0", "2.0", "", "x", 2.5, True, "9" * 5000, float("inf")):
        with pytest.raises(records.InvalidHeartbeat, match="brokerId"):
            records.validate_heartbeat({**BASE, "brokerId": bad})


def test_names_already_matched_are_remembered_within_a_bound_and_a_bad_one_never_is(monkeypatch):
    from electra.state import limits

    monkeypatch.setattr(limits, "NAMES_SEEN_MAX", 4)
    monkeypatch.setattr(limits, "_names_seen", set())
    for i in range(10):
        assert limits.is_name(f"set-{i}") and len(limits._names_seen) <= 4
    for _ in range(2):
        assert not limits.is_name("..") and not limits.is_name("a b")
    assert ".." not in limits._names_seen and "a b" not in limits._names_seen
