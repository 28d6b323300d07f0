"""Hostile HTTP clients against real controller nodes (uvicorn on loopback): bounded numbers, bodies, heads,
slow clients, connections and watchers (docs/security.md, "Containment"; docs/controller-api.md)."""

from __future__ import annotations

import asyncio
import json
import re
import time

import httpx
import pytest
from inprocess_cluster import start_cluster, wait_leader

from electra.api.http_limits import HTTPLimits
from electra.state.codes import Code

pytestmark = pytest.mark.integration

LIMITS = HTTPLimits(request_timeout_s=1.0, max_connections=40, max_watchers=3)


def _run(tmp_path, scenario, limits=LIMITS):
    async def main():
        nodes, http = await start_cluster(tmp_path, scan_interval_s=0.2, http_limits=limits)
        try:
            leader = await wait_leader(nodes)
            async with httpx.AsyncClient(base_url=f"http://{http[leader]}", timeout=10) as client:
                await scenario(nodes, leader, http[leader], client)
        finally:
            for n in nodes.values():
                await n.stop()

    asyncio.run(asyncio.wait_for(main(), 90))


async def _exchange(ep: str, data: bytes, *, pause: float = 0.0, tail: bytes = b"") -> tuple[bytes, float]:
    """Send raw bytes (then `tail` in three slow pieces) and read until the server closes; (reply, seconds)."""
    host, port = ep.split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    t0 = time.monotonic()
    try:
        writer.write(data)
        for _ in range(3 if tail else 0):
            await asyncio.sleep(pause)
            writer.write(tail)
        reply = await asyncio.wait_for(reader.read(65536), 10)
        return reply, time.monotonic() - t0
    finally:
        writer.close()


async def _read_all(ep: str, data: bytes, tail: bytes = b"") -> bytes:
    """Send `data`, then `tail` a moment later, and read everything until the server closes (10 s at most)."""
    host, port = ep.split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(data)
        if tail:
            await asyncio.sleep(0.2)
            writer.write(tail)
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


def _statuses(raw: bytes) -> list[int]:
    """The status of every response in a byte stream (a JSON body has no line end before the next one)."""
    return [int(m) for m in re.findall(rb"HTTP/1\.1 (\d{3}) ", raw)]


def _hb(**over):
    return {"clusterName": "c", "brokerName": "b", "brokerAddr": "10.0.0.1:10911", "brokerId": 1, "epoch": 1,
            "maxOffset": 5, **over}


async def _register(client, name="b"):
    r = await client.post(f"/v1/broker-sets/{name}/apply-broker-id",
                          json={"clusterName": "c", "brokerId": 1, "registerCheckCode": "10.0.0.1:10911;1"})
    assert r.json()["code"] == 0, r.text
    assert (await client.post("/v1/heartbeat", json=_hb(brokerName=name))).status_code == 200
    r = await client.post(f"/v1/broker-sets/{name}/register",
                          json={"clusterName": "c", "brokerId": 1, "brokerAddress": "10.0.0.1:10911"})
    assert r.json()["code"] == 0, r.text


def test_numbers_beyond_javas_types_are_422_naming_the_field_and_never_poison_a_set(tmp_path):
    async def scenario(nodes, leader, ep, client):
        await _register(client)
        for field, value in (("epoch", 2**64), ("epoch", 2**31), ("electionPriority", -(2**31) - 1),
                             ("maxOffset", 2**63), ("confirmOffset", -(2**70))):
            r = await client.post("/v1/heartbeat", json=_hb(**{field: value}))
            assert r.status_code == 422, (field, r.text)
            body = r.json()
            assert body["code"] == Code.CONTROLLER_INVALID_REQUEST
            assert [e["field"] for e in body["errors"]] == [f"body.{field}"]
            assert str(value) not in r.text  # the value is never echoed
        # Every write on the set still works (a 2**64 epoch used to make them all 500).
        r = await client.post("/v1/broker-sets/b/elect-master", json={"clusterName": "c", "brokerId": 1})
        assert r.status_code == 200 and r.json()["header"]["masterBrokerId"] == 1, r.text
        epoch = r.json()["header"]["masterEpoch"]
        for bad in ({"masterEpoch": 2**64}, {"syncStateSetEpoch": 2**64}, {"syncStateSet": [2**64]},
                    {"masterBrokerId": 2**64}, {"masterEpoch": 2**31}):
            body = {"masterBrokerId": 1, "masterEpoch": epoch, "syncStateSet": [1], "syncStateSetEpoch": 1, **bad}
            r = await client.post("/v1/broker-sets/b/sync-state-set", json=body)
            assert r.status_code == 422, (bad, r.text)
        live = {"broker_id": 1, "broker_addr": "10.0.0.1:10911", "last_update_ms": 1}
        for bad in ({"expectedMasterEpoch": 2**64}, {"proposedAtMs": 2**64},
                    {"live": [{**live, "epoch": 2**64}]}, {"live": [{**live, "max_offset": 2**64}]},
                    {"live": [{**live, "priority": 2**31}]}):
            body = {"clusterName": "c", "expectedMasterEpoch": epoch, "live": [live], **bad}
            r = await client.post("/v1/internal/broker-sets/b/elect-master", json=body)
            assert r.status_code == 422, (bad, r.text)
        r = await client.post("/v1/broker-sets/b/sync-state-set", json={
            "masterBrokerId": 1, "masterEpoch": epoch, "syncStateSet": [1], "syncStateSetEpoch": 1})
        assert r.status_code in (200, 409) and r.json()["code"] != Code.SYSTEM_ERROR, r.text

    _run(tmp_path, scenario)


def test_big_bodies_are_413_before_being_read_and_errors_never_echo_input(tmp_path):
    async def scenario(nodes, leader, ep, client):
        term = nodes[leader].node.core.term
        # 100 MB announced: refused from the Content-Length alone, the body is never read.
        reply, _ = await _exchange(ep, b"POST /v1/heartbeat HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                                       b"\r\nContent-Length: 100000000\r\n\r\n" + b"[" * 65536)
        assert reply.startswith(b"HTTP/1.1 413"), reply
        # A chunked body (no Content-Length) is cut off as soon as it passes the limit.
        chunk = b"10000\r\n" + b" " * 65536 + b"\r\n"
        reply, _ = await _exchange(ep, b"POST /v1/heartbeat HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                                       b"\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk * 20)
        assert reply.startswith(b"HTTP/1.1 413") and b'"code": 2005' in reply, reply
        # Under the limit but invalid: a 422 that names the field, never the value.
        marker = "Z" * 5000
        r = await client.post("/v1/heartbeat", json=_hb(brokerAddr=marker, clusterName=marker + "!"))
        assert r.status_code == 422 and "ZZZZ" not in r.text and len(r.content) < 2000, r.text
        r = await client.post("/v1/heartbeat", content=b'{"brokerName": "' + b"Q" * 10000,
                              headers={"content-type": "application/json"})
        assert r.status_code == 422 and "QQQQ" not in r.text, r.text
        assert nodes[leader].node.is_leader and nodes[leader].node.core.term == term

    _run(tmp_path, scenario)


def test_slow_and_oversized_request_heads_are_cut_off(tmp_path):
    async def scenario(nodes, leader, ep, client):
        # Slowloris: a head that never ends gets a 408 and a closed connection after request_timeout_s.
        reply, took = await _exchange(ep, b"POST /v1/heartbeat HTTP/1.1\r\nHost: x\r\n", pause=0.3,
                                      tail=b"X-Slow: 1\r\n")
        assert reply.startswith(b"HTTP/1.1 408") and took < 4, (reply, took)
        # The same for a body that trickles in.
        reply, took = await _exchange(ep, b"POST /v1/heartbeat HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n",
                                      pause=0.3, tail=b" ")
        assert reply.startswith(b"HTTP/1.1 408") and took < 4, (reply, took)
        # A head bigger than max_header_bytes: 431.
        reply, _ = await _exchange(ep, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (64 << 10) + b"\r\n\r\n")
        assert reply.startswith(b"HTTP/1.1 431"), reply
        assert (await client.get("/healthz")).status_code == 200
        # ... also behind an earlier request on the same connection (the head then begins inside a read
        # that carries the end of the request before), whether it ends in that read or goes on past it;
        # one answer each, no 400 after the 431.
        big = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (60 << 10) + b"\r\n\r\n"
        first = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
        for data, tail in ((first + big, b""), (first + big[:20 << 10], big[20 << 10:])):
            statuses = _statuses(await _read_all(ep, data, tail))
            assert statuses == [200, 431], statuses
        small = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (20 << 10) + b"\r\n\r\n"
        statuses = _statuses(await _read_all(ep, first + small + small + b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
                                             b"Connection: close\r\n\r\n"))
        assert statuses == [200, 200, 200, 200], statuses  # the control
        # A head whose CRLF CRLF straddles two reads: the next read's body is not head (it made a 431).
        body = b'{"pad": "' + b"x" * (40 << 10) + b'"}'
        req = (b"POST /v1/heartbeat HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
               b"Content-Length: %d\r\n\r\n" % len(body)) + body
        split = req.index(b"\r\n\r\n") + 3
        statuses = _statuses(await _read_all(ep, req[:split], req[split:]))
        assert statuses == [422], statuses
        # Bytes that are not HTTP: a 400 in JSON, as every other answer (it was uvicorn's text/plain), and a close.
        raw = await _read_all(ep, b"NOT HTTP AT ALL\r\n\r\n")
        head, _, body = raw.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400") and b"content-type: application/json" in head.lower(), raw
        assert json.loads(body) == {"code": Code.CONTROLLER_INVALID_REQUEST, "remark": "malformed HTTP request"}
        assert (await client.get("/healthz")).status_code == 200

    _run(tmp_path, scenario)


async def _read_reply(reader) -> bytes:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length"))
    return head + await asyncio.wait_for(reader.readexactly(length), 5)


def test_a_kept_alive_connection_busy_past_the_request_timeout_stays_and_a_slow_request_on_it_is_cut(tmp_path):
    """The request deadline is armed at each request's start and disarmed at its end without a timer per
    request (http_limits.LazyDeadline): the timer armed for an earlier request must neither cut a
    request still in its time nor a connection that kept busy, nor let a later slow request run long."""
    async def scenario(nodes, leader, ep, client):
        await _register(client, "kept")
        host, port = ep.split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            for i in range(4):  # ~3 s of requests taking 0.7 s each, under the 1 s timeout: a timer armed for
                # an earlier request fires in the middle of a later one, which must go on
                await asyncio.sleep(0.05)
                path = b"/v1/broker-sets/kept/replica-info" if i % 2 else b"/healthz"  # lean path, then FastAPI
                writer.write(b"GET " + path + b" HTTP/1.1\r\n")
                await asyncio.sleep(0.7)
                writer.write(b"Host: x\r\n\r\n")
                reply = await _read_reply(reader)
                assert reply.startswith(b"HTTP/1.1 200"), (i, reply)
            await asyncio.sleep(0.5)  # then one that never ends, on the same connection
            t0 = time.monotonic()
            writer.write(b"POST /v1/heartbeat HTTP/1.1\r\nHost: x\r\n")
            reply = await asyncio.wait_for(reader.read(65536), 10)
            assert reply.startswith(b"HTTP/1.1 408") and time.monotonic() - t0 < 2.5, reply
        finally:
            writer.close()

    _run(tmp_path, scenario)


def test_a_kept_alive_connection_is_closed_once_idle_past_the_keep_alive_limit_and_not_before(tmp_path):
    """The keep-alive deadline rides the connection's one lazy timer (moved at every answer, no timer per
    answer): a connection asking every 0.4 s outlives a 1 s keep-alive limit; left idle after its last
    answer, from either path, it is closed quietly about a second later."""
    limits = HTTPLimits(request_timeout_s=1.0, idle_timeout_s=1, max_connections=40, max_watchers=3)

    async def scenario(nodes, leader, ep, client):
        await _register(client, "idle")
        host, port = ep.split(":")
        for last in (b"/v1/broker-sets/idle/replica-info", b"/healthz"):  # lean path, then FastAPI's
            reader, writer = await asyncio.open_connection(host, int(port))
            try:
                for i in range(6):  # 2.4 s of requests, never idle for the limit
                    path = b"/healthz" if i % 2 else b"/v1/broker-sets/idle/replica-info"
                    writer.write(b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n\r\n")
                    reply = await _read_reply(reader)
                    assert reply.startswith(b"HTTP/1.1 200"), (i, reply)
                    await asyncio.sleep(0.4)
                writer.write(b"GET " + last + b" HTTP/1.1\r\nHost: x\r\n\r\n")
                assert (await _read_reply(reader)).startswith(b"HTTP/1.1 200")
                t0 = time.monotonic()
                rest = await asyncio.wait_for(reader.read(65536), 10)
                idle = time.monotonic() - t0
                assert rest == b"" and 0.7 < idle < 3.0, (last, rest, idle)  # closed, without a reply
            finally:
                writer.close()

    _run(tmp_path, scenario, limits)


async def _open_streams(client, path: str, n: int) -> list:
    """`n` event streams of `path`, each answered 200 and kept open (the context managers, to close them)."""
    streams = []
    for _ in range(n):
        cm = client.stream("GET", path)
        resp = await cm.__aenter__()
        assert resp.status_code == 200
        streams.append(cm)
    return streams


def test_connections_and_watchers_beyond_their_limits_get_503_with_retry_after(tmp_path):
    async def scenario(nodes, leader, ep, client):
        host, port = ep.split(":")
        # Watchers: three streams are served, the fourth is refused until one ends.
        streams = await _open_streams(client, "/v1/broker-sets/b/watch", 3)
        r = await client.get("/v1/broker-sets/b/watch")
        assert r.status_code == 503 and r.headers["retry-after"] and r.json()["code"] == Code.SYSTEM_BUSY
        await streams.pop().__aexit__(None, None, None)
        for _ in range(50):  # the server notices the closed stream within its keep-alive poll
            cm = client.stream("GET", "/v1/broker-sets/b/watch")
            resp = await cm.__aenter__()
            if resp.status_code == 200:
                streams.append(cm)
                break
            await cm.__aexit__(None, None, None)
            await asyncio.sleep(0.2)
        else:
            raise AssertionError("a watcher slot was never freed")
        for cm in streams:
            await cm.__aexit__(None, None, None)
        # Dashboard viewers are capped the same way (each holds a stream and a queue).
        viewers = await _open_streams(client, "/v1/dashboard/stream", 3)
        r = await client.get("/v1/dashboard/stream")
        assert r.status_code == 503 and r.headers["retry-after"] and "dashboard viewers" in r.json()["remark"]
        for cm in viewers:
            await cm.__aexit__(None, None, None)
        # Connections: idle sockets up to the limit, then a 503 with Retry-After and a close.
        conns = [await asyncio.open_connection(host, int(port)) for _ in range(LIMITS.max_connections + 5)]
        try:
            await asyncio.sleep(0.3)
            reply, _ = await _exchange(ep, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert reply.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in reply.lower(), reply
        finally:
            for _, w in conns:
                w.close()
        await asyncio.sleep(0.3)
        assert (await client.get("/healthz")).status_code == 200

    _run(tmp_path, scenario, HTTPLimits(request_timeout_s=30, max_connections=40, max_watchers=3))


def test_an_http10_client_is_refused_a_stream_it_could_not_read_without_taking_a_slot(tmp_path):
    """A stream is sent chunked, which an HTTP/1.0 client cannot read (RFC 9112): 505, before the slot is taken."""
    async def scenario(nodes, leader, ep, client):
        for path in ("/v1/broker-sets/b/watch", "/v1/dashboard/stream"):
            for _ in range(2):  # more than the one slot: a refusal holds none
                raw = await _read_all(ep, f"GET {path} HTTP/1.0\r\nHost: x\r\n\r\n".encode())
                head, _, body = raw.partition(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 505 ") and b"chunked" not in head.lower(), raw
                assert json.loads(body)["code"] == Code.REQUEST_CODE_NOT_SUPPORTED
                assert "HTTP/1.1" in json.loads(body)["remark"]
            streams = await _open_streams(client, path, 1)  # HTTP/1.1 is served
            await streams[0].__aexit__(None, None, None)

    _run(tmp_path, scenario, HTTPLimits(request_timeout_s=30, max_connections=40, max_watchers=1))


def test_an_upgrade_is_refused_with_a_400_saying_so_not_a_422_about_a_missing_body(tmp_path):
    """`curl --http2` over plain HTTP asks to upgrade to h2c: httptools stops at that head, before the body, and the
    application answered `body: Field required` for a body that was sent. No route upgrades: a 400 says so."""
    async def scenario(nodes, leader, ep, client):
        body = json.dumps(_hb()).encode()
        for path in ("/v1/heartbeat", "/v1/broker-sets/b/register"):
            raw = await _read_all(ep, (f"POST {path} HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\n"
                                       "Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n"
                                       "Content-Type: application/json\r\n"
                                       f"Content-Length: {len(body)}\r\n\r\n").encode() + body)
            head, _, answer = raw.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 400 ") and json.loads(answer) == {
                "code": Code.CONTROLLER_INVALID_REQUEST, "remark": "upgrade not supported"}, raw
        assert (await client.post("/v1/heartbeat", json=_hb())).status_code == 200  # the same request, no upgrade

    _run(tmp_path, scenario)
