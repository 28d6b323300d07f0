"""The report's load generator connection: one kept-alive HTTP/1.1 connection per `HttpConn`.

Against a tiny loopback server: answers (with and without a body) come back whole, the
connection is reused, a `Connection: close` answer or a server that went away means a new
connection on the next call, and a server that never answers raises TimeoutError (an OSError, as
every caller expects) instead of hanging the generator.
"""

from __future__ import annotations

import asyncio

import pytest

from electra.bench.broker_load import HttpConn, get, post


async def _server(answers: list[bytes], *, close_after_each: bool = False, silent: bool = False):
    """A server answering each request with the next of `answers`; returns (server, endpoint, connections)."""
    connections = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lower = head.lower()
                if b"content-length:" in lower:
                    i = lower.index(b"content-length:") + 15
                    await reader.readexactly(int(lower[i:lower.index(b"\r\n", i)]))
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
