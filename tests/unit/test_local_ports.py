"""Ports handed to processes that bind them later: never from the ephemeral range (an outgoing connection can
take such a port before the server binds it), never one already in use, never the same one twice."""

from __future__ import annotations

import socket

import pytest

from electra import local_ports


def test_ports_are_below_the_ephemeral_range_and_distinct():
    low = local_ports._ephemeral_low()
    ports = local_ports.free_ports(20) + local_ports.free_ports(20)
    assert len(set(ports)) == 40
    assert all(local_ports._LOWEST <= p < low for p in ports)


def test_a_port_in_use_is_skipped(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        busy = taken.getsockname()[1]
        taken.listen()
        first, second = local_ports.free_ports(2)
        tries = iter([busy, first, first, busy, second])
        monkeypatch.setattr(local_ports._random, "randint", lambda a, b: next(tries))
        monkeypatch.setattr(local_ports, "_handed_out", set())
        assert local_ports.free_ports(1) == [first]
        assert local_ports.free_ports(1) == [second]  # `first` was handed out already: it is not offered again


def test_a_run_of_ports_is_consecutive_and_free():
    base = local_ports.free_port_run(10)
    assert base + 10 <= local_ports._ephemeral_low()
    for p in range(base, base + 10):
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_a_host_whose_ephemeral_range_starts_low_gets_the_kernel_s_ports(monkeypatch):
    """Some containers start the ephemeral range at 1024: nothing lies below it, so the kernel picks."""
    monkeypatch.setattr(local_ports, "_ephemeral_low", lambda: 1024)
    ports = local_ports.free_ports(5)
    assert len(set(ports)) == 5 and all(p >= 1024 for p in ports)
    with pytest.raises(RuntimeError, match="consecutive ports"):
        local_ports.free_port_run(10)
