"""The ingest workers' HTTP/1.1 server, byte for byte: routes, pipelining, keep-alive, limits, bad input.

The producer is a stand-in (Kafka itself is covered by tests/integration/test_kafka_links.py)."""

from __future__ import annotations

import json
import time

import pytest

from electra.api.ingest import KafkaUnavailable
from electra.api.ingest_server import MAX_BODY, IngestProtocol
from electra.api.invalid import SEND_JSON
from electra.api.sessions import SessionRegistry
from electra.streaming import records


class FakeProducer:
    bootstrap = "kafka:9092"

    def __init__(self, up: bool = True) -> None:
        self.up = up
        self.sent: list[dict] = []
        self.to_lane: list[dict] = []  # the liveness topic's copies (api/connection_loss.py)
        self.stats = {"accepted": 0, "invalid": 0, "unavailable": 0}

    @property
    def healthy(self) -> bool:
        return self.up

    def submit(self, hb: dict) -> None:
        if not self.up:
            raise KafkaUnavailable("down")
        self.sent.append(hb)

    def to_liveness(self, record: dict) -> None:
        self.to_lane.append(record)

    def submit_encoded(self, key: bytes, value: bytes) -> None:
        hb = json.loads(value)
        assert key == hb["brokerName"].encode()
        self.submit(hb)


class FakeTransport:
    def __init__(self) -> None:
        self.data = b""
        self.closed = False

    def write(self, data: bytes) -> None:
        self.data += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


def connect(producer: FakeProducer) -> tuple[IngestProtocol, FakeTransport]:
    proto, transport = IngestProtocol(producer), FakeTransport()
    proto.connection_made(transport)
    return proto, transport


def post(body: bytes, path: str = "/v1/heartbeat", extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{extra}"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def responses(raw: bytes) -> list[tuple[int, dict, dict]]:
    """Split a byte stream of responses into (status, headers, body)."""
    out = []
    while raw:
        head, rest = raw.split(b"\r\n\r\n", 1)
        lines = head.decode().split("\r\n")
        status = int(lines[0].split()[1])
        headers = dict(line.lower().split(": ", 1) for line in lines[1:])
        n = int(headers["content-length"])
        out.append((status, headers, rest[:n]))
        raw = rest[n:]
    return out


HB = {"clusterName": "c", "brokerName": "b", "brokerId": 1, "brokerAddr": "10.0.0.1:10911"}


def test_pipelined_heartbeats_are_answered_in_order_on_one_kept_alive_connection():
    producer = FakeProducer()
    proto, transport = connect(producer)
    stream = post(json.dumps(HB).encode()) + post(b"{bad") + post(json.dumps({**HB, "brokerId": 2}).encode())
    proto.data_received(stream[:37])  # requests arrive in arbitrary pieces
    proto.data_received(stream[37:])
    got = responses(transport.data)
    assert [s for s, _, _ in got] == [200, 422, 200]
    assert json.loads(got[0][2])["code"] == 0 and "JSON" in json.loads(got[1][2])["errors"][0]["problem"]
    assert [hb["brokerId"] for hb in producer.sent] == [1, 2] and all(hb["ts"] > 0 for hb in producer.sent)
    assert not transport.closed


class _Kafka:
    """kafka-python's producer as the circuit sees it: `send` returns a future whose callbacks the test fires."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.futures: list[dict] = []

    def partitions_for(self, _topic):
        return {0}

    def send(self, topic, key=None, value=None, partition=None):
        self.sent.append(value)
        fut: dict = {}
        self.futures.append(fut)
        return type("F", (), {"add_callback": lambda s, f: fut.__setitem__("ok", f),
                              "add_errback": lambda s, f: fut.__setitem__("err", f)})()


def test_an_open_circuit_sends_a_probe_a_second_and_still_answers_its_sender_503():
    """The probe's delivery is as unknown as the ones that failed: a broker beating once a second (each beat a
    probe) was told 200 throughout a Kafka outage. The record still goes, and its delivery closes the circuit."""
    from electra.api.ingest import HeartbeatProducer

    kafka = _Kafka()
    p = HeartbeatProducer("k:9092", "hb")
    p._producer, p._healthy = kafka, True
    hb = {**HB, "ts": 1}
    p.submit(hb)
    p.flush_groups()
    kafka.futures[-1]["err"](RuntimeError("expired"))  # the delivery failed: the circuit opens
    for _ in range(2):  # a second apart: each is the probe of its second, sent and refused
        p._last_probe -= 1.0
        with pytest.raises(KafkaUnavailable, match="probe"):
            p.submit(hb)
        with pytest.raises(KafkaUnavailable, match="failing"):  # within the second: refused, not sent
            p.submit(hb)
    p.flush_groups()
    assert len(kafka.sent) == 2 and json.loads(kafka.sent[1])["heartbeats"] == [hb, hb]
    kafka.futures[-1]["ok"](None)  # the probes were delivered: the circuit closes
    p.submit(hb)
    assert p.stats["accepted"] == 2 and p.stats["unavailable"] == 4


def test_topic_metadata_kafka_does_not_give_in_time_is_a_503_for_heartbeats_sessions_and_goodbyes():
    """kafka-python raises KafkaTimeoutError when a topic's partitions are not known within max_block_ms (a new
    topic, auto-creation off, a slow round trip): that was a 500 closing the connection, for a heartbeat, a
    session's opening and its goodbye. Kafka is unavailable: 503 + Retry-After, the connection kept; nothing is
    sent without its partition, and once the metadata is there the probe goes and closes the circuit."""
    from kafka.errors import KafkaTimeoutError

    from electra.api.ingest import HeartbeatProducer

    class NoMetadata(_Kafka):
        known = False

        def partitions_for(self, _topic):
            if not self.known:
                raise KafkaTimeoutError("Failed to update metadata after 0.1 secs.")
            return {0, 1}

    kafka = NoMetadata()
    p = HeartbeatProducer("k:9092", "hb")
    p._producer, p._healthy = kafka, True
    sessions = SessionRegistry(p)
    proto, t = IngestProtocol(p, sessions=sessions), FakeTransport()
    proto.connection_made(t)
    proto.data_received(post(json.dumps(HB).encode()) + post(json.dumps(HB).encode(), "/v1/session"))
    got = responses(t.data)
    assert [s for s, _, _ in got] == [503, 503] and all(h["retry-after"] == "1" for _, h, _ in got)
    assert b"Kafka unavailable" in got[0][2] and not t.closed and not p.healthy and len(sessions) == 0
    kafka.known = True  # the metadata came: the next second's probe is sent, still answered 503
    p._last_probe -= 1.0
    proto.data_received(post(json.dumps(HB).encode(), "/v1/session"))
    p.flush_groups()
    kafka.futures[-1]["ok"](None)  # delivered: the circuit closes
    proto.data_received(post(json.dumps(HB).encode(), "/v1/session"))
    kafka.known = False  # (a set whose partition is cached needs no lookup)
    proto.data_received(post(json.dumps(HB).encode()))
    assert [s for s, _, _ in responses(t.data)][2:] == [503, 200, 200] and len(sessions) == 1
    p._partitions.clear()  # a lookup that times out again: the goodbye is refused, the session stays
    proto.data_received(post(b"", "/v1/session/goodbye"))
    status, headers, _ = responses(t.data)[-1]
    assert status == 503 and headers["retry-after"] == "1" and not t.closed and len(sessions) == 1
    p.flush_groups()
    assert len(kafka.sent) == 2 and p.stats["unavailable"] == 4


def test_unavailable_kafka_gets_503_with_retry_after():
    proto, transport = connect(FakeProducer(up=False))
    proto.data_received(post(json.dumps(HB).encode()))
    [(status, headers, body)] = responses(transport.data)
    assert status == 503 and headers["retry-after"] == "1" and "Kafka" in json.loads(body)["remark"]


def test_routes_methods_limits_and_connection_close():
    proto, transport = connect(FakeProducer())
    proto.data_received(b"GET /v1/heartbeat HTTP/1.1\r\nHost: x\r\n\r\n")
    proto.data_received(b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n")
    proto.data_received(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    proto.data_received(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    got = responses(transport.data)
    assert [s for s, _, _ in got] == [405, 404, 200, 200]
    assert json.loads(got[2][2])["ok"] is True and b"electra_ingest_heartbeats" in got[3][2]
    assert not transport.closed
    proto.data_received(post(b"x" * (MAX_BODY + 1)))
    assert responses(transport.data)[-1][0] == 413 and transport.closed

    proto, transport = connect(FakeProducer())
    proto.data_received(post(json.dumps(HB).encode(), extra="Connection: close\r\n"))
    [(status, headers, _)] = responses(transport.data)
    assert status == 200 and headers["connection"] == "close" and transport.closed


def test_a_content_length_with_thousands_of_leading_zeros_is_its_number_and_a_longer_one_a_413():
    """The parser takes any number of leading zeros; `int()` of more than 4,300 digits raised ValueError (a 500 and a
    traceback, before the token check). Past 19 significant digits a length is over any limit: 413 at once."""
    body = json.dumps(HB).encode()
    producer = FakeProducer()
    proto, transport = connect(producer)
    proto.data_received(post(body).replace(b"Content-Length: %d" % len(body),
                                           b"Content-Length: " + b"0" * 5000 + b"%d" % len(body)))
    assert [s for s, _, _ in responses(transport.data)] == [200] and len(producer.sent) == 1
    for length in (b"0" * 5000 + b"%d" % (MAX_BODY + 1), b"1" + b"0" * 19):
        proto, transport = connect(producer)
        proto.data_received(post(b"").replace(b"Content-Length: 0", b"Content-Length: " + length))
        [(status, headers, _)] = responses(transport.data)
        assert status == 413 and headers["connection"] == "close" and transport.closed, length[-30:]


def test_head_gets_no_body_and_a_405_names_the_methods_allowed():
    proto, transport = connect(FakeProducer())
    proto.data_received(b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /nope HTTP/1.1\r\nHost: x\r\n\r\n")
    head, _, rest = transport.data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"content-length: " in head
    assert rest.startswith(b"HTTP/1.1 404")  # the HEAD's body did not come between: read as the next answer
    transport.data = b""
    proto.data_received(b"GET /v1/heartbeat HTTP/1.1\r\nHost: x\r\n\r\nDELETE /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    got = responses(transport.data)
    assert [(s, h.get("allow", "").upper()) for s, h, _ in got] == [(405, "POST"), (405, "GET, HEAD")]


def test_a_chunked_body_past_the_limit_is_refused_at_once_and_an_upgrade_gets_one_answer():
    proto, transport = connect(FakeProducer())
    chunk = b"8000\r\n" + b"x" * 0x8000 + b"\r\n"
    proto.data_received(b"POST /v1/heartbeat HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk * 3)
    [(status, _, _)] = responses(transport.data)  # no final chunk yet: answered as soon as it passed 64 KiB
    assert status == 413 and transport.closed
    proto, transport = connect(FakeProducer())
    proto.data_received(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
    assert [s for s, _, _ in responses(transport.data)] == [400] and transport.closed


def test_malformed_http_gets_400_and_the_connection_closes():
    proto, transport = connect(FakeProducer())
    proto.data_received(b"THIS IS NOT HTTP\r\n\r\n")
    [(status, _, _)] = responses(transport.data)
    assert status == 400 and transport.closed


def test_announced_big_bodies_and_big_heads_are_refused_before_being_read():
    proto, transport = connect(FakeProducer())
    proto.data_received(b"POST /v1/heartbeat HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n{")
    [(status, _, _)] = responses(transport.data)
    assert status == 413 and transport.closed
    proto, transport = connect(FakeProducer())
    proto.data_received(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (64 << 10))
    [(status, _, body)] = responses(transport.data)
    assert status == 431 and transport.closed and b"aaaa" not in body


def test_a_big_head_behind_an_earlier_request_is_refused_whether_it_ends_in_its_first_read_or_later():
    """The head limit counts a kept-alive connection's later requests too, from their first byte: the read
    in which a head begins also carries the end of the request before, so its part of the head is counted
    from what the parser took. Exactly one answer (the 431), no 400 after it."""
    big = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (60 << 10) + b"\r\n\r\n"
    proto, transport = connect(FakeProducer())
    proto.data_received(post(json.dumps(HB).encode()) + big)  # the big head begins and ends in this read
    assert [s for s, _, _ in responses(transport.data)] == [200, 431] and transport.closed
    proto, transport = connect(FakeProducer())
    proto.data_received(post(json.dumps(HB).encode()) + big[:20 << 10])  # ... or goes on into the next ones
    proto.data_received(big[20 << 10:40 << 10])
    proto.data_received(big[40 << 10:])
    assert [s for s, _, _ in responses(transport.data)] == [200, 431] and transport.closed
    proto, transport = connect(FakeProducer())  # the control: a 20 KiB head behind a request is served
    small = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (20 << 10) + b"\r\n\r\n"
    proto.data_received(post(json.dumps(HB).encode()) + small + small)
    assert [s for s, _, _ in responses(transport.data)] == [200, 200, 200] and not transport.closed


def test_slow_requests_idle_connections_and_too_many_connections_are_cut_off_on_a_real_socket():
    import asyncio
    import time

    from electra.api.http_limits import HTTPLimits

    limits = HTTPLimits(request_timeout_s=0.5, idle_timeout_s=1, max_connections=3)

    async def read_all(reader):
        return await asyncio.wait_for(reader.read(65536), 5)

    async def main():
        conns: set = set()
        server = await asyncio.get_running_loop().create_server(
            lambda: IngestProtocol(FakeProducer(), limits, conns), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            r, w = await asyncio.open_connection("127.0.0.1", port)  # slowloris: a head that never ends
            t0 = time.monotonic()
            w.write(b"POST /v1/heartbeat HTTP/1.1\r\nHost: x\r\n")
            assert (await read_all(r)).startswith(b"HTTP/1.1 408") and time.monotonic() - t0 < 3
            w.close()
            r, w = await asyncio.open_connection("127.0.0.1", port)  # idle after a response
            w.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            first = await asyncio.wait_for(r.readuntil(b"}"), 5)
            assert first.startswith(b"HTTP/1.1 200")
            t0 = time.monotonic()
            assert await read_all(r) == b"" and time.monotonic() - t0 < 3  # closed by the idle timeout
            w.close()
            await asyncio.sleep(0.1)
            held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
            r, w = await asyncio.open_connection("127.0.0.1", port)
            reply = await read_all(r)
            assert reply.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in reply
            for _, hw in held:
                hw.close()
            w.close()
        finally:
            server.close()
            await server.wait_closed()

    asyncio.run(asyncio.wait_for(main(), 30))
def test_a_busy_connection_outlives_the_idle_timeout_and_a_slow_request_on_it_is_still_cut():
    """The deadline moves with every request without re-arming a timer (LazyDeadline): a timer set for an
    older deadline must neither cut a connection that kept busy, nor let a later slow request run long."""
    import asyncio
    import time

    from electra.api.http_limits import HTTPLimits

    limits = HTTPLimits(request_timeout_s=0.3, idle_timeout_s=2, max_connections=3)

    async def main():
        server = await asyncio.get_running_loop().create_server(
            lambda: IngestProtocol(FakeProducer(), limits), "127.0.0.1", 0)
        try:
            r, w = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
            for i in range(7):  # 3 s of requests 0.5 s apart: past the idle timeout, never idle that long
                if i:
                    await asyncio.sleep(0.5)
                w.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                assert (await asyncio.wait_for(r.readuntil(b"}"), 5)).startswith(b"HTTP/1.1 200")
            t0 = time.monotonic()  # right after an answer: the idle timer is due in 2 s, this request's in 0.3
            w.write(b"POST /v1/heartbeat HTTP/1.1\r\nHost: x\r\n")  # a head that never ends
            reply = await asyncio.wait_for(r.read(65536), 5)
            assert reply.startswith(b"HTTP/1.1 408") and time.monotonic() - t0 < 1.5
            w.close()
        finally:
            server.close()
            await server.wait_closed()

    asyncio.run(asyncio.wait_for(main(), 30))


def test_a_lazy_deadline_moved_earlier_fires_then_and_one_moved_later_waits():
    import asyncio

    from electra.api.http_limits import LazyDeadline

    async def main():
        early, late = FakeTransport(), FakeTransport()
        d1, d2 = LazyDeadline(), LazyDeadline()
        d1.arm(early, 30)
        d1.arm(early, 0.05, b"timeout")  # a new request's deadline, before the idle one: it counts
        d2.arm(late, 0.05)
        d2.arm(late, 0.6)  # moved on: the timer set for 0.05 s must not close it then
        for _ in range(100):
            if early.closed:
                break
            await asyncio.sleep(0.02)
        assert early.closed and early.data == b"timeout" and not late.closed
        for _ in range(200):
            if late.closed:
                break
            await asyncio.sleep(0.02)
        assert late.closed

    asyncio.run(asyncio.wait_for(main(), 30))


def test_a_session_lost_without_goodbye_publishes_disconnected_and_a_goodbye_publishes_shutdown():
    producer = FakeProducer()
    sessions = SessionRegistry(producer)
    crashed, t1 = IngestProtocol(producer, sessions=sessions), FakeTransport()
    crashed.connection_made(t1)
    crashed.data_received(post(json.dumps(HB).encode(), "/v1/session") + post(json.dumps(HB).encode()))
    assert [s for s, _, _ in responses(t1.data)] == [200, 200] and len(sessions) == 1
    assert [r.get("type") for r in producer.sent] == [None, None]  # opening a session is a heartbeat
    crashed.connection_lost(ConnectionResetError())
    dc = producer.sent[-1]
    assert dc["type"] == "disconnected" and dc["reason"] == "connection_lost"
    assert (dc["brokerName"], dc["brokerId"], dc["brokerAddr"]) == ("b", 1, "10.0.0.1:10911") and dc["ts"] > 0
    # A clean shutdown: the goodbye says so, the close adds nothing.
    clean, t2 = IngestProtocol(producer, sessions=sessions), FakeTransport()
    clean.connection_made(t2)
    clean.data_received(post(json.dumps(HB).encode(), "/v1/session") + post(b"", "/v1/session/goodbye"))
    assert [s for s, _, _ in responses(t2.data)] == [200, 200]
    assert producer.sent[-1]["reason"] == "shutdown"
    n = len(producer.sent)
    clean.connection_lost(None)
    assert len(producer.sent) == n and len(sessions) == 0
    # A plain keep-alive connection without a session publishes nothing when it ends.
    plain, t3 = connect(producer)
    plain.data_received(post(json.dumps(HB).encode()))
    plain.connection_lost(None)
    assert len(producer.sent) == n + 1
    # The liveness topic (the controllers' connection-loss lane) got each session's opening and end, and no
    # other heartbeat: connected, connection_lost, connected, shutdown.
    assert [(r["type"], r.get("reason")) for r in producer.to_lane] == [
        ("connected", None), ("disconnected", "connection_lost"), ("connected", None), ("disconnected", "shutdown")]
    assert producer.to_lane[0]["ts"] > 0 and producer.to_lane[0]["brokerId"] == 1


def test_a_reopened_session_supersedes_the_old_one_whose_close_then_says_nothing():
    """A broker that reconnected (a new session on this worker) and whose old connection closes later must not
    be reported lost: that record would come after its new session's heartbeats and fail over a live broker."""
    producer = FakeProducer()
    sessions = SessionRegistry(producer)
    old, t1 = IngestProtocol(producer, sessions=sessions), FakeTransport()
    old.connection_made(t1)
    old.data_received(post(json.dumps(HB).encode(), "/v1/session"))
    new, t2 = IngestProtocol(producer, sessions=sessions), FakeTransport()
    new.connection_made(t2)
    new.data_received(post(json.dumps(HB).encode(), "/v1/session") + post(json.dumps(HB).encode()))
    old.connection_lost(ConnectionResetError())
    assert [r.get("type") for r in producer.sent] == [None, None, None] and sessions.stats["superseded"] == 1
    new.connection_lost(ConnectionResetError())  # the live session's own loss still speaks
    assert producer.sent[-1]["reason"] == "connection_lost" and len(sessions) == 0


def test_a_connection_holding_a_session_is_refused_another_cluster_s_broker_of_the_same_set_and_id():
    """A broker is its (cluster, set, id) (docs/failover-signal.md). Connection A held c/b/1, then opened c2/b/1 (a
    200) and the broker index still sent c/b/1 to A: when c/b/1 opened on B, A's c2 session was dropped as
    superseded, A's reset said nothing for c2/b/1, and the stale entry kept A's protocol alive."""
    producer = FakeProducer()
    sessions = SessionRegistry(producer)
    a, ta = IngestProtocol(producer, sessions=sessions), FakeTransport()
    a.connection_made(ta)
    a.data_received(post(json.dumps(HB).encode(), "/v1/session")
                    + post(json.dumps({**HB, "clusterName": "c2"}).encode(), "/v1/session"))
    got = responses(ta.data)
    assert [s for s, _, _ in got] == [200, 409] and b"c/b/1" in got[1][2] and not ta.closed
    assert len(producer.sent) == 1 and sessions.broker_of(a)["clusterName"] == "c"  # nothing of c2 produced
    # c2's broker of the same set and id on a connection of its own is another broker: nothing superseded
    c, tc = IngestProtocol(producer, sessions=sessions), FakeTransport()
    c.connection_made(tc)
    c.data_received(post(json.dumps({**HB, "clusterName": "c2"}).encode(), "/v1/session"))
    b, tb = IngestProtocol(producer, sessions=sessions), FakeTransport()
    b.connection_made(tb)
    b.data_received(post(json.dumps(HB).encode(), "/v1/session"))  # c/b/1 reconnected: A's session superseded
    assert [s for s, _, _ in responses(tc.data) + responses(tb.data)] == [200, 200]
    assert sessions.stats["superseded"] == 1 and sessions.broker_of(a) is None
    n = len(producer.sent)
    a.connection_lost(ConnectionResetError())  # superseded: nothing
    c.connection_lost(ConnectionResetError())  # c2/b/1's own loss speaks
    assert len(producer.sent) == n + 1 and producer.sent[-1]["reason"] == "connection_lost"
    assert producer.sent[-1]["clusterName"] == "c2"
    b.connection_lost(ConnectionResetError())
    assert producer.sent[-1]["clusterName"] == "c" and producer.sent[-1]["reason"] == "connection_lost"
    assert len(sessions) == 0 and sessions._by_broker == {}  # no entry left holding a closed connection


def test_a_session_on_a_connection_its_answer_would_end_is_refused_and_produces_nothing():
    """`Connection: close` (or HTTP/1.0) ends the connection with the answer: such a session would be over at
    once, ended by this worker, and say nothing ever. A clear 400 instead, and no heartbeat produced."""
    for request in (post(json.dumps(HB).encode(), "/v1/session", extra="Connection: close\r\n"),
                    post(json.dumps(HB).encode(), "/v1/session").replace(b"HTTP/1.1", b"HTTP/1.0", 1)):
        producer = FakeProducer()
        sessions = SessionRegistry(producer)
        proto, t = IngestProtocol(producer, sessions=sessions), FakeTransport()
        proto.connection_made(t)
        proto.data_received(request)
        [(status, headers, body)] = responses(t.data)
        assert status == 400 and b"kept-alive" in body and headers["connection"] == "close" and t.closed
        proto.connection_lost(None)
        assert producer.sent == [] and len(sessions) == 0 and sessions.stats["opened"] == 0


def _open_session() -> tuple[FakeProducer, SessionRegistry, IngestProtocol, FakeTransport]:
    """A worker's session registry with one connection whose session is open."""
    producer = FakeProducer()
    sessions = SessionRegistry(producer)
    proto, t = IngestProtocol(producer, sessions=sessions), FakeTransport()
    proto.connection_made(t)
    proto.data_received(post(json.dumps(HB).encode(), "/v1/session"))
    return producer, sessions, proto, t


def test_a_goodbye_kafka_did_not_take_is_a_503_and_the_session_stays():
    producer, sessions, proto, t = _open_session()
    producer.up = False
    proto.data_received(post(b"", "/v1/session/goodbye"))
    producer.up = True
    proto.data_received(post(b"", "/v1/session/goodbye"))
    got = responses(t.data)
    assert [s for s, _, _ in got] == [200, 503, 200] and got[1][1]["retry-after"] == "1"
    assert producer.sent[-1]["reason"] == "shutdown" and len(sessions) == 0


def test_bytes_that_are_not_utf8_are_a_422_and_the_connection_stays():
    producer = FakeProducer()
    proto, t = connect(producer)
    proto.data_received(post(json.dumps(HB).encode(), "/v1/session")
                        + post(json.dumps(HB).encode().replace(b'"b"', b'"b\xff"')) + post(json.dumps(HB).encode()))
    assert [s for s, _, _ in responses(t.data)] == [200, 422, 200] and not t.closed


def test_a_stopping_worker_publishes_nothing_for_the_sessions_it_closes():
    producer, sessions, proto, _ = _open_session()
    assert sessions.stop() == [proto]
    proto.connection_lost(None)
    assert [r.get("type") for r in producer.sent] == [None] and sessions.stats["closed_by_stop"] == 1


def test_session_requests_are_checked():
    producer = FakeProducer()
    proto, t = connect(producer)
    proto.data_received(post(b'{"brokerName":"b"}', "/v1/session") + post(b"", "/v1/session/goodbye")
                        + post(json.dumps(HB).encode(), "/v1/session")
                        + post(json.dumps({**HB, "brokerId": 2}).encode(), "/v1/session")
                        + b"GET /v1/session HTTP/1.1\r\nHost: x\r\n\r\n")
    got = responses(t.data)
    assert [s for s, _, _ in got] == [422, 409, 200, 409, 405]
    assert b"clusterName" in got[0][2] and b"already holds" in got[3][2]
    producer.up = False
    proto2, t2 = connect(producer)
    proto2.data_received(post(json.dumps(HB).encode(), "/v1/session"))
    [(status, headers, _)] = responses(t2.data)
    assert status == 503 and headers["retry-after"] == "1"
    proto2.connection_lost(None)  # never opened: nothing to say


def test_text_utf8_cannot_carry_is_a_422_and_the_session_connection_stays():
    """json decodes `"\\ud800"` to a lone surrogate, which no Kafka key can hold: it was a 400 that closed the
    connection (the key's encode raised inside the parser's callback), so a session was dropped."""
    producer = FakeProducer()
    proto, t = connect(producer)
    surrogate = json.dumps(HB).replace('"b"', '"b\\ud800"', 1).encode()
    assert b"ud800" in surrogate
    proto.data_received(post(json.dumps(HB).encode(), "/v1/session") + post(surrogate)
                        + post(surrogate, "/v1/session") + post(json.dumps(HB).encode()))
    got = responses(t.data)
    assert [s for s, _, _ in got] == [200, 422, 422, 200] and not t.closed
    assert b"brokerName" in got[1][2] and len(producer.sent) == 2


def test_a_session_connection_the_worker_closes_itself_says_nothing_and_may_idle_up_to_its_timeout():
    producer = FakeProducer()
    sessions = SessionRegistry(producer)
    proto, t = IngestProtocol(producer, sessions=sessions), FakeTransport()
    proto.connection_made(t)
    assert sessions.idle_limit_s(proto, 5.0) == 5.0  # no session yet: the plain keep-alive limit
    proto.data_received(post(json.dumps({**HB, "heartbeatTimeoutMillis": 30_000}).encode(), "/v1/session"))
    assert sessions.idle_limit_s(proto, 5.0) == 31.0  # a session may idle until its heartbeat timeout judged it
    proto.deadline.on_fire()  # the idle timer (or an oversized request) closes it from this side
    proto.connection_lost(None)
    assert [r.get("type") for r in producer.sent] == [None]  # the session's heartbeat, no `disconnected`
    assert sessions.stats["closed_by_worker"] == 1 and len(sessions) == 0
    # The nodes are told only that the session no longer speaks for its broker (nothing is failed over on it).
    unvouched = producer.to_lane[-1]
    assert unvouched["type"] == records.UNVOUCHED and unvouched["reason"] == records.CLOSED_BY_WORKER
    assert records.validate_unvouched(unvouched)[records.SESSION_OPENED] == unvouched[records.SESSION_OPENED]
    assert sessions.stats["unvouched"] == 1
    stopping = SessionRegistry(producer)  # a stopping worker's closes say nothing at all
    proto, t = IngestProtocol(producer, sessions=stopping), FakeTransport()
    proto.connection_made(t)
    proto.data_received(post(json.dumps(HB).encode(), "/v1/session"))
    stopping.stop()
    before = len(producer.to_lane)
    stopping.closed_by_worker(proto)
    assert len(producer.to_lane) == before and stopping.stats["unvouched"] == 0


def test_a_worker_holds_thousands_of_broker_sessions():
    """Every broker keeps its session connection open: 1,000 sets x 3 replicas over 3 workers is about a
    thousand connections each, which the node API's connection cap (1,000) answered with 503."""
    conns: set = set()
    transports = []
    for _ in range(3000):
        proto, transport = IngestProtocol(FakeProducer(), open_connections=conns), FakeTransport()
        proto.connection_made(transport)
        transports.append(transport)
        proto.deadline.cancel()
    assert len(conns) == 3000 and not any(t.closed or t.data for t in transports)


def test_broker_sessions_multiplexed_on_one_loop_speak_to_the_ingest_server():
    """The simulator's session (electra/broker_session.py) against this server on a real socket: open,
    heartbeats written without waiting (answers through the callback), a pipelined answer split across
    reads, goodbye (shutdown record) and a reset (connection_lost record)."""
    import asyncio

    from electra.broker_session import BrokerSession, parse_answer

    assert parse_answer(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}HTTP/1.1 503") == (200, 40, False)
    assert parse_answer(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{") is None
    assert parse_answer(b"HTTP/1.1 413 X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")[2] is True

    producer = FakeProducer()
    registry = SessionRegistry(producer)

    async def main():
        server = await asyncio.get_running_loop().create_server(
            lambda: IngestProtocol(producer, sessions=registry), "127.0.0.1", 0)
        ep = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
        ident = {"clusterName": "c", "brokerName": "s1", "brokerAddr": "10.0.0.1:10911",
                 "heartbeatTimeoutMillis": 3000, "electionPriority": 1}
        try:
            a, b = BrokerSession(ep, {**ident, "brokerId": 1}), BrokerSession(ep, {**ident, "brokerId": 2})
            assert await a.open(1, 10, 10) == 200 and await b.open(1, 5, 5) == 200
            answers: list[int] = []
            for i in range(3):
                assert a.send_heartbeat(1, 11 + i, 11 + i, answers.append)
                assert not a.send_heartbeat(1, 99, 99, answers.append)  # one request in flight
                for _ in range(100):
                    if not a.busy:
                        break
                    await asyncio.sleep(0.01)
            assert answers == [200, 200, 200]
            await a.goodbye()
            b.abort()
            for _ in range(100):
                if len(registry) == 0:
                    break
                await asyncio.sleep(0.01)
        finally:
            server.close()
            await server.wait_closed()

    asyncio.run(asyncio.wait_for(main(), 30))
    kinds = [(r.get("type", "hb"), r["brokerId"], r.get("reason"), r.get("maxOffset")) for r in producer.sent]
    assert kinds == [("hb", 1, None, 10), ("hb", 2, None, 5), ("hb", 1, None, 11), ("hb", 1, None, 12),
                     ("hb", 1, None, 13), ("disconnected", 1, "shutdown", None),
                     ("disconnected", 2, "connection_lost", None)]


def test_sessions_over_tls_with_tokens_read_through_the_shared_buffer_and_a_reset_is_still_a_crash(tmp_path):
    """The secure default end to end on a real socket: TLS, a broker token checked once per connection,
    both ends reading into the process's one buffer (read_buffer.py); a reset still publishes
    connection_lost and a goodbye shutdown, for the right brokers."""
    import asyncio
    import ssl

    from electra.broker_session import BrokerSession
    from electra.security.auth import TokenStore
    from electra.security.local import ensure_local_credentials

    creds = ensure_local_credentials(tmp_path / "certs", [1])
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(*creds.node_files(1))
    broker = creds.credentials("broker")
    producer = FakeProducer()
    registry = SessionRegistry(producer)
    tokens = TokenStore(creds.tokens_file)

    async def main():
        server = await asyncio.get_running_loop().create_server(
            lambda: IngestProtocol(producer, tokens=tokens, sessions=registry), "127.0.0.1", 0, ssl=tls)
        ep = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
        ident = {"clusterName": "sim", "brokerName": "sim-set-1", "brokerAddr": "10.0.0.1:10911",
                 "heartbeatTimeoutMillis": 3000, "electionPriority": 1}
        context = broker.ssl_context()
        try:
            a = BrokerSession(ep, {**ident, "brokerId": 1}, credentials=broker, ssl_context=context)
            b = BrokerSession(ep, {**ident, "brokerId": 2}, credentials=broker, ssl_context=context)
            assert await a.open(1, 10, 10) == 200 and await b.open(1, 5, 5) == 200
            for i in range(20):
                assert await a.heartbeat(1, 11 + i, 11 + i) == 200
            b.abort()
            await a.goodbye()
            for _ in range(200):
                if len(registry) == 0:
                    break
                await asyncio.sleep(0.01)
        finally:
            server.close()
            await server.wait_closed()

    asyncio.run(asyncio.wait_for(main(), 30))
    ends = [(r["brokerId"], r["reason"]) for r in producer.sent if r.get("type") == "disconnected"]
    assert sorted(ends) == [(1, "shutdown"), (2, "connection_lost")]
    assert [r["maxOffset"] for r in producer.sent if r["brokerId"] == 1 and "type" not in r] == [10, *range(11, 31)]


def test_a_slow_answer_keeps_the_session_connection():
    """A session whose answer is late is slow, not crashed: resetting it would publish connection_lost (a
    false crash failover of a healthy broker behind an overloaded ingest worker)."""
    import asyncio

    from electra.broker_session import BrokerSession, SessionTimeout

    async def main():
        writers = []

        async def slow(reader, writer):
            writers.append(writer)
            await reader.readuntil(b"\r\n\r\n")

        server = await asyncio.start_server(slow, "127.0.0.1", 0)
        s = BrokerSession(f"127.0.0.1:{server.sockets[0].getsockname()[1]}", {"brokerName": "s1"}, timeout_s=0.2)
        try:
            try:
                await s.open(1, 1, 1)
                raise AssertionError("no answer came: open() must time out")
            except SessionTimeout:
                pass
            assert s.is_open and s.busy and not s.overdue(factor=6)
            writers[0].write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")  # the late answer
            for _ in range(100):
                if not s.busy:
                    break
                await asyncio.sleep(0.01)
            assert s.is_open and not s.busy
            s.abort()
        finally:
            server.close()
            await server.wait_closed()

    asyncio.run(asyncio.wait_for(main(), 30))


def test_a_session_whose_token_is_revoked_ends_at_its_next_request_and_says_nothing(tmp_path):
    """A refused request on a session's connection closes it as this worker's doing: no `connection_lost` (the
    heartbeat timeout judges the broker), and a revoked broker cannot hold the connection with refused requests."""
    from electra.security.auth import TokenStore, create_token, revoke_tokens

    path = tmp_path / "tokens.json"
    token = create_token(path, "broker", "rack-a", broker_sets=["*"])
    producer = FakeProducer()
    sessions = SessionRegistry(producer)
    proto = IngestProtocol(producer, tokens=TokenStore(path, check_interval_s=0), sessions=sessions)
    t = FakeTransport()
    proto.connection_made(t)
    auth = f"Authorization: Bearer {token}\r\n"
    proto.data_received(post(json.dumps(HB).encode(), "/v1/session", extra=auth))
    assert [s for s, _, _ in responses(t.data)] == [200] and len(sessions) == 1
    revoke_tokens(path, "rack-a")
    proto.data_received(post(json.dumps(HB).encode(), extra=auth))
    assert [s for s, _, _ in responses(t.data)] == [200, 401] and t.closed
    proto.connection_lost(None)
    assert [r.get("type") for r in producer.sent] == [None] and len(sessions) == 0
    assert sessions.stats["closed_by_worker"] == 1 and sessions.stats["lost"] == 0


def test_a_head_whose_end_marker_straddles_two_reads_is_not_counted_with_its_body():
    """The read after such a split begins with the rest of CRLF CRLF and then the body: taken for head, a 40 KiB
    body made a 431 of a request whose head was a hundred bytes."""
    body = b'{"pad": "' + b"x" * (40 << 10) + b'"}'
    request = post(body)
    split = request.index(b"\r\n\r\n") + 3  # the read ends after CR LF CR
    proto, transport = connect(FakeProducer())
    proto.data_received(request[:split])
    proto.data_received(request[split:])
    [(status, _, _)] = responses(transport.data)
    assert status != 431 and status in (413, 422), status


def test_a_fault_of_the_worker_is_a_logged_500_not_the_broker_s_malformed_request(caplog):
    """An exception in a parser callback reaches `feed_data` as httptools' parser error: it used to be answered
    400 "malformed HTTP request", blaming the broker, with nothing in the worker's log."""
    producer = FakeProducer()

    def broken(_hb: dict) -> None:
        raise RuntimeError("a bug in the worker")

    producer.submit = broken
    proto, transport = connect(producer)
    with caplog.at_level("ERROR"):
        proto.data_received(post(json.dumps(HB).encode()))
    [(status, _, body)] = responses(transport.data)
    assert status == 500 and json.loads(body)["code"] == 1 and transport.closed
    assert "a request failed" in caplog.text and "a bug in the worker" in caplog.text
    # bytes that are not HTTP are still the sender's mistake
    proto, transport = connect(FakeProducer())
    proto.data_received(b"NOT HTTP\r\n\r\n")
    assert [s for s, _, _ in responses(transport.data)] == [400]


class Clock:
    """A monotonic clock a test moves (seconds)."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _silence_rig(others: int = 2) -> tuple[FakeProducer, SessionRegistry, IngestProtocol, list, Clock]:
    """A registry on a test clock with the session of broker b/1 and `others` more sessions (b/2, ...) on it."""
    clock = Clock()
    producer = FakeProducer()
    sessions = SessionRegistry(producer, mono=clock)
    protos = []
    for i in range(1 + others):
        proto, t = IngestProtocol(producer, sessions=sessions), FakeTransport()
        proto.connection_made(t)
        proto.data_received(post(json.dumps({**HB, "brokerId": 1 + i}).encode(), "/v1/session"))
        protos.append(proto)
    return producer, sessions, protos[0], protos[1:], clock


def _beat(proto: IngestProtocol, **fields) -> None:
    proto.data_received(post(json.dumps({**HB, **fields}).encode()))


def _pass(sessions: SessionRegistry, clock: Clock, seconds: float, others: list[IngestProtocol]) -> int:
    """Let `seconds` pass, swept every 0.1 s, while `others` (brokers b/2, ...) heartbeat every second; the silences
    found."""
    found = 0
    for step in range(round(seconds * 10)):
        clock.t += 0.1
        if step % 10 == 0:
            for o in others:
                _beat(o, brokerId=sessions._by_conn[o].hb["brokerId"])
        found += sessions.sweep(int(time.time() * 1000))
    return found


def test_a_session_whose_broker_sends_no_heartbeat_for_its_timeout_is_reported_silent_once_per_silence():
    """A hung master keeps its connection and sends nothing: after its heartbeat timeout the worker says so on the
    liveness topic (the controllers' lane elects from it, api/connection_loss.py), once, until it heartbeats again."""
    producer, sessions, proto, others, clock = _silence_rig()
    s = sessions._by_conn[proto]
    opened = s.heard_ms
    assert s.timeout_ms == 10_000  # the heartbeat's default
    assert _pass(sessions, clock, 9.9, others) == 0
    clock.t += 0.11  # (past the boundary, whatever the float sums)
    assert sessions.sweep(opened + 10_000) == 1
    silent = producer.to_lane[-1]
    assert silent == {"type": "silent", **{k: HB[k] for k in ("clusterName", "brokerName", "brokerAddr")},
                      "brokerId": 1, "ts": opened + 10_000, "lastHeartbeatMs": opened,
                      "heartbeatTimeoutMillis": 10_000, "sessionOpenedMs": opened}
    assert _pass(sessions, clock, 5, others) == 0 and sessions.stats["silent"] == 1  # once per silence
    # It heartbeats again (with a shorter timeout): a new silence is counted from that heartbeat.
    _beat(proto, heartbeatTimeoutMillis=3_000)
    assert not s.silent and s.timeout_ms == 3_000 and s.heard_ms >= opened
    assert _pass(sessions, clock, 2.9, others) == 0
    assert _pass(sessions, clock, 0.1, others) == 1
    # Another broker's heartbeat on the session's connection (another id, set or cluster) is not its broker's.
    for other_broker in ({"brokerId": 9}, {"brokerName": "x"}, {"clusterName": "x"}):
        _beat(proto, **other_broker)
        assert s.silent, other_broker
    assert [r.get("type") for r in producer.to_lane].count("silent") == 2


def test_silence_is_judged_on_the_monotonic_clock_not_the_wall_clock():
    """A wall-clock step (NTP, a resume) is no silence; the record still carries wall-clock instants."""
    producer, sessions, proto, others, clock = _silence_rig()
    heard = sessions._by_conn[proto].heard_ms
    clock.t += 0.1
    assert sessions.sweep(heard + 3_600_000) == 0  # the wall clock jumped an hour; 0.1 s passed
    assert _pass(sessions, clock, 9.8, others) == 0
    clock.t += 0.11  # (past the boundary, whatever the float sums)
    assert sessions.sweep(heard - 60_000) == 1  # 10 s passed; the wall clock stepped back a minute since
    rec = producer.to_lane[-1]
    assert rec["lastHeartbeatMs"] == heard and rec["ts"] == heard + 10_000  # never dated before a whole timeout


def test_a_stalled_worker_gives_every_session_a_whole_timeout_again_and_says_so():
    """After the worker itself stalled (SIGSTOP, no CPU), its sockets may hold heartbeats it has not read yet: a
    silence is counted from the stall's end, not from the last heartbeat it read."""
    producer, sessions, proto, others, clock = _silence_rig()
    heard = sessions._by_conn[proto].heard_ms
    assert sessions.sweep(heard) == 0
    clock.t += 30.0  # the first sweep after a 30 s gap
    assert sessions.sweep(heard + 30_000) == 0 and sessions.stats["stalled_sweeps"] == 1
    assert _pass(sessions, clock, 9.9, others) == 0
    clock.t += 0.11  # (past the boundary, whatever the float sums)
    assert sessions.sweep(heard + 40_000) == 1
    assert producer.to_lane[-1]["lastHeartbeatMs"] == heard  # the record still says when it was last heard
    clock.t += 0.11  # (past the boundary, whatever the float sums)
    assert sessions.sweep(heard + 40_100) == 0 and sessions.stats["stalled_sweeps"] == 1  # regular sweeps again
    clock.t += 0.9
    sessions.sweep(heard + 41_000)
    assert sessions.stats["stalled_sweeps"] == 1  # 0.9 s apart: a slow loop, not a stall
    clock.t += 1.5
    sessions.sweep(heard + 42_500)
    assert sessions.stats["stalled_sweeps"] == 2  # 1.5 s apart: a stall


def test_when_every_session_of_a_worker_falls_silent_together_none_is_reported():
    """A stalled load generator, a partition without resets: the brokers' side as a whole went quiet, and the job
    (whose data horizon stops) must judge them; a fleet-wide silence fails nothing over. A stopping worker says
    nothing either."""
    producer, sessions, proto, others, clock = _silence_rig(others=3)
    heard = sessions._by_conn[proto].heard_ms
    for step in range(1, 120):  # 12 s of silence everywhere, swept every 0.1 s
        clock.t += 0.1
        sessions.sweep(heard + 100 * step)
    assert sessions.stats["silent"] == 0 and sessions.stats["silent_unreported"] == 4
    # no `silent` record; each session only stops speaking for its broker at the nodes (`unvouched`)
    assert [r["type"] for r in producer.to_lane] == ["connected"] * 4 + [records.UNVOUCHED] * 4
    assert {r["reason"] for r in producer.to_lane[4:]} == {records.SILENCE_UNREPORTED}
    for o in others:  # they come back; broker 1 does not: still not reported (it went silent with the rest)
        _beat(o, brokerId=sessions._by_conn[o].hb["brokerId"])
    clock.t += 0.11  # (past the boundary, whatever the float sums)
    assert sessions.sweep(heard + 12_000) == 0
    _, stopping, _, others, clock = _silence_rig()
    stopping.stop()
    assert _pass(stopping, clock, 12, others) == 0 and stopping.stats["silent_unreported"] == 0


def test_a_silence_staggered_over_a_few_heartbeats_or_with_a_short_timeout_is_still_not_reported():
    """The brokers stop one after another over 2 s (a load generator slowing before it stalls), with the bench's
    3 s timeout; or with a 500 ms timeout: a quorum of the worker's other sessions must have spoken since the
    middle of a silence for it to be reported, not just one heartbeat anywhere (the second review's case)."""
    for timeout_ms, stagger_s in ((3_000, 2.0), (500, 0.4)):
        producer, sessions, _, others, clock = _silence_rig(others=19)
        protos = list(sessions._by_conn)
        stops = {p: clock.t + stagger_s * i / len(protos) for i, p in enumerate(protos)}  # the last stops 2 s on
        for p in protos:
            _beat(p, brokerId=sessions._by_conn[p].hb["brokerId"], heartbeatTimeoutMillis=timeout_ms)
        for _ in range(round((stagger_s + 3 * timeout_ms / 1000) * 20)):  # swept every 50 ms; heartbeats every 0.1 s
            clock.t += 0.05
            for p in protos:
                if clock.t < stops[p] and round(clock.t * 20) % 2 == 0:
                    _beat(p, brokerId=sessions._by_conn[p].hb["brokerId"], heartbeatTimeoutMillis=timeout_ms)
            sessions.sweep(int(time.time() * 1000))
        assert sessions.stats["silent"] == 0 and sessions.stats["silent_unreported"] == 20, (timeout_ms, sessions.stats)
    # A worker with a single other session has no quorum to judge by: left to the job.
    producer, sessions, proto, others, clock = _silence_rig(others=1)
    assert _pass(sessions, clock, 11, others) == 0 and sessions.stats["silent_unreported"] == 1


class _CountedSessions(dict):
    """A registry's sessions by connection, counting the sweeps that looked at them."""

    looked = 0

    def values(self):
        self.looked += 1
        return super().values()


def test_sweeps_look_at_the_sessions_only_from_the_earliest_deadline_and_miss_no_silence():
    """Ten sweeps a second over every session were 3% of a worker's CPU at 1,000 sessions; a session's deadline only
    moves later with its heartbeats, so the sweeps before the earliest one look at none. A silence is still found at
    the first sweep past its deadline, also where a heartbeat brought a deadline earlier (a shorter timeout)."""
    producer, sessions, proto, others, clock = _silence_rig(others=4)
    counted = _CountedSessions(sessions._by_conn)
    sessions._by_conn = counted
    for o in [proto, *others]:
        _beat(o, brokerId=sessions._by_conn[o].hb["brokerId"], heartbeatTimeoutMillis=3_000)
    s = sessions._by_conn[proto]
    assert _pass(sessions, clock, 2.9, others) == 0  # 29 sweeps; broker 1 silent since the start
    assert counted.looked <= 2, counted.looked
    assert _pass(sessions, clock, 0.1, others) == 1 and s.silent  # at the first sweep past its 3 s
    looked = counted.looked
    assert _pass(sessions, clock, 10, others) == 0 and counted.looked - looked <= 10  # 100 sweeps
    _beat(proto, heartbeatTimeoutMillis=10_000)  # back, with a long timeout
    assert _pass(sessions, clock, 1.0, others) == 0
    _beat(proto, heartbeatTimeoutMillis=1_000)  # then a short one: its deadline came earlier than any known
    assert _pass(sessions, clock, 0.9, others) == 0
    assert _pass(sessions, clock, 0.2, others) == 1
    newcomer, t = IngestProtocol(producer, sessions=sessions), FakeTransport()  # a new session, with a short timeout
    newcomer.connection_made(t)
    newcomer.data_received(post(json.dumps({**HB, "brokerId": 9, "heartbeatTimeoutMillis": 500}).encode(),
                                "/v1/session"))
    assert _pass(sessions, clock, 0.4, others) == 0
    assert _pass(sessions, clock, 0.2, others) == 1 and sessions._by_conn[newcomer].silent


def test_a_silence_that_ends_with_the_same_timeout_is_found_again_at_its_new_deadline():
    """A session's silence ends with a heartbeat of the same timeout: its new deadline may come before every deadline
    the last full sweep knew of (here the other sessions' 10 s against its 3 s), so that heartbeat must lower the
    sweeps' bound too, not only a changed timeout does; its next silence is found at its own deadline."""
    _producer, sessions, proto, others, clock = _silence_rig(others=4)
    _beat(proto, heartbeatTimeoutMillis=3_000)
    s = sessions._by_conn[proto]
    assert _pass(sessions, clock, 3.1, others) == 1 and s.silent  # the others keep their 10 s timeout
    _beat(proto, heartbeatTimeoutMillis=3_000)  # back, its timeout unchanged
    assert not s.silent
    assert _pass(sessions, clock, 2.9, others) == 0
    assert _pass(sessions, clock, 0.2, others) == 1 and s.silent  # at its 3 s, not at the others' 10 s


def test_a_heartbeat_taken_the_slow_way_or_refused_for_kafka_still_shows_the_session_alive(monkeypatch):
    import electra.api.ingest_server as server

    producer, sessions, proto, _, clock = _silence_rig(others=0)
    s = sessions._by_conn[proto]
    s.heard_ms = 1  # long ago
    clock.t += 1
    monkeypatch.setattr(server, "fast_heartbeat", lambda raw: None)  # the slow path (json + validate_heartbeat)
    _beat(proto, heartbeatTimeoutMillis=4_000)
    assert s.heard_ms > 1 and s.timeout_ms == 4_000 and s.heard_mono == clock.t
    s.heard_ms = 1
    monkeypatch.undo()
    producer.up = False  # Kafka is down: a 503, but the broker is there
    clock.t += 1
    _beat(proto)
    assert s.heard_ms > 1 and s.heard_mono == clock.t
    s.heard_ms = 1
    proto.data_received(post(b'{"clusterName":"c"}'))  # an invalid one is not a heartbeat
    assert s.heard_ms == 1


def test_a_session_heartbeat_whose_numbers_are_text_or_floats_is_heard_as_its_integers():
    """The slow way reads `"2"` and `2.0` as 2 (docs/heartbeat-pipeline.md); the session must be told the integers it
    validated, not the body's JSON: a text timeout was stored and the idle limit raised TypeError (a 500 that closed
    the session's connection after the heartbeat was produced), `"1" != 1` left the session never heard (a
    spurious `silent` record), and a float timeout put a float `ts` in the `silent` record the nodes refuse."""
    producer, sessions, proto, others, clock = _silence_rig()
    s, t = sessions._by_conn[proto], proto.transport
    for fields, timeout_ms in (({"heartbeatTimeoutMillis": "3000"}, 3_000),
                               ({"brokerId": "1", "heartbeatTimeoutMillis": 4000.0}, 4_000),
                               ({"brokerId": 1.0}, 10_000)):  # (no timeout given: the default again)
        s.heard_ms, s.silent = 1, True
        clock.t += 1
        _beat(proto, **fields)
        assert responses(t.data)[-1][0] == 200 and not t.closed, fields
        assert s.heard_ms > 1 and not s.silent and s.heard_mono == clock.t, fields
        assert s.timeout_ms == timeout_ms and type(s.timeout_ms) is int, fields
        assert sessions.idle_limit_s(proto, 1.0) == timeout_ms / 1000 + 1
    _beat(proto, heartbeatTimeoutMillis=3000.0)
    assert _pass(sessions, clock, 3.1, others) == 1
    silent = producer.to_lane[-1]
    assert silent["type"] == "silent" and silent["heartbeatTimeoutMillis"] == 3_000
    assert type(silent["ts"]) is int and records.validate_silent(silent)["ts"] == silent["ts"]  # as a node reads it


def test_a_heartbeat_that_raises_the_timeout_raises_the_connection_s_idle_limit():
    producer, sessions, proto, _, clock = _silence_rig(others=0)
    armed: list[float] = []

    class Deadline:  # (no event loop here: the deadlines armed are recorded)
        def arm(self, transport, seconds: float, reply: bytes = b"") -> None:
            armed.append(seconds)

        def cancel(self) -> None:
            pass

    proto.deadline = Deadline()
    assert sessions.idle_limit_s(proto, proto.limits.idle_timeout_s) == 11.0
    _beat(proto, heartbeatTimeoutMillis=30_000)
    assert armed[-1] == 31.0  # re-armed after the heartbeat, not only before it (with the old 11 s)


def test_the_worker_sweeps_for_silent_sessions_on_its_loop_and_a_failing_sweep_does_not_end_it():
    import asyncio

    from electra.api.ingest_server import sweep_silent_sessions

    class Registry:
        calls = 0

        def sweep(self, now_ms: int) -> int:
            Registry.calls += 1
            if Registry.calls == 1:
                raise RuntimeError("a fault")
            return 0

    async def main() -> None:
        task = asyncio.create_task(sweep_silent_sessions(Registry(), every_s=0.01))
        for _ in range(200):  # bounded: 2 s
            if Registry.calls >= 3:
                break
            await asyncio.sleep(0.01)
        task.cancel()

    asyncio.run(main())
    assert Registry.calls >= 3


def _reuseport_listener():
    """A listener as another `electra ingest`'s worker holds its port: SO_REUSEPORT, on a free loopback port."""
    import socket

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    return sock


def test_ingest_refuses_a_port_another_process_serves_with_so_reuseport(monkeypatch, capsys):
    """QA: a second `electra ingest` on the first one's port bound beside it (both SO_REUSEPORT) and the kernel
    split the connections between the two; the parent's check now binds without SO_REUSEPORT first."""
    from electra import cli
    from electra.api import ingest_server

    class NoWorkers:  # the old check passed and started workers: this ends the test at once instead
        def Process(self, *args, **kwargs):
            raise AssertionError("workers started on a port another process serves")

    monkeypatch.setattr(ingest_server.multiprocessing, "get_context", lambda _method: NoWorkers())
    with _reuseport_listener() as other:
        port = other.getsockname()[1]
        with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{port}: Address already in use"):
            ingest_server.serve_ingest("127.0.0.1", port, "127.0.0.1:1", workers=1)
        served = []
        monkeypatch.setattr(ingest_server, "serve_ingest", lambda *a, **kw: served.append(a))
        assert cli.main(["ingest", "--insecure", "--listen", f"127.0.0.1:{port}", "--kafka-bootstrap",
                         "127.0.0.1:1", "--workers", "1"]) == 1
    err = capsys.readouterr().err
    assert f"error: cannot listen on 127.0.0.1:{port} (--listen): Address already in use" in err, err
    assert not served


def test_the_parent_s_check_leaves_a_port_free_for_its_own_workers_to_share():
    """The check closes its probe: the command's SO_REUSEPORT workers still bind the port together."""
    import socket

    from electra.api.ingest_server import _listen
    from electra.api.ports import port_taken

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert port_taken("127.0.0.1", port) is None
    with _listen("127.0.0.1", port) as a, _listen("127.0.0.1", port) as b:
        assert a.getsockname() == b.getsockname()
        assert port_taken("127.0.0.1", port) is not None  # and a third process is refused


def test_a_body_not_sent_as_json_is_a_415_as_at_the_node():
    """As the node's API (FastAPI's strict content type): a body without a Content-Type, or as text/plain or a form,
    is never read as JSON; a browser sends such a body cross-site without asking the server first."""
    body = json.dumps(HB).encode()

    def ask(content_type: str | None, path: str = "/v1/heartbeat", data: bytes = body) -> tuple[int, dict]:
        producer = FakeProducer()
        proto, transport = connect(producer)
        head = f"POST {path} HTTP/1.1\r\nHost: x\r\n" + (f"Content-Type: {content_type}\r\n" if content_type else "")
        proto.data_received(head.encode() + b"Content-Length: %d\r\n\r\n" % len(data) + data)
        [(status, _, answer)] = responses(transport.data)
        return status, json.loads(answer)

    for refused in (None, "text/plain", "application/x-www-form-urlencoded", "application/jsonx"):
        for path in ("/v1/heartbeat", "/v1/session"):
            status, answer = ask(refused, path)
            assert status == 415 and answer == {"code": 2005, "remark": SEND_JSON}, (refused, path)
    for taken in ("application/json", "Application/JSON; charset=utf-8", "application/problem+json"):
        assert ask(taken)[0] == 200, taken
    status, answer = ask(None, data=b"")  # nothing sent: the body is what is wrong
    assert status == 422 and answer["errors"][0]["field"] == "body"


def test_a_node_s_front_ends_refuse_a_port_another_process_serves_with_so_reuseport(tmp_path):
    """The same check for `electra node --front-ends N`: its front-ends bind the API port with SO_REUSEPORT, and the
    parent's check did too, so a node started on another's port shared it silently."""
    import asyncio

    from electra.api.front_ends import FrontEnds

    with _reuseport_listener() as other:
        port = other.getsockname()[1]
        fronts = FrontEnds.__new__(FrontEnds)
        fronts.host, fronts.port = "127.0.0.1", port
        with pytest.raises(RuntimeError, match=f"cannot listen on 127.0.0.1:{port} \\(--http-addr\\): Address "):
            asyncio.run(fronts.start(ready_timeout_s=1))


def test_an_absolute_form_or_percent_encoded_path_names_its_route_as_at_the_node():
    """RFC 9112 has every server accept an absolute-form target (what a client sends through a proxy); the node
    (uvicorn) took it and a percent-encoded path, the ingest workers answered 404."""
    body = json.dumps(HB).encode()
    for target in ("http://127.0.0.1:7401/v1/heartbeat", "/v1/%68eartbeat", "/v1/heartbeat?x=1"):
        producer = FakeProducer()
        proto, transport = connect(producer)
        proto.data_received(post(body).replace(b"POST /v1/heartbeat ", f"POST {target} ".encode(), 1))
        assert [s for s, _, _ in responses(transport.data)] == [200], target
        assert len(producer.sent) == 1
    for target in ("http://h/v1/heartbea", "/v1/%2568eartbeat", "*"):  # decoded once: %2568 is "%68", no route
        proto, transport = connect(FakeProducer())
        proto.data_received(post(body).replace(b"POST /v1/heartbeat ", f"POST {target} ".encode(), 1))
        assert [s for s, _, _ in responses(transport.data)] == [404], target


@pytest.mark.parametrize("exitcode, said", [(-9, "killed by SIGKILL"), (-15, "killed by SIGTERM"), (0, "exit code 0"),
                                            (1, "exit code 1")])
def test_ingest_exits_1_naming_the_worker_when_one_ends_without_being_asked(exitcode, said, monkeypatch):
    """A lone worker SIGTERMed (or ending with 0) made `electra ingest` stop the others and exit 0: a supervisor
    restarting on failure (systemd's Restart=on-failure) left the node without heartbeat ingest."""
    from electra.api import ingest_server

    class Worker:
        def __init__(self, name: str, lives: int) -> None:
            self.name, self.lives, self.exitcode = name, lives, None

        def start(self) -> None:
            pass

        def is_alive(self) -> bool:
            if self.exitcode is None and self.lives <= 0:
                self.exitcode = exitcode
            self.lives -= 1
            return self.exitcode is None

        def terminate(self) -> None:
            self.exitcode = -15

        def join(self, timeout: float) -> None:
            pass

    lives = iter([10**6, 2])  # the second worker ends by itself after two looks
    workers: list[Worker] = []

    class Context:
        def Process(self, *, name: str, **kwargs):
            workers.append(Worker(name, next(lives)))
            return workers[-1]

    monkeypatch.setattr(ingest_server.multiprocessing, "get_context", lambda _method: Context())
    monkeypatch.setattr(ingest_server, "port_taken", lambda host, port: None)
    monkeypatch.setattr(ingest_server.time, "sleep", lambda _s: None)
    monkeypatch.setattr(ingest_server.signal, "signal", lambda *_a: None)  # the test process keeps its handlers
    monkeypatch.setattr(ingest_server, "exit_if_stop_hangs", lambda what: None)  # its timer would end pytest
    with pytest.raises(SystemExit) as exit_:
        ingest_server.serve_ingest("127.0.0.1", 1, "127.0.0.1:1", workers=2)
    assert exit_.value.code == f"error: ingest worker ingest-worker-1 ended on its own ({said}); stopped the other " \
                              "workers"
    assert workers[0].exitcode == -15  # the other one was stopped
