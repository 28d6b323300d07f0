"""The link between a front-end process and its node's Raft process: batched msgspec frames on a unix socket.

A front-end (`api/front_end.py`) parses, authenticates and validates broker requests; the Raft
process answers them. Over one unix-socket connection per front-end they exchange frames:

    frame  = 4-byte big-endian length, then a msgpack array of items
    Call   = [id, endpoint, name, cluster, args, scheme, path, query]   front-end -> Raft process
    Answer = [id, status, body (JSON bytes), headers]                     Raft process -> front-end

Both sides batch per event-loop turn: every call admitted in one turn of the front-end's loop
goes out as one frame, so the Raft process starts all of a frame's writes in one turn (one group
commit: `RaftNode.propose_future` queues them for one flush) and all of its reads behind one
ReadIndex round; answers that complete in one turn go back as one frame.

Bounds: a frame is at most `MAX_FRAME` bytes (bigger batches are split; a peer that sends a
bigger one is cut off), and at most `MAX_IN_FLIGHT` calls are open per link. A front-end over
that bound waits for room (its callers hold HTTP connections, themselves capped); the Raft
process also stops reading a link whose calls exceed the bound until answers drain, so the
kernel's socket buffer, not memory, absorbs an overrun.

When the link breaks, the front-end's open calls end: a write whose call was sent has an
unknown outcome (`LinkLost`, 504 like a proposal timeout, `api/replies.py`); a read, or a call
not yet sent, changed nothing (`LinkDown`, 503, retry).

A Raft process can also stop answering with the link still open (stopped by SIGSTOP, or its event
loop blocked). The front-end notices: when it has heard nothing on the link for `PROBE_AFTER_S`
it sends a ping, which the Raft process answers in the turn it reads it; a ping unanswered for
`STALL_AFTER_S` marks the link stalled. A stalled link ends its open calls as a broken one does
(a write's outcome is unknown: it may commit when the process resumes) and refuses new ones
with `LinkDown` until a frame arrives again, so callers get a 503 or 504 within seconds instead
of waiting as long as they are willing to.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from collections.abc import Callable
from typing import Any

import msgspec

from electra.consensus.errors import RaftError

log = logging.getLogger("electra.api.local_link")

MAX_FRAME = 8 << 20  # a request body is at most 1 MiB (the lean path's limit): one always fits
MAX_IN_FLIGHT = 4096  # open calls per link
PROBE_AFTER_S = 1.0  # a link silent this long gets a ping
STALL_AFTER_S = 3.0  # a ping unanswered this long: the Raft process is stalled
PING = "ping"  # the endpoint of a ping Call: answered by the link itself, never executed
# The endpoint of a Call that carries a front-end's own request counts ([[endpoint, code, n], ...]: the
# refusals it answered itself, credentials and link failures) to the node's metrics; never answered.
COUNTS = "counts"
_LEN = struct.Struct(">I")


class Call(msgspec.Struct, array_like=True):
    """One admitted broker request: the lean route's endpoint and its decoded fields, in struct order."""

    id: int
    endpoint: str
    name: str | None
    cluster: str | None
    args: list[Any] | None
    scheme: str
    path: str
    query: str
    limited: tuple[str, tuple[str, ...]] | None = None  # a broker credential's name and cluster patterns


class Answer(msgspec.Struct, array_like=True):
    """The HTTP answer to one call, its body already JSON."""

    id: int
    status: int
    body: bytes
    headers: dict[str, str]


class LinkDown(RaftError):
    """The front-end has no link to its node's Raft process: nothing was sent (retry)."""


class LinkLost(RaftError):
    """The link broke after the call was sent: the write may yet commit."""

    outcome_known = False


class FrameError(Exception):
    """A peer broke the protocol (a frame too large or not decodable): the link is closed."""


_encoder = msgspec.msgpack.Encoder()


def encode_frames(items: list, max_frame: int = MAX_FRAME) -> list[bytes]:
    """`items` as length-prefixed frames of at most `max_frame` bytes each (split in halves as needed)."""
    payload = _encoder.encode(items)
    if len(payload) + _LEN.size <= max_frame:
        return [_LEN.pack(len(payload)) + payload]
    if len(items) == 1:
        raise FrameError(f"one item of {len(payload)} bytes exceeds the {max_frame}-byte frame limit")
    half = len(items) // 2
    return encode_frames(items[:half], max_frame) + encode_frames(items[half:], max_frame)


class FrameReader:
    """Cuts a byte stream into decoded frames (lists of `item_type`); raises FrameError on a bad one."""

    def __init__(self, item_type: type, max_frame: int = MAX_FRAME) -> None:
        self._decoder = msgspec.msgpack.Decoder(list[item_type])
        self._buf = bytearray()
        self._max = max_frame

    def feed(self, data: bytes) -> list[list]:
        buf = self._buf
        buf += data
        frames, pos = [], 0
        while len(buf) - pos >= _LEN.size:
            (size,) = _LEN.unpack_from(buf, pos)
            if size + _LEN.size > self._max:
                raise FrameError(f"a frame of {size} bytes exceeds the {self._max}-byte limit")
            end = pos + _LEN.size + size
            if len(buf) < end:
                break
            try:
                frames.append(self._decoder.decode(memoryview(buf)[pos + _LEN.size:end]))
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                raise FrameError(f"undecodable frame: {exc}") from None
            pos = end
        if pos:
            del buf[:pos]
        return frames


class _Batcher:
    """Items queued during one event-loop turn, written as frames at the end of it (unless writing is paused)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.outbox: list = []
        self.paused = False
        self._scheduled = False

    def queue(self, item) -> None:
        self.outbox.append(item)
        if not self._scheduled and not self.paused:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self._scheduled = False
        if self.paused or not self.outbox or self.transport is None or self.transport.is_closing():
            return
        items, self.outbox = self.outbox, []
        self.transport.writelines(encode_frames(items))

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False
        self.flush()


# ------------------------------------------------------------------ front-end side
class LinkClient(asyncio.Protocol):
    """A front-end's end of the link: `call` sends one request and waits for its answer."""

    def __init__(self, max_in_flight: int = MAX_IN_FLIGHT) -> None:
        self.max_in_flight = max_in_flight
        self.stats = {"calls": 0, "frames_in": 0, "frames_out": 0, "lost": 0, "waited_for_room": 0}
        self._out = _Batcher()
        self._reader = FrameReader(Answer)
        self._open: dict[int, tuple[asyncio.Future, bool]] = {}  # id -> (future, is a write)
        self._sent_upto = 0  # calls with ids up to this one have left in a frame
        self._next_id = 0
        self._room = asyncio.Event()
        self.connected = asyncio.Event()
        self.closed = asyncio.Event()
        self.stalled = False  # a ping went unanswered for STALL_AFTER_S; cleared by the next frame
        self._heard_at = 0.0  # loop time of the last frame from the Raft process (or of connecting)
        self._ping_sent_at: float | None = None
        self._watchdog: asyncio.TimerHandle | None = None

    @property
    def in_flight(self) -> int:
        return len(self._open)

    def close(self) -> None:
        if self._out.transport is not None:
            self._out.transport.close()

    def has_room(self) -> bool:
        return len(self._open) < self.max_in_flight

    def submit(self, c: Call, write: bool) -> asyncio.Future:
        """Queue `c` for this turn's frame (its id is set here): a future of its Answer.

        Raises LinkDown when the link is not up; the future fails with LinkLost (a write that
        was sent) or LinkDown (anything else) when the link breaks. Call only while `has_room()`.
        """
        if not self.connected.is_set() or self.closed.is_set():
            raise LinkDown("this front-end has no link to the node's Raft process")
        if self.stalled:
            raise LinkDown(f"the node's Raft process has not answered this front-end for over {STALL_AFTER_S:.0f}s")
        self._next_id += 1
        c.id = self._next_id
        fut = asyncio.get_running_loop().create_future()
        self._open[c.id] = (fut, write)
        self.stats["calls"] += 1
        self._out.queue(c)
        return fut

    def notify(self, c: Call) -> bool:
        """Queue a call that gets no answer (`COUNTS`); False when the link is not up to take it."""
        if not self.connected.is_set() or self.closed.is_set() or self.stalled:
            return False
        self._out.queue(c)
        return True

    async def call(self, c: Call, write: bool) -> Answer:
        """`submit` after waiting for room (backpressure), then the answer."""
        for _ in range(10_000):  # bounded: each wake-up follows an answer that freed slots
            if self.has_room() or self.closed.is_set():
                break
            self.stats["waited_for_room"] += 1
            self._room.clear()
            await self._room.wait()
        else:
            raise LinkDown("the link to the node's Raft process stays full")
        return await self.submit(c, write)

    # asyncio.Protocol
    def connection_made(self, transport) -> None:
        self._out.transport = transport
        self.connected.set()
        loop = asyncio.get_running_loop()
        self._heard_at = loop.time()
        self._watchdog = loop.call_later(PROBE_AFTER_S, self._watch)

    def _watch(self) -> None:
        """Once a second: ping a silent link; mark it stalled, and end its open calls, when a ping goes unanswered."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self._ping_sent_at is None and now - self._heard_at >= PROBE_AFTER_S:
            self._ping_sent_at = now
            self._next_id += 1
            self._out.queue(Call(self._next_id, PING, None, None, None, "", "", ""))
        elif self._ping_sent_at is not None and now - self._ping_sent_at >= STALL_AFTER_S and not self.stalled:
            self.stalled = True
            log.warning("the node's Raft process has not answered a ping for %.0fs: ending %d open calls, refusing "
                        "new ones until it answers", STALL_AFTER_S, len(self._open))
            self._end_open_calls("the node's Raft process stopped answering")
        self._watchdog = loop.call_later(PROBE_AFTER_S, self._watch)

    def data_received(self, data: bytes) -> None:
        try:
            frames = self._reader.feed(data)
        except FrameError as exc:
            log.error("link to the Raft process: %s; closing it", exc)
            self._out.transport.close()
            return
        if frames:
            self._heard_at = asyncio.get_running_loop().time()
            self._ping_sent_at = None
            if self.stalled:
                self.stalled = False
                log.warning("the node's Raft process answers again")
        for frame in frames:
            self.stats["frames_in"] += 1
            for a in frame:
                entry = self._open.pop(a.id, None)
                if entry is not None and not entry[0].done():
                    entry[0].set_result(a)
        if len(self._open) < self.max_in_flight:
            self._room.set()

    def pause_writing(self) -> None:
        self._out.pause()

    def resume_writing(self) -> None:
        self._out.resume()

    def connection_lost(self, exc) -> None:
        self.closed.set()
        if self._watchdog is not None:
            self._watchdog.cancel()
        self._end_open_calls("the link to the node's Raft process broke")
        self._out.outbox.clear()

    def _end_open_calls(self, why: str) -> None:
        """Fail every open call: a write already sent with LinkLost (it may commit), anything else with LinkDown."""
        unsent = {c.id for c in self._out.outbox}
        for cid, (fut, write) in self._open.items():
            if not fut.done():
                self.stats["lost"] += 1
                if write and cid not in unsent:
                    fut.set_exception(LinkLost(f"{why}; the write may have committed"))
                else:
                    fut.set_exception(LinkDown(why))
        self._open.clear()
        self._room.set()


# ------------------------------------------------------------------ Raft process side
Execute = Callable[[Call], Any]  # a Call -> Answer, or an awaitable Answer


def _peer_pid(transport) -> int:
    """The process at the other end of a unix socket (SO_PEERCRED), 0 when unknown."""
    sock = transport.get_extra_info("socket")
    try:
        pid, _uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                               struct.calcsize("3i")))
    except (OSError, AttributeError):
        return 0
    return pid


class LinkServerProtocol(asyncio.Protocol):
    """The Raft process's end of one front-end's link: runs each frame's calls in one turn, batches answers."""

    def __init__(self, execute: Execute, links: set, max_in_flight: int = MAX_IN_FLIGHT,
                 on_counts: Callable[[list[Any]], None] | None = None) -> None:
        self.execute = execute
        self.on_counts = on_counts  # a front-end's own request counts, for the node's metrics
        self.links = links
        self.max_in_flight = max_in_flight
        self.in_flight = 0
        self.reading_paused = False
        self.stats = {"calls": 0, "frames_in": 0, "reading_paused": 0}
        self._out = _Batcher()
        self._reader = FrameReader(Call)
        self.transport: asyncio.Transport | None = None
        self.peer_pid = 0
        self.heard_at = 0.0  # loop time of the last bytes from the front-end (FrontEnds kills one silent too long)

    def connection_made(self, transport) -> None:
        self.transport = transport
        self._out.transport = transport
        self.peer_pid = _peer_pid(transport)
        self.heard_at = asyncio.get_running_loop().time()
        self.links.add(self)

    def connection_lost(self, exc) -> None:
        self.links.discard(self)
        self._out.outbox.clear()

    def pause_writing(self) -> None:
        self._out.pause()

    def resume_writing(self) -> None:
        self._out.resume()

    def data_received(self, data: bytes) -> None:
        self.heard_at = asyncio.get_running_loop().time()  # a live front-end pings at least every second
        try:
            frames = self._reader.feed(data)
        except FrameError as exc:
            log.error("front-end link: %s; closing it", exc)
            self.transport.close()
            return
        for frame in frames:
            self.stats["frames_in"] += 1
            for c in frame:
                self._run(c)
        if self.in_flight >= self.max_in_flight and not self.reading_paused:
            self.reading_paused = True  # backpressure: the front-end's frames wait in the socket buffer
            self.stats["reading_paused"] += 1
            self.transport.pause_reading()

    def _run(self, c: Call) -> None:
        if c.endpoint == PING:
            self._out.queue(Answer(c.id, 200, b"", {}))
            return
        if c.endpoint == COUNTS:
            if self.on_counts is not None and c.args:
                self.on_counts(c.args)
            return
        self.stats["calls"] += 1
        try:
            out = self.execute(c)
        except Exception:  # a bug: answer this call 500, keep the link
            log.exception("front-end call %s failed", c.endpoint)
            out = Answer(c.id, 500, b'{"detail":"Internal Server Error"}', {})
        if isinstance(out, Answer):
            self._out.queue(out)
            return
        self.in_flight += 1
        fut = asyncio.ensure_future(out)
        fut.add_done_callback(lambda f, cid=c.id: self._done(cid, f))

    def _done(self, cid: int, fut: asyncio.Future) -> None:
        self.in_flight -= 1
        if fut.cancelled() or fut.exception() is not None:
            if not fut.cancelled():
                log.error("front-end call failed", exc_info=fut.exception())
            self._out.queue(Answer(cid, 500, b'{"detail":"Internal Server Error"}', {}))
        else:
            self._out.queue(fut.result())
        if self.reading_paused and self.in_flight <= self.max_in_flight // 2 and not self.transport.is_closing():
            self.reading_paused = False
            self.transport.resume_reading()
