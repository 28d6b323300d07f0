"""One port, two request paths: the lean broker path beside uvicorn's ASGI cycle for everything else.

The node's HTTP protocol is uvicorn's httptools protocol with the containment limits
(`http_limits.guarded_protocol`: connection cap, head size, request deadline, keep-alive
timeout, TLS from the server). When a request's head arrives, `LeanPath.prepare` decides:

* a broker request it serves: its body is collected here, up to its Content-Length, and
  `LeanPath.serve` answers it without scope dicts, receive/send coroutines or FastAPI;
* anything else (admin, dashboard, watch, metrics, OpenAPI pages, and every broker request
  that is not canonical and valid): uvicorn's own cycle runs the FastAPI application, with
  the auth middleware and body limit, as before.

A lean request found unfit only once its body is in (invalid JSON, a value out of range) is
handed to the application then, with the body already read.

Per request the lean path builds no ASGI scope (only a request for the application gets one)
and arms no timer: the request and keep-alive deadlines are the connection's one lazy timer
(`http_limits.LazyDeadline`). Those two uvicorn defaults were two thirds of the protocol's
own cost.

Answers go out in request order: while a lean request is in flight it stands in uvicorn's
`cycle` slot, so a pipelined request behind it waits in uvicorn's pipeline queue, as it would
behind an ASGI request.
"""

from __future__ import annotations

import asyncio
import http
import logging

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from .http_limits import DEFAULT_LIMITS, HTTPLimits, guarded_protocol
from .lean_path import LeanPath, LeanRequest
from .replies import Reply

log = logging.getLogger("electra.api.lean_http")

_STATUS_LINES = {s.value: b"HTTP/1.1 %d %s\r\n" % (s.value, s.phrase.encode()) for s in http.HTTPStatus}
_PLAIN_REPLY = b"%bcontent-type: application/json\r\ncontent-length: %d\r\n\r\n%b"  # status line, length, body
_INTERNAL_ERROR = (b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/plain; charset=utf-8\r\n"
                   b"content-length: 21\r\nconnection: close\r\n\r\nInternal Server Error")


class _Unwaited:
    """An in-flight lean request's `message_event`: uvicorn only ever sets it (on a lost connection);
    nothing waits on it, so no `asyncio.Event` is built per request."""

    __slots__ = ()

    def set(self) -> None:
        pass


_UNWAITED = _Unwaited()


class _InFlight:
    """Stands in uvicorn's `cycle` slot while a lean request is being answered (the fields uvicorn touches)."""

    __slots__ = ("response_complete", "keep_alive", "disconnected", "message_event")

    def __init__(self, keep_alive: bool) -> None:
        self.response_complete = False
        self.keep_alive = keep_alive
        self.disconnected = False
        self.message_event = _UNWAITED


def lean_protocol(lean: LeanPath, limits: HTTPLimits = DEFAULT_LIMITS,
                  scheme: str | None = None) -> type[HttpToolsProtocol]:
    """The node's HTTP protocol class: the guarded uvicorn protocol with the lean broker path in front.

    `scheme`: the scheme the node's clients use, for the Raft process's socket behind front-ends (its own
    connections are plain unix sockets; a redirect built from them said `http://` to HTTPS clients)."""
    base = guarded_protocol(limits)

    class LeanHttpProtocol(base):  # type: ignore[misc, valid-type]
        _lean_req: LeanRequest | None = None
        _lean_body: list[bytes]

        def _begin_message(self) -> None:
            """uvicorn's `on_message_begin` without its ASGI scope, which only a request for the
            application needs (`_app_scope`)."""
            self.url = b""
            self.expect_100_continue = False
            self.headers = []
            self.scope = None

        def _app_scope(self) -> None:
            """Build the scope uvicorn's `on_message_begin` would have, keeping the head parsed since."""
            url, headers, expect = self.url, self.headers, self.expect_100_continue
            HttpToolsProtocol.on_message_begin(self)
            self.url, self.headers, self.expect_100_continue = url, headers, expect
            self.scope["headers"] = headers

        def on_headers_complete(self) -> None:
            self._check_head()
            self._lean_req = None
            busy = self.cycle is not None and not self.cycle.response_complete
            if not busy and self.parser.get_http_version() == "1.1" and not self.parser.should_upgrade():
                self._lean_req = lean.prepare(self.parser.get_method(), self.url, self.headers)
            if self._lean_req is None:
                self._app_scope()
                super().on_headers_complete()
                return
            self._in_head = False
            self._lean_body = []
            self.cycle = _InFlight(self.parser.should_keep_alive())

        def on_body(self, body: bytes) -> None:
            if self._lean_req is None:
                super().on_body(body)
            else:
                self._lean_body.append(body)

        def on_message_complete(self) -> None:
            req = self._lean_req
            if req is None:
                super().on_message_complete()
                return
            self._lean_req = None
            self._request_received()
            body = b"".join(self._lean_body)
            self._lean_body = []
            flight = self.cycle  # a pipelined request behind this one may take the `cycle` slot meanwhile
            try:
                out = lean.serve(req, body, scheme or self.scheme or "http")
            except Exception:  # a bug: answer 500 and close, as the ASGI server would
                log.exception("lean request %s failed", req.path)
                self._finish_raw(flight, _INTERNAL_ERROR, close=True)
                return
            if out is None:
                self._to_asgi(body)
            elif isinstance(out, Reply):
                self._send(flight, out)
            else:
                task = asyncio.ensure_future(out)
                self.tasks.add(task)
                task.add_done_callback(lambda t: self._sent_later(flight, t))

        def _sent_later(self, flight: _InFlight, task: asyncio.Task) -> None:
            self.tasks.discard(task)
            if task.cancelled():
                self._finish_raw(flight, b"", close=True)
            elif task.exception() is not None:
                log.error("lean request failed", exc_info=task.exception())
                self._finish_raw(flight, _INTERNAL_ERROR, close=True)
            else:
                self._send(flight, task.result())

        def _send(self, flight: _InFlight, reply: Reply) -> None:
            body = lean.encode(reply.body)
            close = not flight.keep_alive
            if not reply.headers and not close:  # the usual answer: one format, no list
                self._finish_raw(flight, _PLAIN_REPLY % (_STATUS_LINES[reply.status], len(body), body), close=False)
                return
            head = [_STATUS_LINES[reply.status],
                    b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body)]
            for k, v in reply.headers.items():
                head.append(b"%s: %s\r\n" % (k.encode("latin-1"), v.encode("latin-1")))
            if close:
                head.append(b"connection: close\r\n")
            head.append(b"\r\n")
            head.append(body)
            self._finish_raw(flight, b"".join(head), close=close)

        def _finish_raw(self, flight: _InFlight, data: bytes, *, close: bool) -> None:
            flight.response_complete = True
            if self.transport.is_closing() or flight.disconnected:
                return
            if data:
                self.transport.write(data)
            if close:
                self.transport.close()
                return
            self.on_response_complete()  # keep-alive timer, resume reading, start a pipelined request

        def _to_asgi(self, body: bytes) -> None:
            """Hand a request whose body is in to the FastAPI application (uvicorn's cycle)."""
            from urllib.parse import unquote

            import httptools

            self._app_scope()
            parsed = httptools.parse_url(self.url)
            path = parsed.path.decode("ascii")
            self.scope["method"] = self.parser.get_method().decode("ascii")
            self.scope["path"] = self.root_path + (unquote(path) if "%" in path else path)
            self.scope["raw_path"] = self.root_path.encode("ascii") + parsed.path
            self.scope["query_string"] = parsed.query or b""
            keep_alive = self.cycle.keep_alive
            cycle = RequestResponseCycle(
                scope=self.scope, transport=self.transport, flow=self.flow, logger=self.logger,
                access_logger=self.access_logger, access_log=self.access_log,
                default_headers=self.server_state.default_headers, message_event=asyncio.Event(),
                expect_100_continue=False, keep_alive=keep_alive, on_response=self.on_response_complete)
            cycle.body = body
            cycle.more_body = False
            cycle.message_event.set()
            self.cycle = cycle
            self._start_asgi_task(cycle, self.app)

    return LeanHttpProtocol
