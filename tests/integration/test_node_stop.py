"""A node told to stop (SIGTERM) exits promptly whatever its clients do.

Clients used to hold a stopping node: an open watch or dashboard stream (its response never ends, and
uvicorn waited for every response) and a TLS client that never answers the server's close_notify
(asyncio waits 30 s for it). All are here, as a hung broker or a stopped dashboard would leave them.
"""

from __future__ import annotations

import socket
import ssl
import time

import pytest
from stack_helpers import loopback_stack

pytestmark = pytest.mark.integration


def test_a_node_stops_with_a_watcher_and_a_silent_tls_client_connected(tmp_path):
    stack = loopback_stack(tmp_path, architecture="legacy", tier_uri=None)  # no Kafka needed for this
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    clients: list[ssl.SSLSocket] = []
    try:
        stack.start_controllers()
        stack.wait_log("node1", "controller node 1", 60)
        host, port = stack.endpoints[1].split(":")
        idle = ctx.wrap_socket(socket.create_connection((host, int(port)), timeout=10), server_hostname=host)
        clients.append(idle)  # handshake done, then silence: it never reads the server's goodbye
        watch = ctx.wrap_socket(socket.create_connection((host, int(port)), timeout=10), server_hostname=host)
        clients.append(watch)
        auth = "".join(f"{k}: {v}\r\n" for k, v in stack.creds.credentials("observer").headers().items())
        watch.sendall(f"GET /v1/broker-sets/s1/watch HTTP/1.1\r\nhost: {host}\r\n{auth}\r\n".encode())
        assert watch.recv(4096).startswith(b"HTTP/1.1 200"), "the watch stream is open"
        board = ctx.wrap_socket(socket.create_connection((host, int(port)), timeout=10), server_hostname=host)
        clients.append(board)  # the dashboard's live stream, whose reader stopped reading
        board.sendall(f"GET /v1/dashboard/stream HTTP/1.1\r\nhost: {host}\r\n{auth}\r\n".encode())
        assert board.recv(4096).startswith(b"HTTP/1.1 200"), "the dashboard stream is open"
        t0 = time.monotonic()
        code = stack.stop("node1", timeout=20)  # SIGTERM; SIGKILL after 20 s (then the exit code is -9)
        took = time.monotonic() - t0
        assert code == 0, f"node1 did not stop cleanly in 20 s (exit {code}):\n{stack.log_tail('node1')}"
        print(f"node1 stopped in {took:.1f}s")
        # the watcher saw its stream end, rather than a connection that simply went quiet
        watch.settimeout(5)
        rest = b""
        for _ in range(50):  # bounded: the stream's remaining bytes, then EOF
            try:
                chunk = watch.recv(4096)
            except (ssl.SSLError, OSError):
                break
            if not chunk:
                break
            rest += chunk
        assert rest.endswith(b"0\r\n\r\n"), rest[-200:]  # chunked encoding's last chunk: a clean end
    finally:
        for c in clients:
            c.close()
        stack.stop_all()
