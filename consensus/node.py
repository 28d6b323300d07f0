"""The asyncio driver of `RaftCore`: timers, disk, peers and clients around the pure core.

The driver reaches the outside world only through its `NodeRuntime` (runtime.py):
`electra node` runs it on real time, files, a disk thread and TCP; the simulator
runs this same code on virtual time, a simulated disk and a simulated network.
Everything runs on one event loop except disk work (fsync), which runs on the
runtime's disk executor so the loop keeps receiving acks and proposals meanwhile.
Three mechanisms give throughput:

* group commit: every `propose()` issued while the loop is busy lands in one
  `core.propose()` call, one log record and (with the disk thread) one fsync;
* parallel leader write: AppendEntries leave before the leader's own fsync, the
  leader counts itself only once `persisted()` reports its write durable;
* pipelined persistence: Readies produced while an fsync runs are queued and
  written together by the next one.

Durability is fail-stop: when the log cannot be written or fsynced (ENOSPC, EIO),
the node stops serving at once without sending the acks and votes that waited for
that write, fails every pending request with `DiskFailure` and tells its host
through `failed` (the `electra node` process then exits with code 74). It never
retries an fsync. On start, a damaged newest snapshot that the compacted log no
longer covers is not fatal: the node starts from the best state it can verify
and lets the leader send a snapshot, voting meanwhile as if it still held the log
it lost (`RaftCore.vote_floor`).

Reads (`read()`) are ReadIndex on the leader, lease reads while the leader's lease
holds, follower reads (ReadIndex asked of the leader, bounded staleness) on
followers, or stale local reads. Snapshots are taken every `snapshot_entries`
applied entries or `snapshot_bytes` of applied commands, the log is compacted
behind them, and followers that fell behind the compacted log get InstallSnapshot.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import math
import ssl
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from . import mutations
from .core import REJOIN_FLOOR, RaftConfig, RaftCore, Ready, Role
from .data_dir_claims import check_cluster_stamp
from .errors import (
    DiskFailure,
    FollowerBehind,
    LeadershipLost,
    LogDiverged,
    NodeStopped,
    NoQuorum,
    NotLeader,
    ProposalTimeout,
    QuorumLost,
    RaftError,
    ReadTimeout,
)
from .framing import MAX_COMMAND, brief
from .messages import Heartbeat, Message, SnapChunk, SnapResp
from .runtime import Cancellable, NodeRuntime
from .snapshots import CHUNK_SIZE, SnapshotMeta, SnapshotReceiver, SnapshotSender, SnapshotStore
from .storage import LogStorage, RecoveredLog

READ_MODES = ("linearizable", "lease", "follower", "stale")

log = logging.getLogger("electra.consensus.node")


class StateMachine(Protocol):
    def apply(self, index: int, command: bytes) -> Any: ...

    def snapshot(self, out: BinaryIO) -> None:
        """Stream the whole state into the binary file `out` (deterministic bytes)."""

    def restore(self, inp: BinaryIO) -> None:
        """Replace the whole state with what `snapshot` wrote."""


@dataclass
class NodeConfig:
    node_id: int
    peers: dict[int, tuple[str, int]]  # raft address of every member, this node included
    data_dir: Path
    tick_s: float = 0.1
    # Election timeouts of 1.0-1.4 s at the default tick: a lost leader is replaced about 1 s after
    # it was last heard from (docs/chaos.md, "Failover").
    raft: RaftConfig = field(default_factory=lambda: RaftConfig(election_ticks=10, heartbeat_ticks=1,
                                                                election_jitter_ticks=4))
    fsync: bool = True
    propose_timeout_s: float = 10.0
    max_batch: int = 16384  # commands per core.propose() call
    cluster: str = "electra"
    # Identity: the cluster id (checked in the data dir and on every peer connection) and the
    # mutual-TLS contexts the host built for the transport (None, None: plaintext, insecure mode).
    cluster_id: str | None = None
    peer_server_ssl: ssl.SSLContext | None = field(default=None, repr=False)
    peer_client_ssl: ssl.SSLContext | None = field(default=None, repr=False)
    # Reads.
    lease_reads: bool = True
    max_clock_drift: float = 0.1  # assumed bound on relative clock rate error between nodes
    read_timeout_s: float = 5.0
    follower_max_lag: int = 1000  # entries behind the leader's commit before follower reads refuse
    follower_max_silence_s: float | None = None  # default: the minimum election timeout
    # Snapshots and compaction.
    snapshot_entries: int = 100_000
    snapshot_bytes: int = 64 << 20
    snapshots_kept: int = 3
    compaction_slack: int = 5000  # entries kept behind a snapshot so short lags catch up from the log
    # Containment of a peer's snapshot transfer (docs/security.md): the largest snapshot file a
    # follower accepts, and how long an unfinished transfer may sit idle before its temp file goes.
    max_snapshot_bytes: int = 4 << 30
    snapshot_stall_s: float = 10.0
    snapshot_chunk_bytes: int = CHUNK_SIZE  # bytes per InstallSnapshot message

    def election_timeout_s(self) -> float:
        """The longest randomized election timeout: after this long without a leader, something is wrong."""
        return 2 * self.raft.election_ticks * self.tick_s

    def lease_s(self) -> float:
        """Lease length: the followers' vote-refusal window, shrunk by the drift bound.

        A follower refuses votes for `election_ticks * tick_s` seconds of its clock after hearing
        from the leader (elapsed time, not counted ticks: docs/raft-engine.md, Time); one tick of
        that is kept as slack besides the drift margin (docs/reads-and-snapshots.md, Lease reads).
        """
        if not self.lease_reads or not self.raft.check_quorum:
            return 0.0
        if mutations.enabled("lease_without_margin"):  # the deliberate bug: no drift, no tick of slack
            return 2 * self.raft.election_ticks * self.tick_s
        return (self.raft.election_ticks - 1) * self.tick_s * (1 - self.max_clock_drift)


@dataclass(frozen=True, slots=True)
class _Started:
    """What a node has only from `start()` on: the core recovered from disk and the loop it runs on."""

    core: RaftCore
    loop: asyncio.AbstractEventLoop


def _resolve(fut: asyncio.Future[Any], fn: Callable[[Any], Any], sm: Any) -> None:
    """Serve a read whose turn came: `fut` gets `fn(sm)`, or what `fn` raised (its caller sees it, as from
    a coroutine); a future its caller gave up on is left alone."""
    if fut.done():
        return
    try:
        fut.set_result(fn(sm))
    except Exception as exc:
        fut.set_exception(exc)


class RaftNode:
    """One member of a Raft group. Use `await start()`, then `propose()`."""

    def __init__(self, cfg: NodeConfig, state_machine: StateMachine, runtime: NodeRuntime | None = None) -> None:
        self.cfg = cfg
        self.sm = state_machine
        self.runtime = rt = runtime or NodeRuntime.system(cfg.node_id)
        self.clock = rt.clock
        self.storage = LogStorage(Path(cfg.data_dir) / "raft-log", fsync=cfg.fsync, files=rt.files, clock=rt.clock.now)
        self.snapshots = SnapshotStore(Path(cfg.data_dir) / "snapshots", keep=cfg.snapshots_kept, fsync=cfg.fsync,
                                       files=rt.files)
        self.cluster_id = check_cluster_stamp(cfg.data_dir, cfg.cluster_id)
        self.transport = rt.transport(cfg, self.cluster_id, self._on_message)
        self._started: _Started | None = None  # set by start()
        self.applied = 0
        self._kicked = False
        self._queued_cmds: list[bytes] = []
        self._queued_futs: list[tuple[asyncio.Future[Any], float]] = []
        self._waiters: dict[int, tuple[int, asyncio.Future[Any], float]] = {}  # index -> (term, fut, deadline)
        self._persist_queue: list[Ready] = []
        self._persist_wakeup = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._tick_handle: Cancellable | None = None
        self._running = False
        self._stopped = False
        self._stop_done: asyncio.Future[None] | None = None  # set while/after stop() runs: later callers wait on it
        self.failure: DiskFailure | None = None  # set when the node stopped on a disk error
        self.failed: asyncio.Future[DiskFailure] | None = None  # resolves with that error: the host's signal to exit
        self._role_listeners: list[Callable[[Role, int, int], None]] = []
        self.metrics = {"proposals": 0, "batches": 0, "fsyncs": 0, "entries_persisted": 0,
                        "applied": 0, "max_batch": 0, "reads_readindex": 0, "reads_lease": 0,
                        "reads_follower": 0, "reads_stale": 0, "reads_refused": 0, "snapshots_taken": 0,
                        "snapshots_sent": 0, "snapshots_installed": 0, "tick_errors": 0,
                        "process_errors": 0, "snapshot_chunks_refused": 0, "snapshot_transfers_aborted": 0,
                        "snapshot_failures": 0}
        self._read_ids = itertools.count(1)
        # A read waits first for its read index (ctx -> (fut, deadline, fn)), then until that index
        # is applied (a heap of (index, seq, fut, deadline, fn)); one future serves both stages and
        # resolves with fn(state machine).
        self._read_waiters: dict[int, tuple[asyncio.Future[Any], float, Callable[[Any], Any]]] = {}
        self._apply_waiters: list[tuple[int, int, asyncio.Future[Any], float, Callable[[Any], Any]]] = []
        self._apply_seq = itertools.count()
        self._snap_meta: SnapshotMeta | None = None
        self._snapshotting = False
        self._bytes_since_snap = 0
        self._snapshot_failed_in_a_row = 0
        self._marking = False  # a log mark write in flight (`_write_mark`)
        self._snapshot_retry_at = 0.0  # after a failed snapshot, none is tried before this (the runtime's clock)
        self._senders: dict[int, asyncio.Queue[SnapResp | None]] = {}  # peer -> SNAP_RESP queue of the running transfer
        self._receiver = SnapshotReceiver(cfg.node_id, self.snapshots.receive_sink, max_bytes=cfg.max_snapshot_bytes)
        self._receiving_from = 0  # the leader whose snapshot transfer we are receiving
        self._last_chunk_at = 0.0
        self.last_tick_at = 0.0  # monotonic time of the last completed tick
        self._tick_due = 0.0
        self.tick_lateness: deque[float] = deque(maxlen=100)  # how late (s) each of the last 100 ticks ran
        self.leader_seen_at = 0.0  # monotonic time this node last knew a leader (itself included)
        # The leader's commit watch: (commit index, since when it has not moved while entries wait).
        self._commit_watch = (0, 0.0)
        self._commit_stalled = False  # set by the tick that logs the stall: /healthz turns with the log line
        self._rejoin_said_at = -math.inf

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.failed = loop.create_future()
        if (warning := mutations.banner()) is not None:
            log.critical("node %d: %s", self.cfg.node_id, warning)
        t0 = self.clock.now()
        rec = self.storage.open()
        meta = self.snapshots.latest()
        snap = (meta.index, meta.term) if meta else (0, 0)
        if rec.snapshot_index > snap[0]:
            self._recover_lost_snapshot(rec, snap)
        if meta is not None:
            with self.snapshots.open_data(meta) as f:
                self.sm.restore(f)
            self._snap_meta = meta
            if rec.last_index < meta.index or (rec.snapshot_index < meta.index and
                                                rec.terms[meta.index - rec.first_index] != meta.term):
                # The snapshot is newer than the log (an install whose log reset was not yet durable).
                self.storage.reset(meta.index, meta.term)
                self.storage.sync()
                rec.terms, rec.datas, rec.snapshot_index, rec.snapshot_term = [], [], meta.index, meta.term
        last_term = rec.terms[-1] if rec.terms else rec.snapshot_term
        if last_term > rec.term:
            # A term below its own log's (a bootstrap from the tier that crashed before its term was durable, in
            # an older version): it would hand out terms lower than its entries'. Terms only go up.
            log.warning("node %d: hard-state term %d is below its log's term %d; raising it",
                        self.cfg.node_id, rec.term, last_term)
            self.storage.save_hard_state(last_term, 0)
            self.storage.sync()
            rec.term, rec.vote = last_term, 0
        raft = replace(self.cfg.raft, lease_s=self.cfg.lease_s(), tick_s=self.cfg.tick_s)
        core = RaftCore(
            self.cfg.node_id, sorted(self.cfg.peers), raft,
            term=rec.term, vote=rec.vote, log_offset=rec.snapshot_index, offset_term=rec.snapshot_term,
            log_terms=rec.terms, log_data=rec.datas, snapshot=snap if meta else None,
            vote_floor=rec.vote_floor, clock=self.clock.now, rng=self.runtime.rng,
        )
        self._started = _Started(core, loop)
        self.applied = snap[0]
        self.restart_seconds = self.clock.now() - t0
        log.info("node %d starting: term=%d vote=%d snapshot=%d log=[%d..%d] fsync=%s (loaded in %.2fs)",
                 self.cfg.node_id, rec.term, rec.vote, snap[0], rec.first_index, core.last_index(),
                 self.cfg.fsync, self.restart_seconds)
        self._running = True
        self.last_tick_at = self.leader_seen_at = self.clock.now()
        await self.transport.start()
        self._tasks.append(asyncio.create_task(self._persister(), name=f"raft-persist-{self.cfg.node_id}"))
        self._tick_handle = self.clock.call_later(self.cfg.tick_s, self._on_tick)

    def _recover_lost_snapshot(self, rec: RecoveredLog, snap: tuple[int, int]) -> None:
        """The log is compacted past the newest snapshot that verifies: its state is lost here.

        Keep the hard state (term, vote: still valid), drop the log (useless without the
        state below it) and restart from `snap` (an older valid snapshot, or nothing) so the
        leader brings this node up with entries or InstallSnapshot. The newest entry of the
        dropped log becomes the vote floor, written with the hard state before the log is
        reset, so that neither now nor after another crash does this node vote for a
        candidate missing entries it once acknowledged.
        """
        if len(self.cfg.peers) == 1:
            raise RuntimeError(
                f"the Raft log in {self.storage.dir} is compacted up to {rec.snapshot_index} but the newest valid "
                f"snapshot in {self.snapshots.dir} is at {snap[0]}, and a one-member group has no leader to "
                "recover from; refusing to start (restore the snapshot files from a backup)")
        lost = (rec.last_index, rec.terms[-1] if rec.terms else rec.snapshot_term)
        floor = max(lost, rec.vote_floor, key=lambda it: (it[1], it[0]))
        log.critical(
            "node %d: the Raft log in %s is compacted up to %d but the newest valid snapshot in %s is at %d; "
            "the state machine data up to %d is lost here. Dropping the log [%d..%d] and recovering from the "
            "leader (InstallSnapshot); until then this node votes as if its log ended at index %d term %d",
            self.cfg.node_id, self.storage.dir, rec.snapshot_index, self.snapshots.dir, snap[0],
            rec.snapshot_index, rec.first_index, rec.last_index, floor[0], floor[1])
        self.storage.save_vote_floor(*floor)
        self.storage.reset(*snap)
        self.storage.sync()
        rec.vote_floor = floor
        rec.terms, rec.datas, rec.snapshot_index, rec.snapshot_term = [], [], snap[0], snap[1]

    async def stop(self) -> None:
        """Stop serving, fail what waits, close the log. A second caller returns when the first is done.

        (A disk failure stops the node from its own task; the host's stop arriving meanwhile must not
        return, and let the process exit, before the log is closed.)
        """
        if self._stop_done is not None:
            await asyncio.shield(self._stop_done)
            return
        if self._stopped or (not self._running and self.failure is None):
            return  # halted, or never started
        self._stop_done = asyncio.get_running_loop().create_future()
        try:
            await self._stop()
        finally:
            self._stop_done.set_result(None)

    async def _stop(self) -> None:
        self._stopped = True
        self._running = False
        if self._tick_handle:
            self._tick_handle.cancel()
        self._persist_wakeup.set()
        me = asyncio.current_task()
        for t in self._tasks:
            if t is not me:
                t.cancel()
        await asyncio.gather(*(t for t in self._tasks if t is not me), return_exceptions=True)
        await self.transport.stop()
        self._receiver.abort()
        self._fail_pending(self.failure or NodeStopped("node stopped before the result was known"))
        await self.runtime.disk.run(self.storage.close)
        self.runtime.disk.shutdown()
        self.runtime.snapshot_disk.shutdown()

    def halt(self) -> None:
        """Stop dead, as a killed process does: no more I/O, no flush, nothing answered.

        The simulator's crash; what survives is whatever the disk already made durable.
        """
        self._running = False
        self._stopped = True
        if self._tick_handle:
            self._tick_handle.cancel()
        for t in self._tasks:
            t.cancel()

    def _fail_stop(self, exc: DiskFailure) -> None:
        """The log cannot be made durable: stop serving now, acknowledge nothing more."""
        if self.failure is not None:
            return
        log.critical("node %d: FATAL %s, stopping without acknowledging anything more: %s", self.cfg.node_id,
                     "log divergence" if isinstance(exc, LogDiverged) else "disk failure", exc)
        self.failure = exc
        self._running = False  # no more ticks, messages, proposals, acks or votes
        if self._tick_handle:
            self._tick_handle.cancel()
        self._persist_queue.clear()
        self._fail_pending(exc)
        self._tasks.append(asyncio.create_task(self.stop()))
        if self.failed is not None and not self.failed.done():
            self.failed.set_result(exc)

    def _fail_pending(self, err: RaftError) -> None:
        for fut, _ in self._queued_futs:
            if not fut.done():
                fut.set_exception(err)
        for _, fut, _ in self._waiters.values():
            if not fut.done():
                fut.set_exception(err)
        for fut, _, _ in self._read_waiters.values():
            if not fut.done():
                fut.set_exception(err)
        for _, _, fut, _, _ in self._apply_waiters:
            if not fut.done():
                fut.set_exception(err)
        self._read_waiters.clear()
        self._apply_waiters.clear()
        self._queued_futs.clear()
        self._queued_cmds.clear()
        self._waiters.clear()

    # ------------------------------------------------------------------ client API
    @property
    def core(self) -> RaftCore | None:
        """The Raft core: None until `start()` has recovered it from disk."""
        return self._started.core if self._started is not None else None

    @property
    def _live(self) -> _Started:
        """The core and its loop, for the paths that run only once the node has started (NodeStopped before)."""
        if self._started is None:
            raise NodeStopped(f"node {self.cfg.node_id} has not started")
        return self._started

    @property
    def role(self) -> Role:
        return self.core.role if self.core else Role.FOLLOWER

    @property
    def is_leader(self) -> bool:
        return self.core is not None and self.core.role == Role.LEADER

    @property
    def leader_id(self) -> int:
        return self.core.lead if self.core else 0

    def status(self) -> dict[str, Any]:
        c = self.core
        return {
            "node_id": self.cfg.node_id, "role": c.role.name.lower() if c else "stopped",
            "term": c.term if c else 0, "leader_id": c.lead if c else 0,
            "commit_index": c.commit if c else 0, "applied_index": self.applied,
            "last_index": c.last_index() if c else 0, "peers": sorted(self.cfg.peers),
            "snapshot_index": c.snap_index if c else 0, "log_first_index": c.offset + 1 if c else 0,
            "fsync": self.cfg.fsync, "refused_terms": c.refused_terms if c else 0,
            # False while it may not vote or campaign: rejoining (`--rejoin`) or after a lost snapshot
            "votes": not c.behind_vote_floor() if c else False, **self.metrics,
            **{f"peer_{k}": v for k, v in self.transport.stats.items()},
            **self._tick_lateness_ms(), "commit_stalled_s": round(self.commit_stalled_s(), 3),
        }

    def _tick_lateness_ms(self) -> dict[str, float]:
        """How late the last 100 ticks ran (p99 and max): whatever starves the event loop shows here."""
        late = sorted(self.tick_lateness)
        if not late:
            return {"tick_late_p99_ms": 0.0, "tick_late_max_ms": 0.0}
        return {"tick_late_p99_ms": round(late[int(0.99 * (len(late) - 1))] * 1000, 1),
                "tick_late_max_ms": round(late[-1] * 1000, 1)}

    def on_role_change(self, fn: Callable[[Role, int, int], None]) -> None:
        """Call `fn(role, term, leader_id)` whenever this node's role or leader changes."""
        self._role_listeners.append(fn)

    async def propose(self, command: bytes, timeout: float | None = None) -> Any:
        """Replicate `command`; return the state machine's result once applied here.

        Raises NotLeader (with a hint), ProposalDropped, LeadershipLost (the entry was
        overwritten: definitely not committed), ProposalTimeout or NodeStopped (outcome unknown).
        """
        return await self.propose_future(command, timeout)

    def propose_future(self, command: bytes, timeout: float | None = None) -> asyncio.Future[Any]:
        """`propose()` without a coroutine: for servers that answer from a done-callback."""
        if not isinstance(command, bytes | bytearray) or not command:
            raise ValueError("a command must be non-empty bytes (empty entries are reserved for no-ops)")
        if len(command) > MAX_COMMAND:
            raise ValueError(f"a command must be at most {MAX_COMMAND} bytes, not {len(command)}")
        if not self._running:
            raise self.failure or NodeStopped("node is not running")
        live = self._live
        if live.core.role != Role.LEADER:
            raise NotLeader(live.core.lead)
        fut = live.loop.create_future()
        deadline = self.clock.now() + (timeout if timeout is not None else self.cfg.propose_timeout_s)
        self._queued_cmds.append(bytes(command))
        self._queued_futs.append((fut, deadline))
        self._kick()
        return fut

    async def read(self, fn: Callable[[Any], Any], mode: str = "linearizable", timeout: float | None = None) -> Any:
        """Run `fn(state_machine)` under the consistency `mode` asks for.

        * linearizable (default): ReadIndex: confirm leadership with one heartbeat round
          (shared by every read queued before it), wait until that commit index is applied.
        * lease: answer locally while the leader's lease holds; otherwise ReadIndex.
        * follower: on a follower, ask the leader for a read index and wait for it locally;
          refuse at once (FollowerBehind) when too far behind or out of touch with the leader.
          On the leader it is a lease read.
        * stale: local state, no check (admin views).
        On a follower every mode but stale is a follower read.
        """
        return await self.read_future(fn, mode, timeout)

    def read_future(self, fn: Callable[[Any], Any], mode: str = "linearizable",
                    timeout: float | None = None) -> asyncio.Future[Any]:
        """`read` as a future of `fn(state_machine)`, resolved by the node itself once the read may be
        served: no coroutine and no Task per read (the lean HTTP path answers from its done-callback).
        A read refused at once (not running, no leader, behind, no quorum) raises here."""
        if mode not in READ_MODES:
            raise ValueError(f"unknown read mode {mode!r}; expected one of {READ_MODES}")
        if not self._running:
            raise self.failure or NodeStopped("node is not running")
        m = self.metrics
        live = self._live
        fut = live.loop.create_future()
        if mode == "stale":
            m["reads_stale"] += 1
            _resolve(fut, fn, self.sm)
            return fut
        core = live.core
        deadline = self.clock.now() + (timeout if timeout is not None else self.cfg.read_timeout_s)
        if core.role == Role.LEADER:
            index = core.lease_read_index() if mode in ("lease", "follower") else None
            if index is not None:
                m["reads_lease"] += 1
                self._park(index, fut, deadline, fn)  # the lease's fast path when applied: no message, no wait
            else:
                m["reads_readindex"] += 1
                self._start_read_index(fut, deadline, fn)
        else:
            self._check_follower_fresh(core)
            m["reads_follower"] += 1
            self._start_read_index(fut, deadline, fn)
        return fut

    def _check_follower_fresh(self, core: RaftCore) -> None:
        silence = self.cfg.follower_max_silence_s
        if silence is None:
            silence = self.cfg.raft.election_ticks * self.cfg.tick_s
        if core.lead == 0 or core.clock() - core.last_leader_contact > silence:
            self.metrics["reads_refused"] += 1
            raise FollowerBehind(f"node {self.cfg.node_id} has not heard from a leader for over {silence:.2f}s",
                                 core.lead)
        lag = core.leader_commit - self.applied
        if lag > self.cfg.follower_max_lag:
            self.metrics["reads_refused"] += 1
            raise FollowerBehind(f"node {self.cfg.node_id} is {lag} entries behind its leader "
                                 f"(limit {self.cfg.follower_max_lag})", core.lead)

    def _start_read_index(self, fut: asyncio.Future[Any], deadline: float, fn: Callable[[Any], Any]) -> None:
        ctx = next(self._read_ids)
        self._live.core.read_index(ctx)  # raises NotLeader when no leader is known
        self._read_waiters[ctx] = (fut, deadline, fn)
        self._kick()

    def _park(self, index: int, fut: asyncio.Future[Any], deadline: float, fn: Callable[[Any], Any]) -> None:
        """Resolve `fut` with `fn(state machine)` once `index` is applied here."""
        if self.applied >= index:
            _resolve(fut, fn, self.sm)
        else:
            heapq.heappush(self._apply_waiters, (index, next(self._apply_seq), fut, deadline, fn))

    async def transfer_leadership(self, target: int, timeout: float = 5.0) -> None:
        """Ask the leader to hand over to `target`; returns once `target` leads."""
        self._live.core.transfer_leadership(target)
        self._kick()
        deadline = self.clock.now() + timeout
        while self.clock.now() < deadline:
            if self._live.core.lead == target:
                return
            await asyncio.sleep(self.cfg.tick_s / 2)
        raise ProposalTimeout(f"leadership did not move to node {target} within {timeout}s")

    @property
    def election_timeout_s(self) -> float:
        return self._live.core.cfg.election_ticks * self.cfg.tick_s

    def best_transferee(self) -> int | None:
        """The follower a leadership transfer with no target goes to (`RaftCore.best_transferee`)."""
        return self._live.core.best_transferee()

    async def hand_over_leadership(self) -> int | None:
        """A leader about to stop hands over to its most caught-up live follower (etcd does the same on a
        graceful stop): writes then pause for a round trip and a vote, not for an election timeout. Returns
        the new leader's id, or None (not leading, alone, or no follower took over within an election
        timeout, after which the core gives the transfer up by itself)."""
        if not self._running or (target := self.best_transferee()) is None:
            return None
        try:
            await self.transfer_leadership(target, self.election_timeout_s)
        except (RaftError, ValueError) as exc:
            log.warning("node %d: leadership not handed over before stopping: %s", self.cfg.node_id, exc)
            return None
        log.info("node %d: handed leadership over to node %d before stopping", self.cfg.node_id, target)
        return target

    # ------------------------------------------------------------------ event handling
    def _on_message(self, msg: Message) -> None:
        if not self._running:
            return
        if isinstance(msg, SnapChunk):
            self._on_snapshot_chunk(msg)
        elif isinstance(msg, SnapResp):
            q = self._senders.get(msg.src)
            if q is not None:
                q.put_nowait(msg)
        else:
            core = self._live.core
            core.step(msg)
            if core.diverged is not None:
                self._fail_stop(LogDiverged(core.diverged))
                return
        self._kick()

    def _on_tick(self) -> None:
        """One tick; whatever fails inside it is logged and counted, and the next tick is armed regardless."""
        if not self._running:
            return
        try:
            now = self.clock.now()
            if self._tick_due:
                self.tick_lateness.append(max(0.0, now - self._tick_due))
            core = self._live.core
            core.tick()
            if core.lead:
                self.leader_seen_at = now
            self._watch_commit(core, now)
            self._say_rejoining(core, now)
            if (self._waiters or self._read_waiters) and core.quorum_silent:
                self._fail_uncommitted_waiters()
                self._fail_read_waiters(NoQuorum(f"leader {self.cfg.node_id} has heard from no quorum for an "
                                                 f"election timeout: read not confirmed"))
            self._expire_waiters()
            self._abort_stalled_snapshot(now)
            self._process()
        except Exception as exc:
            self.metrics["tick_errors"] += 1
            log.exception("node %d: tick failed (%d so far); ticking on: %s", self.cfg.node_id,
                          self.metrics["tick_errors"], brief(exc))
        finally:
            if self._running:
                self.last_tick_at = self.clock.now()
                delay = self.cfg.tick_s
                due = self._live.core.election_due_s()  # a follower times out on time, not up to a tick late
                if due is not None and due < delay:
                    delay = due + 0.001
                self._tick_due = self.last_tick_at + delay
                self._tick_handle = self.clock.call_later(delay, self._on_tick)

    REJOIN_SAY_EVERY_S = 10.0

    def _say_rejoining(self, core: RaftCore, now: float) -> None:
        """Every 10 s while behind its vote floor (`--rejoin`, a lost snapshot), what it waits for: a node that
        votes for nobody looks healthy otherwise, and a group whose majority rejoins never elects (each waits
        for a leader)."""
        if not core.behind_vote_floor() or now - self._rejoin_said_at < self.REJOIN_SAY_EVERY_S:
            return
        self._rejoin_said_at = now
        if core.term_probe is not None:
            waits = f"the terms of nodes {sorted(core.term_probe)} (a majority of the others must answer)"
        elif core.vote_floor == REJOIN_FLOOR:
            waits = "a leader of the current term"
        else:
            index, term = core.vote_floor
            waits = f"its log to reach index {index} of term {term} (now {core.last_index()})"
        log.warning("node %d neither votes nor campaigns until it has caught up (--rejoin, or a lost snapshot's "
                    "vote floor); waiting for %s", self.cfg.node_id, waits)

    def commit_stall_limit_s(self) -> float:
        """How long a leader's commit index may stand still with entries waiting before it is unhealthy:
        three election timeouts (a slow fsync or a follower catching up is shorter than that)."""
        return 3 * self.cfg.election_timeout_s()

    def _watch_commit(self, core: RaftCore, now: float) -> None:
        """Note when the leader's commit index stopped moving while its log holds entries beyond it.

        A leader that hears from a quorum (so CheckQuorum keeps it leading) but cannot commit is
        the one failure a role and a term do not show: its followers refuse its entries (a log
        that conflicts with theirs), or its disk does not finish a write. Every write and read
        then times out while each node looked healthy (docs/raft-engine.md, "Health")."""
        commit, since = self._commit_watch
        if core.role != Role.LEADER or core.commit != commit or core.last_index() <= core.commit:
            if self._commit_stalled:
                log.warning("node %d: commit index moves again (%d)", self.cfg.node_id, core.commit)
                self._commit_stalled = False
            self._commit_watch = (core.commit, now)
            return
        if not self._commit_stalled and now - since > self.commit_stall_limit_s():
            self._commit_stalled = True
            log.error("node %d: leader in term %d cannot commit: commit index %d has not moved for %.1fs with "
                      "entries up to %d; its followers refuse its entries or its disk does not finish writes "
                      "(check every node's log; /healthz answers 503 until it moves)", self.cfg.node_id,
                      core.term, core.commit, now - since, core.last_index())

    def commit_stalled_s(self) -> float:
        """How long this leader's commit index has stood still with entries waiting (0: it moves, or not leader)."""
        core = self.core
        commit, since = self._commit_watch
        if core is None or core.role != Role.LEADER or core.commit != commit or core.last_index() <= commit:
            return 0.0
        return max(0.0, self.clock.now() - since)

    def health(self) -> tuple[bool, str]:
        """(healthy, reason): unhealthy once ticks stop, no leader was known for an election timeout, or
        this leader could not commit for `commit_stall_limit_s`."""
        if not self._running:
            return False, "stopped"
        now = self.clock.now()
        limit = self.cfg.election_timeout_s()
        if now - self.last_tick_at > limit:
            return False, f"no Raft tick for {now - self.last_tick_at:.1f}s"
        if self._live.core.lead == 0 and now - self.leader_seen_at > limit:
            return False, f"no leader known for {now - self.leader_seen_at:.1f}s"
        stalled = self.commit_stalled_s()
        if self._commit_stalled and stalled > 0:  # (the tick notices a commit that moved again within a tick)
            core = self._live.core
            return False, (f"leader cannot commit: commit index {core.commit} has not moved for {stalled:.1f}s "
                           f"with entries up to {core.last_index()}")
        return True, "ok"

    def _kick(self) -> None:
        if not self._kicked:
            self._kicked = True
            self._live.loop.call_soon(self._process)

    def _process(self) -> None:
        self._kicked = False
        if not self._running:
            return
        try:
            core = self._live.core
            if self._queued_cmds:
                self._propose_queued()
            while core.has_ready():
                self._handle_ready(core.ready())
        except Exception as exc:
            self.metrics["process_errors"] += 1
            log.exception("node %d: processing Raft output failed: %s", self.cfg.node_id, brief(exc))

    def _propose_queued(self) -> None:
        cmds, futs = self._queued_cmds, self._queued_futs
        self._queued_cmds, self._queued_futs = [], []
        core = self._live.core
        for lo in range(0, len(cmds), self.cfg.max_batch):
            chunk = cmds[lo:lo + self.cfg.max_batch]
            try:
                first = core.propose(chunk)
            except RaftError as exc:
                for fut, _ in futs[lo:]:
                    if not fut.done():
                        fut.set_exception(type(exc)(*exc.args) if not isinstance(exc, NotLeader)
                                          else NotLeader(exc.leader_id))
                return
            term = core.term
            waiters = self._waiters
            for k, (fut, deadline) in enumerate(futs[lo:lo + len(chunk)]):
                waiters[first + k] = (term, fut, deadline)
            m = self.metrics
            m["proposals"] += len(chunk)
            m["batches"] += 1
            if len(chunk) > m["max_batch"]:
                m["max_batch"] = len(chunk)

    def _handle_ready(self, rd: Ready) -> None:
        if rd.send_now:
            self.transport.send_many(rd.send_now)
        if rd.read_states:
            for ctx, index in rd.read_states:
                w = self._read_waiters.pop(ctx, None)
                if w is not None and not w[0].done():
                    self._park(index, *w)
        if rd.reads_dropped:
            self._reads_lost_their_leader(rd.reads_dropped)
        for peer in rd.snapshot_requests:
            if peer not in self._senders:
                self._senders[peer] = asyncio.Queue()
                self._tasks.append(asyncio.create_task(self._send_snapshot(peer)))
        if rd.needs_persist() or rd.send_after_persist:
            self._persist_queue.append(rd)
            self._persist_wakeup.set()
        if rd.apply_terms:
            self._apply(rd)
        if rd.role_changed:
            c = self._live.core
            if c.lead != self._receiving_from:
                self._receiver.abort()  # a transfer from the previous leader will never finish
            log.info("node %d is now %s in term %d (leader %d)", self.cfg.node_id, c.role.name, c.term, c.lead)
            if c.role != Role.LEADER:
                for q in self._senders.values():
                    q.put_nowait(None)  # wake running snapshot transfers: they end with the leadership
                for fut, _ in self._queued_futs:
                    if not fut.done():
                        fut.set_exception(NotLeader(c.lead))
                self._queued_futs.clear()
                self._queued_cmds.clear()
                self._fail_uncommitted_waiters()
            for fn in self._role_listeners:
                try:
                    fn(c.role, c.term, c.lead)
                except Exception:
                    log.exception("role-change listener failed")

    def _reads_lost_their_leader(self, dropped: list[int]) -> None:
        """Reads a role change dropped. On a node that leads now (a follower read asked of the old leader,
        which this node replaced) they start over as its own ReadIndex reads; elsewhere they fail with
        the leader known now. They used to fail here too, with this node named as the leader to ask: an
        HTTP client got a redirect to the node that answered it."""
        core = self._live.core
        for ctx in dropped:
            w = self._read_waiters.pop(ctx, None)
            if w is None or w[0].done():
                continue
            if core.role == Role.LEADER:
                try:
                    core.read_index(ctx)
                except RaftError as exc:
                    w[0].set_exception(exc)
                    continue
                self._read_waiters[ctx] = w
                self.metrics["reads_readindex"] += 1
            else:
                w[0].set_exception(NotLeader(core.lead))

    def _apply(self, rd: Ready) -> None:
        apply = self.sm.apply
        waiters = self._waiters
        idx = rd.apply_first
        for term, data in zip(rd.apply_terms, rd.apply_data, strict=True):
            result = apply(idx, data) if data else None
            w = waiters.pop(idx, None) if waiters else None
            if w is not None:
                wterm, fut, _ = w
                if not fut.done():
                    if wterm == term:
                        fut.set_result(result)
                    else:
                        fut.set_exception(LeadershipLost(f"entry {idx} was replaced by a new leader"))
            self._bytes_since_snap += len(data)
            idx += 1
        self.applied = idx - 1
        self.metrics["applied"] = self.applied
        self._wake_apply_waiters()
        last_snap = self._snap_meta.index if self._snap_meta else 0
        if not self._snapshotting and (self.applied - last_snap >= self.cfg.snapshot_entries
                                       or self._bytes_since_snap >= self.cfg.snapshot_bytes) \
                and self.clock.now() >= self._snapshot_retry_at:
            self._take_snapshot()

    def _wake_apply_waiters(self) -> None:
        w = self._apply_waiters
        while w and w[0][0] <= self.applied:
            _, _, fut, _, fn = heapq.heappop(w)
            _resolve(fut, fn, self.sm)

    def _fail_read_waiters(self, exc: RaftError) -> None:
        """Reads waiting for a confirmation this node cannot get (they change nothing: safe to retry)."""
        waiting, self._read_waiters = self._read_waiters, {}
        for fut, _, _ in waiting.values():
            if not fut.done():
                fut.set_exception(exc)

    def _fail_uncommitted_waiters(self) -> None:
        """This node stopped leading, or heard from no quorum for an election timeout: its proposals not
        yet committed have an unknown outcome (a later leader may commit or drop them), and their callers
        learn so now instead of at their deadline. Committed ones still apply here and answer with their
        result."""
        commit = self._live.core.commit
        lost = [idx for idx in self._waiters if idx > commit]
        for idx in lost:
            _, fut, _ = self._waiters.pop(idx)
            if not fut.done():
                fut.set_exception(QuorumLost(f"node {self.cfg.node_id} lost its quorum before entry {idx} "
                                             f"committed; a new leader may still commit it"))

    def _expire_waiters(self) -> None:
        if not self._waiters and not self._read_waiters and not self._apply_waiters:
            return
        now = self.clock.now()
        expired = []
        for idx, (_, _fut, deadline) in self._waiters.items():
            if deadline > now:
                break  # waiters are in index order, which is proposal order
            expired.append(idx)
        for idx in expired:
            _, fut, _ = self._waiters.pop(idx)
            if not fut.done():
                fut.set_exception(ProposalTimeout(f"entry {idx} not applied before the deadline"))
        if self._read_waiters:
            late = [ctx for ctx, (fut, deadline, _) in self._read_waiters.items() if deadline <= now or fut.done()]
            for ctx in late:
                fut, _, _ = self._read_waiters.pop(ctx)
                if not fut.done():
                    fut.set_exception(ReadTimeout("read index not confirmed before the deadline"))
        for _, _, fut, deadline, _ in self._apply_waiters:
            if deadline <= now and not fut.done():
                fut.set_exception(ReadTimeout("read index not applied here before the deadline"))

    # ------------------------------------------------------------------ persistence
    async def _persister(self) -> None:
        storage = self.storage
        while self._running:
            await self._persist_wakeup.wait()
            self._persist_wakeup.clear()
            if not self._running:
                return
            batch, self._persist_queue = self._persist_queue, []
            if not batch:
                continue
            wrote = False
            n_entries = 0
            for rd in batch:
                if rd.reset_to is not None:
                    storage.reset(*rd.reset_to)
                    wrote = True
                if rd.hard_state is not None:
                    storage.save_hard_state(*rd.hard_state)
                    wrote = True
                if rd.vote_floor is not None:  # a rejoining node learned its floor (core.REJOIN_FLOOR)
                    storage.save_vote_floor(*rd.vote_floor)
                    wrote = True
                if rd.ent_terms:
                    storage.append(rd.entries_first, rd.ent_terms, rd.ent_data)
                    n_entries += len(rd.ent_terms)
                    wrote = True
            early = mutations.enabled("ack_before_fsync")
            if early:  # the deliberate bug: acknowledge what is still only in memory
                for rd in batch:
                    if rd.send_after_persist:
                        self.transport.send_many(rd.send_after_persist)
            if wrote:
                storage.note_commit(self._live.core.commit)  # for the mark of how far the log durably held
                try:
                    await self.runtime.disk.run(storage.sync)
                except DiskFailure as exc:
                    # The messages that waited for this write (acks, votes) are never sent.
                    self._fail_stop(exc)
                    return
                self.metrics["fsyncs"] += 1
                self.metrics["entries_persisted"] += n_entries
            if not self._running:
                return
            core = self._live.core
            for rd in batch:
                if rd.send_after_persist and not early:
                    self.transport.send_many(rd.send_after_persist)
                idx, term = rd.persist_last
                if idx:
                    core.persisted(idx, term)
            if storage.mark_pending and not self._marking:  # after the messages: off the votes' and acks' path
                self._marking = True
                self._tasks.append(asyncio.create_task(self._write_mark()))
            self._kick()

    # ------------------------------------------------------------------ snapshots
    def _take_snapshot(self) -> None:
        """Capture the state at `applied` now; make it durable and compact the log off the loop."""
        core = self._live.core
        index = self.applied
        term = core.term_at(index)
        if term is None or index <= (self._snap_meta.index if self._snap_meta else 0):
            return
        self._snapshotting = True
        self._bytes_since_snap = 0
        try:
            _, finish = self.snapshots.create(index, term, self.sm.snapshot)
        except Exception as exc:
            self._snapshotting = False
            self._snapshot_failed(index, exc)
            return

        async def complete() -> None:
            try:
                meta = await self.runtime.snapshot_disk.run(finish)
            except Exception as exc:
                self._snapshot_failed(index, exc)
                return
            finally:
                self._snapshotting = False
            self._snapshot_failed_in_a_row = 0
            if not self._running:
                return
            if self._snap_meta is not None and self._snap_meta.index >= meta.index:
                return  # a newer snapshot was installed from the leader meanwhile
            self._snap_meta = meta
            self.metrics["snapshots_taken"] += 1
            core.snapshot_taken(meta.index, meta.term)
            upto = meta.index - self.cfg.compaction_slack
            if upto > core.offset:
                upto_term = core.term_at(upto)
                core.compact_log(upto)
                if core.offset == upto and upto_term is not None:  # not None: the log held `upto`
                    self.storage.compact(upto, upto_term)
            log.info("node %d: snapshot at %d (%d bytes); log now starts at %d", self.cfg.node_id,
                     meta.index, meta.size, core.offset + 1)

        self._tasks.append(asyncio.create_task(complete()))

    async def _write_mark(self) -> None:
        """The log's mark (`LogStorage.write_mark`), on the snapshot thread: never in the way of a log sync."""
        try:
            await self.runtime.snapshot_disk.run(self.storage.write_mark)
        finally:
            self._marking = False
            with contextlib.suppress(ValueError):  # one a second for the node's life: not kept in `_tasks`
                self._tasks.remove(asyncio.current_task())  # type: ignore[arg-type]

    def _snapshot_failed(self, index: int, exc: BaseException) -> None:
        """A snapshot could not be taken (a full disk, a read-only or unwritable snapshots directory): the log
        keeps every entry meanwhile, and the next try waits 5 s, doubling to 5 min while it keeps failing.
        Without the wait every applied batch tried again, about 400 tracebacks a second. The first failure
        in a row is logged with its traceback, later ones in one line; `snapshot_failures` counts them."""
        self._snapshot_failed_in_a_row += 1
        self.metrics["snapshot_failures"] += 1
        wait = min(300.0, 5.0 * 2 ** (self._snapshot_failed_in_a_row - 1))
        self._snapshot_retry_at = self.clock.now() + wait
        if self._snapshot_failed_in_a_row == 1:
            log.error("node %d: snapshot at %d failed (next try in %.0f s; the log keeps every entry meanwhile)",
                      self.cfg.node_id, index, wait, exc_info=exc)
        else:
            log.error("node %d: snapshot at %d failed again (%d in a row: %s); next try in %.0f s", self.cfg.node_id,
                      index, self._snapshot_failed_in_a_row, exc, wait)

    def _abort_stalled_snapshot(self, now: float) -> None:
        """Drop an incoming transfer (and its temp file) whose leader went quiet or lost its role."""
        rcv = self._receiver
        if rcv.sink is None:
            return
        if now - self._last_chunk_at > self.cfg.snapshot_stall_s or self._live.core.role == Role.LEADER:
            log.warning("node %d: abandoning snapshot transfer %s at byte %d (no chunk for %.1fs)",
                        self.cfg.node_id, rcv.key, rcv.expected, now - self._last_chunk_at)
            rcv.abort()
            self.metrics["snapshot_transfers_aborted"] += 1

    async def _send_snapshot(self, peer: int) -> None:
        """Stream the newest snapshot to `peer`, one chunk in flight, resuming on its offsets."""
        q = self._senders[peer]
        ok = False
        try:
            meta = self._snap_meta
            core = self._live.core
            if meta is None or core.role != Role.LEADER:
                return
            sender = SnapshotSender(self.cfg.node_id, peer, core.term, meta,
                                    lambda off, n: self.snapshots.read_chunk(meta, off, n),
                                    chunk_size=self.cfg.snapshot_chunk_bytes)
            log.info("node %d: sending snapshot %d (%d bytes) to node %d", self.cfg.node_id, meta.index,
                     meta.file_size, peer)
            silent = 0
            term = core.term
            # A transfer belongs to one term: once leadership of it is lost, a later term's
            # transfer must not wait behind this one (its chunks would only be refused).
            while self._running and core.role == Role.LEADER and core.term == term and silent < 3:
                self.transport.send(sender.next_message())
                try:
                    async with asyncio.timeout(max(1.0, self.cfg.tick_s * 20)):
                        resp = await q.get()
                except TimeoutError:
                    silent += 1  # resend the same chunk; the receiver tells us where it is
                    continue
                if resp is None:
                    continue  # woken by a role change: the loop condition decides
                silent = 0
                outcome = sender.on_response(resp)
                if outcome == "done":
                    ok = True
                    self.metrics["snapshots_sent"] += 1
                    return
                if outcome == "failed":
                    return
        except OSError:
            log.warning("node %d: snapshot for node %d became unreadable; will retry", self.cfg.node_id, peer)
        finally:
            del self._senders[peer]
            if self._running:
                self._live.core.snapshot_done(peer, ok)
                self._kick()

    def _on_snapshot_chunk(self, m: SnapChunk) -> None:
        core = self._live.core
        if m.term != core.term or core.lead != m.src or core.role != Role.FOLLOWER or core.term_probe is not None:
            # Only the leader this node follows, in its term, may install a snapshot here; the
            # leader's heartbeats establish it first, and the sender resends the chunk. A rejoining node
            # still asking the others for their terms acknowledges no leader (core.RaftCore.term_probe).
            self.metrics["snapshot_chunks_refused"] += 1
            return
        self._last_chunk_at = core.clock()
        # A chunk is contact from the current leader, like a heartbeat.
        core.step(Heartbeat(m.src, self.cfg.node_id, m.term))
        self._receiving_from = m.src
        reply, meta = self._receiver.on_chunk(m, core.term)
        if meta is not None and meta.index > core.commit:
            with self.snapshots.open_data(meta) as f:
                self.sm.restore(f)
            self._snap_meta = meta
            self.applied = meta.index
            self._bytes_since_snap = 0
            core.install_snapshot(meta.index, meta.term)
            self.metrics["snapshots_installed"] += 1
            self._wake_apply_waiters()
            log.info("node %d: installed snapshot %d from node %d", self.cfg.node_id, meta.index, m.src)
        self.transport.send(reply)
