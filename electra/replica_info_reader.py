"""Replica-info polls for a simulated fleet: kept-alive connections, requests encoded once, spread over every node.

RocketMQ brokers poll GetReplicaInfo every 5 s: 3,000 brokers make 600 requests a second. Through
aiohttp (`ControllerClient`) each one cost the load generator a task, a stream reader and header
dicts, and every one went to the leader (the client sticks to the node a 307 named). This reader is
the read-side counterpart of `broker_session.py`:

* a small pool of kept-alive HTTP/1.1 connections per controller node, each an asyncio `Protocol`
  with one request in flight, sharing one client TLS context;
* the request is plain bytes built from the set's name and the node's prepared head;
* requests go round-robin to **every** node: a follower answers with a follower read, which asks the
  leader for its commit index and waits until it has applied it (docs/reads-and-snapshots.md), so the
  answer is as linearizable as the leader's own and the leader serves a third of the HTTP and TLS
  work. A node that refuses (503: no leader, or too stale) or cannot be reached is skipped: the next
  node is asked.

It answers like `ControllerClient.replica_info` (the body's JSON plus `httpStatus`) and raises
`ReplicaInfoUnavailable` when no node answered.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import ssl
from collections import deque
from urllib.parse import quote

from electra.broker_session import AnswerConnection
from electra.security.credentials import ClientCredentials


class ReplicaInfoUnavailable(ConnectionError):
    """No controller node answered the read."""


class _NodePool:
    """Up to `size` connections to one node, reused most-recently-idle first (the rest may idle out)."""

    def __init__(self, endpoint: str, head: bytes, ssl_context: ssl.SSLContext | None, size: int) -> None:
        host, _, port = endpoint.rpartition(":")
        self.endpoint = endpoint
        self.addr = (host, int(port))
        self.ssl = ssl_context
        self.head = head  # `Host` and credential lines, then the blank line
        self.idle: deque[AnswerConnection] = deque()
        self.slots = asyncio.Semaphore(size)

    async def get(self, path: bytes, timeout_s: float) -> tuple[int, bytes]:
        async with self.slots:
            reused = bool(self.idle)
            try:
                return await self._get(path, timeout_s)
            except ConnectionError:
                if not reused:
                    raise
            # a kept-alive connection the node closed while idle: once more on a new one
            return await self._get(path, timeout_s)

    async def _get(self, path: bytes, timeout_s: float) -> tuple[int, bytes]:
        conn = None
        while self.idle:
            c = self.idle.pop()
            if not c.closed:
                conn = c
                break
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout_s):
                if conn is None:
                    _, conn = await loop.create_connection(AnswerConnection, *self.addr, ssl=self.ssl)
                conn.waiter = loop.create_future()
                conn.transport.write(b"GET " + path + self.head)
                status, body = await conn.waiter
        except (OSError, ssl.SSLError, TimeoutError) as exc:
            if conn is not None:
                conn.close()
            raise ConnectionError(f"{self.endpoint}: {exc!r}") from None
        if not conn.closed:
            self.idle.append(conn)
        return status, body

    def close(self) -> None:
        while self.idle:
            self.idle.pop().close()


class ReplicaInfoReader:
    """GET /v1/broker-sets/{name}/replica-info, spread over `endpoints` (every controller node)."""

    def __init__(self, endpoints: list[str], *, credentials: ClientCredentials | None = None,
                 ssl_context: ssl.SSLContext | None = None, connections_per_node: int = 8,
                 timeout_s: float = 5.0) -> None:
        if not endpoints:
            raise ValueError("at least one controller endpoint (host:port) is required")
        creds = credentials or ClientCredentials()
        tls = ssl_context if ssl_context is not None else creds.ssl_context()
        auth = "".join(f"{k}: {v}\r\n" for k, v in creds.headers().items())
        self.timeout_s = timeout_s
        self.pools = [_NodePool(ep, f" HTTP/1.1\r\nHost: {ep}\r\n{auth}\r\n".encode(), tls, connections_per_node)
                      for ep in endpoints]
        self._next = itertools.cycle(range(len(self.pools)))
        self.stats = {"requests": 0, "moved_on": 0}

    async def replica_info(self, name: str) -> dict:
        """The replica info of broker set `name` from the first node (round-robin) that answers it."""
        self.stats["requests"] += 1
        path = b"/v1/broker-sets/" + quote(name, safe=":").encode() + b"/replica-info"  # `%` is a name character
        start = next(self._next)
        last: object = None
        for k in range(len(self.pools)):
            pool = self.pools[(start + k) % len(self.pools)]
            try:
                status, body = await pool.get(path, self.timeout_s)
            except ConnectionError as exc:
                last = exc
                self.stats["moved_on"] += 1
                continue
            if status == 503:  # no leader known there, or a follower too far behind: ask the next node
                last = f"{pool.endpoint}: HTTP 503 {body[:200]!r}"
                self.stats["moved_on"] += 1
                continue
            try:
                out = json.loads(body) if body else {}
            except ValueError:
                out = {"body": body.decode("utf-8", "replace")}
            return (out if isinstance(out, dict) else {"body": out}) | {"httpStatus": status}
        raise ReplicaInfoUnavailable(f"no controller answered replica info of {name}: {last}")

    def close(self) -> None:
        for pool in self.pools:
            pool.close()
