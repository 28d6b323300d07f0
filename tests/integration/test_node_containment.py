"""Real RaftNodes over loopback TCP in one process: a tick that fails, and snapshot transfers from the wrong
sender, beyond the size bound or stalled halfway (docs/security.md, "Containment")."""

from __future__ import annotations

import asyncio
import time

import pytest

from electra.consensus.core import RaftConfig
from electra.consensus.framing import MAX_COMMAND
from electra.consensus.kv import KVStateMachine, encode_put
from electra.consensus.messages import SnapChunk, SnapResp
from electra.consensus.node import NodeConfig, RaftNode
from electra.local_ports import free_ports

pytestmark = pytest.mark.integration


async def _group(tmp_path, **kw) -> dict[int, RaftNode]:
    ports = free_ports(3)
    peers = {i + 1: ("127.0.0.1", p) for i, p in enumerate(ports)}
    nodes = {i: RaftNode(NodeConfig(node_id=i, peers=peers, data_dir=tmp_path / f"n{i}", tick_s=0.05,
                                    raft=RaftConfig(election_ticks=10, heartbeat_ticks=1), **kw), KVStateMachine())
             for i in peers}
    for n in nodes.values():
        await n.start()
    return nodes


async def _leader(nodes, timeout=10.0) -> RaftNode:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for n in nodes.values():
            if n.is_leader and n.core.committed_in_term():
                return n
        await asyncio.sleep(0.02)
    raise AssertionError("no leader")


def _run(tmp_path, scenario, **kw):
    async def main():
        nodes = await _group(tmp_path, **kw)
        try:
            await scenario(nodes)
        finally:
            for n in nodes.values():
                await n.stop()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_failing_tick_is_counted_and_the_node_keeps_ticking_and_leading(tmp_path):
    async def scenario(nodes):
        leader = await _leader(nodes)
        real_tick, failures = leader.core.tick, []

        def flaky_tick():
            if len(failures) < 3:
                failures.append(1)
                raise OverflowError("integer out of range")  # what a 2**64 term did to msgpack
            real_tick()

        leader.core.tick = flaky_tick
        await asyncio.sleep(1.0)  # 20 ticks
        assert leader.metrics["tick_errors"] == 3
        assert time.monotonic() - leader.last_tick_at < 0.5
        assert (await _leader(nodes)) is leader
        await leader.propose(encode_put("k", 1), timeout=5)
        assert leader.health() == (True, "ok")
        with pytest.raises(ValueError, match="at most"):  # no entry may outgrow a frame
            leader.propose_future(b"x" * (MAX_COMMAND + 1))

    _run(tmp_path, scenario)


def _chunk(src, dst, term, *, offset=0, total=1 << 20, data=b"x" * 1000, done=False):
    return SnapChunk(src, dst, term, snap_index=10**6, snap_term=term, size=total, offset=offset, data=data,
                     done=done)


def _temp_files(node):
    return list(node.snapshots.dir.glob("*.tmp"))


def test_snapshot_chunks_are_accepted_only_from_the_current_leader_in_its_term(tmp_path):
    async def scenario(nodes):
        leader = await _leader(nodes)
        follower, other = (n for n in nodes.values() if n is not leader)
        follower._on_message(_chunk(other.cfg.node_id, follower.cfg.node_id, leader.core.term))
        follower._on_message(_chunk(leader.cfg.node_id, follower.cfg.node_id, leader.core.term + 1))
        leader._on_message(_chunk(other.cfg.node_id, leader.cfg.node_id, leader.core.term))
        assert follower.metrics["snapshot_chunks_refused"] == 2 and leader.metrics["snapshot_chunks_refused"] == 1
        assert not _temp_files(follower) and not _temp_files(leader)
        assert (await _leader(nodes)) is leader  # a forged chunk with a higher term unseated nobody

    _run(tmp_path, scenario)


def test_snapshot_transfer_over_the_size_bound_is_refused(tmp_path):
    async def scenario(nodes):
        leader = await _leader(nodes)
        follower = next(n for n in nodes.values() if n is not leader)
        sent = []
        follower.transport.send = sent.append
        follower._on_message(_chunk(leader.cfg.node_id, follower.cfg.node_id, leader.core.term, total=1 << 30))
        follower._on_message(_chunk(leader.cfg.node_id, follower.cfg.node_id, leader.core.term, total=10))
        assert [m.reject for m in sent if isinstance(m, SnapResp)] == [True, True]
        assert not _temp_files(follower)

    _run(tmp_path, scenario, max_snapshot_bytes=1 << 20)


def test_a_stalled_snapshot_transfer_is_aborted_and_its_temp_file_removed(tmp_path):
    async def scenario(nodes):
        leader = await _leader(nodes)
        follower = next(n for n in nodes.values() if n is not leader)
        follower._on_message(_chunk(leader.cfg.node_id, follower.cfg.node_id, leader.core.term))
        assert len(_temp_files(follower)) == 1  # the transfer started
        deadline = time.monotonic() + 5
        while _temp_files(follower):
            assert time.monotonic() < deadline, "the stalled transfer's temp file is still there"
            await asyncio.sleep(0.05)
        assert follower.metrics["snapshot_transfers_aborted"] == 1
        await leader.propose(encode_put("k", 1), timeout=5)

    _run(tmp_path, scenario, snapshot_stall_s=0.5)


def test_a_leader_that_cannot_commit_turns_unhealthy_and_recovers(tmp_path, caplog):
    """Followers that answer heartbeats but get none of the leader's entries keep it leading (CheckQuorum is
    satisfied) while nothing commits: /healthz must say so after three election timeouts, and recover."""
    from electra.consensus.messages import Append

    async def scenario(nodes):
        leader = await _leader(nodes)
        followers = [n for n in nodes.values() if n is not leader]
        real_send = leader.transport.send
        leader.transport.send = lambda m: None if isinstance(m, Append) else real_send(m)  # entries never arrive
        fut = leader.propose_future(encode_put("k", 1), timeout=30)
        limit = leader.commit_stall_limit_s()
        await asyncio.sleep(limit / 2)
        assert leader.health() == (True, "ok") and leader.is_leader
        deadline = time.monotonic() + limit + 2
        while leader.health()[0] and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        ok, reason = leader.health()
        assert not ok and reason.startswith("leader cannot commit") and leader.is_leader, reason
        assert leader.status()["commit_stalled_s"] > limit
        assert any("cannot commit" in r.getMessage() for r in caplog.records)
        assert all(f.health() == (True, "ok") for f in followers)
        leader.transport.send = real_send
        await asyncio.wait_for(fut, 10)
        assert leader.health() == (True, "ok") and leader.status()["commit_stalled_s"] == 0

    _run(tmp_path, scenario)
