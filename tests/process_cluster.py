"""Real `electra node` processes (KV state machine, raw client protocol) for integration tests.

One place for what every process-level Raft test needs: start, SIGKILL and restart
nodes, find the leader, wait for a node to catch up, write under load and check
that every acknowledged write is still there. The scenarios stay in the tests.
Also how a test starts a process it will send SIGHUP (`hangup_by_default`).
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterable

from electra.consensus.client import RaftClient
from electra.consensus.errors import RaftError
from electra.consensus.kv import encode_get, encode_put
from electra.local_ports import free_ports


class Cluster:
    """n node processes on loopback; logs in `tmp/node<i>.log`, data in `tmp/node<i>`."""

    def __init__(self, tmp_path, n: int = 3) -> None:
        ports = free_ports(2 * n)
        self.raft_ports = ports[:n]
        self.client_ports = ports[n:]
        self.ids = list(range(1, n + 1))
        self.peers = ",".join(f"{i}=127.0.0.1:{p}" for i, p in zip(self.ids, self.raft_ports, strict=True))
        self.tmp = tmp_path
        self.procs: dict[int, subprocess.Popen] = {}
        self.endpoints = {i: ("127.0.0.1", p) for i, p in zip(self.ids, self.client_ports, strict=True)}

    def command(self, i: int, *extra: str) -> list[str]:
        return [sys.executable, "-m", "electra.cli", "--log-level", "INFO", "node", "--id", str(i),
                "--peers", self.peers, "--client-addr", f"127.0.0.1:{self.client_ports[i - 1]}",
                "--data-dir", str(self.tmp / f"node{i}"), "--tick-ms", "50", "--state-machine", "kv",
                "--insecure", *extra]

    def start(self, i: int, *extra: str) -> None:
        log = open(self.tmp / f"node{i}.log", "ab")  # noqa: SIM115 - owned by the process
        self.procs[i] = subprocess.Popen(self.command(i, *extra), stdout=log, stderr=subprocess.STDOUT)

    def start_all(self, *extra: str) -> None:
        for i in self.ids:
            self.start(i, *extra)

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

    def run(self, scenario: Callable[[], Awaitable[None]], timeout: float = 150) -> None:
        """Run `scenario()` with a deadline; print the nodes' logs if it fails; always stop the nodes."""
        try:
            asyncio.run(asyncio.wait_for(scenario(), timeout))
        except BaseException:
            print(self.logs())
            raise
        finally:
            self.stop_all()


async def find_leader(client: RaftClient, ids: Iterable[int], timeout: float = 20.0) -> int:
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


async def wait_caught_up(client: RaftClient, node: int, leader: int, timeout: float = 30.0) -> dict:
    """Wait until `node` holds and has applied everything the leader committed; return its status."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            st = await client.status(node)
        except (OSError, TimeoutError):
            st = {"applied_index": 0, "last_index": 0}
        lead_st = await client.status(leader)
        if st["applied_index"] >= lead_st["commit_index"] and st["last_index"] == lead_st["last_index"]:
            return st
        assert time.monotonic() < deadline, f"node {node} did not catch up: {st} vs {lead_st}"
        await asyncio.sleep(0.2)


async def writer(client: RaftClient, prefix: str, acked: dict, stop: asyncio.Event, limit: int) -> None:
    """Put `prefix-k` = k until stopped; record in `acked` only what the cluster acknowledged."""
    for k in range(limit):
        if stop.is_set():
            return
        key = f"{prefix}-{k}"
        try:
            await client.propose(encode_put(key, k), deadline_s=10)
            acked[key] = k
        except RaftError:
            await asyncio.sleep(0.05)  # unknown or refused: not acknowledged, not checked


async def check_all_acked(client: RaftClient, acked: dict) -> None:
    """Every acknowledged write reads back (reads go through the log: linearizable)."""
    keys = sorted(acked)
    for lo in range(0, len(keys), 500):
        chunk = keys[lo:lo + 500]
        values = await asyncio.gather(*(client.propose(encode_get(k), deadline_s=20) for k in chunk))
        lost = [(k, acked[k], v) for k, v in zip(chunk, values, strict=True) if v != acked[k]]
        assert not lost, f"{len(lost)} acknowledged writes lost or wrong, e.g. {lost[:5]}"


def hangup_by_default() -> None:
    """`preexec_fn` for a child a test sends SIGHUP: the default disposition, as for a command started from
    a terminal. Under `nohup` the test run ignores SIGHUP, a child inherits that, and the hangup the test
    sends would never arrive."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
