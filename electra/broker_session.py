"""A broker's session connection to an ingest worker: its heartbeats and its connection-loss signal.

One kept-alive TCP connection per broker (api/sessions.py is the other end). The session
is opened with a heartbeat (`POST /v1/session`), the broker's heartbeats then go over the
same connection, and:

* `goodbye()` is a clean shutdown: the worker publishes `disconnected` (reason `shutdown`)
  and the connection closes;
* `abort()` is a crash as the network sees it: the socket is reset without a goodbye, and
  the worker publishes `disconnected` (reason `connection_lost`);
* a hung broker simply stops sending: the connection stays, only the heartbeat timeout
  can tell.

Requests are plain HTTP/1.1 bytes, most of them encoded once per session (the head and
the heartbeat's constant fields); one request is in flight at a time. Per heartbeat the
cost is then asyncio's streams and task switches, not encoding (docs/failover-signal.md).
"""

from __future__ import annotations

import asyncio
import json

from electra.security.credentials import ClientCredentials


class SessionError(ConnectionError):
    """The session could not be opened or its connection failed; the caller reconnects."""


def _post_head(path: str, host: str, auth: dict[str, str]) -> bytes:
    extra = "".join(f"{k}: {v}\r\n" for k, v in auth.items())
    return (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n{extra}"
            "Content-Length: ").encode()


class BrokerSession:
    """One session: `open()`, then `heartbeat()` every period, then `goodbye()` or `abort()`."""

    def __init__(self, endpoint: str, identity: dict, *, timeout_s: float = 5.0,
                 credentials: ClientCredentials | None = None) -> None:
        """`identity`: the heartbeat fields that do not change (cluster, set, id, address, timeout, priority);
        `credentials`: the broker's token and the cluster CA (HTTPS) of a secure cluster."""
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        host, _, port = endpoint.rpartition(":")
        self._addr = (host, int(port))
        creds = credentials or ClientCredentials()
        self._ssl = creds.ssl_context()
        auth = creds.headers()
        self._hb_head = _post_head("/v1/heartbeat", endpoint, auth)
        self._open_head = _post_head("/v1/session", endpoint, auth)
        self._bye = _post_head("/v1/session/goodbye", endpoint, auth) + b"0\r\n\r\n"
        self._body_start = json.dumps(identity, separators=(",", ":")).encode()[:-1] + b","
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    @property
    def is_open(self) -> bool:
        return self._writer is not None and not self._writer.is_closing()

    def _body(self, epoch: int, max_offset: int, confirm_offset: int) -> bytes:
        return self._body_start + b'"epoch":%d,"maxOffset":%d,"confirmOffset":%d}' % (epoch, max_offset,
                                                                                      confirm_offset)

    async def open(self, epoch: int, max_offset: int, confirm_offset: int) -> int:
        """Connect and open the session with a heartbeat; returns the HTTP status (200: open)."""
        try:
            async with asyncio.timeout(self.timeout_s):
                self._reader, self._writer = await asyncio.open_connection(*self._addr, ssl=self._ssl)
        except (OSError, TimeoutError) as exc:
            raise SessionError(f"cannot connect to {self.endpoint}: {exc!r}") from None
        status = await self._request(self._open_head, self._body(epoch, max_offset, confirm_offset))
        if status != 200:
            self.abort()
        return status

    async def heartbeat(self, epoch: int, max_offset: int, confirm_offset: int) -> int:
        """One heartbeat on the session's connection; returns the HTTP status."""
        return await self._request(self._hb_head, self._body(epoch, max_offset, confirm_offset))

    async def goodbye(self) -> None:
        """Clean shutdown: tell the worker, then close."""
        try:
            if self.is_open:
                self._writer.write(self._bye)
                await self._read_response()
        except SessionError:
            pass
        finally:
            if self._writer is not None:
                self._writer.close()
                self._writer = None

    def abort(self) -> None:
        """Crash: reset the connection without a goodbye."""
        if self._writer is not None:
            self._writer.transport.abort()
            self._writer = None

    async def _request(self, head: bytes, body: bytes) -> int:
        if not self.is_open:
            raise SessionError("session connection is closed")
        self._writer.write(head + b"%d\r\n\r\n" % len(body) + body)
        return await self._read_response()

    async def _read_response(self) -> int:
        reader = self._reader
        try:  # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation (a fleet that never stops)
            async with asyncio.timeout(self.timeout_s):
                head = await reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
                elif name.strip().lower() == b"connection" and value.strip().lower() == b"close":
                    self.abort()
            if length:
                async with asyncio.timeout(self.timeout_s):
                    await reader.readexactly(length)
            return status
        except (OSError, TimeoutError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            self.abort()
            raise SessionError(f"session connection to {self.endpoint} failed: {exc!r}") from None
