"""Loopback ports for processes that tests, benchmarks and `electra chaos` start (`electra up` takes fixed ones).

A port is picked here and bound later by another process, so it must stay free in between. The kernel's
"bind to port 0" answer comes from the ephemeral range, the same range every outgoing connection takes its local
port from: a Kafka client or HTTP probe that connects in that gap can take the port, and the server then fails
with "Address already in use". Ports are therefore drawn from below the ephemeral range, which outgoing
connections never use, checked free by binding them, and not handed out twice by one process.
"""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

_LOWEST = 10_000
_handed_out: set[int] = set()
_lock = threading.Lock()
_random = random.SystemRandom()


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """`n` distinct ports on `host` that were free when this returned and that outgoing connections will not take."""
    high = _ephemeral_low() - 1
    if high - _LOWEST < 4 * n:  # a host whose ephemeral range starts low (some containers: 1024): the kernel's pick
        return _kernel_ports(n, host)
    picked: list[int] = []
    socks: list[socket.socket] = []
    with _lock:
        try:
            for _ in range(200 * max(n, 1)):
                if len(picked) == n:
                    break
                port = _random.randint(_LOWEST, high)
                if port in _handed_out or port in picked:
                    continue
                s = socket.socket()
                try:
                    s.bind((host, port))
                except OSError:
                    s.close()
                    continue
                socks.append(s)
                picked.append(port)
            if len(picked) < n:
                raise RuntimeError(f"found only {len(picked)} of {n} free ports on {host} in {_LOWEST}-{high}")
            _handed_out.update(picked)
            return picked
        finally:
            for s in socks:
                s.close()


def _kernel_ports(n: int, host: str) -> list[int]:
    """Ports the kernel picks (bound to port 0 together), where there is no room below the ephemeral range."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            socks.append(s)
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port(host: str = "127.0.0.1") -> int:
    return free_ports(1, host)[0]


def free_port_run(n: int, host: str = "127.0.0.1") -> int:
    """The first of `n` consecutive free ports (for commands that take one base port and count up from it)."""
    high = _ephemeral_low() - 1
    if high - _LOWEST < 4 * n:
        raise RuntimeError(f"no room for {n} consecutive ports below the ephemeral range (it starts at {high + 1})")
    with _lock:
        for _ in range(200):
            base = _random.randint(_LOWEST, high - n)
            run = range(base, base + n)
            if any(p in _handed_out for p in run):
                continue
            try:
                for port in run:
                    with socket.socket() as s:
                        s.bind((host, port))
            except OSError:
                continue
            _handed_out.update(run)
            return base
    raise RuntimeError(f"found no {n} consecutive free ports on {host} in {_LOWEST}-{high}")
