"""Client for the node protocol in `service.py`: leader discovery and safe retries.

A proposal is retried on another node only when the error proves it was never
appended (`NotLeader`, `ProposalDropped`, connection refused before sending).
Once a request has been sent, a lost connection or a timeout surfaces as
`ProposalTimeout` (outcome unknown), because retrying could apply it twice.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from typing import Any

import msgpack

from . import errors
from .framing import pack_frame, read_frame

_ERRORS: dict[str, type[errors.RaftError]] = {
    c.__name__: c for c in (errors.NotLeader, errors.ProposalDropped, errors.LeadershipLost, errors.ProposalTimeout,
                            errors.QuorumLost, errors.NodeStopped)}


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.task = asyncio.create_task(self._read_loop())

    async def _read_loop(self) -> None:
        try:
            while True:
                reply = msgpack.unpackb(await read_frame(self.reader), raw=False)
                fut = self.waiting.pop(reply.get("id"), None)
                if fut is not None and not fut.done():
                    fut.set_result(reply)
        except (asyncio.IncompleteReadError, ConnectionError, OSError, ValueError):
            pass
        finally:
            for fut in self.waiting.values():
                if not fut.done():
                    fut.set_exception(ConnectionError("connection to node lost"))
            self.waiting.clear()
            self.writer.close()

    def close(self) -> None:
        self.task.cancel()
        self.writer.close()


class RaftClient:
    def __init__(self, endpoints: dict[int, tuple[str, int]], *, timeout: float = 5.0) -> None:
        if not endpoints:
            raise ValueError("at least one node endpoint is required")
        self.endpoints = dict(endpoints)
        self.timeout = timeout
        self.leader: int | None = None
        self._conns: dict[int, _Conn] = {}
        self._ids = itertools.count(1)

    async def _conn(self, node_id: int) -> _Conn:
        c = self._conns.get(node_id)
        if c is None or c.task.done():
            host, port = self.endpoints[node_id]
            reader, writer = await asyncio.open_connection(host, port)
            c = self._conns[node_id] = _Conn(reader, writer)
        return c

    async def request(self, node_id: int, req: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """Send one request to one node and return the raw reply map."""
        return await self._send(await self._conn(node_id), req, timeout)

    async def _send(self, c: _Conn, req: dict[str, Any], timeout: float | None) -> dict[str, Any]:
        req_id = next(self._ids)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        c.waiting[req_id] = fut
        c.writer.write(pack_frame(msgpack.packb({**req, "id": req_id}, use_bin_type=True)))
        try:
            async with asyncio.timeout(timeout or self.timeout):
                return await fut
        finally:
            c.waiting.pop(req_id, None)

    async def propose(self, command: bytes, *, deadline_s: float | None = None) -> Any:
        """Propose on the leader, following leader hints; raises the typed error on failure."""
        loop = asyncio.get_running_loop()
        end = loop.time() + (deadline_s or self.timeout * 3)
        tried: list[int] = []
        while True:
            target = self.leader or self._pick(tried)
            tried.append(target)
            try:
                conn = await self._conn(target)
            except OSError:
                self.leader = None  # nothing was sent: safe to try another node
            else:
                try:
                    reply = await self._send(conn, {"op": "propose", "cmd": command, "timeout": self.timeout},
                                             self.timeout + 1)
                except (OSError, TimeoutError) as exc:
                    # Sent, then no answer: the command may have been appended. Never retry it blindly.
                    self.leader = None
                    raise errors.ProposalTimeout(f"no reply from node {target}: {exc!r}") from exc
                if reply.get("ok"):
                    self.leader = target
                    return reply.get("result")
                err = reply.get("error")
                if err == "NotLeader":
                    hint = reply.get("leader")
                    self.leader = hint if hint in self.endpoints and hint != target else None
                elif err == "ProposalDropped":
                    self.leader = None
                else:
                    error_type = _ERRORS.get(err, errors.RaftError) if isinstance(err, str) else errors.RaftError
                    raise error_type(reply.get("message", err))
            if loop.time() >= end:
                raise errors.NotLeader(0)
            await asyncio.sleep(0.02 if self.leader else 0.1)

    def _pick(self, tried: list[int]) -> int:
        fresh = [n for n in self.endpoints if n not in tried[-len(self.endpoints):]]
        return random.choice(fresh or list(self.endpoints))

    async def status(self, node_id: int) -> dict[str, Any]:
        reply = await self.request(node_id, {"op": "status"})
        status: dict[str, Any] = reply["result"]
        return status

    async def close(self) -> None:
        for c in self._conns.values():
            c.close()
        self._conns.clear()
