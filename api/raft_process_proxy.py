"""A front-end's path for everything but the lean broker requests: relay it to the Raft process's own HTTP socket.

Admin, dashboard, watch (SSE), metrics, OpenAPI pages, and every broker request the lean path
hands to FastAPI (422s, 405s, 413s, coercions) are answered by the node's FastAPI application in
the Raft process, where the audit log, dashboard sign-in sessions and watchers live. This ASGI
app relays such a request as raw HTTP/1.1 over the Raft process's unix socket (one connection per
request): the request body streams up while the answer streams back (so a 413 can come before
the body, and SSE streams flow), hop-by-hop headers are dropped, and the caller's address and
scheme go in `X-Forwarded-For` / `X-Forwarded-Proto` (the Raft process trusts them only on that
socket, in a directory only the node's user can open).

A Raft process that stops answering (SIGSTOP, a blocked event loop) accepts the relay's
connection and never answers. Until the answer's first byte the relay therefore checks, every
`STALL_CHECK_S`, whether the front-end's link to the same process has gone stalled
(`api/local_link.py`: an unanswered ping); then it answers at once, 503 for a read (nothing
changed) and 504 for anything else (it may yet take effect), instead of waiting as long as the
caller does. A slow answer from a live process (a leadership transfer, a history query) is not cut.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable

import httptools

from electra.state.codes import Code

log = logging.getLogger("electra.api.raft_process_proxy")

# The caller's port, which X-Forwarded-For does not carry: the Raft process restores it (`front_ends.ServedAs`)
# for the audit log. Set by the relay only (a caller's own copy is dropped with the other forwarding headers).
CLIENT_PORT = b"x-electra-client-port"

_HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"te", b"upgrade", b"proxy-connection",
        b"x-forwarded-for", b"x-forwarded-proto", b"expect", CLIENT_PORT}
_DROP_FROM_ANSWER = {b"connection", b"keep-alive", b"transfer-encoding", b"date", b"server"}
# The API's error shape (`code`, `remark`), as every other refusal of the node speaks it; the code is the
# one the lean path gives the same condition (`LinkDown` through `replies.refused`: SYSTEM_ERROR).
_UNAVAILABLE = json.dumps({"code": int(Code.SYSTEM_ERROR),
                           "remark": "the node's Raft process is not reachable from this front-end"}).encode()
_CLOSED = json.dumps({"code": int(Code.SYSTEM_ERROR),
                      "remark": "the node's Raft process closed the connection before answering"}).encode()
_NOT_SENT = json.dumps({"code": int(Code.SYSTEM_ERROR),
                        "remark": "the node's Raft process is not answering (nothing was sent); try another "
                                  "node"}).encode()
_STALLED_READ = json.dumps({"code": int(Code.SYSTEM_ERROR),
                           "remark": "the node's Raft process is not answering; try another node"}).encode()
_STALLED_WRITE = json.dumps({"code": int(Code.SYSTEM_ERROR),
                            "remark": "the node's Raft process stopped answering; the outcome is unknown"}).encode()
_READ_CHUNK = 64 << 10
STALL_CHECK_S = 1.0
_SAFE = {"GET", "HEAD", "OPTIONS"}


class _Answer:
    """httptools response callbacks collected as ASGI messages."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.headers: list[tuple[bytes, bytes]] = []
        self.events: list[dict] = []
        self.complete = False

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.events.append({"type": "http.response.start", "status": self.parser.get_status_code(),
                            "headers": [(k, v) for k, v in self.headers if k not in _DROP_FROM_ANSWER]})

    def on_body(self, body: bytes) -> None:
        self.events.append({"type": "http.response.body", "body": bytes(body), "more_body": True})

    def on_message_complete(self) -> None:
        self.complete = True


class RaftProcessProxy:
    """ASGI app: relay each HTTP request to the FastAPI application behind `socket_path`."""

    def __init__(self, socket_path: str, stalled: Callable[[], bool] = lambda: False) -> None:
        self.socket_path = socket_path
        self.stalled = stalled  # the front-end's link to the same process has gone unanswered

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        if self.stalled():  # nothing was sent: the outcome is known (nothing happened), whatever the method
            await _send_simple(send, 503, _health_or(scope, _NOT_SENT), [(b"retry-after", b"1")])
            return
        try:
            async with asyncio.timeout(5):
                reader, writer = await asyncio.open_unix_connection(self.socket_path)
        except (TimeoutError, OSError):
            await _send_simple(send, 503, _health_or(scope, _UNAVAILABLE), [(b"retry-after", b"1")])
            return
        pump = None
        try:
            chunked = self._write_head(scope, writer)
            pump = asyncio.ensure_future(self._pump_body(receive, writer, chunked))
            if not await self._relay_answer(reader, send):
                await self._refuse_stalled(scope, send)
        finally:
            if pump is not None:
                pump.cancel()  # its error, if it had one (the process answered and closed mid-body), is read:
                pump.add_done_callback(lambda t: t.cancelled() or t.exception())  # not logged as never retrieved
            writer.close()

    def _write_head(self, scope, writer: asyncio.StreamWriter) -> bool:
        target = scope["raw_path"] + (b"?" + scope["query_string"] if scope["query_string"] else b"")
        lines = [b"%s %s HTTP/1.1" % (scope["method"].encode("ascii"), target)]
        has_length = False
        for k, v in scope["headers"]:
            if k in _HOP:
                continue
            has_length = has_length or k == b"content-length"
            lines.append(k + b": " + v)
        client = scope.get("client")
        if client:
            lines.append(b"x-forwarded-for: " + client[0].encode("latin-1"))
            lines.append(CLIENT_PORT + b": %d" % client[1])
        lines.append(b"x-forwarded-proto: " + scope["scheme"].encode("ascii"))
        chunked = not has_length and scope["method"] in ("POST", "PUT", "PATCH")
        if chunked:
            lines.append(b"transfer-encoding: chunked")
        lines.append(b"connection: close")
        writer.write(b"\r\n".join(lines) + b"\r\n\r\n")
        return chunked

    @staticmethod
    async def _pump_body(receive, writer: asyncio.StreamWriter, chunked: bool) -> None:
        """The caller's body, up to the Raft process as it comes; a caller that goes away closes the relay."""
        more = True
        while more:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                writer.close()
                return
            body, more = msg.get("body", b""), msg.get("more_body", False)
            if chunked and body:
                writer.write(b"%x\r\n%s\r\n" % (len(body), body))
            elif body:
                writer.write(body)
            await writer.drain()
        if chunked:
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        msg = await receive()  # after the body only a disconnect comes: stop the relay then
        if msg["type"] == "http.disconnect":
            writer.close()

    @staticmethod
    async def _refuse_stalled(scope, send) -> None:
        if scope["method"] in _SAFE:
            await _send_simple(send, 503, _health_or(scope, _STALLED_READ), [(b"retry-after", b"1")])
        else:
            await _send_simple(send, 504, _STALLED_WRITE)

    async def _relay_answer(self, reader: asyncio.StreamReader, send) -> bool:
        """Stream the answer to the caller; False when the process went stalled before its first byte."""
        ans = _Answer()
        started = False
        while not ans.complete:
            try:
                if started:
                    data = await reader.read(_READ_CHUNK)
                else:
                    async with asyncio.timeout(STALL_CHECK_S):
                        data = await reader.read(_READ_CHUNK)
            except TimeoutError:
                if self.stalled():
                    return False
                continue
            except OSError:
                data = b""
            if not data:
                if not started:
                    await _send_simple(send, 502, _CLOSED)
                    return True
                break
            try:
                ans.parser.feed_data(data)
            except httptools.HttpParserError:
                log.error("malformed answer from the Raft process")
                break
            for ev in ans.events:
                started = True
                await send(ev)
            ans.events.clear()
        if started:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        return True


def _health_or(scope, body: bytes) -> bytes:
    """`/healthz` keeps its own shape when the relay answers for it (`{"ok": false, "reason": ...}`, as the
    node's healthz answers): monitoring reads `ok` and `reason`, not `code`."""
    if scope.get("path") != "/healthz":
        return body
    return json.dumps({"ok": False, "reason": json.loads(body)["remark"], "role": None, "leader_id": None}).encode()


async def _send_simple(send, status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
                + (extra or [])})
    await send({"type": "http.response.body", "body": body})
