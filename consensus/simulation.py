"""Deterministic simulation of a Raft group running the node runtime that ships.

Every node is the real `RaftNode` (the driver `electra node` runs: group commit, the
persist pipeline, storage recovery, snapshots and InstallSnapshot, lease and
follower reads) over a simulated `NodeRuntime`: a per-node drifting clock
(simclock.py) on one virtual-time event loop (simloop.py), a disk that loses, tears,
fails and rots writes under the production log and snapshot formats (simdisk.py),
and a network that drops, delays, duplicates, partitions and corrupts (simnet.py).
One seeded generator drives everything, so a seed replays exactly.

As in TigerBeetle's VOPR, each seed draws its own fault rates (swarm testing: some
faults are off entirely, others frequent), runs a safety phase with clients and
faults, then a liveness phase where every fault heals and the group must converge.
The checkers are separate modules: replication safety (simcheck.py), the workload's
invariants (simcheck_controller.py) and linearizability of the client history
(linearizability.py), for two workloads: the KV register and the real controller
state machine (simworkloads.py, simcontroller.py). A failure names its seed, and
`electra sim --seed N` replays it with its trace.
"""

from __future__ import annotations

import asyncio
import logging
import random
import traceback
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import mutations
from .core import RaftConfig
from .data_dir_claims import mark_rejoining
from .errors import DiskFailure, LeadershipLost, NotLeader, ProposalDropped, RaftError
from .linearizability import History, check
from .node import NodeConfig, RaftNode
from .runtime import NodeRuntime
from .simcheck import RecordingStateMachine, ReplicationChecker, Violation
from .simclock import SimClock
from .simdisk import DiskFaults, SimDiskExecutor, SimFiles
from .simloop import Gate, VirtualTimeLoop
from .simnet import NetFaults, SimNetwork, SimTransport
from .simworkloads import ClientOp, KVWorkload, Workload
from .storage import CorruptLogError, _batch_end_after

WORKLOADS = ("kv", "controller")
FAULTS = ("partition", "isolate_leader", "heal", "kill", "power_off", "restart", "pause", "crash_leader",
          "clock_jump", "clock_rate", "rot")
# An operator's actions, drawn only when a config names them in `fault_kinds` (so every seed of the faults
# above runs exactly as before): "wipe" empties a stopped node's disk (or one that refused to start on bit
# rot, as its refusal advises) and starts it with `--rejoin`.
OPERATOR_FAULTS = ("wipe",)


class SimulationFailure(AssertionError):
    def __init__(self, seed: int, reason: str, trace: list[str]) -> None:
        self.seed = seed
        self.reason = reason
        self.trace = trace
        tail = "\n".join(trace[-60:])
        super().__init__(f"seed {seed}: {reason}\n--- last events ---\n{tail}")


@dataclass
class SimConfig:
    nodes: int = 3
    workload: str = "kv"
    duration_ms: int = 1200  # safety phase: clients and faults
    settle_ms: int = 1500  # liveness phase: every fault healed, every node up: must converge
    tick_ms: int = 10
    clients: int = 4
    keys: int = 3  # KV keys, or broker sets
    client_timeout_ms: tuple[int, int] = (100, 400)  # drawn per seed
    read_ratio: tuple[float, float] = (0.2, 0.9)  # drawn per seed
    # Swarm testing: each seed draws every rate in [0, bound] (and switches some faults off).
    swarm: bool = True
    net_delay_ms: tuple[float, float] = (1.0, 8.0)
    drop_rate: float = 0.15
    dup_rate: float = 0.05
    long_delay_rate: float = 0.03
    corrupt_chunk_rate: float = 0.3
    disk_ms: tuple[float, float] = (0.2, 6.0)  # the upper bound of an operation's latency is drawn in here
    torn_write_rate: float = 1.0
    fsync_failure_rate: float = 0.01
    enospc_rate: float = 0.005
    fault_interval_ms: tuple[int, int] = (40, 300)
    fault_kinds: tuple[str, ...] = FAULTS  # a test that aims at one kind of fault names it here
    pause_ms: tuple[int, int] = (20, 300)
    clock_jump_ms: float = 50.0
    # Clocks: each node's rate is within 1 +- clock_drift (drawn per seed below max_clock_drift
    # when None); the lease assumes max_clock_drift. Set clock_drift above it to break the assumption.
    clock_drift: float | None = None
    max_clock_drift: float = 0.1
    lease_reads: bool = True
    snapshot_every: tuple[int, int] = (5, 30)  # entries between snapshots, drawn per seed
    compaction_slack: int = 4
    snapshot_chunk: int = 48  # bytes per InstallSnapshot chunk: small, so transfers take several
    follower_max_lag: int = 20
    raft: RaftConfig = field(default_factory=lambda: RaftConfig(election_ticks=10, heartbeat_ticks=2,
                                                                election_jitter_ticks=4,  # as NodeConfig
                                                                max_entries_per_msg=16, max_inflight=4))
    trace: bool = True


@dataclass
class Swarm:
    """The fault rates one seed drew."""

    net: NetFaults
    disk: DiskFaults
    weights: dict[str, float]
    drift: float
    snapshot_every: int
    read_ratio: float  # of client ops (reads keep going at an isolated leader; writes block there)
    client_timeout_ms: float

    @staticmethod
    def draw(rng: random.Random, cfg: SimConfig) -> Swarm:
        def rate(bound: float) -> float:
            if not cfg.swarm:
                return bound
            return 0.0 if rng.random() < 0.3 else rng.uniform(0, bound)

        net = NetFaults(cfg.net_delay_ms, rate(cfg.drop_rate), rate(cfg.dup_rate), rate(cfg.long_delay_rate),
                        rate(cfg.corrupt_chunk_rate))
        lo, hi = cfg.disk_ms
        disk = DiskFaults((lo, rng.uniform(lo, hi) if cfg.swarm else hi), rate(cfg.torn_write_rate),
                          rate(cfg.fsync_failure_rate), rate(cfg.enospc_rate))
        weights = {f: (0.0 if cfg.swarm and rng.random() < 0.25 else rng.uniform(0.2, 1.0)) for f in FAULTS}
        # Partitions do not last forever.
        weights["heal"] = max(weights["heal"], weights["partition"], weights["isolate_leader"])
        weights["restart"] = max(weights["restart"], 0.3)
        weights = {f: (w if f in cfg.fault_kinds else 0.0) for f, w in weights.items()}
        weights.update({f: 0.5 for f in OPERATOR_FAULTS if f in cfg.fault_kinds})  # no draw: FAULTS' seeds unchanged
        drift = cfg.clock_drift if cfg.clock_drift is not None else rng.uniform(0, cfg.max_clock_drift * 0.9)
        lo_t, hi_t = cfg.client_timeout_ms
        return Swarm(net, disk, weights, drift, rng.randrange(*cfg.snapshot_every), rng.uniform(*cfg.read_ratio),
                     rng.uniform(lo_t, hi_t) if cfg.swarm else hi_t)


@dataclass
class SimResult:
    seed: int
    workload: str
    ops: int
    ok_ops: int
    ok_reads: dict[str, int]
    leaders: int
    final_index: int
    snapshots_installed: int
    faults: dict[str, int]
    disk: dict[str, int]  # torn tails, fsync failures, ENOSPC, refused starts, fail-stops on disk errors


class _Process:
    """One simulated machine: its disk and clock outlive the node process that runs on them."""

    def __init__(self, sim: Simulation, node_id: int, rate: float) -> None:
        self.id = node_id
        self.files = SimFiles(sim.rng, sim.swarm.disk)
        self.clock = SimClock(sim.loop, rate)
        self.disk_free_at = [0.0]
        self.incarnation = 0
        self.gate: Gate | None = None
        self.node: RaftNode | None = None
        self.up = False  # started and not stopped
        self.refused = False  # refused to start on a damaged disk: stays down
        self.rejoining = False  # wiped and started with --rejoin, not yet caught up (it does not vote)


def make_workload(name: str, cfg: SimConfig, read_ratio: float) -> Workload:
    if name == "kv":
        return KVWorkload(keys=cfg.keys, get_ratio=read_ratio)
    if name == "controller":
        from .simcontroller import ControllerWorkload

        return ControllerWorkload(sets=cfg.keys, read_ratio=read_ratio)
    raise ValueError(f"unknown workload {name!r}; expected one of {WORKLOADS}")


class Simulation:
    def __init__(self, seed: int, cfg: SimConfig | None = None) -> None:
        self.seed = seed
        self.cfg = cfg = cfg or SimConfig()
        self.rng = random.Random(seed)
        self.loop = VirtualTimeLoop()
        self.swarm = Swarm.draw(self.rng, cfg)
        self.workload = make_workload(cfg.workload, cfg, self.swarm.read_ratio)
        self.invariants = self.workload.invariants()
        self.net = SimNetwork(self.loop, self.rng, self.swarm.net)
        self.ids = list(range(1, cfg.nodes + 1))
        d = self.swarm.drift
        self.procs = {i: _Process(self, i, 1.0 + self.rng.uniform(-d, d)) for i in self.ids}
        self.trace: deque[str] = deque(maxlen=400)
        self.violations: list[str] = []
        self.checker = ReplicationChecker(self._violate)
        self.history = History(self.workload.model)
        self.ok_reads: dict[str, int] = {}
        self.faults: dict[str, int] = dict.fromkeys([*FAULTS, *(f for f in OPERATOR_FAULTS if f in cfg.fault_kinds)],
                                                    0)
        self.faults_on = True
        self.all_nodes: list[RaftNode] = []
        self._clients: dict[int, tuple[int, ClientOp] | None] = {}
        self._leader_hint: dict[int, int] = {}
        self._op_seq = 0
        self._lease_count = 0
        self.log(f"seed {seed}: workload={cfg.workload} nodes={cfg.nodes} swarm={self.swarm}")

    # ------------------------------------------------------------------ plumbing
    def now_ms(self) -> float:
        return self.loop.time() * 1000.0

    def log(self, text: str) -> None:
        if self.cfg.trace:
            self.trace.append(f"{self.now_ms():9.2f} {text}")

    def _violate(self, reason: str) -> None:
        if not self.violations:
            self.log(f"VIOLATION: {reason}")
            if self.loop.is_running():
                self.loop.stop()
        self.violations.append(reason)

    def _node_error(self, p: _Process) -> Any:
        def on_error(exc: BaseException) -> None:
            self.log("".join(traceback.format_exception(exc)).rstrip())
            self._violate(f"node {p.id} raised {exc!r} while handling an event")
        return on_error

    def _loop_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, asyncio.CancelledError):
            return
        self._violate(f"unhandled error in the event loop: {context.get('message')} {exc!r}")

    # ------------------------------------------------------------------ processes
    def _node_config(self, node_id: int) -> NodeConfig:
        c = self.cfg
        return NodeConfig(node_id=node_id, peers={i: ("sim", i) for i in self.ids},
                          data_dir=Path(f"/electra-sim/n{node_id}"), tick_s=c.tick_ms / 1000.0, raft=c.raft,
                          propose_timeout_s=2.0, lease_reads=c.lease_reads, max_clock_drift=c.max_clock_drift,
                          read_timeout_s=1.0, follower_max_lag=c.follower_max_lag,
                          snapshot_entries=self.swarm.snapshot_every, snapshots_kept=2,
                          compaction_slack=c.compaction_slack, snapshot_stall_s=0.5,
                          snapshot_chunk_bytes=c.snapshot_chunk)

    def start(self, p: _Process) -> None:
        p.incarnation += 1
        gate = p.gate = Gate(self.loop, self._node_error(p))
        p.clock.gate = gate
        disk = self.swarm.disk

        def transport(cfg: NodeConfig, cluster_id: str | None, on_message: Any) -> SimTransport:
            return SimTransport(self.net, p.id, gate, on_message)

        rt = NodeRuntime(p.clock, p.files, SimDiskExecutor(self.loop, gate, self.rng, disk, p.disk_free_at, p.files),
                         SimDiskExecutor(self.loop, gate, self.rng, disk, p.disk_free_at, p.files), transport,
                         rng=random.Random(self.rng.getrandbits(64)))
        sm = RecordingStateMachine(self.workload.state_machine(), p.id, p.incarnation, self.checker,
                                   self.invariants)
        node = p.node = RaftNode(self._node_config(p.id), sm, rt)
        self.all_nodes.append(node)
        sm.term_of = lambda index: node.core.term_at(index) if node.core is not None else None
        node.on_role_change(lambda role, term, lead: self._on_role(p, node, role, term, lead))
        def boot() -> None:
            self.loop.create_task(self._boot(p, node, gate))

        gate.run_soon(boot)

    async def _boot(self, p: _Process, node: RaftNode, gate: Gate) -> None:
        try:
            await node.start()
        except CorruptLogError as exc:
            if not p.files.corrupted:
                self._violate(f"node {p.id} refused to start though its disk only lost unsynced writes: {exc}")
            self.log(f"n{p.id} refuses to start on its damaged disk ({p.files.corrupted}): {exc}")
            p.refused = True
            gate.alive = False
            p.node = None
            return
        except (OSError, DiskFailure) as exc:  # the disk failed under recovery: the process exits
            self.log(f"n{p.id} failed to start: {exc!r}")
            if p.gate is gate:
                self.kill(p, power_loss=False)
                if not self.faults_on:
                    self.start(p)
            return
        if not gate.alive:
            return
        p.up = True
        self.log(f"n{p.id} up (incarnation {p.incarnation}, applied {node.applied})")
        assert node.failed is not None
        node.failed.add_done_callback(lambda _: self._exited(p, gate))

    def _on_role(self, p: _Process, node: RaftNode, role: Any, term: int, lead: int) -> None:
        self.log(f"n{p.id} {role.name} term={term} lead={lead}")
        self.checker.on_role(p.id, node, role, term)

    def _exited(self, p: _Process, gate: Gate) -> None:
        if p.gate is gate and gate.alive:
            self.log(f"n{p.id} stopped on a disk failure: {p.node.failure if p.node else None}")
            self.kill(p, power_loss=False)
            if not self.faults_on:
                self.start(p)  # the liveness phase: its supervisor starts it again

    def kill(self, p: _Process, power_loss: bool) -> None:
        """The process dies (its page cache survives), or the machine loses power (it does not)."""
        if p.gate is not None:
            p.gate.alive = False
        self.net.endpoints.pop(p.id, None)
        if p.node is not None:
            p.node.halt()
        p.node = None
        p.up = False
        if power_loss:
            p.files.crash()

    def alive(self) -> list[_Process]:
        return [p for p in self.procs.values() if p.node is not None]

    def down(self) -> list[_Process]:
        return [p for p in self.procs.values() if p.node is None and not p.refused]

    # ------------------------------------------------------------------ clients
    def _issue(self, c: int) -> None:
        if not self.faults_on:
            return  # clients stop with the safety phase
        self._op_seq += 1
        op_id = self._op_seq
        op = self.workload.next_op(self.rng, op_id, int(self.now_ms()))
        self.history.invoke(op_id, c, op.key, op.kind, op.value, self.now_ms())
        self._clients[c] = (op_id, op)
        hint = self._leader_hint.get(c)
        target = hint if hint and op.mode != "follower" else self.rng.choice(self.ids)
        self.loop.call_later(self.net.delay(), self._arrive, target, c, op_id, op)
        self.loop.call_later(self.swarm.client_timeout_ms / 1000.0, self._timeout, c, op_id)

    def _arrive(self, target: int, c: int, op_id: int, op: ClientOp) -> None:
        p = self.procs[target]
        if p.up and p.gate is not None:
            p.gate.run_soon(self._serve, p, c, op_id, op)

    def _serve(self, p: _Process, c: int, op_id: int, op: ClientOp) -> None:
        node = p.node
        if node is None or not p.up:
            return
        if op.command is not None:
            try:
                fut = node.propose_future(op.command)
            except NotLeader as exc:
                self._reply(c, op_id, "fail", None, exc.leader_id)
                return
            except RaftError:
                self._reply(c, op_id, "fail", None, None)
                return
            fut.add_done_callback(lambda f: self._answered(f, c, op_id, write=True))
        else:
            assert op.read is not None
            # The driver decides on a lease read in the read task's first step: the callbacks
            # queued right before and after it see whether this read took the lease path.
            lease_reads = node.metrics["reads_lease"]
            self.loop.call_soon(self._lease_watch, p, node, lease_reads, True)
            task = self.loop.create_task(node.read(op.read, op.mode))
            self.loop.call_soon(self._lease_watch, p, node, lease_reads, False)
            task.add_done_callback(lambda f: self._answered(f, c, op_id, write=False))

    def _lease_watch(self, p: _Process, node: RaftNode, before: int, first: bool) -> None:
        if first:
            self._lease_count = node.metrics["reads_lease"]
        elif node.metrics["reads_lease"] > self._lease_count and node.core is not None:
            self.checker.on_lease_read(p.id, node.core.term)

    def _answered(self, f: asyncio.Future[Any], c: int, op_id: int, write: bool) -> None:
        if f.cancelled():
            return  # the node was killed: the client times out
        exc = f.exception()
        if exc is None:
            self._reply(c, op_id, "ok", f.result(), None)
        elif isinstance(exc, NotLeader):
            self._reply(c, op_id, "fail", None, exc.leader_id)
        elif isinstance(exc, LeadershipLost | ProposalDropped) or (not write and isinstance(exc, RaftError)):
            self._reply(c, op_id, "fail", None, None)
        elif isinstance(exc, RaftError):
            self._reply(c, op_id, "unknown", None, None)  # timed out, stopped: it may yet be applied
        else:
            self._violate(f"client request failed with an unexpected error: {exc!r}")

    def _reply(self, c: int, op_id: int, status: str, value: Any, hint: int | None) -> None:
        self.loop.call_later(self.net.delay(), self._on_reply, c, op_id, status, value, hint)

    def _on_reply(self, c: int, op_id: int, status: str, value: Any, hint: int | None) -> None:
        cur = self._clients.get(c)
        if cur is None or cur[0] != op_id:
            return  # a late answer to an op that already timed out
        op = cur[1]
        self._clients[c] = None
        now = self.now_ms()
        if status == "ok":
            self.history.ok(op_id, value, now)
            if op.command is not None:
                self.checker.on_acked(op.command)
            self.ok_reads[op.mode] = self.ok_reads.get(op.mode, 0) + 1
        elif status == "fail":
            self.history.fail(op_id, now)
            self._leader_hint[c] = hint or 0
        else:
            self.history.unknown(op_id, now)
            self._leader_hint[c] = 0
        self.loop.call_later(self.rng.uniform(0, 0.005), self._issue, c)

    def _timeout(self, c: int, op_id: int) -> None:
        cur = self._clients.get(c)
        if cur is not None and cur[0] == op_id:
            self._clients[c] = None
            self._leader_hint[c] = 0
            self.history.unknown(op_id, self.now_ms())
            self.loop.call_later(self.rng.uniform(0, 0.005), self._issue, c)

    # ------------------------------------------------------------------ faults
    def _fault(self) -> None:
        if not self.faults_on:
            return
        w = self.swarm.weights
        kinds = list(w)  # FAULTS, then any operator action the config names
        kind = self.rng.choices(kinds, weights=[w[f] for f in kinds])[0] if sum(w.values()) else "heal"
        if self._inject(kind):
            self.faults[kind] += 1
        lo, hi = self.cfg.fault_interval_ms
        self.loop.call_later(self.rng.uniform(lo, hi) / 1000.0, self._fault)

    def _inject(self, kind: str) -> bool:
        rng, alive, down = self.rng, self.alive(), self.down()
        if kind == "partition":
            if len(self.ids) < 2:  # a group of one has no two sides to cut it into
                return False
            ids = self.ids[:]
            rng.shuffle(ids)
            cut = rng.randrange(1, len(ids))
            self.net.partition = {i: (0 if k < cut else 1) for k, i in enumerate(ids)}
            self.log(f"partition {sorted(ids[:cut])} | {sorted(ids[cut:])}")
        elif kind == "isolate_leader":
            leader_ids = [p.id for p in alive if p.node is not None and p.node.is_leader]
            if not leader_ids:
                return False
            self.net.partition = {i: int(i == leader_ids[0]) for i in self.ids}
            self.log(f"isolate leader n{leader_ids[0]}")
        elif kind == "heal":
            self.net.partition = {}
            self.log("heal")
        elif kind in ("kill", "power_off") and alive:
            p = rng.choice(alive)
            self.kill(p, power_loss=kind == "power_off")
            self.log(f"{kind} n{p.id}")
        elif kind == "restart" and down:
            p = rng.choice(down)
            self.log(f"restart n{p.id}")
            self.start(p)
        elif kind == "pause" and alive:
            p = rng.choice(alive)
            assert p.gate is not None
            p.gate.paused_until = max(p.gate.paused_until, self.loop.time() + rng.uniform(*self.cfg.pause_ms) / 1000)
            self.log(f"pause n{p.id} until {p.gate.paused_until * 1000:.1f}")
        elif kind == "crash_leader":
            leaders = [p for p in alive if p.node is not None and p.node.is_leader]
            if not leaders:
                return False
            self.kill(leaders[0], power_loss=rng.random() < 0.5)
            self.log(f"crash leader n{leaders[0].id}")
        elif kind == "clock_jump" and alive:
            p = rng.choice(alive)
            jump = rng.uniform(0, self.cfg.clock_jump_ms) / 1000.0
            p.clock.jump(jump)
            self.log(f"clock of n{p.id} jumps {jump * 1000:.1f} ms forward")
        elif kind == "clock_rate" and alive:
            p = rng.choice(alive)
            d = self.swarm.drift
            p.clock.set_rate(1.0 + rng.uniform(-d, d))
            self.log(f"clock of n{p.id} now runs at rate {p.clock.rate:.3f}")
        elif kind == "rot":
            # Bit rot on a stopped machine's disk (a minority of one per seed: none while a wiped node still
            # rejoins, which has lost its data too), noticed at restart.
            if any(p.files.corrupted for p in self.procs.values()) or not down or self._still_rejoining():
                return False
            p = rng.choice(down)
            damaged = p.files.rot(".seg", _batch_end_after) if rng.random() < 0.7 else p.files.rot(".snap")
            if not damaged:
                return False
            self.log(f"bit rot on n{p.id}'s disk: {p.files.corrupted}")
        elif kind == "wipe":
            # As an operator would: only while the other nodes that kept their data are a majority (a rejoining
            # node votes for nobody until a leader caught it up, so a group of mostly rejoining nodes waits)
            self._still_rejoining()
            intact = {p.id for p in self.procs.values() if not (p.refused or p.rejoining or p.files.corrupted)}
            quorum = len(self.ids) // 2 + 1
            stopped = [p for p in self.procs.values() if p.node is None and len(intact - {p.id}) >= quorum]
            if not stopped:
                return False
            self._wipe_and_rejoin(rng.choice(stopped))
        else:
            return False
        return True

    def _still_rejoining(self) -> bool:
        """Clear `rejoining` of wiped nodes that caught up; whether one is still rejoining."""
        for p in self.procs.values():
            if p.rejoining and p.node is not None and p.node.core is not None and not p.node.core.behind_vote_floor():
                p.rejoining = False
        return any(p.rejoining for p in self.procs.values())

    def _wipe_and_rejoin(self, p: _Process) -> None:
        """The operator empties the node's data dir and starts it with `--rejoin` (data_dir_claims.mark_rejoining,
        run on a healthy disk: the sim's disk faults are off for that one command)."""
        p.files = SimFiles(self.rng, self.swarm.disk)
        p.refused, p.rejoining = False, True
        faults_on, self.swarm.disk.faults_on = self.swarm.disk.faults_on, False
        try:
            mark_rejoining(self._node_config(p.id).data_dir, files=p.files)
        finally:
            self.swarm.disk.faults_on = faults_on
        self.log(f"wipe n{p.id}'s disk; it starts again with --rejoin")
        self.start(p)

    def _settle(self) -> None:
        """The liveness phase: heal everything, restart every node that can start."""
        self.faults_on = False
        self.net.partition = {}
        self.swarm.net.faults_on = False
        self.swarm.disk.faults_on = False
        self.log("settle: faults healed, restarting every stopped node")
        for p in self.down():
            self.start(p)

    # ------------------------------------------------------------------ run
    async def _main(self) -> None:
        for p in self.procs.values():
            self.start(p)
        for c in range(self.cfg.clients):
            self._clients[c] = None
            self.loop.call_later(self.rng.uniform(0, 0.05), self._issue, c)
        lo, hi = self.cfg.fault_interval_ms
        self.loop.call_later(self.rng.uniform(lo, hi) / 1000.0, self._fault)
        await asyncio.sleep(self.cfg.duration_ms / 1000.0)
        self._settle()
        # The liveness phase ends as soon as the group converged, or at settle_ms (then the
        # final checks say what did not converge).
        deadline = self.loop.time() + self.cfg.settle_ms / 1000.0
        while self.loop.time() < deadline and not self._converged():
            await asyncio.sleep(0.02)

    def _converged(self) -> bool:
        live = [p.node for p in self.procs.values() if not p.refused and p.up and p.node is not None]
        if len(live) != sum(1 for p in self.procs.values() if not p.refused):
            return False
        leaders = [n for n in live if n.is_leader]
        if len(leaders) != 1 or leaders[0].core is None:
            return False
        core = leaders[0].core
        return core.commit == core.last_index() and all(n.applied == core.commit for n in live)

    def run(self) -> SimResult:
        self.loop.set_exception_handler(self._loop_exception)
        try:
            with _node_logs_into(self):
                try:
                    self.loop.run_until_complete(self._main())
                except RuntimeError:
                    if not self.violations:
                        raise
                if not self.violations:
                    self._final_checks()
        finally:
            self._close()
        if self.violations:
            raise SimulationFailure(self.seed, self.violations[0], list(self.trace))
        ops = self.history.ops()
        return SimResult(self.seed, self.cfg.workload, len(ops), sum(1 for op in ops if op.status == "ok"),
                         dict(self.ok_reads), len(self.checker.leader_of_term),
                         max(self.checker.applied, default=0),
                         sum(n.metrics["snapshots_installed"] for n in self.all_nodes), dict(self.faults),
                         self._disk_counts())

    def _disk_counts(self) -> dict[str, int]:
        counts = {"torn_tails": 0, "lost_pages": 0, "fsync_failures": 0, "enospc": 0}
        for p in self.procs.values():
            for k, v in p.files.counts.items():
                counts[k] += v
        counts["refused_starts"] = sum(p.refused for p in self.procs.values())
        counts["disk_failure_stops"] = sum(n.failure is not None for n in self.all_nodes)
        return counts

    def _final_checks(self) -> None:
        for st in self._clients.values():
            if st is not None:
                self.history.unknown(st[0], self.now_ms())
        nodes: dict[int, RaftNode] = {}
        for p in self.procs.values():
            if p.refused:
                continue
            if not p.up or p.node is None:
                self._violate(f"liveness: node {p.id} is not running after the faults healed")
                return
            nodes[p.id] = p.node
        errors = {i: (n.metrics["process_errors"], n.metrics["tick_errors"])
                  for i, n in enumerate(self.all_nodes) if n.metrics["process_errors"] or n.metrics["tick_errors"]}
        if errors:
            self._violate(f"the driver swallowed errors (process, tick) in node instances {errors}")
            return
        try:
            self.checker.final(nodes)
        except Violation:
            return
        result = check(self.history, timeout_s=20.0)
        if not result.ok:
            self._violate(f"history not linearizable (key {result.key}): {result.explanation}")

    def _close(self) -> None:
        for p in self.procs.values():
            if p.gate is not None:
                p.gate.alive = False
            if p.node is not None:
                p.node.halt()
        pending = asyncio.all_tasks(self.loop)
        for t in pending:
            t.cancel()
        if pending:
            try:
                self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            except RuntimeError as exc:  # closing after Ctrl-C mid-step: the virtual loop may have nothing to run
                if not isinstance(exc.__context__, KeyboardInterrupt):
                    raise
        self.loop.close()


class _TraceHandler(logging.Handler):
    def __init__(self, sim: Simulation) -> None:
        super().__init__(logging.INFO)
        self.sim = sim

    def emit(self, record: logging.LogRecord) -> None:
        self.sim.log(f"[{record.levelname.lower()}] {record.getMessage()}")


@contextmanager
def _node_logs_into(sim: Simulation) -> Iterator[None]:
    """The driver's log lines go into the seed's trace (with virtual time), not to the console."""
    logger = logging.getLogger("electra.consensus")
    handler = _TraceHandler(sim)
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO if sim.cfg.trace else logging.CRITICAL + 1)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


def run_seed(seed: int, cfg: SimConfig | None = None) -> SimResult:
    return Simulation(seed, cfg).run()


def ci_config(workload: str = "kv", **overrides: Any) -> SimConfig:
    """The cheap seeds CI runs by the thousand: a short safety phase, a liveness phase that ends on convergence."""
    settings: dict[str, Any] = {"duration_ms": 500, "settle_ms": 1500, "trace": False, **overrides}
    return SimConfig(workload=workload, **settings)


MUTATION_SEEDS = 600  # every deliberate bug must make some seed fail among this many


# The workload a deliberate bug shows under: bugs in the controller state machine need its commands.
MUTATION_WORKLOADS = {"elect_keeps_epoch": "controller"}
MUTATION_FAULTS = {"rejoin_without_floor": FAULTS + ("wipe",)}  # bugs only an operator's action exposes


def hunt_mutation(name: str, workload: str | None = None, max_seeds: int = MUTATION_SEEDS,
                  start: int = 0) -> SimulationFailure | None:
    """Run seeds with the deliberate bug `name` switched on; the first failure, or None if none failed.

    `workload` defaults to the one the bug lives under (MUTATION_WORKLOADS, else the KV model)."""
    cfg = SimConfig(workload=workload or MUTATION_WORKLOADS.get(name, "kv"), duration_ms=1000, trace=False,
                    fault_kinds=MUTATION_FAULTS.get(name, FAULTS))
    with mutations.forced(name):
        for seed in range(start, start + max_seeds):
            try:
                run_seed(seed, cfg)
            except SimulationFailure as exc:
                return exc
    return None


__all__ = ["hunt_mutation", "ci_config", "SimConfig", "SimResult", "Simulation", "SimulationFailure", "run_seed"]
