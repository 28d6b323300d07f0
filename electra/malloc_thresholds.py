"""Fixed glibc malloc thresholds, so that a TLS read's buffer comes from the heap and not from mmap.

asyncio's and uvloop's TLS transports take decrypted bytes with `SSLObject.read(256 KiB)`: CPython
allocates a 256 KiB bytes object, OpenSSL fills a few hundred bytes of it, the object shrinks to that
and is freed later. glibc serves an allocation above its mmap threshold (128 KiB at start) with a fresh
mapping. It raises that threshold only when a chunk mapped that way is freed at its full size, and the
shrunken read buffer never is: so a process that never happened to free some other large allocation
maps, faults in, remaps and unmaps 256 KiB for every TLS record it reads. Measured on this machine
(docs/failover-signal.md, "TLS reads and malloc"): an ingest worker took 226-240 µs of CPU per HTTPS
heartbeat at glibc's defaults and 135-162 µs with these thresholds, against 105 µs over plain HTTP.

Every Electra process that serves or sends TLS calls `keep_read_buffers_off_mmap()` once at its start
(the CLI, ingest workers, front-ends, the streaming job's driver). It is a no-op outside glibc.
"""

from __future__ import annotations

import ctypes
import platform

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3

# Above the 256 KiB TLS reads, below what is worth a mapping of its own.
MMAP_THRESHOLD_BYTES = 1 << 20
# The heap's free top is returned to the system only above this: a read buffer shrunk in place leaves
# ~256 KiB there, and trimming it at glibc's default (128 KiB) would be one brk() down and up a read.
TRIM_THRESHOLD_BYTES = 4 << 20


def keep_read_buffers_off_mmap() -> bool:
    """Fix glibc's mmap and trim thresholds for this process; True if glibc took both."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
