"""Length-prefixed frames over asyncio streams: 4-byte big-endian length, then payload.

The length is checked against a cap *before* any byte of the payload is read, so a
peer cannot make this node buffer more than the cap (see docs/security.md,
"Containment"). `MAX_FRAME` is sized to the largest legal message: an AppendEntries
batch is cut at `RaftConfig.max_bytes_per_msg` (4 MiB) plus at most one command of
`MAX_COMMAND` bytes, and a snapshot chunk is 1 MiB.
"""

from __future__ import annotations

import asyncio
import struct

MAX_COMMAND = 1 << 20  # largest single log entry a node accepts for proposal
MAX_FRAME = 8 << 20  # largest Raft message frame: 4 MiB batch + one command + encoding overhead
MAX_HANDSHAKE = 4 << 10  # the hello frame exchanged before anything else
_LEN = struct.Struct(">I")
TLS_RECORD_START = b"\x16\x03"  # a TLS record of type handshake, protocol version 3.x
_HTTP_STARTS = (b"GET ", b"POST", b"HEAD", b"PUT ", b"DELE", b"OPTI", b"PATC", b"PRI ")


class FrameError(Exception):
    """The peer sent something that is not a valid frame; close the connection."""


def pack_frame(payload: bytes, limit: int = MAX_FRAME) -> bytes:
    if len(payload) > limit:
        raise FrameError(f"frame of {len(payload)} bytes exceeds the {limit}-byte limit")
    return _LEN.pack(len(payload)) + payload


async def read_frame(reader: asyncio.StreamReader, limit: int = MAX_FRAME) -> bytes:
    """Read one frame; raises asyncio.IncompleteReadError at EOF, FrameError if over `limit`."""
    (n,) = _LEN.unpack(await reader.readexactly(4))
    if n > limit:
        raise FrameError(f"frame length {n} exceeds the {limit}-byte limit")
    return await reader.readexactly(n)


async def read_hello_frame(reader: asyncio.StreamReader, limit: int = MAX_HANDSHAKE) -> bytes:
    """`read_frame` for the first frame of a peer connection, naming the two mistakes that put
    something else there: a TLS peer talking to a plaintext (`--insecure`) node, and an HTTP
    client pointed at the Raft port. Without this both read as an absurd frame length."""
    head = await reader.readexactly(4)
    if head.startswith(TLS_RECORD_START):
        raise FrameError("a TLS handshake arrived: the peer runs with TLS certificates and this node with "
                         "--insecure; every member of a group must run the same way")
    if head in _HTTP_STARTS:
        raise FrameError("an HTTP request arrived on the Raft peer port: clients belong on the node's HTTP "
                         "address (--http-addr), not on its --peers address")
    (n,) = _LEN.unpack(head)
    if n > limit:
        raise FrameError(f"frame length {n} exceeds the {limit}-byte limit")
    return await reader.readexactly(n)


def brief(value: object, limit: int = 200) -> str:
    """`str(value)` cut to `limit` characters: what a log line may quote of peer input."""
    s = value if isinstance(value, str) else str(value)
    return s if len(s) <= limit else f"{s[:limit]}... ({len(s)} chars)"
