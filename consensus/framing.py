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


def brief(value: object, limit: int = 200) -> str:
    """`str(value)` cut to `limit` characters: what a log line may quote of peer input."""
    s = value if isinstance(value, str) else str(value)
    return s if len(s) <= limit else f"{s[:limit]}... ({len(s)} chars)"
