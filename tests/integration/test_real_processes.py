"""Three real node processes over loopback TCP: SIGKILL the leader under load, restart it.

Checks that the cluster keeps accepting writes, that the restarted node catches
up from its own disk plus replication, and that no acknowledged write is lost.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import pytest

from electra.bench.common import free_ports
from electra.consensus.client import RaftClient
from electra.consensus.errors import RaftError
from electra.consensus.kv import encode_get, encode_put

pytestmark = pytest.mark.integration


class Cluster:
    def __init__(self, tmp_path, n: int = 3) -> None:
        ports = free_ports(2 * n)
        self.raft_ports = ports[:n]
        self.client_ports = ports[n:]
        self.ids = list(range(1, n + 1))
        self.peers = ",".join(f"{i}=127.0.0.1:{p}" for i, p in zip(self.ids, self.raft_ports, strict=True))
        self.tmp = tmp_path
        self.procs: dict[int, subprocess.Popen] = {}
        self.endpoints = {i: ("127.0.0.1", p) for i, p in zip(self.ids, self.client_ports, strict=True)}

    def start(self, i: int, *extra: str) -> None:
        log = open(self.tmp / f"node{i}.log", "ab")  # noqa: SIM115 - owned by the process
        self.procs[i] = subprocess.Popen(
            [sys.executable, "-m", "electra.cli", "--log-level", "INFO", "node", "--id", str(i),
             "--peers", self.peers, "--client-addr", f"127.0.0.1:{self.client_ports[i - 1]}",
             "--data-dir", str(self.tmp / f"node{i}"), "--tick-ms", "50", "--state-machine", "kv",
             "--insecure", *extra],
            stdout=log, stderr=subprocess.STDOUT)

    def kill(self, i: int) -> None:
        self.procs[i].send_signal(signal.SIGKILL)
        self.procs[i].wait(timeout=10)

    def stop_all(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        for p in self.procs.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()

    def logs(self) -> str:
        return "\n".join(f"--- node{i}.log ---\n" + (self.tmp / f"node{i}.log").read_text()[-3000:]
                         for i in self.ids)


async def _find_leader(client: RaftClient, ids, timeout: float = 20.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for i in ids:
            try:
                st = await client.status(i)
            except (OSError, TimeoutError):
                continue
            if st["role"] == "leader":
                return i
        await asyncio.sleep(0.1)
    raise AssertionError("no leader elected")


async def _writer(client: RaftClient, prefix: str, acked: dict, stop: asyncio.Event, limit: int) -> None:
    for k in range(limit):
        if stop.is_set():
            return
        key = f"{prefix}-{k}"
        try:
            await client.propose(encode_put(key, k), deadline_s=10)
            acked[key] = k
        except RaftError:
            await asyncio.sleep(0.05)  # unknown or refused: not acknowledged, not checked


def test_leader_sigkill_under_load_loses_no_acknowledged_write(tmp_path):
    cluster = Cluster(tmp_path)
    for i in cluster.ids:
        cluster.start(i)

    async def scenario() -> None:
        client = RaftClient(cluster.endpoints, timeout=3.0)
        acked: dict[str, int] = {}
        stop = asyncio.Event()
        try:
            leader = await _find_leader(client, cluster.ids)
            writers = [asyncio.create_task(_writer(RaftClient(cluster.endpoints, timeout=3.0), f"w{w}",
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

            # The restarted node catches up with the group.
            new_leader = await _find_leader(client, [i for i in cluster.ids])
            deadline = time.monotonic() + 20
            while True:
                lead_st = await client.status(new_leader)
                st = await client.status(leader)
                if st["applied_index"] >= lead_st["commit_index"] and st["last_index"] == lead_st["last_index"]:
                    break
                assert time.monotonic() < deadline, f"node {leader} did not catch up: {st} vs {lead_st}"
                await asyncio.sleep(0.2)

            # Every acknowledged write is there (reads go through the log: linearizable).
            keys = sorted(acked)
            for lo in range(0, len(keys), 500):
                chunk = keys[lo:lo + 500]
                values = await asyncio.gather(*(client.propose(encode_get(k)) for k in chunk))
                lost = [(k, acked[k], v) for k, v in zip(chunk, values, strict=True) if v != acked[k]]
                assert not lost, f"acknowledged writes lost or wrong: {lost[:5]}"
        finally:
            stop.set()
            await client.close()

    try:
        asyncio.run(asyncio.wait_for(scenario(), timeout=120))
    except BaseException:
        print(cluster.logs())
        raise
    finally:
        cluster.stop_all()


def test_follower_behind_the_compacted_log_catches_up_by_install_snapshot(tmp_path):
    cluster = Cluster(tmp_path)
    snap = ("--snapshot-entries", "500", "--compaction-slack", "100")
    for i in cluster.ids:
        cluster.start(i, *snap)

    async def scenario() -> None:
        client = RaftClient(cluster.endpoints, timeout=3.0)
        try:
            leader = await _find_leader(client, cluster.ids)
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

    try:
        asyncio.run(asyncio.wait_for(scenario(), 120))
    except BaseException:
        print(cluster.logs())
        raise
    finally:
        cluster.stop_all()


def test_corrupt_log_refuses_to_start_with_a_clear_error(tmp_path):
    """A node whose log is corrupt before its tail exits non-zero naming the file and offset."""
    cluster = Cluster(tmp_path, n=1)
    cluster.start(1)

    async def write_some() -> None:
        client = RaftClient(cluster.endpoints, timeout=3.0)
        try:
            await _find_leader(client, [1])
            for k in range(50):
                await client.propose(encode_put(f"k{k}", k))
        finally:
            await client.close()

    try:
        asyncio.run(asyncio.wait_for(write_some(), timeout=30))
    finally:
        cluster.stop_all()
    seg_dir = tmp_path / "node1" / "raft-log"
    segs = sorted(p for p in seg_dir.iterdir() if p.is_file())
    assert segs
    data = bytearray(segs[0].read_bytes())
    data[len(data) // 3] ^= 0xFF  # corrupt a record in the middle, valid records follow
    segs[0].write_bytes(bytes(data))
    proc = subprocess.run(
        [sys.executable, "-m", "electra.cli", "node", "--id", "1", "--peers", cluster.peers,
         "--client-addr", f"127.0.0.1:{cluster.client_ports[0]}", "--data-dir", str(tmp_path / "node1"),
         "--state-machine", "kv", "--insecure"],
        capture_output=True, text=True, timeout=30, env={**os.environ})
    assert proc.returncode != 0
    assert segs[0].name in proc.stderr and "offset" in proc.stderr
