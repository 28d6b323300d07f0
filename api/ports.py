"""Listening sockets and whether a port is free: one way to bind, for the node's API, its front-ends, the ingest
workers and `electra up`'s checks."""

from __future__ import annotations

import socket


def bind_listening(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """A socket bound to host:port as the servers bind it (SO_REUSEADDR: a stopped server's connections in
    TIME_WAIT are no conflict); `reuse_port` for processes that share the port (the ingest workers, front-ends).
    OSError if it cannot bind."""
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host.strip("[]"), port))
    except OSError:
        sock.close()
        raise
    return sock


def port_taken(host: str, port: int) -> OSError | None:
    """Why nothing could listen on host:port now (EADDRINUSE: another process listens there), or None.

    Bound without SO_REUSEPORT: with it, the bind succeeded beside another process's SO_REUSEPORT listener
    (another `electra ingest`, another node's front-ends) and the kernel split the connections between the two."""
    try:
        bind_listening(host, port).close()
    except OSError as exc:
        return exc
    return None
