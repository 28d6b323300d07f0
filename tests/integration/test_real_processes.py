"""Three real node processes over loopback TCP: SIGKILL the leader under load, restart it.

Checks that the cluster keeps accepting writes, that the restarted node catches
up from its own disk plus replication, and that no acknowledged write is lost.
"""

from __future__ import annotations

import asyncio
import subprocess
import time

import pytest
from process_cluster import Cluster, check_all_acked, find_leader, wait_caught_up, writer

from electra.consensus.client import RaftClient
from electra.consensus.kv import encode_get, encode_put

pytestmark = pytest.mark.integration


def test_leader_sigkill_under_load_loses_no_acknowledged_write(tmp_path):
    cluster = Cluster(tmp_path)
    cluster.start_all()

    async def scenario() -> None:
        client = RaftClient(cluster.endpoints, timeout=3.0)
        acked: dict[str, int] = {}
        stop = asyncio.Event()
        try:
            leader = await find_leader(client, cluster.ids)
            writers = [asyncio.create_task(writer(RaftClient(cluster.endpoints, timeout=3.0), f"w{w}",
                                                   acked, stop, 100_000)) for w in range(16)]
            await asyncio.sleep(1.5)
            before_kill = len(acked)
            assert before_kill > 50, "the cluster did not accept writes before the kill"
            cluster.kill(leader)
            await asyncio.sleep(3.0)  # writers keep going: a new leader takes over
            after_kill = len(acked)
            assert after_kill > before_kill + 20, "no writes were acknowledged after the leader died"
            cluster.start(leader)  # the old leader restarts from its own disk
            await asyncio.sleep(1.5)
            stop.set()
            await asyncio.wait_for(asyncio.gather(*writers), timeout=30)

            # The restarted node catches up with the group; every acknowledged write is there.
            new_leader = await find_leader(client, cluster.ids)
            await wait_caught_up(client, leader, new_leader, timeout=20)
            await check_all_acked(client, acked)
        finally:
            stop.set()
            await client.close()

    cluster.run(scenario, timeout=120)


def test_follower_behind_the_compacted_log_catches_up_by_install_snapshot(tmp_path):
    cluster = Cluster(tmp_path)
    snap = ("--snapshot-entries", "500", "--compaction-slack", "100")
    cluster.start_all(*snap)

    async def scenario() -> None:
        client = RaftClient(cluster.endpoints, timeout=3.0)
        try:
            leader = await find_leader(client, cluster.ids)
            lagger = next(i for i in cluster.ids if i != leader)
            await client.propose(encode_put("before", 1))
            cluster.kill(lagger)
            for lo in range(0, 3000, 300):
                await asyncio.gather(*(client.propose(encode_put(f"k{k}", k)) for k in range(lo, lo + 300)))
            st = await client.status(leader)
            assert st["log_first_index"] > 1000, st  # the lagger's next entry is long compacted away
            cluster.start(lagger, *snap)
            deadline = time.monotonic() + 30
            while True:
                try:
                    lst = await client.status(lagger)
                except (OSError, TimeoutError):
                    lst = {"applied_index": 0}
                lead_st = await client.status(leader)
                caught_up = lst["applied_index"] >= lead_st["commit_index"] > 3000
                if caught_up and lead_st["snapshots_sent"] >= 1:  # the leader counts it on the final ack
                    break
                assert time.monotonic() < deadline, f"no catch-up: {lst} vs {lead_st}"
                await asyncio.sleep(0.2)
            assert lst["snapshots_installed"] >= 1 and lead_st["snapshots_sent"] >= 1
            assert await client.propose(encode_get("k2999")) == 2999
        finally:
            await client.close()

    cluster.run(scenario, timeout=120)


def test_corrupt_log_refuses_to_start_with_a_clear_error(tmp_path):
    """A node whose log is corrupt before its tail exits non-zero naming the file and offset."""
    cluster = Cluster(tmp_path, n=1)
    cluster.start(1)

    async def write_some() -> None:
        client = RaftClient(cluster.endpoints, timeout=3.0)
        try:
            await find_leader(client, [1])
            for k in range(50):
                await client.propose(encode_put(f"k{k}", k))
        finally:
            await client.close()

    cluster.run(write_some, timeout=30)
    seg_dir = tmp_path / "node1" / "raft-log"
    segs = sorted(p for p in seg_dir.iterdir() if p.is_file())
    assert segs
    data = bytearray(segs[0].read_bytes())
    data[len(data) // 3] ^= 0xFF  # corrupt a record in the middle, valid records follow
    segs[0].write_bytes(bytes(data))
    proc = subprocess.run(cluster.command(1), capture_output=True, text=True, timeout=30)
    assert proc.returncode != 0
    assert segs[0].name in proc.stderr and "offset" in proc.stderr
