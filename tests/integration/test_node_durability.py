"""Fail-stop in the RaftNode runtime: a failed fsync stops the node without acknowledging anything.

Real RaftNodes over loopback TCP in one process; the fault is an `os.fdatasync` that fails
for one node's log file descriptor (the kernel-level fault itself is exercised with a full
tmpfs in test_durability_processes.py).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os

import pytest
from test_node_reads_snapshots import _configs, _leader, _wait

from electra.consensus.errors import DiskFailure, NodeStopped, ProposalTimeout, QuorumLost
from electra.consensus.kv import KVStateMachine, encode_put
from electra.consensus.messages import Heartbeat, MsgType, SnapChunk
from electra.consensus.node import RaftNode
from electra.consensus.snapshots import make_blob

pytestmark = pytest.mark.integration


def _fail_fsync_of(monkeypatch, bad: list[RaftNode]) -> list[int]:
    calls: list[int] = []
    real = os.fdatasync

    def fdatasync(fd):
        if any(getattr(n.storage._file, "fd", None) == fd for n in bad):
            calls.append(fd)
            raise OSError(errno.EIO, "Input/output error")
        return real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    return calls


def test_followers_whose_fsync_fails_stop_and_acknowledge_nothing(tmp_path, monkeypatch):
    async def main():
        nodes = {i: RaftNode(c, KVStateMachine()) for i, c in _configs(tmp_path).items()}
        for n in nodes.values():
            await n.start()
        try:
            leader = await _leader(nodes)
            followers = [n for n in nodes.values() if n is not leader]
            await leader.propose(encode_put("before", 1))
            committed = leader.core.commit
            acks_after: list = []
            for f in followers:  # record every append ack a failed follower would still send
                send_many = f.transport.send_many

                def spy(msgs, f=f, send_many=send_many):
                    if f.failure is not None:
                        acks_after.extend(m for m in msgs if m.type == MsgType.APP_RESP)
                    return send_many(msgs)

                f.transport.send_many = spy
            calls = _fail_fsync_of(monkeypatch, followers)
            # outcome unknown to the caller: at its deadline, or sooner once the leader has heard from no
            # quorum for an election timeout (QuorumLost); either way nothing may commit
            with pytest.raises((ProposalTimeout, QuorumLost)):
                await leader.propose(encode_put("after", 2), timeout=1.5)
            for f in followers:
                await asyncio.wait_for(f.failed, 5)  # the host's signal to exit
                assert isinstance(f.failure, DiskFailure) and "Input/output error" in str(f.failure)
                assert not f._running
                with pytest.raises(DiskFailure):
                    f.propose_future(encode_put("x", 1))
            assert leader.core.commit == committed, "an entry committed on acks that were never durable"
            assert acks_after == []
            n_calls = len(calls)
            await asyncio.sleep(0.5)
            assert len(calls) == n_calls, "a failed fsync was retried"
        finally:
            for n in nodes.values():
                await n.stop()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_leader_whose_fsync_fails_fails_every_pending_request(tmp_path, monkeypatch):
    async def main():
        cfg = _configs(tmp_path)[1]
        cfg.peers = {1: cfg.peers[1]}  # a one-node group: only its own disk can acknowledge
        node = RaftNode(cfg, KVStateMachine())
        await node.start()
        try:
            await _wait(lambda: node.is_leader, what="leadership")
            await node.propose(encode_put("before", 1))
            _fail_fsync_of(monkeypatch, [node])
            pending = [node.propose_future(encode_put(f"k{i}", i)) for i in range(20)]
            results = await asyncio.wait_for(asyncio.gather(*pending, return_exceptions=True), 10)
            assert all(isinstance(r, DiskFailure) for r in results), results
            assert node.failed.done() and node.failure is not None
            assert node.sm.data.get("k0") is None  # nothing applied after the failure
        finally:
            await node.stop()
        with pytest.raises((DiskFailure, NodeStopped)):
            node.propose_future(encode_put("late", 1))

    asyncio.run(asyncio.wait_for(main(), 60))


def test_the_hosts_stop_during_a_disk_failure_stop_returns_once_the_log_is_closed(tmp_path, monkeypatch):
    """The node stops itself on a failed fsync; the host's stop, arriving meanwhile, waits for that stop.

    Returning early would let the process exit with the log still open and the node's tasks running.
    """
    async def main():
        cfg = _configs(tmp_path)[1]
        cfg.peers = {1: cfg.peers[1]}
        node = RaftNode(cfg, KVStateMachine())
        await node.start()
        await _wait(lambda: node.is_leader, what="leadership")
        _fail_fsync_of(monkeypatch, [node])
        node.propose_future(encode_put("k", 1))
        await asyncio.wait_for(node.failed, 10)  # the host's signal: it stops the node now
        await node.stop()
        assert node.storage._file is None, "stop() returned before the failing node closed its log"
        assert all(t.done() for t in node._tasks)

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_transfer_from_a_leader_that_went_away_leaves_no_temporary_file(tmp_path):
    """Node 1 runs alone (its peers' ports are silent); peers 2 and 3 are played by hand."""

    async def main():
        cfg = _configs(tmp_path)[1]
        node = RaftNode(cfg, KVStateMachine())
        await node.start()
        snap_dir = cfg.data_dir / "snapshots"
        blob = make_blob(500, 5, b"s" * 4096)
        try:
            # Chunks are accepted only from the leader this node follows (docs/security.md): node 2
            # makes itself known with a heartbeat first, as a real leader does.
            node._on_message(Heartbeat(2, 1, 5, leader_commit=0, commit=0))
            node._on_message(SnapChunk(2, 1, 5, snap_index=500, snap_term=5, size=len(blob),
                                       offset=0, data=blob[:1000], done=False))
            await asyncio.sleep(0.1)
            assert node.leader_id == 2 and list(snap_dir.glob("*.tmp")), "the transfer should have started"
            node._on_message(Heartbeat(3, 1, 6, leader_commit=0, commit=0))  # a new leader
            await _wait(lambda: not list(snap_dir.glob("*.tmp")), what="the partial transfer to be dropped")
            assert node.leader_id == 3
            node._on_message(SnapChunk(3, 1, 6, snap_index=500, snap_term=5, size=len(blob),
                                       offset=0, data=blob[:1000], done=False))
            await asyncio.sleep(0.1)
            assert list(snap_dir.glob("*.tmp"))
        finally:
            await node.stop()
        assert not list(snap_dir.glob("*.tmp")), "stopping must drop a partial transfer"

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_one_member_group_with_a_damaged_snapshot_refuses_to_start(tmp_path):
    """With no leader to recover from, starting from older state would lose acknowledged writes."""

    async def main():
        cfg = _configs(tmp_path, snapshot_entries=50, compaction_slack=5)[1]
        cfg.peers = {1: cfg.peers[1]}
        node = RaftNode(cfg, KVStateMachine())
        await node.start()
        await _wait(lambda: node.is_leader, what="leadership")
        for k in range(300):
            await node.propose(encode_put(f"k{k}", k))
        await _wait(lambda: node.metrics["snapshots_taken"] >= 3 and not node._snapshotting, what="snapshots")
        await node.stop()
        for path in (cfg.data_dir / "snapshots").glob("*.snap"):
            data = bytearray(path.read_bytes())
            data[15] ^= 0x01
            path.write_bytes(bytes(data))
        again = RaftNode(cfg, KVStateMachine())
        with pytest.raises(RuntimeError, match="no leader to recover from"):
            await again.start()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_snapshot_that_cannot_be_written_is_retried_after_a_growing_wait(tmp_path, monkeypatch):
    """A full disk or an unwritable snapshots directory: the node keeps serving from its log, counts the failure and
    waits before the next try. Before, every applied batch tried again (about 400 tracebacks a second)."""

    async def main():
        cfg = _configs(tmp_path, snapshot_entries=20, compaction_slack=5)[1]
        cfg.peers = {1: cfg.peers[1]}
        node = RaftNode(cfg, KVStateMachine())
        await node.start()
        tries = []

        def refuse(*args, **kwargs):
            tries.append(node.applied)
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(node.snapshots, "create", refuse)
        try:
            await _wait(lambda: node.is_leader, what="leadership")
            for k in range(200):  # ten times the snapshot interval, in many batches
                await node.propose(encode_put(f"k{k}", k))
            assert len(tries) == 1 and node.metrics["snapshot_failures"] == 1  # one try, then the wait
            assert node.status()["snapshot_failures"] == 1
            node._snapshot_retry_at = 0.0  # the wait is over
            await node.propose(encode_put("again", 1))
            assert len(tries) == 2 and node._snapshot_retry_at - node.clock.now() > 9  # 10 s: the wait doubled
            monkeypatch.undo()  # the disk has room again
            node._snapshot_retry_at = 0.0
            await node.propose(encode_put("last", 1))
            await _wait(lambda: node.metrics["snapshots_taken"] >= 1 and not node._snapshotting, what="a snapshot")
            assert node._snapshot_failed_in_a_row == 0
        finally:
            await node.stop()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_node_restored_empty_with_rejoin_learns_its_floor_from_the_leader_and_stores_it(tmp_path, caplog):
    """Real nodes over loopback: node 3's data dir is emptied while it is down and it restarts with the rejoin
    floor (`electra node --rejoin`). Its first leader's commit becomes its floor, durably, and it catches up."""
    import shutil

    from electra.consensus.core import REJOIN_FLOOR
    from electra.consensus.data_dir_claims import mark_rejoining
    from electra.consensus.storage import LogStorage

    cfgs = _configs(tmp_path)

    async def main():
        nodes = {i: RaftNode(c, KVStateMachine()) for i, c in cfgs.items()}
        for n in nodes.values():
            await n.start()
        try:
            leader = await _leader(nodes)
            for i in range(20):
                await leader.propose(encode_put(f"k{i}", i))
            await nodes[3].stop()
            shutil.rmtree(cfgs[3].data_dir)
            assert mark_rejoining(cfgs[3].data_dir)
            nodes[3] = RaftNode(cfgs[3], KVStateMachine())
            await nodes[3].start()
            assert nodes[3].core.vote_floor == REJOIN_FLOOR and nodes[3].status()["votes"] is False
            await _wait(lambda: nodes[3].applied >= leader.core.commit, what="node 3 caught up")
            assert nodes[3].status()["votes"] is True
            floor = nodes[3].core.vote_floor
            assert floor != REJOIN_FLOOR and floor[0] >= 21  # the leader's commit when it first heard from it
        finally:
            for n in nodes.values():
                await n.stop()
        return floor

    with caplog.at_level(logging.WARNING, logger="electra.consensus.node"):
        floor = asyncio.run(main())
    said = [r.getMessage() for r in caplog.records if "neither votes nor campaigns" in r.getMessage()]
    assert said and said[0].startswith("node 3 neither votes nor campaigns until it has caught up"), said
    s = LogStorage(cfgs[3].data_dir / "raft-log", fsync=False)
    assert s.open().vote_floor == floor  # stored: a restart does not fall back to the rejoin floor
    s.close()
