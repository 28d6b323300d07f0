"""Peer-to-peer transport for Raft messages: one TCP connection per peer pair.

The node with the lower id dials, the higher one accepts, and both use that one
connection in both directions. A handshake names cluster, cluster id and node
ids, so a stray or misconfigured process is refused. With SSL contexts injected
by the host (mutual TLS), a peer's node id and cluster id come from its
certificate (see peer_identity): the handshake's `from` must equal the node the
certificate names, and so must every message's `src`. Without them the
transport is plaintext and believes the handshake (the node's explicit
insecure mode). Sends never block and never raise:
a message for a peer that is not connected (or whose socket buffer is over the
high-water mark) is dropped and counted, because Raft retransmits anyway.
Writes are coalesced into one `write()` per event-loop iteration per peer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import ssl
from collections.abc import Callable, Iterable
from typing import Any

import msgpack

from .framing import FrameError, brief, pack_frame, read_frame, read_hello_frame
from .messages import Message
from .peer_identity import identity_from_peercert

PROTO = "electra-raft/1"
HIGH_WATER = 64 << 20
HUNG_UP_LOG_EVERY_S = 30.0  # a peer that keeps closing this node's dials mid-handshake is logged this often


class _Peer:
    __slots__ = ("id", "writer", "pending", "flush_scheduled", "reader_task")

    def __init__(self, peer_id: int) -> None:
        self.id = peer_id
        self.writer: asyncio.StreamWriter | None = None
        self.pending: list[bytes] = []
        self.flush_scheduled = False
        self.reader_task: asyncio.Task[None] | None = None


class PeerTransport:
    def __init__(self, node_id: int, peers: dict[int, tuple[str, int]], on_message: Callable[[Message], None],
                 *, cluster: str = "electra", logger: logging.Logger | None = None,
                 high_water: int = HIGH_WATER, cluster_id: str | None = None,
                 server_ssl: ssl.SSLContext | None = None, client_ssl: ssl.SSLContext | None = None) -> None:
        if (server_ssl is None) != (client_ssl is None):
            raise ValueError("give both SSL contexts (mutual TLS) or neither (insecure mode)")
        if node_id not in peers:
            raise ValueError(f"node {node_id} has no address in {sorted(peers)}")
        self.id = node_id
        self.addrs = dict(peers)
        self.on_message = on_message
        self.cluster = cluster
        self.log = logger or logging.getLogger("electra.consensus.transport")
        self.high_water = high_water
        self.cluster_id = cluster_id
        self.server_ssl = server_ssl
        self.client_ssl = client_ssl
        self.peers = {p: _Peer(p) for p in peers if p != node_id}
        self.stats = dict.fromkeys(("frames_sent", "frames_received", "dropped", "malformed",
                                    "rejected_handshakes", "rejected_messages", "reconnects",
                                    "unencodable", "handler_errors"), 0)
        self._refusals_logged: dict[tuple[str, str], tuple[float, int]] = {}  # (host, why) -> (logged at, not since)
        self._server: asyncio.base_events.Server | None = None
        self._listener: socket.socket | None = None
        self._handshakes: set[asyncio.Task[None]] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        host, port = self.addrs[self.id]
        if self.server_ssl is None:
            self._server = await asyncio.start_server(self._accept, host, port)
        else:  # own accept loop: the TLS handshake's failures are then ours to count and log
            self._listener = socket.create_server((host, port), backlog=128)
            self._listener.setblocking(False)
            self._tasks.append(asyncio.create_task(self._accept_tls_forever(), name=f"accept-{self.id}"))
        for pid in self.peers:
            if pid > self.id:
                self._tasks.append(asyncio.create_task(self._dial_forever(pid), name=f"dial-{self.id}-{pid}"))

    async def stop(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        for t in self._tasks:
            t.cancel()
        for peer in self.peers.values():
            if peer.reader_task:
                peer.reader_task.cancel()
            if peer.writer:
                peer.writer.close()
                peer.writer = None
        if self._server:
            self._server.close()
            await self._server.wait_closed()
        if self._listener is not None:
            self._listener.close()
        for t in list(self._handshakes):
            t.cancel()
        await asyncio.gather(*self._handshakes, return_exceptions=True)
        tasks = self._tasks + [p.reader_task for p in self.peers.values() if p.reader_task]
        await asyncio.gather(*tasks, return_exceptions=True)

    def connected(self, peer_id: int) -> bool:
        p = self.peers.get(peer_id)
        return bool(p and p.writer and not p.writer.is_closing())

    # ------------------------------------------------------------------ sending
    def send(self, msg: Message) -> None:
        peer = self.peers.get(msg.dst)
        w = peer.writer if peer else None
        if peer is None or w is None or w.is_closing() or w.transport.get_write_buffer_size() > self.high_water:
            self.stats["dropped"] += 1
            return
        try:
            frame = pack_frame(msg.encode())
        except (FrameError, OverflowError, TypeError, ValueError) as exc:
            # A message that cannot be framed is a bug on this side; drop it rather than the caller.
            self.stats["unencodable"] += 1
            self.log.error("node %d: cannot encode %r for node %d: %s", self.id, msg, msg.dst, brief(exc))
            return
        peer.pending.append(frame)
        if not peer.flush_scheduled:
            peer.flush_scheduled = True
            assert self._loop is not None  # peers have writers only once the transport started
            self._loop.call_soon(self._flush, peer)

    def send_many(self, msgs: Iterable[Message]) -> None:
        for m in msgs:
            self.send(m)

    def _flush(self, peer: _Peer) -> None:
        peer.flush_scheduled = False
        frames, peer.pending = peer.pending, []
        w = peer.writer
        if not frames:
            return
        if w is None or w.is_closing():
            self.stats["dropped"] += len(frames)
            return
        w.write(b"".join(frames))
        self.stats["frames_sent"] += len(frames)

    # ------------------------------------------------------------------ connections
    def _hello(self, to: int) -> bytes:
        return pack_frame(msgpack.packb({"proto": PROTO, "cluster": self.cluster, "cluster_id": self.cluster_id,
                                         "from": self.id, "to": to}))

    def _check_hello(self, frame: bytes, expect_from: int | None, writer: asyncio.StreamWriter) -> int:
        """Validate a handshake against this node and the peer's certificate; return the peer id or raise ValueError."""
        try:
            h = msgpack.unpackb(frame, raw=False, max_array_len=16, max_map_len=16, max_ext_len=0)
        except Exception as exc:
            raise ValueError(f"undecodable handshake: {type(exc).__name__}") from exc
        if not isinstance(h, dict) or h.get("proto") != PROTO:
            raise ValueError(f"wrong protocol {brief(h.get('proto') if isinstance(h, dict) else h, 80)}")
        if h.get("cluster") != self.cluster:
            raise ValueError(f"wrong cluster {brief(repr(h.get('cluster')), 80)} (this is {self.cluster!r})")
        if h.get("cluster_id") != self.cluster_id:
            raise ValueError(f"peer belongs to cluster id {brief(repr(h.get('cluster_id')), 80)}, "
                             f"this is {self.cluster_id!r}")
        src = h.get("from")
        if type(src) is not int or src not in self.peers:  # (True == 1: a bool is no node id)
            raise ValueError(f"unknown node id {brief(repr(src), 40)}")
        if h.get("to") != self.id:
            raise ValueError(f"handshake addressed to node {brief(repr(h.get('to')), 40)}, this is node {self.id}")
        if expect_from is not None and src != expect_from:
            raise ValueError(f"expected node {expect_from}, got node {src}")
        if self.server_ssl is not None:
            cert_cluster, cert_node = identity_from_peercert(writer.get_extra_info("peercert"))
            if cert_cluster != self.cluster_id:
                raise ValueError(f"peer certificate is for cluster id {cert_cluster!r}, this is {self.cluster_id!r}")
            if cert_node != src:
                raise ValueError(f"peer certificate names node {cert_node} but the handshake claims node {src}")
        return src

    async def _accept_tls_forever(self) -> None:
        loop = asyncio.get_running_loop()
        listener = self._listener
        assert listener is not None  # start() opens it before running this
        while not self._stopping:
            try:
                sock, addr = await loop.sock_accept(listener)
            except OSError as exc:
                if self._stopping:
                    return
                self.log.warning("node %d: accept failed: %s", self.id, exc)
                await asyncio.sleep(0.1)
                continue
            task = asyncio.create_task(self._tls_handshake(sock, addr))
            self._handshakes.add(task)
            task.add_done_callback(self._handshakes.discard)

    async def _tls_handshake(self, sock: socket.socket, addr: Any) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=2**16, loop=loop)
        protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
        try:
            async with asyncio.timeout(6):
                transport, _ = await loop.connect_accepted_socket(
                    lambda: protocol, sock, ssl=self.server_ssl, ssl_handshake_timeout=5)
        except (OSError, TimeoutError) as exc:
            sock.close()
            self.stats["rejected_handshakes"] += 1
            why = str(exc) or repr(exc)
            if "WRONG_VERSION_NUMBER" in why or "HTTP_REQUEST" in why:
                why += (" (the peer spoke plaintext: it runs --insecure, or is not a Raft peer, while this node has "
                        "TLS certificates; every member of a group must run the same way)")
            self._log_refusal(addr, f"TLS handshake failed: {why}")
            return
        await self._accept(reader, asyncio.StreamWriter(transport, protocol, reader, loop))

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _nodelay(writer)
        peername = writer.get_extra_info("peername")
        try:
            async with asyncio.timeout(5):
                frame = await read_hello_frame(reader)
            src = self._check_hello(frame, None, writer)
            if src > self.id:  # lower ids dial higher ones, so there is one connection per pair
                raise ValueError(f"node {src} must accept connections from node {self.id}, not dial it")
        except (ValueError, FrameError, asyncio.IncompleteReadError, TimeoutError, OSError) as exc:
            self.stats["rejected_handshakes"] += 1
            self._log_refusal(peername, f"TLS handshake failed: {brief(exc)}" if isinstance(exc, ssl.SSLError)
                              else _why(exc))
            writer.close()
            return
        writer.write(self._hello(src))
        self._attach(self.peers[src], reader, writer)

    def _log_refusal(self, addr: Any, why: str) -> None:
        """Log a refused connection; the same refusal of the same host at most once per HUNG_UP_LOG_EVERY_S
        (a misconfigured peer redials several times a second), with the count of those not logged."""
        key = (addr[0] if isinstance(addr, tuple) and addr else str(addr), why)
        now = asyncio.get_running_loop().time()
        last, quiet = self._refusals_logged.get(key, (-HUNG_UP_LOG_EVERY_S, 0))
        if now < last + HUNG_UP_LOG_EVERY_S:
            self._refusals_logged[key] = (last, quiet + 1)
            return
        if len(self._refusals_logged) >= 1024:  # bounded: many hosts or reasons only cost repeated lines
            self._refusals_logged.clear()
        self._refusals_logged[key] = (now, 0)
        more = f" ({quiet} more like it from this host not logged)" if quiet else ""
        self.log.warning("node %d: rejected connection from %s: %s%s", self.id, addr, why, more)

    async def _dial_forever(self, pid: int) -> None:
        backoff = 0.05
        hung_up_logged = -HUNG_UP_LOG_EVERY_S
        peer = self.peers[pid]
        host, port = self.addrs[pid]
        while not self._stopping:
            try:
                async with asyncio.timeout(7):
                    reader, writer = await asyncio.open_connection(
                        host, port, ssl=self.client_ssl, ssl_handshake_timeout=5 if self.client_ssl else None)
                _nodelay(writer)
                writer.write(self._hello(pid))
                async with asyncio.timeout(5):
                    frame = await read_hello_frame(reader)
                self._check_hello(frame, pid, writer)
            except (OSError, TimeoutError, ValueError, FrameError, asyncio.IncompleteReadError) as exc:
                if isinstance(exc, ValueError | FrameError | ssl.SSLError):
                    self.log.warning("node %d: handshake with node %d failed: %s", self.id, pid, brief(exc))
                elif isinstance(exc, asyncio.IncompleteReadError | ConnectionResetError) \
                        and asyncio.get_running_loop().time() >= hung_up_logged + HUNG_UP_LOG_EVERY_S:
                    # The peer accepted and then closed without a word: it refused this node (its log says
                    # why). Said at most twice a minute: the dial is retried several times a second.
                    hung_up_logged = asyncio.get_running_loop().time()
                    self.log.warning("node %d: node %d closed the connection during the handshake: it refuses this "
                                     "node (TLS on one side and --insecure on the other, another cluster id or "
                                     "member list: its log says which)", self.id, pid)
                await asyncio.sleep(backoff * (0.5 + random.random()))
                # Capped low: a link still backing off from a peer's restart when the leader fails holds
                # the election up (docs/chaos.md, "Failover"); a dead peer costs two dials a second.
                backoff = min(0.4, backoff * 2)
                continue
            backoff = 0.05
            self.stats["reconnects"] += 1
            task = self._attach(peer, reader, writer)
            # Wait for the connection to end; unlike awaiting the task, this neither raises when a
            # newer connection cancels the reader nor swallows our own cancellation.
            await asyncio.wait({task})
            if self._stopping:
                return
            await asyncio.sleep(0.05 * (0.5 + random.random()))

    def _attach(self, peer: _Peer, reader: asyncio.StreamReader,
                writer: asyncio.StreamWriter) -> asyncio.Task[None]:
        """Make this connection the peer's one connection, replacing an older one."""
        if peer.writer is not None:
            if not peer.writer.is_closing():
                self.log.warning("node %d: new connection from node %d (%s) replaces the open one (%s)", self.id,
                                 peer.id, writer.get_extra_info("peername"), peer.writer.get_extra_info("peername"))
            peer.writer.close()
        if peer.reader_task is not None:
            peer.reader_task.cancel()
        peer.writer = writer
        peer.pending.clear()
        peer.reader_task = asyncio.create_task(self._read_loop(peer, reader, writer),
                                               name=f"read-{self.id}-{peer.id}")
        return peer.reader_task

    async def _read_loop(self, peer: _Peer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        deliver = self.on_message
        decode = Message.decode
        try:
            while True:
                frame = await read_frame(reader)
                msg = decode(frame)
                self.stats["frames_received"] += 1
                if msg.src != peer.id or msg.dst != self.id:
                    self.stats["rejected_messages"] += 1
                    self.log.warning("node %d: dropped message %r on the connection of node %d",
                                     self.id, msg, peer.id)
                    continue
                try:
                    deliver(msg)
                except Exception as exc:  # a handler bug must not cut the connection or go unseen
                    self.stats["handler_errors"] += 1
                    self.log.exception("node %d: handling %r from node %d failed: %s", self.id, msg, peer.id,
                                       brief(exc))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except (FrameError, ValueError) as exc:
            self.stats["malformed"] += 1
            self.log.warning("node %d: malformed frame from node %d, closing the connection: %s",
                             self.id, peer.id, brief(exc))
        finally:
            writer.close()
            if peer.writer is writer:
                peer.writer = None


def _nodelay(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _why(exc: BaseException) -> str:
    """What a refused peer connection did wrong, in words (a timeout's own text is empty)."""
    if isinstance(exc, TimeoutError):
        return "no hello frame within 5 s"
    if isinstance(exc, asyncio.IncompleteReadError):
        return f"closed after {len(exc.partial)} bytes, before its hello frame was whole"
    return brief(exc) or type(exc).__name__
