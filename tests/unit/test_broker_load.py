"""The report's load generator connections: `HttpConn` and the heartbeat lanes.

Against a tiny loopback server: answers (with and without a body) come back whole, the
connection is reused, a `Connection: close` answer or a server that went away means a new
connection on the next call, and a server that never answers raises TimeoutError (an OSError, as
every caller expects) instead of hanging the generator. A `HeartbeatLane` sends each live
broker's heartbeat once a period at its own phase on one connection, counts latency from the
intended time, skips dead brokers and reconnects after the server closed the connection.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from electra.bench import broker_load
from electra.bench.broker_load import Broker, HeartbeatLane, HttpConn, Samples, get, post


async def _server(answers: list[bytes], *, close_after_each: bool = False, silent: bool = False,
                  bodies: list | None = None):
    """A server answering each request with the next of `answers`; returns (server, endpoint, connections).
    `bodies`: every request body received, with its arrival time, is appended there."""
    connections = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lower = head.lower()
                if b"content-length:" in lower:
                    i = lower.index(b"content-length:") + 15
                    body = await reader.readexactly(int(lower[i:lower.index(b"\r\n", i)]))
                    if bodies is not None:
                        bodies.append((time.monotonic(), body))
                if silent:
                    continue
                writer.write(answers.pop(0))
                await writer.drain()
                if close_after_each:
                    writer.close()
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"127.0.0.1:{server.sockets[0].getsockname()[1]}", connections


def test_answers_come_back_whole_on_one_kept_alive_connection():
    async def main():
        server, ep, conns = await _server([b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n{\"code\":0}\n",
                                           b"HTTP/1.1 307 Temporary Redirect\r\nContent-Length: 0\r\n\r\n"])
        c = HttpConn()
        try:
            first = await c.call(get(ep, "/v1/broker-sets/s/replica-info"), ep)
            second = await c.call(post(ep, "/v1/heartbeat", {"brokerId": 1}), ep)
        finally:
            c.close()
            server.close()
        return first, second, len(conns)

    first, second, opened = asyncio.run(main())
    assert first == (200, b'{"code":0}\n')
    assert second == (307, b"")
    assert opened == 1


def test_a_closed_connection_is_reopened_for_the_next_call():
    async def main():
        ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
        server, ep, conns = await _server([ok, ok, ok], close_after_each=True)
        c = HttpConn()
        try:
            answers = [await c.call(get(ep, "/healthz"), ep) for _ in range(3)]
        finally:
            c.close()
            server.close()
        return answers, len(conns)

    answers, opened = asyncio.run(main())
    assert answers == [(200, b"ok")] * 3
    assert opened == 3


def test_a_server_that_never_answers_raises_instead_of_hanging():
    async def main():
        server, ep, _ = await _server([], silent=True)
        c = HttpConn(timeout_s=0.2)
        try:
            with pytest.raises(OSError):  # TimeoutError: the callers count it as a failed request
                await c.call(get(ep, "/healthz"), ep)
        finally:
            c.close()
            server.close()

    asyncio.run(main())


class _Load:
    """What a lane needs of its BrokerLoad: the phase's samples and a place for background tasks."""

    def __init__(self) -> None:
        self.samples = Samples(time.monotonic())
        self.tasks: list[asyncio.Task] = []

    def spawn(self, coro) -> None:
        self.tasks.append(asyncio.create_task(coro))


def _brokers(n: int) -> list[Broker]:
    bs = [Broker("c", f"s{i}", 1, f"10.0.0.{i}:10911") for i in range(n)]
    for b in bs:
        b.heartbeat = post("controller", "/v1/heartbeat", {"brokerName": b.name})
    return bs


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


def test_a_lane_sends_each_live_broker_once_a_period_at_its_phase(monkeypatch):
    monkeypatch.setattr(broker_load, "HEARTBEAT_PERIOD_S", 0.2)

    async def main():
        bodies: list = []
        server, ep, conns = await _server([OK] * 100, bodies=bodies)
        load, brokers = _Load(), _brokers(3)
        brokers[2].alive = False  # a dead broker sends nothing
        t0 = time.monotonic()
        lane = HeartbeatLane(load, lambda: ep, brokers, [t0 + 0.1, t0 + 0.05, t0 + 0.15])
        lane.start()
        await asyncio.sleep(0.57)  # phases 0.05 and 0.1, then every 0.2 s: 3 rounds each (the last at 0.5)
        lane.stop()
        server.close()
        return t0, bodies, load.samples, len(conns)

    t0, bodies, samples, opened = asyncio.run(main())
    names = [b'"s1"' in body and "s1" or b'"s0"' in body and "s0" or "?" for _, body in bodies]
    assert names == ["s1", "s0"] * 3
    for k, (at, _) in enumerate(bodies):  # on time: each at its phase plus whole periods, not before
        due = t0 + (0.05 if k % 2 == 0 else 0.1) + 0.2 * (k // 2)
        assert due <= at < due + 0.05, (k, at - due)
    assert len(samples.done["heartbeat"]) == 6 and not samples.failed
    assert all(0 <= lat < 0.05 for _, lat in samples.done["heartbeat"])  # from the intended time
    assert opened == 1


@pytest.mark.parametrize(("brokers", "late_s", "run_s", "least"), [(1, 0.0, 0.45, 4), (3, 0.05, 0.25, 3)],
                         ids=["on-time", "late"])
def test_a_lane_reconnects_after_the_server_closed_its_connection(monkeypatch, brokers, late_s, run_s, least):
    """Every answer closes its connection: the next heartbeat goes on a new one. Behind schedule ("late": every
    broker overdue) the lane sends the next heartbeat as soon as an answer comes; an answer that closes the
    connection must not take that heartbeat with it (it was counted failed: the server never read it)."""
    monkeypatch.setattr(broker_load, "HEARTBEAT_PERIOD_S", 0.1)

    async def main():
        bodies: list = []
        close = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
        server, ep, conns = await _server([close] * 100, close_after_each=True, bodies=bodies)
        load = _Load()
        lane = HeartbeatLane(load, lambda: ep, _brokers(brokers), [time.monotonic() - late_s] * brokers)
        lane.start()
        await asyncio.sleep(run_s)
        lane.stop()
        server.close()
        return bodies, load.samples, len(conns)

    bodies, samples, opened = asyncio.run(main())
    assert len(bodies) >= least and opened == len(bodies)  # a new connection for each
    assert len(samples.done["heartbeat"]) >= least and not samples.failed


@pytest.mark.parametrize("brokers", [3, 4, 5, 10, 100, 999, 1000, 1001, 5000])
def test_a_point_runs_exactly_the_brokers_asked_for(brokers):
    sizes = broker_load.set_sizes(brokers)
    assert sum(sizes) == brokers
    assert len(sizes) == brokers // 3
    assert min(sizes) >= 3 and max(sizes) - min(sizes) <= 1
