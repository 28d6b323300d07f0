"""One read buffer per process for asyncio protocols: no 256 KiB allocation per TLS record.

uvloop (like asyncio) hands a plain `asyncio.Protocol` behind TLS a new bytes object for every TLS
record it decrypts, allocated at the largest record size (256 KiB) and then shrunk: for a server or
client whose every request is one small record (a heartbeat, a replica-info poll), that allocation was
a large part of the TLS cost per request. A `BufferedProtocol` is read into a buffer it provides;
this mixin provides one buffer shared by every connection of the process, which is safe because the
loop hands the bytes over (`buffer_updated`) right after reading them, before it reads any other
socket, and `buffer_updated` copies them out before anything else runs.

Use it first among the bases: `class MyProtocol(SharedReadBuffer, asyncio.Protocol)` with the usual
`data_received`. Plain protocols behind TLS elsewhere still get the 256 KiB object per record;
`electra/malloc_thresholds.py` keeps that allocation off mmap for the whole process.
"""

from __future__ import annotations

import asyncio

_BUFFER = memoryview(bytearray(256 << 10))


class SharedReadBuffer(asyncio.BufferedProtocol):
    """`get_buffer`/`buffer_updated` on the process's one read buffer, delivering to `data_received`."""

    def get_buffer(self, sizehint: int) -> memoryview:
        return _BUFFER

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(bytes(_BUFFER[:nbytes]))

    def data_received(self, data: bytes) -> None:  # the subclass's reader
        raise NotImplementedError
