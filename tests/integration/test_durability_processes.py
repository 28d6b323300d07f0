"""Disk faults on three real node processes: a full disk, a torn log tail, a damaged snapshot.

The full-disk test mounts small tmpfs file systems (we run as root, so does CI) under
the followers' data directories: a real ENOSPC with real short writes, not a mock.
If mounting is impossible the test fails loudly; it never skips.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import subprocess
import time
from pathlib import Path

import pytest
from process_cluster import Cluster, check_all_acked, find_leader, wait_caught_up, writer

from electra.consensus.client import RaftClient
from electra.consensus.kv import encode_get, encode_put

pytestmark = pytest.mark.integration
EXIT_DISK_FAILURE = 74


@contextlib.contextmanager
def tmpfs(path: Path, size: str):
    """A real, small file system at `path` for the duration of the block."""
    path.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        pytest.fail(f"cannot mount a tmpfs at {path} (this test needs root): {proc.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


def fill(fs: Path) -> Path:
    """Write a filler file until the file system is full; returns it (delete it to free the space)."""
    filler = fs / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for _ in range(100_000):  # bounded: a 64 MiB tmpfs is full long before
            os.write(fd, b"\0" * 65536)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(fd)
    return filler


def test_followers_disks_fill_up_then_the_leader_dies_and_no_acknowledged_write_is_lost(tmp_path):
    cluster = Cluster(tmp_path)
    with contextlib.ExitStack() as mounts:
        for i in cluster.ids:  # every data dir on its own small file system; fill the followers' later
            mounts.enter_context(tmpfs(tmp_path / f"node{i}", "64m"))
        for i in cluster.ids:
            cluster.start(i)

        async def scenario() -> None:
            client = RaftClient(cluster.endpoints, timeout=3.0)
            acked: dict[str, int] = {}
            stop = asyncio.Event()
            try:
                leader = await find_leader(client, cluster.ids)
                followers = [i for i in cluster.ids if i != leader]
                writers = [asyncio.create_task(writer(RaftClient(cluster.endpoints, timeout=3.0), f"w{w}",
                                                       acked, stop, 100_000)) for w in range(16)]
                await asyncio.sleep(1.0)
                assert len(acked) > 50, "the cluster did not accept writes"
                fillers = [fill(tmp_path / f"node{i}") for i in followers]  # ENOSPC, short writes first
                deadline = time.monotonic() + 30
                while any(cluster.procs[i].poll() is None for i in followers):
                    assert time.monotonic() < deadline, "followers kept running on a full disk"
                    await asyncio.sleep(0.1)
                for i in followers:  # fail-stop with the distinct exit code and a clear line
                    assert cluster.procs[i].returncode == EXIT_DISK_FAILURE, cluster.procs[i].returncode
                    assert "FATAL" in (tmp_path / f"node{i}.log").read_text()
                await asyncio.sleep(1.0)  # writes still in flight time out: not acknowledged
                stop.set()
                await asyncio.wait_for(asyncio.gather(*writers), timeout=60)
                cluster.kill(leader)  # the only node that may still hold what the followers lost
                for f in fillers:
                    f.unlink()  # space is back; the followers restart from their own disks
                for i in followers:
                    cluster.start(i)
                survivor = await find_leader(client, followers, timeout=30)
                await check_all_acked(client, acked)
                assert survivor in followers
            finally:
                stop.set()
                await client.close()

        cluster.run(scenario)


def test_a_follower_whose_newest_segment_lost_its_tail_catches_up_and_one_cut_in_its_middle_refuses(tmp_path):
    cluster = Cluster(tmp_path)
    cluster.start_all()

    async def scenario() -> None:
        client = RaftClient(cluster.endpoints, timeout=3.0)
        try:
            leader = await find_leader(client, cluster.ids)
            follower = next(i for i in cluster.ids if i != leader)
            for lo in range(0, 600, 200):
                await asyncio.gather(*(client.propose(encode_put(f"k{k}", k)) for k in range(lo, lo + 200)))
            await wait_caught_up(client, follower, leader)
            term = (await client.status(leader))["term"]
            cluster.kill(follower)
            seg = sorted((tmp_path / f"node{follower}" / "raft-log").glob("*.seg"))[-1]
            whole = seg.read_bytes()
            with open(seg, "ab") as f:  # the crash tore an append: a record header and a part of its body
                f.write((5000).to_bytes(4, "big") + b"\x00\x01\x02" * 100)
            cluster.start(follower)
            st = await wait_caught_up(client, follower, leader)
            lead_st = await client.status(leader)
            assert (lead_st["role"], lead_st["term"]) == ("leader", term), "the leader must not change"
            assert st["last_index"] == lead_st["last_index"]
            await client.propose(encode_put("after", 1))
            await wait_caught_up(client, follower, leader)
            assert "torn tail" in (tmp_path / f"node{follower}.log").read_text()

            # Cut in the middle instead: synced, committed entries gone, which no torn write does. The
            # node's log mark says how far its log durably reached: it refuses to start rather than take
            # the cut for a torn tail (then it and a stale peer could elect a leader without those entries).
            await asyncio.sleep(1.5)  # the mark is written at most once a second: let it cover the entries above
            await client.propose(encode_put("marked", 1))
            await wait_caught_up(client, follower, leader)
            cluster.kill(follower)
            seg.write_bytes(whole[:len(whole) * 2 // 3 - 3])
            cluster.start(follower)
            assert cluster.procs[follower].wait(timeout=60) != 0
            assert "refusing to start" in (tmp_path / f"node{follower}.log").read_text()
            await client.propose(encode_put("still-served", 1))  # the other two serve on
        finally:
            await client.close()

    cluster.run(scenario)


async def snapshot_with_durable_compaction(client: RaftClient, node: int, leader: int, slack: int) -> int:
    """Wait until `node`'s newest snapshot is written and the log compaction it allows is durable.

    A snapshot is written in the background after apply, and its compaction record reaches the
    disk with the next append; killing the node earlier tests a different (older) snapshot. So:
    the snapshot and the compaction must show in the status before a few more appends, and no newer
    snapshot may appear meanwhile. Returns the snapshot's index.
    """
    for attempt in range(20):
        st = await wait_caught_up(client, node, leader)
        index = st["snapshot_index"]
        compacted = index > 0 and st["log_first_index"] == index - slack + 1
        pad = range(attempt * 10, attempt * 10 + 10)  # appends that carry the compaction record to disk
        await asyncio.gather(*(client.propose(encode_put(f"pad{j}", j)) for j in pad))
        await wait_caught_up(client, node, leader)
        await asyncio.sleep(0.5)  # a snapshot started by these appends would show by now
        if compacted and (await client.status(node))["snapshot_index"] == index:
            return index
    raise AssertionError(f"node {node}'s snapshot and log compaction did not settle: {st}")


def test_a_follower_with_a_damaged_newest_snapshot_recovers_from_the_leader(tmp_path):
    cluster = Cluster(tmp_path)
    snap = ("--snapshot-entries", "400", "--compaction-slack", "50")
    cluster.start_all(*snap)

    async def scenario() -> None:
        client = RaftClient(cluster.endpoints, timeout=3.0)
        try:
            leader = await find_leader(client, cluster.ids)
            follower = next(i for i in cluster.ids if i != leader)
            for lo in range(0, 2000, 250):
                await asyncio.gather(*(client.propose(encode_put(f"k{k}", k)) for k in range(lo, lo + 250)))
            newest_index = await snapshot_with_durable_compaction(client, follower, leader, slack=50)
            cluster.kill(follower)
            snaps = sorted((tmp_path / f"node{follower}" / "snapshots").glob("*.snap"))
            assert len(snaps) >= 2, snaps
            newest = snaps[-1]
            assert int(newest.name.split("-")[0]) == newest_index, (newest, newest_index)
            data = bytearray(newest.read_bytes())
            data[15] ^= 0x01  # one flipped bit in the header's index field
            newest.write_bytes(bytes(data))
            for lo in range(2000, 2600, 200):  # the group moves on meanwhile
                await asyncio.gather(*(client.propose(encode_put(f"k{k}", k)) for k in range(lo, lo + 200)))
            cluster.start(follower, *snap)
            st = await wait_caught_up(client, follower, leader)
            assert cluster.procs[follower].poll() is None, "the follower must not refuse to start"
            assert st["snapshots_installed"] >= 1, st
            text = (tmp_path / f"node{follower}.log").read_text()
            assert "recovering from the leader" in text and "votes as if its log ended" in text
            assert await client.propose(encode_get("k2599")) == 2599
        finally:
            await client.close()

    cluster.run(scenario)
