"""A broker's session connection to an ingest worker: its heartbeats and its connection-loss signal.

One kept-alive TCP (TLS on a secure cluster) connection per broker (api/sessions.py is the
other end). The session is opened with a heartbeat (`POST /v1/session`), the broker's
heartbeats then go over the same connection, and:

* `goodbye()` is a clean shutdown: the worker publishes `disconnected` (reason `shutdown`)
  and the connection closes;
* `abort()` is a crash as the network sees it: the socket is reset without a goodbye, and
  the worker publishes `disconnected` (reason `connection_lost`);
* a hung broker simply stops sending: the connection stays, only the heartbeat timeout
  can tell.

Built for a load generator that multiplexes thousands of brokers in one process: the
session is an asyncio `Protocol` (no stream reader, no task per request), requests are
plain HTTP/1.1 bytes encoded once per session up to the three numbers that change, and
`send_heartbeat()` writes one and returns at once; the answer's status reaches a callback
from `data_received`. One request is in flight at a time. All sessions of a process should
share one client `ssl.SSLContext` (`ClientCredentials.ssl_context()` builds a new one,
loading the CA, every time).
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import Callable

from electra.api.read_buffer import SharedReadBuffer
from electra.security.credentials import ClientCredentials


class SessionError(ConnectionError):
    """The session could not be opened or its connection failed; the caller reconnects."""


class SessionTimeout(SessionError):
    """No answer within the session's timeout. The connection stays open with the request in flight: a
    slow ingest worker is not a crash, and resetting the connection would publish one (connection_lost)."""


def _post_head(path: str, host: str, auth: dict[str, str]) -> bytes:
    extra = "".join(f"{k}: {v}\r\n" for k, v in auth.items())
    return (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n{extra}"
            "Content-Length: ").encode()


def parse_answer(buf: bytes) -> tuple[int, int, bool] | None:
    """(status, bytes used, connection: close) of the first complete HTTP/1.1 answer in `buf`, or None."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return None
    head = buf[:end].lower()
    try:
        status = int(head[9:12])
        length = 0
        at = head.find(b"\r\ncontent-length:")
        if at >= 0:
            stop = head.find(b"\r\n", at + 2)
            length = int(head[at + 17:stop if stop >= 0 else len(head)])
    except ValueError:
        return 0, len(buf), True  # not HTTP: give up on the connection
    if len(buf) < end + 4 + length:
        return None
    return status, end + 4 + length, b"\r\nconnection: close" in head


class AnswerConnection(SharedReadBuffer, asyncio.Protocol):
    """One kept-alive client connection with one request in flight: its answer's (status, body) resolves
    `waiter`. The replica-info reader and the performance report's load generator send on it."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.waiter: asyncio.Future | None = None
        self.closed = False

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        got = parse_answer(self.buf)
        if got is None:
            return
        status, used, close = got
        body = self.buf[self.buf.find(b"\r\n\r\n") + 4:used]
        self.buf = self.buf[used:]
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result((status, body))
        if close or status == 0:
            self.close()

    def connection_lost(self, exc) -> None:
        self.closed = True
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(ConnectionError("connection closed before the answer"))

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


class StatusProtocol(SharedReadBuffer, asyncio.Protocol):
    """Reads the answers of one kept-alive connection; hands each status to the request in flight (`on_answer`;
    0: the connection failed). Read into the process's one buffer: under TLS a plain Protocol cost a 256 KiB
    allocation per answer. A broker's session and the performance report's heartbeat lanes use it."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.on_answer: Callable[[int], None] | None = None  # the request in flight
        self.sent_at = 0.0
        self.closed = False

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while not self.closed:
            got = parse_answer(self.buf)
            if got is None:
                return
            status, used, close = got
            self.buf = self.buf[used:]
            if close:  # closed before the answer is handed on: its callback must not send on this connection
                self.closed = True
                if self.transport is not None:
                    self.transport.abort()
            self._answer(status)

    def _answer(self, status: int) -> None:
        cb, self.on_answer = self.on_answer, None
        if cb is not None:
            cb(status)

    def connection_lost(self, exc) -> None:
        self.closed = True
        self._answer(0)

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()
        self._answer(0)


class BrokerSession:
    """One session: `open()`, then `heartbeat()` (or `send_heartbeat()`) every period, then `goodbye()` or
    `abort()`."""

    def __init__(self, endpoint: str, identity: dict, *, timeout_s: float = 5.0,
                 credentials: ClientCredentials | None = None, ssl_context: ssl.SSLContext | None = None) -> None:
        """`identity`: the heartbeat fields that do not change (cluster, set, id, address, timeout, priority);
        `credentials`: the broker's token and the cluster CA (HTTPS) of a secure cluster; `ssl_context`: a
        client context to use instead of building one from `credentials` (share one among sessions)."""
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        host, _, port = endpoint.rpartition(":")
        self._addr = (host, int(port))
        creds = credentials or ClientCredentials()
        self._ssl = ssl_context if ssl_context is not None else creds.ssl_context()
        auth = creds.headers()
        self._hb_head = _post_head("/v1/heartbeat", endpoint, auth)
        self._open_head = _post_head("/v1/session", endpoint, auth)
        self._bye_head = _post_head("/v1/session/goodbye", endpoint, auth)
        self._body_start = json.dumps(identity, separators=(",", ":")).encode()[:-1] + b","
        self._proto: StatusProtocol | None = None

    @property
    def is_open(self) -> bool:
        p = self._proto
        return p is not None and not p.closed and p.transport is not None and not p.transport.is_closing()

    @property
    def busy(self) -> bool:
        """A request is in flight (its answer has not come yet)."""
        return self._proto is not None and self._proto.on_answer is not None

    def overdue(self, now: float | None = None, factor: float = 1.0) -> bool:
        """The request in flight has waited longer than `factor` x `timeout_s`."""
        return self.busy and ((now if now is not None else time.monotonic()) - self._proto.sent_at
                              > factor * self.timeout_s)

    def _body(self, epoch: int, max_offset: int, confirm_offset: int) -> bytes:
        return self._body_start + b'"epoch":%d,"maxOffset":%d,"confirmOffset":%d}' % (epoch, max_offset,
                                                                                      confirm_offset)

    async def open(self, epoch: int, max_offset: int, confirm_offset: int) -> int:
        """Connect and open the session with a heartbeat; returns the HTTP status (200: open)."""
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.timeout_s):
                _, self._proto = await loop.create_connection(StatusProtocol, *self._addr, ssl=self._ssl)
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            raise SessionError(f"cannot connect to {self.endpoint}: {exc!r}") from None
        status = await self._request(self._open_head, self._body(epoch, max_offset, confirm_offset))
        if status != 200:
            self.abort()
        return status  # SessionTimeout: the connection stays, the answer may still come

    async def heartbeat(self, epoch: int, max_offset: int, confirm_offset: int) -> int:
        """One heartbeat on the session's connection; returns the HTTP status."""
        return await self._request(self._hb_head, self._body(epoch, max_offset, confirm_offset))

    def send_heartbeat(self, epoch: int, max_offset: int, confirm_offset: int,
                       on_status: Callable[[int], None]) -> bool:
        """Write one heartbeat and return at once; `on_status(status)` runs when the answer comes (0: the
        connection failed). False (nothing sent) while the session is closed or a request is in flight."""
        if not self.is_open or self.busy:
            return False
        self._send(self._hb_head, self._body(epoch, max_offset, confirm_offset), on_status)
        return True

    async def goodbye(self) -> None:
        """Clean shutdown: tell the worker (after the answer of a request in flight), then close."""
        try:
            async with asyncio.timeout(self.timeout_s):
                if self.is_open and self.busy:
                    await self._answer_in_flight()
                if self.is_open:
                    fut = asyncio.get_running_loop().create_future()
                    self._send(self._bye_head, b"", lambda status: fut.done() or fut.set_result(status))
                    await fut
        except TimeoutError:
            pass
        finally:
            if self._proto is not None and self._proto.transport is not None:
                self._proto.transport.close()
            self._proto = None

    def abort(self) -> None:
        """Crash: reset the connection without a goodbye."""
        if self._proto is not None:
            proto, self._proto = self._proto, None
            proto.abort()

    async def _answer_in_flight(self) -> None:
        fut = asyncio.get_running_loop().create_future()
        prev = self._proto.on_answer

        def both(status: int) -> None:
            prev(status)
            if not fut.done():
                fut.set_result(status)

        self._proto.on_answer = both
        await fut

    def _send(self, head: bytes, body: bytes, on_status: Callable[[int], None]) -> None:
        self._proto.on_answer = on_status
        self._proto.sent_at = time.monotonic()
        self._proto.transport.write(head + b"%d\r\n\r\n" % len(body) + body)

    async def _request(self, head: bytes, body: bytes) -> int:
        if not self.is_open or self.busy:
            raise SessionError("session connection is closed" if not self.is_open else "a request is in flight")
        fut = asyncio.get_running_loop().create_future()
        self._send(head, body, lambda status: fut.done() or fut.set_result(status))
        try:  # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation (a fleet that never stops)
            async with asyncio.timeout(self.timeout_s):
                status = await fut
        except TimeoutError:
            raise SessionTimeout(f"session connection to {self.endpoint}: no answer in {self.timeout_s} s") from None
        if status == 0:
            self.abort()
            raise SessionError(f"session connection to {self.endpoint} failed")
        return status
