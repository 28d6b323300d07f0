"""Request handling: RocketMQ controller requests on top of one Raft node (`api.requests.BrokerRequests`).

Requests are handled concurrently (no single-threaded queue): writes build a
command, carrying this node's liveness view where the outcome depends on it,
and `propose()` it; the engine batches concurrent proposals. A register or election
that would change nothing is answered from a linearizable read instead (no log entry).
Consistent reads (next broker id, replica info) are ReadIndex reads on the leader and
bounded-staleness follower reads on followers; the admin's sync-state data is a stale
local read. Without Kafka, heartbeats update the node's liveness table; with the heartbeat
pipeline (docs/heartbeat-pipeline.md) they go to Kafka and the streaming job proposes
elections (`propose_election`). The other pieces of a node's controller (liveness, watchers,
the inactive-master scan, the Kafka links) are built beside it by `api/controller.py`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from electra.consensus.core import Role
from electra.consensus.errors import NotLeader, RaftError
from electra.consensus.node import RaftNode
from electra.state import commands as C
from electra.state.codes import Code
from electra.state.liveness import BrokerLiveInfo, LivenessTable
from electra.state.machine import ControllerStateMachine
from electra.state.results import Result

from .futures import failed, resolved, then

if TYPE_CHECKING:
    from .controller import ControllerConfig
    from .ingest import HeartbeatProducer

log = logging.getLogger("electra.api.service")


class ControllerService:
    """Request handling (`api.requests.BrokerRequests`): RocketMQ's requests on one node's Raft engine.

    It owns no background work: liveness is the table it is given (fed by its heartbeats or the
    Kafka liveness consumer), watchers and the inactive-master scan are their own pieces
    (`api/watchers.py`, `api/inactive_scan.py`), and `api.controller.Controller` builds them all.
    """

    scan_elections_in_flight = 64  # the inactive-master scan's elections, proposed together (group commit)

    def __init__(self, node: RaftNode, sm: ControllerStateMachine, liveness: LivenessTable, cfg: ControllerConfig,
                 heartbeat_producer: HeartbeatProducer | None = None) -> None:
        self.node = node
        self.sm = sm
        self.liveness = liveness
        self.http_peers = cfg.http_peers
        self.unclean = cfg.unclean_election
        self.clock = cfg.clock
        self.heartbeat_producer = heartbeat_producer  # with the Kafka pipeline: this node's /v1/heartbeat goes there
        self.elections = {"success": 0, "failed": 0, "still_exist": 0, "fenced": 0}
        self.heartbeats_received = 0  # heartbeats this node's liveness table took (no Kafka pipeline)

    # ------------------------------------------------------------------ lifecycle (the Controller calls these)
    def start(self) -> None:
        """Background work of the request handler itself: none here (the legacy one has its scheduler)."""

    async def stop(self) -> None:
        """Stop what `start()` started."""

    def status(self) -> dict[str, Any]:
        """What this request handler adds to the node's metadata."""
        return {"architecture": "new"}

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    def live_now_ms(self) -> int:
        """The instant liveness is judged at: the clock, or the streaming job's data horizon
        (`LivenessTable.judge_at`). Commands whose outcome depends on liveness carry it."""
        return self.liveness.judge_at(self.now_ms())

    def leader_address(self) -> str | None:
        return self.http_peers.get(self.node.leader_id)

    # ------------------------------------------------------------------ requests
    def other_cluster(self, cluster: str | None, name: str) -> dict | None:
        """The refusal of a request that names broker set `name` in `cluster` when the set is in another one.

        A set belongs to the cluster it was created in (the state keys sets by name, as RocketMQ's
        controller does, which never compares the two). Without this check a broker credential scoped
        to cluster c1 could register addresses, add broker ids, keep masters "alive" or elect in a
        set of cluster c2 by naming c1 in its request (docs/security.md). Checked against this
        node's applied state: a set created by another request in the same instant is not seen."""
        bs = self.sm.sets.get(name)
        if cluster is None or bs is None or bs.cluster == cluster:
            return None
        return {"code": int(Code.CONTROLLER_INVALID_REQUEST),
                "remark": f"broker set {name!r} is not in cluster {cluster!r}"}

    def set_liveness(self, name: str, cluster: str | None = None) -> dict[int, BrokerLiveInfo]:
        """This node's heartbeat records of set `name`, under the set's own cluster (`cluster`, from a request
        that `other_cluster` admitted, for a set not created yet). Heartbeats naming another cluster do not
        make a broker alive in this set."""
        bs = self.sm.sets.get(name)
        own = bs.cluster if bs is not None else cluster
        return self.liveness.group(own, name) if own else {}

    def heartbeat(self, cluster: str, name: str, broker_id: int, addr: str, *, epoch: int = -1,
                  max_offset: int = -1, confirm_offset: int = -1, timeout_ms: int = 10_000,
                  priority: int = 2**31 - 1) -> dict:
        if (refusal := self.other_cluster(cluster, name)) is not None:
            return refusal
        self.heartbeats_received += 1
        self.liveness.on_heartbeat(cluster, name, broker_id, addr, self.now_ms(), timeout_ms=timeout_ms,
                                   epoch=epoch, max_offset=max_offset, confirm_offset=confirm_offset,
                                   priority=priority)
        return {"code": 0, "remark": "Heart beat success"}

    def _read(self, fn: Callable[[ControllerStateMachine], Result], lease: bool = False) -> asyncio.Future[dict]:
        """The future response of a read, as `_write`'s of a write (no Task; refusals inside the future).

        On the leader: ReadIndex, or its lease when asked (docs/reads-and-snapshots.md); elsewhere a follower read.
        """
        mode = ("lease" if lease else "linearizable") if self.node.role == Role.LEADER else "follower"
        try:
            return self.node.read_future(lambda sm: fn(sm).to_response(), mode=mode)
        except RaftError as exc:
            return failed(exc)

    def get_next_broker_id(self, cluster: str, name: str) -> Awaitable[dict]:
        if (refusal := self.other_cluster(cluster, name)) is not None:
            return resolved(refusal)
        return self._read(lambda sm: sm.get_next_broker_id(cluster, name))

    def get_replica_info(self, name: str, lease: bool = False) -> Awaitable[dict]:
        return self._read(lambda sm: sm.get_replica_info(name), lease)

    def get_sync_state_data(self, names: list[str]) -> dict:
        return self.sm.get_sync_state_data(names, self.liveness.group, self.live_now_ms()).to_response()

    def _write(self, cmd: bytes) -> asyncio.Future[dict]:
        """Propose `cmd`; the future answer is its applied result's response.

        A future, not a coroutine: the lean path answers from its done-callback, without a Task
        and its steps per write. Engine errors are in the future
        too, so every caller sees them where it awaits, as from a coroutine.
        """
        try:
            if self.node.role != Role.LEADER:
                raise NotLeader(self.node.leader_id, self.leader_address())
            applied = self.node.propose_future(cmd)
        except RaftError as exc:
            return failed(exc)
        return then(applied, _response)

    def apply_broker_id(self, cluster: str, name: str, broker_id: int, check_code: str) -> Awaitable[dict]:
        if (refusal := self.other_cluster(cluster, name)) is not None:
            return resolved(refusal)
        return self._write(C.apply_broker_id(cluster, name, broker_id, check_code, self.now_ms()))

    async def _write_if_it_changes(self, cmd: bytes) -> dict:
        """Propose `cmd` unless applying it would change nothing: then answer it from a linearizable read.

        This node's applied state picks the path (a hint): a command that changes it goes
        straight to the log (applied later it may change nothing: a harmless no-op entry); one
        that changes nothing here is re-checked at a ReadIndex, which sees every write committed
        before the request arrived, and proposed only if the state moved on meanwhile.
        """
        if self.node.role != Role.LEADER:
            raise NotLeader(self.node.leader_id, self.leader_address())
        if self.sm.answer_without_write(cmd) is not None:
            res = await self.node.read(lambda sm: sm.answer_without_write(cmd), mode="linearizable")
            if res is not None:
                return res.to_response()
        return await self._write(cmd)

    def register_broker(self, cluster: str, name: str, broker_id: int, addr: str) -> Awaitable[dict]:
        """RocketMQ writes only when the address changes; an unchanged one is answered by a read."""
        if (refusal := self.other_cluster(cluster, name)) is not None:
            return resolved(refusal)
        cmd = C.register_broker(cluster, name, broker_id, addr, self.live_now_ms(), self.liveness.group(cluster, name))
        bs = self.sm.sets.get(name)
        if bs is not None and broker_id in bs.brokers and bs.address(broker_id) != addr:
            return self._write(cmd)  # a new address: no need to try it against the state first
        return self._write_if_it_changes(cmd)

    async def elect_master(self, cluster: str, name: str, broker_id: int, designate: bool = False,
                           unclean: bool = False) -> dict:
        """An election that would change nothing (master still alive: 2011, or refused) is answered by a read."""
        if (refusal := self.other_cluster(cluster or None, name)) is not None:
            return refusal
        live = self.set_liveness(name, cluster)
        res = await self._write_if_it_changes(C.elect_master(cluster, name, broker_id, self.live_now_ms(), live,
                                                             designate=designate,
                                                             unclean=self.unclean or unclean))
        self._count_election(res)
        return res

    async def propose_election(self, cluster: str, name: str, expected_master_epoch: int,
                               live: list[BrokerLiveInfo], judged_at_ms: int | None = None) -> dict:
        """The streaming job's election: its heartbeat snapshot of the set, fenced by the master epoch it saw.

        The command carries the instant the job judged liveness at (never later than this
        node's clock), so apply sees the snapshot as the job did: a replica alive at detection
        is not declared dead by the seconds the proposal spent in the pipeline.
        """
        if (refusal := self.other_cluster(cluster, name)) is not None:
            return refusal
        now = self.now_ms() if judged_at_ms is None else min(judged_at_ms, self.now_ms())
        res = await self._write(C.elect_master(cluster, name, C.CONTROLLER_TRIGGER, now, live,
                                               unclean=self.unclean, expected_master_epoch=expected_master_epoch))
        self._count_election(res)
        return res

    def _count_election(self, res: dict) -> None:
        key = {Code.SUCCESS: "success", Code.CONTROLLER_MASTER_STILL_EXIST: "still_exist",
               Code.CONTROLLER_FENCED_MASTER_EPOCH: "fenced"}.get(res["code"], "failed")
        self.elections[key] += 1

    def alter_sync_state_set(self, name: str, master_id: int, master_epoch: int, new_set: list[int],
                             sync_state_set_epoch: int) -> Awaitable[dict]:
        return self._write(C.alter_sync_state_set(name, master_id, master_epoch, new_set,
                                                        sync_state_set_epoch, self.live_now_ms(),
                                                        self.set_liveness(name)))

    async def clean_broker_data(self, cluster: str | None, name: str, ids: list[int] | None,
                                clean_living: bool) -> dict:
        if (refusal := self.other_cluster(cluster or None, name)) is not None:
            return refusal
        live = self.set_liveness(name, cluster)
        return await self._write(C.clean_broker_data(cluster, name, ids, clean_living, self.live_now_ms(), live))


def _response(res: Result) -> dict:
    return res.to_response()
