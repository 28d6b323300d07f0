"""Fuzzing the Raft port of real `electra node` processes with random frames (bounded in count and time).

Hypothesis generates raw bytes, arbitrary msgpack structures and near-valid Raft messages
(the 17-field array with random types and integers, so they get past the decoder's shape
checks into the protocol core). They go to a follower over a connection that
impersonates the other follower (the one link the leader does not use). Afterwards no
process has died, the group has a leader that commits a write, no tick failed, and the
target's peak RSS grew by less than 64 MiB.
"""

from __future__ import annotations

import socket
import struct
import time

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_peer_containment import Group, _frame, _impersonate

pytestmark = pytest.mark.integration

ints = st.one_of(st.integers(0, 20), st.integers(-(2**63), 2**64 - 1), st.sampled_from([2**62, 2**63 - 1, 2**64 - 1]))
scalars = st.one_of(st.none(), st.booleans(), ints, st.floats(allow_nan=True), st.binary(max_size=64),
                    st.text(max_size=32))
structures = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=8),
                                                           st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                          max_leaves=40)


def near_valid(src: int, dst: int):
    """17-field Raft messages: real type numbers and ids, random terms, indexes, flags and entries."""
    return st.tuples(st.integers(1, 13), st.just(src), st.sampled_from([dst, dst, 0, 99]), ints, ints, ints,
                     st.lists(ints, max_size=4), st.lists(st.binary(max_size=16), max_size=4), ints, st.booleans(),
                     ints, ints, ints, st.booleans(), ints, st.binary(max_size=64), st.booleans()).map(list)


def test_random_frames_never_crash_a_node_and_the_group_keeps_committing(tmp_path):
    group = Group(tmp_path)
    try:
        leader = group.leader()["node_id"]
        a, b = sorted(i for i in (1, 2, 3) if i != leader)  # a dials b: the followers' own link
        rss0 = group.peak_rss_kib(b)
        conn: list[socket.socket] = []
        sent = {"frames": 0}
        deadline = time.monotonic() + 90

        def send(payload: bytes) -> None:
            if time.monotonic() > deadline:
                return
            if not conn:
                conn.append(_impersonate(group, a, b))
            try:
                conn[0].sendall(_frame(payload))
                sent["frames"] += 1
            except OSError:
                conn.pop().close()  # the node closed it (malformed frame): next frame redials

        @given(payload=st.one_of(st.binary(max_size=256), structures.map(msgpack.packb),
                                 near_valid(a, b).map(msgpack.packb)))
        @settings(max_examples=400, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        def fuzz(payload: bytes) -> None:
            send(payload)

        fuzz()
        # And frames whose length prefix lies: larger than the cap, or larger than what follows.
        for prefix in (struct.pack(">I", 2**32 - 1), struct.pack(">I", 1000) + b"\x93"):
            with _impersonate(group, a, b) as s:
                s.sendall(prefix)
        for c in conn:
            c.close()
        assert sent["frames"] >= 200
        time.sleep(1.0)
        assert all(p.poll() is None for p in group.procs.values()), "a node process died"
        group.write(1, "after-peer-fuzz", timeout=30)
        for i in group.procs:
            st_ = group.status(i)
            assert st_["tick_errors"] == 0 and st_["process_errors"] == 0, st_
        assert group.peak_rss_kib(b) - rss0 < 64 << 10
        assert group.logs[b].stat().st_size < 4 << 20  # warnings are one short line per bad frame
    finally:
        group.stop()
