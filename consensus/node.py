"""The asyncio runtime that drives `RaftCore` with real sockets, disk and timers.

Everything runs on one event loop except fsync, which runs on a dedicated disk
thread so the loop keeps receiving acks and proposals while the disk works.
Three mechanisms give throughput:

* group commit: every `propose()` issued while the loop is busy lands in one
  `core.propose()` call, one log record and (with the disk thread) one fsync;
* parallel leader write: AppendEntries leave before the leader's own fsync, the
  leader counts itself only once `persisted()` reports its write durable;
* pipelined persistence: Readies produced while an fsync runs are queued and
  written together by the next one.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from .core import RaftConfig, RaftCore, Ready, Role
from .errors import LeadershipLost, NodeStopped, NotLeader, ProposalTimeout, RaftError
from .messages import Message
from .storage import LogStorage
from .transport import PeerTransport

log = logging.getLogger("electra.consensus.node")


class StateMachine(Protocol):
    def apply(self, index: int, command: bytes) -> Any: ...


@dataclass
class NodeConfig:
    node_id: int
    peers: dict[int, tuple[str, int]]  # raft address of every member, this node included
    data_dir: Path
    tick_s: float = 0.1
    raft: RaftConfig = field(default_factory=lambda: RaftConfig(election_ticks=10, heartbeat_ticks=1))
    fsync: bool = True
    propose_timeout_s: float = 10.0
    max_batch: int = 16384  # commands per core.propose() call
    cluster: str = "electra"


class RaftNode:
    """One member of a Raft group. Use `await start()`, then `propose()`."""

    def __init__(self, cfg: NodeConfig, state_machine: StateMachine) -> None:
        self.cfg = cfg
        self.sm = state_machine
        self.storage = LogStorage(Path(cfg.data_dir) / "raft-log", fsync=cfg.fsync)
        self.transport = PeerTransport(cfg.node_id, cfg.peers, self._on_message, cluster=cfg.cluster)
        self.core: RaftCore | None = None
        self.applied = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._disk = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"raft-disk-{cfg.node_id}")
        self._kicked = False
        self._queued_cmds: list[bytes] = []
        self._queued_futs: list[tuple[asyncio.Future, float]] = []
        self._waiters: dict[int, tuple[int, asyncio.Future, float]] = {}  # index -> (term, fut, deadline)
        self._persist_queue: list[Ready] = []
        self._persist_wakeup = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._tick_handle: asyncio.TimerHandle | None = None
        self._running = False
        self._role_listeners: list[Callable[[Role, int, int], None]] = []
        self.metrics = {"proposals": 0, "batches": 0, "fsyncs": 0, "entries_persisted": 0,
                        "applied": 0, "max_batch": 0}

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        rec = self.storage.open()
        self.core = RaftCore(
            self.cfg.node_id, sorted(self.cfg.peers), self.cfg.raft,
            term=rec.term, vote=rec.vote, log_offset=rec.snapshot_index, offset_term=rec.snapshot_term,
            log_terms=rec.terms, log_data=rec.datas,
        )
        self.applied = rec.snapshot_index
        log.info("node %d starting: term=%d vote=%d log=[%d..%d] fsync=%s", self.cfg.node_id, rec.term,
                 rec.vote, rec.first_index, self.core.last_index(), self.cfg.fsync)
        self._running = True
        await self.transport.start()
        self._tasks.append(asyncio.create_task(self._persister(), name=f"raft-persist-{self.cfg.node_id}"))
        self._tick_handle = self._loop.call_later(self.cfg.tick_s, self._on_tick)

    async def stop(self) -> None:
        if not self._running:
            return
        self._running = False
        if self._tick_handle:
            self._tick_handle.cancel()
        self._persist_wakeup.set()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.transport.stop()
        err = NodeStopped("node stopped before the result was known")
        for fut, _ in self._queued_futs:
            if not fut.done():
                fut.set_exception(err)
        for _, fut, _ in self._waiters.values():
            if not fut.done():
                fut.set_exception(err)
        self._queued_futs.clear()
        self._queued_cmds.clear()
        self._waiters.clear()
        await asyncio.get_running_loop().run_in_executor(self._disk, self.storage.close)
        self._disk.shutdown(wait=True)

    # ------------------------------------------------------------------ client API
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
            "fsync": self.cfg.fsync, **self.metrics,
        }

    def on_role_change(self, fn: Callable[[Role, int, int], None]) -> None:
        """Call `fn(role, term, leader_id)` whenever this node's role or leader changes."""
        self._role_listeners.append(fn)

    async def propose(self, command: bytes, timeout: float | None = None) -> Any:
        """Replicate `command`; return the state machine's result once applied here.

        Raises NotLeader (with a hint), ProposalDropped, LeadershipLost (the entry was
        overwritten: definitely not committed), ProposalTimeout or NodeStopped (outcome unknown).
        """
        return await self.propose_future(command, timeout)

    def propose_future(self, command: bytes, timeout: float | None = None) -> asyncio.Future:
        """`propose()` without a coroutine: for servers that answer from a done-callback."""
        if not isinstance(command, bytes | bytearray) or not command:
            raise ValueError("a command must be non-empty bytes (empty entries are reserved for no-ops)")
        if not self._running:
            raise NodeStopped("node is not running")
        if self.core.role != Role.LEADER:
            raise NotLeader(self.core.lead)
        fut = self._loop.create_future()
        deadline = time.monotonic() + (timeout if timeout is not None else self.cfg.propose_timeout_s)
        self._queued_cmds.append(bytes(command))
        self._queued_futs.append((fut, deadline))
        self._kick()
        return fut

    async def transfer_leadership(self, target: int, timeout: float = 5.0) -> None:
        """Ask the leader to hand over to `target`; returns once `target` leads."""
        self.core.transfer_leadership(target)
        self._kick()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.core.lead == target:
                return
            await asyncio.sleep(self.cfg.tick_s / 2)
        raise ProposalTimeout(f"leadership did not move to node {target} within {timeout}s")

    # ------------------------------------------------------------------ event handling
    def _on_message(self, msg: Message) -> None:
        if self._running:
            self.core.step(msg)
            self._kick()

    def _on_tick(self) -> None:
        if not self._running:
            return
        self.core.tick()
        self._expire_waiters()
        self._process()
        self._tick_handle = self._loop.call_later(self.cfg.tick_s, self._on_tick)

    def _kick(self) -> None:
        if not self._kicked:
            self._kicked = True
            self._loop.call_soon(self._process)

    def _process(self) -> None:
        self._kicked = False
        if not self._running:
            return
        core = self.core
        if self._queued_cmds:
            self._propose_queued()
        while core.has_ready():
            self._handle_ready(core.ready())

    def _propose_queued(self) -> None:
        cmds, futs = self._queued_cmds, self._queued_futs
        self._queued_cmds, self._queued_futs = [], []
        core = self.core
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
        if rd.needs_persist() or rd.send_after_persist:
            self._persist_queue.append(rd)
            self._persist_wakeup.set()
        if rd.apply_terms:
            self._apply(rd)
        if rd.role_changed:
            c = self.core
            log.info("node %d is now %s in term %d (leader %d)", self.cfg.node_id, c.role.name, c.term, c.lead)
            if c.role != Role.LEADER:
                for fut, _ in self._queued_futs:
                    if not fut.done():
                        fut.set_exception(NotLeader(c.lead))
                self._queued_futs.clear()
                self._queued_cmds.clear()
            for fn in self._role_listeners:
                try:
                    fn(c.role, c.term, c.lead)
                except Exception:
                    log.exception("role-change listener failed")

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
            idx += 1
        self.applied = idx - 1
        self.metrics["applied"] = self.applied

    def _expire_waiters(self) -> None:
        if not self._waiters and not self._queued_futs:
            return
        now = time.monotonic()
        expired = []
        for idx, (_, _fut, deadline) in self._waiters.items():
            if deadline > now:
                break  # waiters are in index order, which is proposal order
            expired.append(idx)
        for idx in expired:
            _, fut, _ = self._waiters.pop(idx)
            if not fut.done():
                fut.set_exception(ProposalTimeout(f"entry {idx} not applied before the deadline"))

    # ------------------------------------------------------------------ persistence
    async def _persister(self) -> None:
        loop = asyncio.get_running_loop()
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
                if rd.hard_state is not None:
                    storage.save_hard_state(*rd.hard_state)
                    wrote = True
                if rd.ent_terms:
                    storage.append(rd.entries_first, rd.ent_terms, rd.ent_data)
                    n_entries += len(rd.ent_terms)
                    wrote = True
            if wrote:
                try:
                    await loop.run_in_executor(self._disk, storage.sync)
                except OSError:
                    # A node that cannot make its log durable must not vote or ack anything.
                    log.critical("node %d: fsync failed; stopping", self.cfg.node_id, exc_info=True)
                    self._running = False
                    os._exit(70)
                self.metrics["fsyncs"] += 1
                self.metrics["entries_persisted"] += n_entries
            if not self._running:
                return
            core = self.core
            for rd in batch:
                if rd.send_after_persist:
                    self.transport.send_many(rd.send_after_persist)
                idx, term = rd.persist_last
                if idx:
                    core.persisted(idx, term)
            self._kick()
