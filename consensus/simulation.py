"""Deterministic simulation of a Raft cluster running the real `RaftCore`.

One seeded random generator drives everything: a simulated clock, a network that
drops, delays, reorders and duplicates messages, partitions that come and heal,
disks whose writes are durable only when their (simulated) fsync completes, and
crashes that lose every unsynced write. Clients issue KV puts and gets through
the log and the history they observe is checked for linearizability.

After every event the simulator checks Raft's safety properties: at most one
leader per term, log matching (via prefix hashes keyed by index and term), leader
completeness, state machine safety (no two nodes apply different commands at one
index) and monotonic terms and commits. At the end the network heals, every node
restarts, and the run checks that the cluster converges and that no acknowledged
write was lost. A failure names its seed so `electra sim --seed N` replays it.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field
from typing import Any

import msgpack

from .core import RaftConfig, RaftCore, Ready, Role
from .errors import NotLeader, ProposalDropped
from .kv import KVStateMachine, encode_get, encode_put
from .linearizability import History, check
from .messages import Message


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
    raft: RaftConfig = field(default_factory=lambda: RaftConfig(election_ticks=10, heartbeat_ticks=2,
                                                                max_entries_per_msg=16, max_inflight=4))
    trace: bool = True


@dataclass
class SimResult:
    seed: int
    ops: int
    ok_ops: int
    leaders: int
    final_index: int
    events: int


class _DiskState:
    """What survives a crash: only writes whose simulated fsync completed."""

    def __init__(self) -> None:
        self.term = 0
        self.vote = 0
        self.terms: list[int] = []
        self.datas: list[bytes] = []

    def write(self, rd: Ready) -> None:
        if rd.hard_state is not None:
            if rd.hard_state[0] < self.term:
                raise AssertionError(f"durable term goes back from {self.term} to {rd.hard_state[0]}")
            self.term, self.vote = rd.hard_state
        if rd.ent_terms:
            cut = rd.entries_first - 1
            del self.terms[cut:]
            del self.datas[cut:]
            self.terms.extend(rd.ent_terms)
            self.datas.extend(rd.ent_data)


class _SimNode:
    def __init__(self, sim: Simulation, node_id: int) -> None:
        self.sim = sim
        self.id = node_id
        self.disk = _DiskState()
        self.alive = False
        self.incarnation = 0
        self.core: RaftCore | None = None
        self.sm = KVStateMachine()
        self.applied = 0
        self.disk_free_at = 0.0
        self.pending: dict[int, tuple[int, int, int]] = {}  # index -> (term, client, op_id)
        self.shadow_hash: list[int] = []  # prefix hash of the in-memory log, from Readies
        self.last_commit = 0
        self.last_term = 0

    def start(self) -> None:
        self.incarnation += 1
        self.alive = True
        d = self.disk
        self.core = RaftCore(self.id, self.sim.ids, self.sim.cfg.raft, term=d.term, vote=d.vote,
                             log_terms=d.terms, log_data=d.datas,
                             rng=random.Random(self.sim.rng.getrandbits(64)))
        self.sm = KVStateMachine()
        self.applied = 0
        self.pending = {}
        self.last_commit = 0
        self.last_term = d.term  # an unsynced term bump may be lost in a crash; durable terms never go back
        self.shadow_hash = []
        h = 0
        for i, (t, data) in enumerate(zip(d.terms, d.datas, strict=True), start=1):
            h = hash((h, t, data))
            self.shadow_hash.append(h)
            self.sim.check_log_entry(self, i, t, h)
        self.disk_free_at = self.sim.now
        self.sim.schedule(self.sim.rng.uniform(0, self.sim.cfg.tick_ms), "tick", self.id, self.incarnation)

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
        self.entry_hash: dict[tuple[int, int], int] = {}
        self.committed: dict[int, int] = {}  # index -> term, from any node's commit index
        self.applied_cmd: dict[int, bytes] = {}
        self.max_committed = 0
        self.partition: dict[int, int] = {}  # node -> side; empty = fully connected
        self.history = History()
        self.acked_writes: list[tuple[int, int, int]] = []  # (index, term, op_id)
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
        r = self.rng.random()
        if self.faults_on and r < self.cfg.drop_rate:
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
        """Drain the core's Ready, as node.py does: send, persist, apply."""
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
            if rd.role_changed and self.max_committed:
                want = self.committed[self.max_committed]
                if core.term_at(self.max_committed) != want:
                    self.fail(f"leader completeness: node {node.id} leads term {core.term} without "
                              f"committed entry {self.max_committed} (term {want})")
        if rd.ent_terms:
            cut = rd.entries_first - 1
            del node.shadow_hash[cut:]
            h = node.shadow_hash[-1] if node.shadow_hash else 0
            for k, (t, data) in enumerate(zip(rd.ent_terms, rd.ent_data, strict=True)):
                h = hash((h, t, data))
                node.shadow_hash.append(h)
                self.check_log_entry(node, rd.entries_first + k, t, h)
        if core.commit < node.last_commit:
            self.fail(f"node {node.id} commit index went back")
        for i in range(node.last_commit + 1, core.commit + 1):
            t = core.term_at(i)
            known = self.committed.get(i)
            if known is None:
                self.committed[i] = t
                self.max_committed = max(self.max_committed, i)
            elif known != t:
                self.fail(f"state machine safety: index {i} committed with terms {known} and {t}")
        node.last_commit = core.commit

    def check_log_entry(self, node: _SimNode, index: int, term: int, h: int) -> None:
        known = self.entry_hash.setdefault((index, term), h)
        if known != h:
            self.fail(f"log matching: node {node.id} entry ({index}, t{term}) has a different prefix")

    def apply(self, node: _SimNode, rd: Ready) -> None:
        for k, (t, data) in enumerate(zip(rd.apply_terms, rd.apply_data, strict=True)):
            idx = rd.apply_first + k
            if idx != node.applied + 1:
                self.fail(f"node {node.id} applied {idx} after {node.applied}")
            node.applied = idx
            prev = self.applied_cmd.setdefault(idx, data)
            if prev != data:
                self.fail(f"node {node.id} applied a different command at {idx}")
            result = node.sm.apply(idx, data) if data else None
            waiter = node.pending.pop(idx, None)
            if waiter is not None:
                wterm, client, op_id = waiter
                if wterm == t:
                    self.reply(client, op_id, "ok", result, (idx, t))
                else:
                    self.reply(client, op_id, "fail", None, None)

    # ------------------------------------------------------------------ clients
    def reply(self, client: int, op_id: int, status: str, result: Any, where: Any) -> None:
        lo, hi = self.cfg.net_delay_ms
        self.schedule(self.rng.uniform(lo, hi), "reply", client, (op_id, status, result, where))

    def client_issue(self, c: int) -> None:
        st = self._clients[c]
        if not self.faults_on and self.now >= self.cfg.duration_ms:
            return
        self._op_seq += 1
        op_id = self._op_seq
        key = f"k{self.rng.randrange(self.cfg.keys)}"
        if self.rng.random() < 0.5:
            kind, value, cmd = "put", op_id, encode_put(key, op_id)
        else:
            kind, value, cmd = "get", None, encode_get(key)
        self.history.invoke(op_id, c, key, kind, value, self.now)
        st["op"] = (op_id, kind)
        target = st["leader"] or self.rng.choice(self.ids)
        lo, hi = self.cfg.net_delay_ms
        self.schedule(self.rng.uniform(lo, hi), "request", target, (c, op_id, cmd))
        self.schedule(self.cfg.client_timeout_ms, "timeout", c, op_id)

    def handle_request(self, node_id: int, c: int, op_id: int, cmd: bytes) -> None:
        node = self.nodes[node_id]
        if not node.alive or node.core is None:
            return  # lost; the client times out
        try:
            index = node.core.propose([cmd])
        except NotLeader as e:
            self.reply(c, op_id, "not_leader", e.leader_id, None)
            return
        except ProposalDropped:
            self.reply(c, op_id, "fail", None, None)
            return
        node.pending[index] = (node.core.term, c, op_id)
        self.process(node)

    def handle_reply(self, c: int, op_id: int, status: str, result: Any, where: Any) -> None:
        st = self._clients[c]
        if st["op"] is None or st["op"][0] != op_id:
            return  # a late answer for an op that already timed out
        _, kind = st["op"]
        st["op"] = None
        if status == "ok":
            self.history.ok(op_id, result, self.now)
            if kind == "put":
                self.acked_writes.append((where[0], where[1], op_id))
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
        if r < 0.3:
            ids = self.ids[:]
            self.rng.shuffle(ids)
            cut = self.rng.randrange(1, len(ids))
            self.partition = {i: (0 if k < cut else 1) for k, i in enumerate(ids)}
            self.log(f"partition {sorted(ids[:cut])} | {sorted(ids[cut:])}")
        elif r < 0.5:
            self.partition = {}
            self.log("heal")
        elif r < 0.7 and alive:
            n = self.rng.choice(alive)
            n.crash()
            self.log(f"crash n{n.id}")
        elif r < 0.9 and dead:
            n = self.rng.choice(dead)
            n.start()
            self.log(f"restart n{n.id}")
        else:
            # Leader crash, the most interesting crash.
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
        return SimResult(self.seed, len(self.history.ops()), ok_ops, len(self.leader_of_term),
                         max(n.applied for n in self.nodes.values()), self.events)

    def dispatch(self, kind: str, a: Any, b: Any) -> None:
        if kind == "msg":
            node = self.nodes[a.dst]
            if node.alive and self.connected(a.src, a.dst):
                node.core.step(a)
                self.process(node)
        elif kind == "tick":
            node = self.nodes[a]
            if node.alive and node.incarnation == b:
                node.core.tick()
                self.process(node)
                self.schedule(self.cfg.tick_ms, "tick", a, b)
        elif kind == "persisted":
            node_id, inc = a
            node = self.nodes[node_id]
            if node.alive and node.incarnation == inc:
                node.disk.write(b)
                for m in b.send_after_persist:
                    self.send(m)
                idx, term = b.persist_last
                if idx:
                    node.core.persisted(idx, term)
                self.process(node)
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
                if not n.alive:
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
        node = leaders[0]
        for idx, term, op_id in self.acked_writes:
            if node.core.term_at(idx) != term:
                self.fail(f"acknowledged write {op_id} at ({idx}, t{term}) lost from the final log")
        result = check(self.history, timeout_s=20.0)
        if not result.ok:
            self.fail(f"history not linearizable (key {result.key}): {result.explanation}")


def run_seed(seed: int, cfg: SimConfig | None = None) -> SimResult:
    return Simulation(seed, cfg).run()
