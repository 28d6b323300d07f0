"""Length-prefixed frames over asyncio streams: 4-byte big-endian length, then payload."""

from __future__ import annotations

import asyncio
import struct

MAX_FRAME = 64 << 20
_LEN = struct.Struct(">I")


class FrameError(Exception):
    """The peer sent something that is not a valid frame; close the connection."""


def pack_frame(payload: bytes) -> bytes:
    if len(payload) > MAX_FRAME:
        raise FrameError(f"frame of {len(payload)} bytes exceeds the {MAX_FRAME}-byte limit")
    return _LEN.pack(len(payload)) + payload


async def read_frame(reader: asyncio.StreamReader) -> bytes:
    """Read one frame; raises asyncio.IncompleteReadError at EOF, FrameError if oversized."""
    (n,) = _LEN.unpack(await reader.readexactly(4))
    if n > MAX_FRAME:
        raise FrameError(f"frame length {n} exceeds the {MAX_FRAME}-byte limit")
    return await reader.readexactly(n)
