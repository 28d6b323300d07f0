"""Deterministic simulation of a Raft cluster running the real `RaftCore`.

One seeded random generator drives everything: a simulated clock, per-node
clocks that drift within a bound, a network that drops, delays, reorders and
duplicates messages, partitions that come and heal, process pauses, disks whose
writes are durable only when their (simulated) fsync completes, and crashes that
lose every unsynced write. Nodes take snapshots, compact their logs and send
InstallSnapshot in chunks (with the same `SnapshotSender`/`SnapshotReceiver` the
asyncio runtime uses). Clients issue KV puts, and gets in every read mode
(through the log, ReadIndex, lease, follower); the history they observe is checked
for linearizability.

After every event the simulator checks Raft's safety properties: at most one
leader per term, log matching (every (index, term) always has the same command
and the same predecessor term), leader completeness, state machine safety (no
two nodes apply different commands at one index, or hold different states after
one index, snapshots included) and monotonic durable terms and commits. At the
end the network heals, every node restarts, and the run checks that the cluster
converges and that no acknowledged write was lost. A failure names its seed so
`electra sim --seed N` replays it.
"""

from __future__ import annotations

import heapq
import io
import random
from dataclasses import dataclass, field
from typing import Any

import msgpack

from .core import RaftConfig, RaftCore, Ready, Role
from .errors import NotLeader, ProposalDropped
from .kv import KVStateMachine, encode_get, encode_put
from .linearizability import History, check
from .messages import Heartbeat, Message, SnapChunk, SnapResp
from .snapshots import HEADER, BytesSink, SnapshotReceiver, SnapshotSender, make_blob, verify_blob

READ_MODES = ("log", "readindex", "lease", "follower")


class SimulationFailure(AssertionError):
    def __init__(self, seed: int, reason: str, trace: list[str]) -> None:
        self.seed = seed
        self.reason = reason
        self.trace = trace
        tail = "\n".join(trace[-40:])
        super().__init__(f"seed {seed}: {reason}\n--- last events ---\n{tail}")


@dataclass
class SimConfig:
    nodes: int = 3
    duration_ms: int = 3000  # time with clients and faults
    settle_ms: int = 3000  # healed, restarted, no faults: must converge
    tick_ms: int = 10
    clients: int = 4
    keys: int = 3
    client_timeout_ms: int = 400
    net_delay_ms: tuple[int, int] = (1, 8)
    drop_rate: float = 0.02
    dup_rate: float = 0.02
    long_delay_rate: float = 0.01  # occasionally a message takes up to 100 ms
    disk_ms: tuple[float, float] = (0.2, 3.0)
    fault_interval_ms: tuple[int, int] = (150, 600)
    pause_ms: tuple[int, int] = (20, 300)
    clock_drift: float = 0.02  # each node's clock runs at a rate within 1 +- clock_drift ...
    max_clock_drift: float = 0.1  # ... which the lease bound assumes to be at most this
    lease_reads: bool = True
    get_ratio: float = 0.5
    snapshot_every: tuple[int, int] = (15, 60)  # entries between snapshots, drawn per seed
    compaction_slack: int = 4
    snapshot_chunk: int = 48  # bytes per InstallSnapshot chunk: small, so transfers take several
    follower_max_lag: int = 20
    raft: RaftConfig = field(default_factory=lambda: RaftConfig(election_ticks=10, heartbeat_ticks=2,
                                                                max_entries_per_msg=16, max_inflight=4))
    trace: bool = True


@dataclass
class SimResult:
    seed: int
    ops: int
    ok_ops: int
    ok_reads: dict[str, int]
    leaders: int
    final_index: int
    events: int
    snapshots_installed: int


class _DiskState:
    """What survives a crash: only writes whose simulated fsync completed."""

    def __init__(self) -> None:
        self.term = 0
        self.vote = 0
        self.offset = 0
        self.offset_term = 0
        self.terms: list[int] = []
        self.datas: list[bytes] = []
        self.snapshot: tuple[int, int, bytes] | None = None

    def write(self, rd: Ready) -> None:
        if rd.reset_to is not None:
            self.offset, self.offset_term = rd.reset_to
            self.terms.clear()
            self.datas.clear()
        if rd.hard_state is not None:
            if rd.hard_state[0] < self.term:
                raise AssertionError(f"durable term goes back from {self.term} to {rd.hard_state[0]}")
            self.term, self.vote = rd.hard_state
        if rd.ent_terms:
            cut = rd.entries_first - self.offset - 1
            if cut < 0:
                raise AssertionError(f"persisting entries at {rd.entries_first} inside the compacted prefix")
            del self.terms[cut:]
            del self.datas[cut:]
            self.terms.extend(rd.ent_terms)
            self.datas.extend(rd.ent_data)

    def compact(self, upto: int, term: int) -> None:
        cut = upto - self.offset
        if cut > 0:
            del self.terms[:cut]
            del self.datas[:cut]
            self.offset, self.offset_term = upto, term


class _SimNode:
    def __init__(self, sim: Simulation, node_id: int) -> None:
        self.sim = sim
        self.id = node_id
        self.disk = _DiskState()
        self.alive = False
        self.incarnation = 0
        self.rate = 1.0 + sim.rng.uniform(-sim.cfg.clock_drift, sim.cfg.clock_drift)
        self.core: RaftCore | None = None
        self.sm = KVStateMachine()
        self.applied = 0
        self.disk_free_at = 0.0
        self.paused_until = 0.0
        self.pending: dict[int, tuple[int, int, int]] = {}  # index -> (term, client, op_id)
        self.reads: dict[int, tuple[int, int, str]] = {}  # ctx -> (client, op_id, key)
        self.read_wait: list[tuple[int, int, int, str]] = []  # (index, client, op_id, key)
        self.read_ctx = 0
        self.last_commit = 0
        self.last_term = 0
        self.snapshotting = False
        self.senders: dict[int, list] = {}  # peer -> [SnapshotSender, silent rounds, seq]
        self.receiver: SnapshotReceiver | None = None
        self.last_sink: BytesSink | None = None
        self.pending_install: tuple[int, int, bytes] | None = None
        self.snapshot_every = sim.rng.randrange(*sim.cfg.snapshot_every)

    def local_now(self) -> float:
        """This node's monotonic clock, in seconds, drifting at its own rate."""
        return self.sim.now * self.rate / 1000.0

    def _new_sink(self, index: int, term: int) -> BytesSink:
        self.last_sink = BytesSink()
        return self.last_sink

    def start(self) -> None:
        sim = self.sim
        self.incarnation += 1
        self.alive = True
        d = self.disk
        self.sm = KVStateMachine()
        self.applied = 0
        snap = None
        if d.snapshot is not None:
            idx, term, blob = d.snapshot
            self.sm.restore(io.BytesIO(blob[HEADER.size:]))
            self.applied = idx
            snap = (idx, term)
            sim.check_state(self, idx)
        cfg = sim.cfg.raft
        if sim.cfg.lease_reads:
            lease = (cfg.election_ticks - 1) * sim.cfg.tick_ms / 1000.0 * (1 - sim.cfg.max_clock_drift)
            cfg = RaftConfig(**{**cfg.__dict__, "lease_s": lease})
        self.core = RaftCore(self.id, sim.ids, cfg, term=d.term, vote=d.vote, log_offset=d.offset,
                             offset_term=d.offset_term, log_terms=d.terms, log_data=d.datas, snapshot=snap,
                             rng=random.Random(sim.rng.getrandbits(64)), clock=self.local_now)
        self.pending, self.reads, self.read_wait, self.senders = {}, {}, [], {}
        self.receiver = SnapshotReceiver(self.id, self._new_sink)
        self.pending_install = None
        self.snapshotting = False
        self.last_commit = 0
        self.last_term = d.term  # an unsynced term bump may be lost in a crash; durable terms never go back
        prev = d.offset_term
        for k, (t, data) in enumerate(zip(d.terms, d.datas, strict=True)):
            sim.check_log_entry(self, d.offset + 1 + k, t, data, prev)
            prev = t
        self.disk_free_at = sim.now
        sim.schedule(sim.rng.uniform(0, sim.cfg.tick_ms), "tick", self.id, self.incarnation)

    def crash(self) -> None:
        self.alive = False
        self.core = None


class Simulation:
    def __init__(self, seed: int, cfg: SimConfig | None = None) -> None:
        self.seed = seed
        self.cfg = cfg or SimConfig()
        self.rng = random.Random(seed)
        self.ids = list(range(1, self.cfg.nodes + 1))
        self.nodes = {i: _SimNode(self, i) for i in self.ids}
        self.now = 0.0
        self._queue: list[tuple[float, int, str, Any, Any]] = []
        self._seq = 0
        self.trace: list[str] = []
        self.events = 0
        # Global knowledge for invariants.
        self.leader_of_term: dict[int, int] = {}
        self.entry_info: dict[tuple[int, int], tuple[bytes, int]] = {}  # (index, term) -> (data, prev term)
        self.committed: dict[int, int] = {}  # index -> term, from any node's commit index
        self.applied_cmd: dict[int, tuple[int, bytes]] = {}  # index -> (term, command)
        self.state_at: dict[int, bytes] = {}  # index -> state machine contents after applying it
        self.max_committed = 0
        self.partition: dict[int, int] = {}  # node -> side; empty = fully connected
        self.history = History()
        self.acked_writes: list[tuple[int, int, int]] = []  # (index, term, op_id)
        self.ok_reads = dict.fromkeys(READ_MODES, 0)
        self.installs = 0
        self._op_seq = 0
        self._clients: dict[int, dict[str, Any]] = {}
        self.faults_on = True

    # ------------------------------------------------------------------ plumbing
    def schedule(self, delay: float, kind: str, a: Any = None, b: Any = None) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (self.now + delay, self._seq, kind, a, b))

    def log(self, text: str) -> None:
        if self.cfg.trace:
            self.trace.append(f"{self.now:9.2f} {text}")
            if len(self.trace) > 400:
                del self.trace[:200]

    def fail(self, reason: str) -> None:
        raise SimulationFailure(self.seed, reason, self.trace)

    def connected(self, a: int, b: int) -> bool:
        return not self.partition or self.partition.get(a) == self.partition.get(b)

    # ------------------------------------------------------------------ network
    def send(self, m: Message) -> None:
        if not self.connected(m.src, m.dst):
            return
        if self.faults_on and self.rng.random() < self.cfg.drop_rate:
            return
        lo, hi = self.cfg.net_delay_ms
        delay = self.rng.uniform(lo, hi)
        if self.faults_on and self.rng.random() < self.cfg.long_delay_rate:
            delay += self.rng.uniform(0, 100)
        self.schedule(delay, "msg", m)
        if self.faults_on and self.rng.random() < self.cfg.dup_rate:
            self.schedule(self.rng.uniform(lo, hi * 3), "msg", m)

    # ------------------------------------------------------------------ node runtime
    def process(self, node: _SimNode) -> None:
        """Drain the core's Ready, as node.py does: send, persist, apply, answer reads."""
        core = node.core
        while core is not None and core.has_ready():
            rd = core.ready()
            self.observe(node, rd)
            for m in rd.send_now:
                self.send(m)
            if rd.needs_persist() or rd.send_after_persist:
                lo, hi = self.cfg.disk_ms
                cost = self.rng.uniform(lo, hi) if rd.needs_persist() else 0.0
                done = max(self.now, node.disk_free_at) + cost
                node.disk_free_at = done
                self.schedule(done - self.now, "persisted", (node.id, node.incarnation), rd)
            if rd.apply_terms:
                self.apply(node, rd)
            for ctx, index in rd.read_states:
                r = node.reads.pop(ctx, None)
                if r is not None:
                    node.read_wait.append((index, *r))
            for ctx in rd.reads_dropped:
                r = node.reads.pop(ctx, None)
                if r is not None:
                    self.reply(r[0], r[1], "fail", None, None)
            for peer in rd.snapshot_requests:
                self.start_snapshot_send(node, peer)
            if rd.role_changed and core.role != Role.LEADER:
                node.senders.clear()
        self.answer_reads(node)

    def answer_reads(self, node: _SimNode) -> None:
        if not node.read_wait:
            return
        keep = []
        for index, client, op_id, key in node.read_wait:
            if node.applied >= index:
                self.reply(client, op_id, "ok", node.sm.data.get(key), None)
            else:
                keep.append((index, client, op_id, key))
        node.read_wait = keep

    def observe(self, node: _SimNode, rd: Ready) -> None:
        core = node.core
        assert core is not None
        if core.term < node.last_term:
            self.fail(f"node {node.id} term went back from {node.last_term} to {core.term}")
        node.last_term = core.term
        if rd.role_changed:
            self.log(f"n{node.id} role={core.role.name} term={core.term} lead={core.lead}")
        if core.role == Role.LEADER:
            prev = self.leader_of_term.setdefault(core.term, node.id)
            if prev != node.id:
                self.fail(f"two leaders in term {core.term}: {prev} and {node.id}")
            if rd.role_changed:
                # Every entry committed in an earlier term must be in this leader's log. A stale
                # leader of an old term (a paused candidate) may lack entries of later terms.
                i = self.max_committed
                while i > core.offset and self.committed.get(i, 0) >= core.term:
                    i -= 1
                if i > core.offset and i in self.committed and core.term_at(i) != self.committed[i]:
                    self.fail(f"leader completeness: node {node.id} leads term {core.term} without "
                              f"committed entry {i} (term {self.committed[i]})")
        if rd.ent_terms:
            prev = core.term_at(rd.entries_first - 1)
            for k, (t, data) in enumerate(zip(rd.ent_terms, rd.ent_data, strict=True)):
                self.check_log_entry(node, rd.entries_first + k, t, data, prev)
                prev = t
        if core.commit < node.last_commit:
            self.fail(f"node {node.id} commit index went back")
        for i in range(max(node.last_commit, core.offset) + 1, core.commit + 1):
            t = core.term_at(i)
            known = self.committed.get(i)
            if known is None:
                self.committed[i] = t
                self.max_committed = max(self.max_committed, i)
            elif known != t:
                self.fail(f"state machine safety: index {i} committed with terms {known} and {t}")
        node.last_commit = core.commit

    def check_log_entry(self, node: _SimNode, index: int, term: int, data: bytes, prev_term: int | None) -> None:
        """Log matching, checked locally: an (index, term) always has one command and one predecessor term."""
        known = self.entry_info.setdefault((index, term), (data, prev_term))
        if known[0] != data:
            self.fail(f"log matching: node {node.id} entry ({index}, t{term}) has a different command")
        if prev_term is not None and known[1] is not None and known[1] != prev_term:
            self.fail(f"log matching: node {node.id} entry ({index}, t{term}) follows term {prev_term}, "
                      f"elsewhere term {known[1]}")

    def check_state(self, node: _SimNode, index: int) -> None:
        state = msgpack.packb(sorted(node.sm.data.items()))
        known = self.state_at.setdefault(index, state)
        if known != state:
            self.fail(f"node {node.id} holds a different state after index {index}")

    def apply(self, node: _SimNode, rd: Ready) -> None:
        for k, (t, data) in enumerate(zip(rd.apply_terms, rd.apply_data, strict=True)):
            idx = rd.apply_first + k
            if idx != node.applied + 1:
                self.fail(f"node {node.id} applied {idx} after {node.applied}")
            node.applied = idx
            prev = self.applied_cmd.setdefault(idx, (t, data))
            if prev != (t, data):
                self.fail(f"node {node.id} applied a different command at {idx}")
            result = node.sm.apply(idx, data) if data else None
            self.check_state(node, idx)
            waiter = node.pending.pop(idx, None)
            if waiter is not None:
                wterm, client, op_id = waiter
                if wterm == t:
                    self.reply(client, op_id, "ok", result, (idx, t))
                else:
                    self.reply(client, op_id, "fail", None, None)
        if not node.snapshotting and node.applied - (node.core.snap_index) >= node.snapshot_every:
            self.take_snapshot(node)

    # ------------------------------------------------------------------ snapshots
    def take_snapshot(self, node: _SimNode) -> None:
        idx = node.applied
        term = node.core.term_at(idx)
        out = io.BytesIO()
        node.sm.snapshot(out)
        blob = make_blob(idx, term, out.getvalue())
        node.snapshotting = True
        lo, hi = self.cfg.disk_ms
        self.schedule(self.rng.uniform(lo, hi * 2), "snap_done", (node.id, node.incarnation), (idx, term, blob))

    def snapshot_done(self, node: _SimNode, idx: int, term: int, blob: bytes) -> None:
        node.snapshotting = False
        core = node.core
        if node.disk.snapshot is None or idx > node.disk.snapshot[0]:
            node.disk.snapshot = (idx, term, blob)
        core.snapshot_taken(idx, term)
        upto = idx - self.cfg.compaction_slack
        if upto > core.offset:
            upto_term = core.term_at(upto)
            core.compact_log(upto)
            if core.offset == upto:
                node.disk.compact(upto, upto_term)
        self.process(node)

    def start_snapshot_send(self, node: _SimNode, peer: int) -> None:
        core = node.core
        if peer in node.senders:
            return
        snap = node.disk.snapshot
        if snap is None or core.role != Role.LEADER:
            core.snapshot_done(peer, False)
            return
        blob = snap[2]
        sender = SnapshotSender(node.id, peer, core.term, verify_blob(blob),
                                lambda off, n: blob[off:off + n], chunk_size=self.cfg.snapshot_chunk)
        node.senders[peer] = [sender, 0, 0]
        self.send_chunk(node, peer)

    def send_chunk(self, node: _SimNode, peer: int) -> None:
        st = node.senders[peer]
        st[2] += 1
        self.send(st[0].next_message())
        self.schedule(60, "snap_timeout", (node.id, node.incarnation), (peer, st[2]))

    def finish_send(self, node: _SimNode, peer: int, ok: bool) -> None:
        node.senders.pop(peer, None)
        node.core.snapshot_done(peer, ok)
        self.process(node)

    def on_snap_resp(self, node: _SimNode, m: SnapResp) -> None:
        st = node.senders.get(m.src)
        if st is None:
            return
        st[1] = 0
        outcome = st[0].on_response(m)
        if outcome == "continue":
            self.send_chunk(node, m.src)
        else:
            self.finish_send(node, m.src, outcome == "done")

    def on_snap_timeout(self, node: _SimNode, peer: int, seq: int) -> None:
        st = node.senders.get(peer)
        if st is None or st[2] != seq:
            return
        st[1] += 1
        if st[1] >= 3:
            self.finish_send(node, peer, False)
        else:
            self.send_chunk(node, peer)

    def on_snap_chunk(self, node: _SimNode, m: SnapChunk) -> None:
        core = node.core
        if m.term < core.term or core.role == Role.LEADER:
            return
        core.step(Heartbeat(m.src, node.id, m.term))
        reply, meta = node.receiver.on_chunk(m, core.term)
        if meta is not None and meta.index > core.commit:
            blob = bytes(node.last_sink.buf)
            node.sm = KVStateMachine()
            node.sm.restore(io.BytesIO(blob[HEADER.size:]))
            node.applied = meta.index
            self.check_state(node, meta.index)
            known = self.committed.get(meta.index)
            if known is not None and known != meta.term:
                self.fail(f"snapshot at {meta.index} has term {meta.term}, committed term is {known}")
            if core.install_snapshot(meta.index, meta.term):
                node.pending_install = (meta.index, meta.term, blob)
                self.installs += 1
                self.log(f"n{node.id} installed snapshot {meta.index} from n{m.src}")
        self.send(reply)
        self.process(node)

    # ------------------------------------------------------------------ clients
    def reply(self, client: int, op_id: int, status: str, result: Any, where: Any) -> None:
        lo, hi = self.cfg.net_delay_ms
        self.schedule(self.rng.uniform(lo, hi), "reply", client, (op_id, status, result, where))

    def client_issue(self, c: int) -> None:
        st = self._clients[c]
        self._op_seq += 1
        op_id = self._op_seq
        key = f"k{self.rng.randrange(self.cfg.keys)}"
        if self.rng.random() >= self.cfg.get_ratio:
            kind, value, mode = "put", op_id, "log"
        else:
            kind, value, mode = "get", None, self.rng.choice(READ_MODES)
        self.history.invoke(op_id, c, key, kind, value, self.now)
        st["op"] = (op_id, kind, mode)
        if mode == "follower":
            target = self.rng.choice(self.ids)
        else:
            target = st["leader"] or self.rng.choice(self.ids)
        lo, hi = self.cfg.net_delay_ms
        self.schedule(self.rng.uniform(lo, hi), "request", target, (c, op_id, kind, key, value, mode))
        self.schedule(self.cfg.client_timeout_ms, "timeout", c, op_id)

    def handle_request(self, node_id: int, c: int, op_id: int, kind: str, key: str, value: Any,
                       mode: str) -> None:
        node = self.nodes[node_id]
        if not node.alive or node.core is None:
            return  # lost; the client times out
        core = node.core
        if mode == "log":
            cmd = encode_put(key, value) if kind == "put" else encode_get(key)
            try:
                index = core.propose([cmd])
            except NotLeader as e:
                self.reply(c, op_id, "not_leader", e.leader_id, None)
                return
            except ProposalDropped:
                self.reply(c, op_id, "fail", None, None)
                return
            node.pending[index] = (core.term, c, op_id)
        elif core.role == Role.LEADER:
            index = core.lease_read_index() if mode in ("lease", "follower") else None
            if index is not None:
                node.read_wait.append((index, c, op_id, key))
            else:
                node.read_ctx += 1
                node.reads[node.read_ctx] = (c, op_id, key)
                core.read_index(node.read_ctx)
        elif mode == "follower":
            silence_s = self.cfg.raft.election_ticks * self.cfg.tick_ms / 1000.0
            if (core.lead == 0 or core.clock() - core.last_leader_contact > silence_s
                    or core.leader_commit - node.applied > self.cfg.follower_max_lag):
                self.reply(c, op_id, "fail", None, None)  # refused at once: reads change nothing
                return
            node.read_ctx += 1
            node.reads[node.read_ctx] = (c, op_id, key)
            core.read_index(node.read_ctx)
        else:
            self.reply(c, op_id, "not_leader", core.lead, None)
            return
        self.process(node)

    def handle_reply(self, c: int, op_id: int, status: str, result: Any, where: Any) -> None:
        st = self._clients[c]
        if st["op"] is None or st["op"][0] != op_id:
            return  # a late answer for an op that already timed out
        _, kind, mode = st["op"]
        st["op"] = None
        if status == "ok":
            self.history.ok(op_id, result, self.now)
            if kind == "put":
                self.acked_writes.append((where[0], where[1], op_id))
            else:
                self.ok_reads[mode] += 1
        else:
            self.history.fail(op_id, self.now)
            if status == "not_leader":
                st["leader"] = result or None
        self.schedule(self.rng.uniform(0, 5), "issue", c)

    def handle_timeout(self, c: int, op_id: int) -> None:
        st = self._clients[c]
        if st["op"] is not None and st["op"][0] == op_id:
            st["op"] = None
            st["leader"] = None
            self.history.unknown(op_id, self.now)
            self.schedule(self.rng.uniform(0, 5), "issue", c)

    # ------------------------------------------------------------------ faults
    def inject_fault(self) -> None:
        if not self.faults_on:
            return
        r = self.rng.random()
        alive = [n for n in self.nodes.values() if n.alive]
        dead = [n for n in self.nodes.values() if not n.alive]
        if r < 0.25:
            ids = self.ids[:]
            self.rng.shuffle(ids)
            cut = self.rng.randrange(1, len(ids))
            self.partition = {i: (0 if k < cut else 1) for k, i in enumerate(ids)}
            self.log(f"partition {sorted(ids[:cut])} | {sorted(ids[cut:])}")
        elif r < 0.42:
            self.partition = {}
            self.log("heal")
        elif r < 0.57 and alive:
            n = self.rng.choice(alive)
            n.crash()
            self.log(f"crash n{n.id}")
        elif r < 0.75 and dead:
            n = self.rng.choice(dead)
            n.start()
            self.log(f"restart n{n.id}")
        elif r < 0.9 and alive:
            n = self.rng.choice(alive)
            n.paused_until = max(n.paused_until, self.now + self.rng.uniform(*self.cfg.pause_ms))
            self.log(f"pause n{n.id} until {n.paused_until:.1f}")
        else:
            leaders = [n for n in alive if n.core and n.core.role == Role.LEADER]
            if leaders:
                leaders[0].crash()
                self.log(f"crash leader n{leaders[0].id}")
        lo, hi = self.cfg.fault_interval_ms
        self.schedule(self.rng.uniform(lo, hi), "fault")

    # ------------------------------------------------------------------ main loop
    def run(self) -> SimResult:
        for n in self.nodes.values():
            n.start()
        for c in range(self.cfg.clients):
            self._clients[c] = {"op": None, "leader": None}
            self.schedule(self.rng.uniform(0, 50), "issue", c)
        lo, hi = self.cfg.fault_interval_ms
        self.schedule(self.rng.uniform(lo, hi), "fault")
        self.schedule(self.cfg.duration_ms, "settle")
        end = self.cfg.duration_ms + self.cfg.settle_ms
        while self._queue and self._queue[0][0] <= end:
            t, _, kind, a, b = heapq.heappop(self._queue)
            self.now = t
            self.events += 1
            try:
                self.dispatch(kind, a, b)
            except SimulationFailure:
                raise
            except Exception as exc:  # a crash inside the core is a failure of this seed too
                self.fail(f"exception while handling {kind}: {exc!r}")
        self.final_checks()
        ok_ops = sum(1 for op in self.history.ops() if op.status == "ok")
        return SimResult(self.seed, len(self.history.ops()), ok_ops, dict(self.ok_reads), len(self.leader_of_term),
                         max(n.applied for n in self.nodes.values()), self.events, self.installs)

    def _node_of(self, kind: str, a: Any) -> _SimNode | None:
        if kind == "msg":
            return self.nodes[a.dst]
        if kind in ("tick", "request"):
            return self.nodes[a]
        if kind in ("persisted", "snap_done", "snap_timeout"):
            return self.nodes[a[0]]
        return None

    def dispatch(self, kind: str, a: Any, b: Any) -> None:
        node = self._node_of(kind, a)
        if node is not None and node.alive and self.now < node.paused_until:
            # A paused process handles nothing; everything waits until it resumes.
            self._seq += 1
            heapq.heappush(self._queue, (node.paused_until, self._seq, kind, a, b))
            return
        if kind == "msg":
            if node.alive and self.connected(a.src, a.dst):
                if isinstance(a, SnapChunk):
                    self.on_snap_chunk(node, a)
                elif isinstance(a, SnapResp):
                    self.on_snap_resp(node, a)
                else:
                    node.core.step(a)
                    self.process(node)
        elif kind == "tick":
            if node.alive and node.incarnation == b:
                node.core.tick()
                self.process(node)
                self.schedule(self.cfg.tick_ms / node.rate, "tick", a, b)
        elif kind == "persisted":
            if node.alive and node.incarnation == a[1]:
                node.disk.write(b)
                if b.reset_to is not None and node.pending_install and node.pending_install[:2] == b.reset_to:
                    node.disk.snapshot = node.pending_install
                    node.pending_install = None
                for m in b.send_after_persist:
                    self.send(m)
                idx, term = b.persist_last
                if idx:
                    node.core.persisted(idx, term)
                self.process(node)
        elif kind == "snap_done":
            if node.alive and node.incarnation == a[1]:
                self.snapshot_done(node, *b)
        elif kind == "snap_timeout":
            if node.alive and node.incarnation == a[1]:
                self.on_snap_timeout(node, *b)
        elif kind == "request":
            self.handle_request(a, *b)
        elif kind == "reply":
            self.handle_reply(a, *b)
        elif kind == "timeout":
            self.handle_timeout(a, b)
        elif kind == "issue":
            if self.now < self.cfg.duration_ms:
                self.client_issue(a)
        elif kind == "fault":
            self.inject_fault()
        elif kind == "settle":
            self.faults_on = False
            self.partition = {}
            self.log("settle: heal and restart everything")
            for n in self.nodes.values():
                if not n.alive:  # pauses run out by themselves: events they hold must keep their order
                    n.start()

    def final_checks(self) -> None:
        # Clients stopped at duration_ms; every op without an answer is unknown.
        for st in self._clients.values():
            if st["op"] is not None:
                self.history.unknown(st["op"][0], self.now)
                st["op"] = None
        leaders = [n for n in self.nodes.values() if n.core and n.core.role == Role.LEADER]
        if not leaders:
            self.fail("liveness: no leader after the settle period")
        applied = {n.id: n.applied for n in self.nodes.values()}
        if len(set(applied.values())) != 1:
            self.fail(f"liveness: nodes did not converge after settling: applied={applied}")
        states = {n.id: msgpack.packb(sorted(n.sm.data.items())) for n in self.nodes.values()}
        if len(set(states.values())) != 1:
            self.fail("replicas applied the same log but hold different state")
        final = max(applied.values())
        missing = [i for i in range(1, final + 1) if i not in self.applied_cmd]
        if missing:
            self.fail(f"indexes {missing[:5]} were never applied by any node")
        for idx, term, op_id in self.acked_writes:
            if self.applied_cmd[idx][0] != term:
                self.fail(f"acknowledged write {op_id} at ({idx}, t{term}) lost from the final log")
        result = check(self.history, timeout_s=20.0)
        if not result.ok:
            self.fail(f"history not linearizable (key {result.key}): {result.explanation}")


def run_seed(seed: int, cfg: SimConfig | None = None) -> SimResult:
    return Simulation(seed, cfg).run()
