"""Hostile bytes on the Raft port of real `electra node` processes: the group keeps leading and committing.

Each test reproduces one probe finding of issue #15 against three controller processes
(`docs/security.md`, "Containment"): forged terms, frame and handshake bombs, and a
node that lost its leader reporting itself unhealthy.
"""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import msgpack
import pytest

from electra.bench.common import stop_processes
from electra.consensus.messages import Vote
from electra.consensus.transport import PROTO
from electra.local_ports import free_ports

pytestmark = pytest.mark.integration


class Group:
    """Three controller processes (50 ms ticks) with their Raft and HTTP addresses and log files."""

    def __init__(self, tmp: Path) -> None:
        ports = free_ports(6)
        self.raft = {i: ("127.0.0.1", ports[i - 1]) for i in (1, 2, 3)}
        self.http = {i: f"127.0.0.1:{ports[2 + i]}" for i in (1, 2, 3)}
        peers = ",".join(f"{i}={h}:{p}" for i, (h, p) in self.raft.items())
        http_peers = ",".join(f"{i}={ep}" for i, ep in self.http.items())
        self.logs = {i: tmp / f"node{i}.log" for i in (1, 2, 3)}
        self.procs = {}
        for i in (1, 2, 3):
            with open(self.logs[i], "wb") as log:
                self.procs[i] = subprocess.Popen(
                    [sys.executable, "-m", "electra.cli", "node", "--id", str(i), "--peers", peers,
                     "--http-addr", self.http[i], "--http-peers", http_peers, "--data-dir", str(tmp / f"n{i}"),
                     "--tick-ms", "50", "--insecure"],  # containment holds for any sender, authenticated or not
                    stdout=log, stderr=subprocess.STDOUT)

    def get(self, i: int, path: str) -> tuple[int, dict]:
        try:
            with urllib.request.urlopen(f"http://{self.http[i]}{path}", timeout=2) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def status(self, i: int) -> dict | None:
        try:
            return self.get(i, "/v1/admin/metadata")[1]
        except OSError:
            return None

    def leader(self, timeout: float = 15.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for i in self.procs:
                st = self.status(i)
                if st and st["is_leader"] and st["commit_index"] >= 1:
                    return st
            time.sleep(0.1)
        raise AssertionError("no leader")

    def all_up(self, timeout: float = 30.0) -> None:
        """Every node answers over HTTP, so its Raft listener is up too (a node starts Raft first). Two
        nodes elect a leader without the third: on a loaded machine it may still be importing."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(self.status(i) for i in self.procs):
                return
            time.sleep(0.1)
        raise AssertionError("not every node came up")

    def write(self, i: int, name: str, timeout: float = 15.0) -> None:
        """Register a broker id through whichever node leads (bounded retries)."""
        body = json.dumps({"clusterName": "c", "brokerId": 1, "registerCheckCode": "10.0.0.1:1;1"}).encode()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ep = self.http[self.leader(timeout)["node_id"]]
            req = urllib.request.Request(f"http://{ep}/v1/broker-sets/{name}/apply-broker-id", body,
                                         {"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=5) as r:
                    if json.loads(r.read())["code"] == 0:
                        return
            except (urllib.error.HTTPError, OSError):
                pass
            time.sleep(0.2)
        raise AssertionError(f"no write committed for {name}")

    def peak_rss_kib(self, i: int) -> int:
        for line in Path(f"/proc/{self.procs[i].pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
        raise AssertionError("no VmHWM")

    def stop(self) -> None:
        stop_processes(list(self.procs.values()))


def _frame(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


def _nil_array(size: int) -> bytes:
    """A msgpack array of `size` bytes in all: nils, the densest object bomb msgpack allows."""
    return b"\xdd" + struct.pack(">I", size - 5) + b"\xc0" * (size - 5)


def _impersonate(group: Group, as_id: int, to: int) -> socket.socket:
    """Dial node `to` claiming to be node `as_id` (< to), as a compromised or buggy peer would."""
    s = socket.create_connection(group.raft[to], timeout=5)
    s.sendall(_frame(msgpack.packb({"proto": PROTO, "cluster": "electra", "from": as_id, "to": to})))
    (n,) = struct.unpack(">I", s.recv(4, socket.MSG_WAITALL))
    s.recv(n, socket.MSG_WAITALL)
    return s


def _forged_vote(group: Group, term: int) -> None:
    """A forced VOTE (the leadership-transfer flag) with `term` to both nodes that accept node 1's dial."""
    for to in (2, 3):
        s = _impersonate(group, 1, to)
        m = Vote(1, to, term, last_index=2**40, last_term=min(term, 2**62), force=True)
        body = msgpack.unpackb(m.encode())
        body[3] = term  # the encoder itself would refuse nothing here; forge the raw field
        s.sendall(_frame(msgpack.packb(body)))
        time.sleep(0.2)
        s.close()


@pytest.fixture
def group(tmp_path):
    g = Group(tmp_path)
    try:
        g.leader()
        g.all_up()
        yield g
    finally:
        g.stop()


def test_forged_huge_and_inflated_terms_leave_the_group_leading_and_committing(group):
    term = group.leader()["term"]
    _forged_vote(group, 2**64 - 1)
    _forged_vote(group, term + 1000)
    time.sleep(2.5)  # several election timeouts: a dead tick loop or an inflated term would show
    group.write(1, "after-forged-votes")
    for i in group.procs:
        st = group.status(i)
        assert st["term"] < term + 10, st
        assert st["tick_errors"] == 0 and st["process_errors"] == 0, st
        assert group.get(i, "/healthz")[0] == 200


def test_handshake_bomb_is_refused_after_four_bytes(group):
    st = group.leader()
    leader, term = st["node_id"], st["term"]
    rss0 = group.peak_rss_kib(leader)
    # A 16 MiB msgpack array of nils (16M list slots once decoded), as the first frame, before any handshake.
    bomb = _frame(_nil_array(16 << 20))
    s = socket.create_connection(group.raft[leader], timeout=5)
    sent = 0
    try:
        while sent < len(bomb):
            sent += s.send(memoryview(bomb)[sent:sent + (1 << 20)])
    except OSError:
        pass  # the node closed the connection: the point of the test
    finally:
        s.close()
    assert sent < len(bomb), "the node read a whole 16 MiB handshake frame"
    time.sleep(0.5)
    group.write(1, "after-handshake-bomb")
    assert group.leader()["term"] == term  # leadership was never lost
    assert group.peak_rss_kib(leader) - rss0 < 24 << 10
    assert group.logs[leader].stat().st_size < 1 << 20  # nothing quoted the input


def test_oversized_and_malformed_frames_after_the_handshake_close_only_that_connection(group):
    st = group.leader()
    term = st["term"]
    target = 3 if st["node_id"] != 3 else 2
    rss0 = group.peak_rss_kib(target)
    for payload in (b"\x00" * 16, msgpack.packb([5, 1, target, 1, 0, 0, [0] * 70_000, [b""] * 70_000] + [0] * 9),
                    msgpack.packb(["x" * 1000] * 17)):
        s = _impersonate(group, 1, target)
        s.sendall(_frame(payload))
        s.close()
    s = _impersonate(group, 1, target)
    closed = False
    try:
        s.sendall(_frame(_nil_array(16 << 20)))  # twice the largest legal message
    except OSError:
        closed = True  # closed after the length prefix (or when node 1's own redial replaced this link)
    s.close()
    assert closed, "the node read a whole 16 MiB frame"
    time.sleep(0.5)
    group.write(1, "after-frame-bombs")
    assert group.leader()["term"] == term
    assert group.status(target)["peer_malformed"] >= 3  # each undecodable frame closed its connection, counted
    assert group.peak_rss_kib(target) - rss0 < 24 << 10
    assert group.logs[target].stat().st_size < 1 << 20


def test_healthz_fails_once_no_leader_is_known_for_an_election_timeout(group):
    survivor = group.leader()["node_id"]
    for i, p in group.procs.items():
        if i != survivor:
            p.kill()
            p.wait(timeout=10)
    deadline = time.monotonic() + 10
    while (code := group.get(survivor, "/healthz"))[0] == 200:
        assert time.monotonic() < deadline, "/healthz kept answering 200 without a leader"
        time.sleep(0.1)
    assert code[0] == 503 and "no leader" in code[1]["reason"]
