"""A TLS read's 256 KiB buffer must come from the heap, not from a fresh mapping per record
(electra/malloc_thresholds.py). Each case runs in its own interpreter: glibc's thresholds are
per process, and the control shows what the default does, so the check can fail."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from electra.security.pki import create_ca, create_node_cert

# One TLS 1.3 exchange over memory BIOs, then the read asyncio's and uvloop's transports make
# (`SSLObject.read(256 KiB)`): how many chunks glibc has mapped while its result is alive.
PROBE = r"""
import ctypes, json, ssl, sys
tuned = sys.argv[1] == "tuned"
if tuned:
    from electra.malloc_thresholds import keep_read_buffers_off_mmap
    assert keep_read_buffers_off_mmap()
from electra.security.tls import client_context

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
server_ctx.load_cert_chain(sys.argv[3], sys.argv[4])
bios = [ssl.MemoryBIO() for _ in range(4)]
client = client_context(sys.argv[2]).wrap_bio(bios[0], bios[1], server_hostname="127.0.0.1")
server = server_ctx.wrap_bio(bios[2], bios[3], server_side=True)

def pump():
    bios[2].write(bios[1].read())
    bios[0].write(bios[3].read())

for _ in range(10):
    for end in (client, server):
        try:
            end.do_handshake()
        except ssl.SSLWantReadError:
            pass
    pump()
counts = []
for i in range(20):
    client.write(b'{"heartbeat": %d}' % i)
    pump()
    before = libc.mallinfo2().hblks
    data = server.read(256 * 1024)
    counts.append(libc.mallinfo2().hblks - before)
    assert data == b'{"heartbeat": %d}' % i
    del data
print(json.dumps(counts))
"""


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> tuple[Path, Path, Path]:
    d = tmp_path_factory.mktemp("certs")
    create_ca(d)
    cert, key = create_node_cert(d, 1, ["127.0.0.1"])
    return d / "ca.crt", cert, key


def _mapped_per_read(mode: str, certs) -> list[int]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode, *map(str, certs)], capture_output=True, text=True,
                         timeout=60, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_glibc_defaults_map_a_fresh_chunk_for_every_tls_read(certs):
    assert _mapped_per_read("default", certs) == [1] * 20


def test_after_the_warm_up_every_tls_read_stays_in_the_heap(certs):
    assert _mapped_per_read("tuned", certs) == [0] * 20


def test_every_tls_process_entry_point_raises_the_threshold():
    """The CLI, the ingest worker, the front-ends and the streaming job's driver each call it at their
    start (each is a process of its own: spawned, or `python -m`)."""
    root = Path(__file__).resolve().parents[2]
    for path, function in (("electra/cli.py", "main"), ("api/ingest_server.py", "run_worker"),
                           ("api/front_end.py", "main"), ("streaming/job.py", "main")):
        tree = ast.parse((root / path).read_text())
        [fn] = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function]
        calls = {n.func.id for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        assert "keep_read_buffers_off_mmap" in calls, f"{path}: {function}() does not raise the threshold"
