"""A small binary client protocol for a Raft node: propose, status, transfer.

Frames are length-prefixed msgpack maps (see `framing.py`). Requests carry an
`id` and are answered out of order as they complete, so one connection can keep
thousands of proposals in flight. Errors travel as the name of the typed error
(`NotLeader`, `ProposalTimeout`, ...) with a leader hint, so a client can tell a
safe retry from an unknown outcome. The HTTP API of the controller sits on top of
the same `RaftNode`; this protocol is for tools, tests and benchmarks.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import msgpack

from .errors import NotLeader, RaftError
from .framing import FrameError, pack_frame, read_frame
from .node import RaftNode

log = logging.getLogger("electra.consensus.service")


def _outcome(req_id: Any, done: asyncio.Future[Any], *, with_result: bool) -> dict[str, Any]:
    """The reply for a finished request: its error, or ok (with its result)."""
    exc = done.exception()
    if exc is not None:
        return error_reply(req_id, exc)
    return {"id": req_id, "ok": True, "result": done.result()} if with_result else {"id": req_id, "ok": True}


def error_reply(req_id: Any, exc: BaseException) -> dict[str, Any]:
    reply: dict[str, Any] = {"id": req_id, "ok": False, "error": type(exc).__name__, "message": str(exc)}
    if isinstance(exc, NotLeader):
        reply["leader"] = exc.leader_id
    if isinstance(exc, RaftError):
        reply["outcome_known"] = exc.outcome_known
    return reply


class _Connection:
    """Coalesces replies: one write per event-loop iteration, not one per request."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.out: list[bytes] = []
        self.flush_scheduled = False

    def reply(self, obj: dict[str, Any]) -> None:
        if self.writer.is_closing():
            return
        self.out.append(pack_frame(msgpack.packb(obj, use_bin_type=True)))
        if not self.flush_scheduled:
            self.flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self.flush_scheduled = False
        if self.out and not self.writer.is_closing():
            self.writer.write(b"".join(self.out))
        self.out.clear()


class ClientService:
    def __init__(self, node: RaftNode, host: str, port: int) -> None:
        self.node = node
        self.host = host
        self.port = port
        self._server: asyncio.base_events.Server | None = None
        self._conns: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server:
            self._server.close()
            for w in list(self._conns):
                w.close()
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Connection(writer)
        self._conns.add(writer)
        try:
            while True:
                try:
                    frame = await read_frame(reader)
                    req = msgpack.unpackb(frame, raw=False)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                except (FrameError, ValueError, msgpack.ExtraData) as exc:
                    log.warning("closing client connection: malformed request: %s", exc)
                    return
                if not isinstance(req, dict) or "op" not in req:
                    conn.reply({"id": None, "ok": False, "error": "BadRequest",
                                "message": "a request is a map with 'id' and 'op'"})
                    continue
                self._handle(conn, req)
        finally:
            self._conns.discard(writer)
            writer.close()

    def _handle(self, conn: _Connection, req: dict[str, Any]) -> None:
        req_id = req.get("id")
        op = req["op"]
        try:
            if op == "propose":
                cmd: Any = req.get("cmd")  # propose_future refuses anything but non-empty bytes
                timeout = req.get("timeout")
                fut = self.node.propose_future(cmd, timeout)
                fut.add_done_callback(lambda f: conn.reply(_outcome(req_id, f, with_result=True)))
            elif op == "status":
                conn.reply({"id": req_id, "ok": True, "result": self.node.status()})
            elif op == "transfer":
                task = asyncio.ensure_future(self.node.transfer_leadership(int(req["target"])))
                task.add_done_callback(lambda f: conn.reply(_outcome(req_id, f, with_result=False)))
            else:
                conn.reply({"id": req_id, "ok": False, "error": "BadRequest", "message": f"unknown op {op!r}"})
        except (RaftError, ValueError, KeyError, TypeError) as exc:
            conn.reply(error_reply(req_id, exc))
