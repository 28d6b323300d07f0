"""Real RaftNodes over loopback TCP in one process: every read mode, compaction, InstallSnapshot."""

from __future__ import annotations

import asyncio
import time

import pytest

from electra.consensus.core import RaftConfig
from electra.consensus.errors import FollowerBehind, NotLeader, RaftError, ReadTimeout
from electra.consensus.kv import KVStateMachine, encode_put
from electra.consensus.node import NodeConfig, RaftNode
from electra.local_ports import free_ports

pytestmark = pytest.mark.integration


def _configs(tmp_path, **kw):
    ports = free_ports(3)
    peers = {i + 1: ("127.0.0.1", p) for i, p in enumerate(ports)}
    return {i: NodeConfig(node_id=i, peers=peers, data_dir=tmp_path / f"n{i}", tick_s=0.05,
                          raft=RaftConfig(election_ticks=10, heartbeat_ticks=1), **kw) for i in peers}


async def _started(tmp_path, **kw) -> dict[int, RaftNode]:
    """Three KV nodes over loopback, started."""
    nodes = {i: RaftNode(c, KVStateMachine()) for i, c in _configs(tmp_path, **kw).items()}
    for n in nodes.values():
        await n.start()
    return nodes


async def _leader(nodes: dict, timeout=10.0) -> RaftNode:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        leaders = [n for n in nodes.values() if n._running and n.is_leader]
        if leaders and leaders[0].core.committed_in_term():
            return leaders[0]
        await asyncio.sleep(0.02)
    raise AssertionError("no leader")


async def _wait(cond, timeout=10.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def _put_all(nodes: dict, commands: list[bytes], attempts: int = 10) -> RaftNode:
    """Commit idempotent puts through whichever node leads, as a client would; returns that leader.

    A proposal the leader refused (NoQuorum after a stall of this loop, which all three nodes share)
    or lost to a new leader is retried there: a put applied twice leaves the same state.
    """
    for _ in range(attempts):
        leader = await _leader(nodes)
        results = await asyncio.gather(*(leader.propose(c) for c in commands), return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException) and not isinstance(r, RaftError):
                raise r
        commands = [c for c, r in zip(commands, results, strict=True) if isinstance(r, RaftError)]
        if not commands:
            return leader
    raise AssertionError(f"{len(commands)} puts still refused after {attempts} attempts")


def _get(key):
    return lambda sm: sm.data.get(key)


def test_every_read_mode_sees_acknowledged_writes(tmp_path):
    async def main():
        nodes = await _started(tmp_path)
        try:
            leader = await _leader(nodes)
            follower = next(n for n in nodes.values() if n is not leader)
            for k in range(50):
                await leader.propose(encode_put("k", k))
                # After the ack, every consistent read anywhere must see k (or later).
                assert await leader.read(_get("k")) == k
                assert await leader.read(_get("k"), mode="lease") == k
                assert await follower.read(_get("k"), mode="follower") == k
            # Reads are batched: many concurrent ReadIndex reads share heartbeat rounds.
            rounds_before = leader.core.read_round
            values = await asyncio.gather(*(leader.read(_get("k")) for _ in range(500)))
            assert set(values) == {49}
            assert leader.core.read_round - rounds_before < 50
            assert leader.metrics["reads_lease"] >= 40  # the lease served most lease-mode reads
            assert await follower.read(_get("k"), mode="stale") is not None
            with pytest.raises(ValueError):
                await leader.read(_get("k"), mode="bogus")
        finally:
            for n in nodes.values():
                await n.stop()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_cut_off_follower_refuses_reads_within_its_deadline(tmp_path):
    async def main():
        nodes = await _started(tmp_path)
        try:
            leader = await _leader(nodes)
            follower = next(n for n in nodes.values() if n is not leader)
            await leader.propose(encode_put("k", 1))
            await _wait(lambda: follower.applied >= leader.core.commit, what="follower apply")
            await follower.transport.stop()  # cut it off from everyone
            t0 = time.monotonic()
            with pytest.raises((ReadTimeout, FollowerBehind)):
                await follower.read(_get("k"), mode="follower", timeout=0.5)
            assert time.monotonic() - t0 < 1.5
            await asyncio.sleep(0.7)  # longer than the election timeout without a leader
            t0 = time.monotonic()
            with pytest.raises((FollowerBehind, NotLeader)):
                await follower.read(_get("k"), mode="follower", timeout=5)
            assert time.monotonic() - t0 < 0.1  # refused at once, not after the deadline
        finally:
            for n in nodes.values():
                await n.stop()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_follower_read_on_the_node_that_becomes_leader_is_served_there(tmp_path):
    """Follower reads wait on the leader that stops; the node that takes over serves its own as a leader.
    They used to fail with NotLeader naming that very node (over HTTP: a redirect to itself)."""
    async def main():
        nodes = await _started(tmp_path)
        try:
            leader = await _leader(nodes)
            await leader.propose(encode_put("k", 7))
            others = [n for n in nodes.values() if n is not leader]
            for n in others:
                await _wait(lambda n=n: n.applied >= leader.core.commit, what="followers apply")
            await leader.stop()
            reads = [asyncio.ensure_future(n.read(_get("k"), mode="follower", timeout=5)) for n in others]
            new = await _leader({i: n for i, n in nodes.items() if n is not leader})
            served = await asyncio.gather(*reads, return_exceptions=True)
            mine = served[others.index(new)]
            assert mine == 7, f"the new leader's own follower read: {mine!r}"
            for n, r in zip(others, served, strict=True):
                if isinstance(r, NotLeader):
                    assert r.leader_id != n.cfg.node_id, "a node named itself as the leader to ask"
        finally:
            for n in nodes.values():
                if n._running:
                    await n.stop()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_lagging_follower_is_brought_up_by_install_snapshot_and_restarts_fast(tmp_path):
    async def main():
        cfgs = _configs(tmp_path, snapshot_entries=300, compaction_slack=50)
        nodes = {i: RaftNode(c, KVStateMachine()) for i, c in cfgs.items()}
        for n in nodes.values():
            await n.start()
        try:
            leader = await _leader(nodes)
            lagger_id = next(i for i, n in nodes.items() if n is not leader)
            await nodes[lagger_id].stop()
            for lo in range(0, 2000, 200):
                leader = await _put_all(nodes, [encode_put(f"k{k % 97}", k) for k in range(lo, lo + 200)])
            await _wait(lambda: leader.core.offset > 300, what="leader compaction")
            # The lagging node restarts from its own disk, then needs a snapshot: its log is compacted away.
            nodes[lagger_id] = RaftNode(cfgs[lagger_id], KVStateMachine())
            await nodes[lagger_id].start()
            lagger = nodes[lagger_id]
            await _wait(lambda: lagger.applied >= leader.core.commit, timeout=20, what="catch-up")
            assert lagger.metrics["snapshots_installed"] >= 1
            # The leader counts the transfer once the final acknowledgement reaches it.
            await _wait(lambda: any(n.metrics["snapshots_sent"] >= 1 for n in nodes.values()),
                        what="leader sees the transfer done")
            assert lagger.sm.data == leader.sm.data
            # A restart now loads the newest snapshot and replays only the tail.
            await _wait(lambda: lagger.metrics["snapshots_taken"] >= 1 or lagger._snap_meta is not None,
                        what="lagger snapshot")
            await lagger.stop()
            again = RaftNode(cfgs[lagger_id], KVStateMachine())
            await again.start()
            nodes[lagger_id] = again
            assert again.applied >= 300 and again.core.offset > 0
            await _wait(lambda: again.applied >= leader.core.commit, what="catch-up after restart")
            assert again.sm.data == leader.sm.data
        finally:
            for n in nodes.values():
                await n.stop()

    asyncio.run(asyncio.wait_for(main(), 90))


def test_snapshots_are_taken_while_the_loops_default_executor_is_busy(tmp_path):
    """Snapshots run on the node's own threads: slow tier reads that fill the default pool can't hold them up.

    `/v1/admin/history` and the dashboard read the Delta tier through `asyncio.to_thread`; an object
    store that answers slowly occupies the loop's default pool. Here that pool's one thread is held
    for the whole test, and every node must still write its snapshot.
    """
    import threading
    from concurrent.futures import ThreadPoolExecutor

    async def main():
        busy, release = ThreadPoolExecutor(max_workers=1), threading.Event()
        asyncio.get_running_loop().set_default_executor(busy)
        held = asyncio.get_running_loop().run_in_executor(None, release.wait, 60)
        cfgs = _configs(tmp_path, snapshot_entries=300, compaction_slack=50)
        nodes = {i: RaftNode(c, KVStateMachine()) for i, c in cfgs.items()}
        for n in nodes.values():
            await n.start()
        try:
            await _put_all(nodes, [encode_put(f"k{k}", k) for k in range(400)])
            await _wait(lambda: all(n.metrics["snapshots_taken"] >= 1 for n in nodes.values()),
                        what="a snapshot on every node while the default pool is busy")
            assert not held.done()
        finally:
            release.set()
            for n in nodes.values():
                await n.stop()
            await held

    asyncio.run(asyncio.wait_for(main(), 60))
