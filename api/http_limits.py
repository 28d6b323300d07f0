"""Limits on what an HTTP client may cost a node (docs/security.md, "Containment").

Both HTTP servers of a node share one set of limits: the controller API (FastAPI on
uvicorn, `api/app.py`) and the lean ingest server (`api/ingest_server.py`). They run
on the event loop that also drives Raft, so every limit here is about keeping one
client's bytes or slowness from starving that loop or the node's memory:

* request bodies above `max_body_bytes` are answered 413 before they are buffered
  (from `Content-Length`, or as soon as a chunked body passes the limit);
* request heads above `max_header_bytes` are answered 431 and the connection closed;
* a request must arrive whole (head and body) within `request_timeout_s` of its first
  byte, or of the connection being opened (slowloris); idle keep-alive connections
  close after `idle_timeout_s`;
* beyond `max_connections` open connections a new one is answered 503 with
  `Retry-After` and closed; SSE watchers are capped separately (`max_watchers`).
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from electra.security.http_auth import send_too_large
from electra.state.codes import Code
from electra.state.limits import content_length

_INVALID, _BUSY = int(Code.CONTROLLER_INVALID_REQUEST), int(Code.SYSTEM_BUSY)


@dataclass(frozen=True)
class HTTPLimits:
    max_body_bytes: int = 1 << 20
    max_header_bytes: int = 32 << 10
    request_timeout_s: float = 10.0
    idle_timeout_s: int = 5
    max_connections: int = 1000
    max_watchers: int = 200  # SSE watch streams per node
    stop_grace_s: int = 2  # a stopping server cuts streams still open and TLS goodbyes unanswered after this


DEFAULT_LIMITS = HTTPLimits()

_REASONS = {400: b"Bad Request", 413: b"Payload Too Large", 431: b"Request Header Fields Too Large",
            503: b"Service Unavailable", 408: b"Request Timeout", 500: b"Internal Server Error"}


def raw_error(status: int, code: int, remark: str, *, retry_after: bool = False) -> bytes:
    """A complete HTTP/1.1 error response that closes the connection, for use below the ASGI layer."""
    body = json.dumps({"code": code, "remark": remark}).encode()
    head = [b"HTTP/1.1 %d %s" % (status, _REASONS.get(status, b"Error")), b"content-type: application/json",
            b"content-length: %d" % len(body), b"connection: close"]
    if retry_after:
        head.append(b"retry-after: 1")
    return b"\r\n".join(head) + b"\r\n\r\n" + body


class LazyDeadline:
    """One deadline per connection, closing the transport (after an optional response) when it passes.

    Connections move it on every request (the node's HTTP connections, the ingest server's sessions), so
    moving it is a float store, and so is `disarm`; its one timer, firing before the deadline, re-arms
    itself for the rest, and finding it disarmed, goes. (Re-arming a timer twice per heartbeat was ~5% of
    an ingest worker's CPU per heartbeat; arming and cancelling one per request ~4% of a node leader's
    at a read's.)"""

    __slots__ = ("loop", "handle", "transport", "reply", "on_fire", "expires", "due")

    def __init__(self) -> None:
        try:  # looked up once: `get_running_loop` costs a getpid() a call (2% of a node's CPU at two a request)
            self.loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self.loop = None  # a protocol driven by hand, outside any event loop (unit tests): no clock to keep
        self.handle: asyncio.TimerHandle | None = None
        self.transport: asyncio.BaseTransport | None = None
        self.reply = b""
        self.on_fire: Callable[[], None] | None = None  # told before the timer closes the connection
        self.expires = math.inf  # the deadline (loop time); inf: none
        self.due = 0.0           # when the armed timer fires (loop time), at or before `expires`

    def arm(self, transport: asyncio.BaseTransport, seconds: float, reply: bytes = b"") -> None:
        loop = self.loop
        if loop is None:
            return
        self.transport, self.reply = transport, reply
        self.expires = loop.time() + seconds
        if self.handle is None or self.due > self.expires:
            if self.handle is not None:
                self.handle.cancel()
            self.due = self.expires
            self.handle = loop.call_at(self.expires, self._fire)

    def disarm(self) -> None:
        """No deadline until the next `arm`; the timer, if any, stays and finds nothing to do."""
        self.expires = math.inf

    def cancel(self) -> None:
        """No deadline and no timer (the connection is closing)."""
        self.expires = math.inf
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None

    def _fire(self) -> None:
        self.handle = None
        if self.expires == math.inf:  # disarmed since: nothing to cut
            return
        loop = self.loop
        assert loop is not None  # only `arm` sets the timer, with a loop
        if loop.time() < self.expires:  # moved on since the timer was set: wait for the rest
            self.due = self.expires
            self.handle = loop.call_at(self.expires, self._fire)
            return
        t = self.transport
        if t is not None and not t.is_closing():
            if self.on_fire is not None:
                self.on_fire()
            if self.reply:
                t.write(self.reply)
            t.close()


def tls_bounded_loop() -> asyncio.AbstractEventLoop:
    """uvloop's event loop whose TLS servers bound the handshake by `request_timeout_s` unless told otherwise.

    A connection is handed to its HTTP protocol only once TLS's handshake is done, so none of the
    limits above sees one that never finishes it; asyncio's and uvloop's default bound is 60 s, and
    uvicorn, which creates the node's servers, passes none. A client opening thousands of sockets and
    sending nothing held a file descriptor each for that minute. The `uvloop.run` of a node and of a
    front-end use this loop (`loop_factory`); the ingest workers pass the bound themselves."""
    import uvloop

    class _Loop(uvloop.Loop):  # type: ignore[misc]
        async def create_server(self, *args: Any, **kwargs: Any) -> asyncio.Server:
            if kwargs.get("ssl") is not None and kwargs.get("ssl_handshake_timeout") is None:
                kwargs["ssl_handshake_timeout"] = DEFAULT_LIMITS.request_timeout_s
            return await super().create_server(*args, **kwargs)

    return _Loop()


TIMEOUT_REPLY = raw_error(408, _INVALID, "request not received in time")
MALFORMED_REPLY = raw_error(400, _INVALID, "malformed HTTP request")  # the ingest workers' answer too
# No route upgrades the connection (h2c, websocket): httptools stops at such a head, before its body, and the
# application then answered a 422 about a missing body (curl --http2 over plain HTTP). The ingest workers' too.
UPGRADE_REMARK = "upgrade not supported"
UPGRADE_REPLY = raw_error(400, _INVALID, UPGRADE_REMARK)
INTERNAL_REPLY = raw_error(500, 1, "internal error; see the node's log")
BUSY_REPLY = raw_error(503, _BUSY, "too many connections", retry_after=True)


def head_too_large(limit: int) -> bytes:
    return raw_error(431, _INVALID, f"request head over {limit} bytes")


def head_end_in(data: bytes, before: bytes) -> int:
    """Where a request head in progress ends in this read (after its CRLF CRLF), or -1: the marker may begin in
    the last bytes of the read before (`before`), and then the body follows at once. Not finding it there
    counted the whole read, a body included, as head: a 431 for a request whose head was small."""
    end = data.find(b"\r\n\r\n")
    if end >= 0:
        return end
    if before:
        joined = (before + data[:3]).find(b"\r\n\r\n")
        if joined >= 0:
            return 0  # the marker ends within the first bytes of this read: nothing of the head is here
    return -1


def open_line_bytes(data: bytes) -> int:
    """The bytes after a read's last CRLF: the part of a head line the parser holds back until the line ends.

    With the lines the parser passed on (URL, complete headers) they count a head that began inside a read
    and goes on past it. (If the request line itself is unfinished its URL part is counted twice: a URL
    thousands of bytes long, cut by a read, is refused a little early.)"""
    return len(data) - data.rfind(b"\r\n") - 2 if b"\r\n" in data else len(data)


def _has_path(url: bytes) -> bool:
    """Whether a request target that is not origin-form (`http://host/...`, `*`) names a path uvicorn can read."""
    try:
        return httptools.parse_url(url).path is not None
    except httptools.HttpParserInvalidURLError:
        return False


class HeadRefused(Exception):
    """Raised from a parser callback to stop parsing a request whose head was refused (431, answered)."""


def guarded_protocol(limits: HTTPLimits = DEFAULT_LIMITS) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with the connection, head-size and slow-request limits added."""

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        def connection_made(self, transport) -> None:  # type: ignore[override]
            # One lazy timer per connection keeps both deadlines: the request's, from its start (from the
            # connection for the first) to its end, then the keep-alive's, from the answer to the next start.
            self._deadline = LazyDeadline()
            self._in_request = True
            self._head_bytes = 0
            self._in_head = True
            self._head_began = False  # a request head began in the read being parsed
            self._chunk_len = 0
            self._refusal: bytes | None = None  # a refused request's answer (431, 400), due after those before it
            self._last_bytes = b""  # the end of the previous read: a head's end marker may straddle two reads
            over = len(self.connections) >= limits.max_connections
            super().connection_made(transport)
            if over:
                transport.write(BUSY_REPLY)
                transport.close()
                return
            self._deadline.arm(transport, limits.request_timeout_s, TIMEOUT_REPLY)

        def connection_lost(self, exc) -> None:
            self._deadline.cancel()
            super().connection_lost(exc)

        def shutdown(self) -> None:
            """The server is stopping. A connection uvicorn closes here waits for the client's answer to
            TLS's goodbye (close_notify), by default for asyncio's 30 s: a hung or stopped client would hold
            the node's exit that long. Cut the ones still closing after `stop_grace_s`."""
            super().shutdown()
            asyncio.get_running_loop().call_later(limits.stop_grace_s, self._cut_if_closing)

        def _cut_if_closing(self) -> None:
            if self in self.connections and self.transport.is_closing():
                self.transport.abort()

        def data_received(self, data: bytes) -> None:
            """uvicorn's, with the head-size limit. A head is counted by the bytes read while it is in
            progress; the part of it in the read where it begins is counted from what the parser took
            (`_head_began`): that read also carries the end of the request before, whose bytes are not
            the new head's. A head refused from a parser callback was answered (431) there: the parser's
            error is not a malformed request then, and gets no second answer."""
            if self._refusal is not None:  # refused, the answers before it still going out: nothing more is read
                return
            self._head_began, self._chunk_len = False, len(data)
            if self._in_head:
                end = head_end_in(data, self._last_bytes)  # the head may end inside this chunk, a body following
                self._head_bytes += len(data) if end < 0 else end
                if self._head_bytes > limits.max_header_bytes:
                    self._refuse_head()
                    return
            self._last_bytes = data[-3:]
            self._unset_keepalive_if_required()
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserCallbackError as exc:  # raised by a callback: a 431 answered, or a fault
                if self._refusal is not None or self.transport.is_closing():
                    return
                self.logger.error("a request failed in the HTTP protocol", exc_info=exc.__context__ or exc)
                self.transport.write(INTERNAL_REPLY)
                self.transport.close()
                return
            except httptools.HttpParserError:
                if self._refusal is not None:
                    return
                self.logger.warning("Invalid HTTP request received.")
                self._refuse(MALFORMED_REPLY)  # JSON, as every other answer (uvicorn's is plain text)
                return
            except httptools.HttpParserUpgrade:
                if self._should_upgrade():
                    self.handle_websocket_upgrade()
                else:
                    self._unsupported_upgrade_warning()
                return
            if self._head_began and self._in_head:  # a head began in this read and goes on past it
                self._head_bytes = self._head_so_far() + open_line_bytes(data)
                if self._head_bytes > limits.max_header_bytes:
                    self._refuse_head()

        def _head_so_far(self) -> int:
            return len(self.url) + 12 + sum(len(name) + len(value) + 4 for name, value in self.headers)

        def _check_head(self) -> None:
            """At a head's end: refuse it if it began in this read, the read was larger than the limit, and
            the head itself is (the cheap tests first: most heads begin and end in a small read)."""
            if self._head_began and self._chunk_len > limits.max_header_bytes and \
                    self._head_so_far() > limits.max_header_bytes:
                self._refuse_head()
                raise HeadRefused  # stops the parser: nothing of this request reaches the application
            if self.parser.should_upgrade():
                self._refuse(UPGRADE_REPLY)
                raise HeadRefused
            if self.url[:1] != b"/" and not _has_path(self.url):  # `GET http://x`: uvicorn fails on it (a 500)
                self._refuse(MALFORMED_REPLY)
                raise HeadRefused

        def _refuse_head(self) -> None:
            self._refuse(head_too_large(limits.max_header_bytes))

        def _refuse(self, reply: bytes) -> None:
            """Answer `reply` and close, after the answers still due to the requests before this one (pipelined):
            a request the node took before a malformed one or an oversized head is answered, not left unknown."""
            self._refusal = reply
            self._deadline.cancel()
            if self.pipeline or (self.cycle is not None and not self.cycle.response_complete):
                return  # `on_response_complete` answers once they are out; what else arrives is ignored
            self.transport.write(reply)
            self.transport.close()

        def on_message_begin(self) -> None:
            self._begin_message()
            self._in_head, self._head_bytes, self._head_began = True, 0, True
            if not self._in_request:  # the connection's first request counts from the connection
                self._in_request = True
                self._deadline.arm(self.transport, limits.request_timeout_s, TIMEOUT_REPLY)

        def _begin_message(self) -> None:
            """A new request's parser state (uvicorn's `on_message_begin`)."""
            HttpToolsProtocol.on_message_begin(self)

        def on_headers_complete(self) -> None:
            self._check_head()
            self._in_head = False
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._request_received()
            super().on_message_complete()

        def _request_received(self) -> None:
            """The request is in: no deadline while it is answered, the keep-alive one after."""
            self._deadline.disarm()
            self._in_request = False

        def on_response_complete(self) -> None:
            """uvicorn's, but the keep-alive deadline moves the connection's lazy timer instead of arming a
            timer per answer (its `call_later` was the largest part of this callback's cost)."""
            self.server_state.total_requests += 1
            if self.transport.is_closing():
                return
            self._unset_keepalive_if_required()
            self.flow.resume_reading()
            if self.pipeline:
                cycle, app = self.pipeline.pop()
                self._start_asgi_task(cycle, app)
            elif self._refusal is not None:  # the answers before a refused request are out: now its own
                self._refuse(self._refusal)
            elif not self._in_request:  # idle until the next request: closed quietly at the keep-alive limit
                self._deadline.arm(self.transport, self.timeout_keep_alive)

    return GuardedHttpToolsProtocol


ASGIApp = Callable[[dict, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]]


class BodyLimit:
    """ASGI middleware: 413 for bodies over the limit, before the app (or pydantic) sees a byte of them.

    Bodies of POST/PUT/PATCH requests are read here, up to the limit, and replayed to the
    app; the app's later `receive()` calls (disconnect detection) go to the server.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: dict, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length" and ((length := content_length(value)) is None or length > self.max_bytes):
                await self._too_large(send)
                return
        chunks, size = [], 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._too_large(send)
                return
            chunks.append(chunk)
            if not msg.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, send) -> None:
        await send_too_large(send, self.max_bytes)
