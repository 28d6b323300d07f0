"""Raise glibc's mmap threshold at a process's start, so that a TLS read's buffer comes from the heap.

asyncio's and uvloop's TLS transports take decrypted bytes with `SSLObject.read(256 KiB)`: CPython
allocates a 256 KiB bytes object, OpenSSL fills a few hundred bytes of it, the object shrinks to that
and is freed later. glibc serves an allocation above its mmap threshold (128 KiB at start) with a fresh
mapping, and raises the threshold (and the heap's trim threshold, to twice that) only when a chunk mapped
that way is freed at its full size, which the shrunken read buffer never is. So until some other large
allocation happens to be freed whole, a process maps, faults in, remaps and unmaps 256 KiB for every TLS
record it reads. Measured on this machine (docs/failover-signal.md, "Round 6"): a fresh ingest worker
took 210-247 µs of CPU per HTTPS heartbeat, 155-166 µs after the warm-up, 105 µs over plain HTTP.

`api/read_buffer.SharedReadBuffer` keeps Electra's own hottest protocols (ingest, broker sessions) off
that allocation altogether; this covers everything else behind TLS in the process (the Raft peers'
streams, uvicorn's protocols, clients, kafka-python's buffers in its threads).

`keep_read_buffers_off_mmap()` does at start what glibc would do after that first large free: it
allocates and frees one 1 MiB chunk, which moves the threshold past the read buffers and leaves glibc's
own adjustment on (fixing the thresholds with `mallopt` would turn it off). Every Electra process that
serves or sends TLS calls it (the CLI, ingest workers, front-ends, the streaming job's driver). It is a
no-op outside glibc, and where the threshold is already higher.
"""

from __future__ import annotations

import ctypes
import platform

# Above the 256 KiB TLS reads (asyncio's and uvloop's `max_size`), and above glibc's 128 KiB default
# threshold, so that glibc maps this chunk and, when it is freed, raises the threshold to its size.
WARM_CHUNK_BYTES = 1 << 20


def keep_read_buffers_off_mmap() -> bool:
    """Raise glibc's dynamic mmap threshold past a TLS read's buffer; False outside glibc."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(None)
        malloc, free = libc.malloc, libc.free
    except (OSError, AttributeError):
        return False
    malloc.argtypes, malloc.restype = (ctypes.c_size_t,), ctypes.c_void_p
    free.argtypes, free.restype = (ctypes.c_void_p,), None
    chunk = malloc(WARM_CHUNK_BYTES)
    if not chunk:
        return False
    free(chunk)
    return True
