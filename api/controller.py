"""One node's controller, built whole from one configuration: every piece and its one owner.

| piece | class | owns |
| --- | --- | --- |
| request handling | `ControllerService` (`api/service.py`, a `BrokerRequests`) | RocketMQ's requests |
| liveness | `LivenessTable` (`state/liveness.py`) | broker heartbeats as this node saw them (or Kafka's) |
| watchers | `Watchers` (`api/watchers.py`) | the applied-event journal, SSE role-change queues |
| inactive-master scan | `InactiveMasterScan` (`api/inactive_scan.py`) | the leader's re-election loop (no Kafka) |
| connection-loss lane | `ConnectionLossLane` (`api/connection_loss.py`) | elections when a master's session ends |
| heartbeat pipeline | `HeartbeatProducer`, `EventsPublisher`, `LivenessConsumer` | the Kafka links |
| tier | `TierUploader` (`tiering/uploader.py`) | Delta uploads of snapshots and events |
| dashboard | `DashboardFeed` (`api/dashboard.py`) | the live frame |

Nothing is attached after construction: `Controller(node, sm, cfg)` makes them all,
`start()` starts the background ones, `stop()` stops them in reverse order. The request
handler is made by `cfg.make_requests`, so another architecture (the legacy mode) plugs its
own `BrokerRequests` into the same node, API and pipeline.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from electra.consensus.core import Role
from electra.consensus.errors import NotLeader, ProposalDropped
from electra.consensus.node import RaftNode
from electra.state.codes import Code
from electra.state.liveness import BrokerLiveInfo, LivenessTable
from electra.state.machine import ControllerStateMachine
from electra.streaming.records import Topics

from .connection_loss import ConnectionLossLane
from .dashboard import DashboardFeed
from .inactive_scan import InactiveMasterScan
from .requests import BrokerRequests
from .service import ControllerService
from .watchers import Watchers

if TYPE_CHECKING:
    from electra.tiering.uploader import TierConfig

    from .ingest import HeartbeatProducer

RequestsFactory = Callable[..., BrokerRequests]  # (node, sm, liveness, cfg, heartbeat_producer) -> BrokerRequests


@dataclass(frozen=True)
class ControllerConfig:
    """Everything a node's controller is built from (besides its Raft node and state machine)."""

    http_peers: dict[int, str] = field(default_factory=dict)  # node id -> HTTP API host:port (redirects)
    unclean_election: bool = False
    scan_interval_s: float = 5.0  # the inactive-master scan; 0 when the streaming job detects them
    kafka_bootstrap: str | None = None  # the heartbeat pipeline (docs/heartbeat-pipeline.md)
    topics: Topics = field(default_factory=Topics)
    tier: TierConfig | None = None  # Delta tiering (docs/tiering.md)
    clock: Callable[[], float] = time.time
    make_requests: RequestsFactory = ControllerService


class Controller:
    def __init__(self, node: RaftNode, sm: ControllerStateMachine, cfg: ControllerConfig) -> None:
        self.cfg = cfg
        self.node = node
        self.sm = sm
        self.http_peers = cfg.http_peers
        self.liveness = LivenessTable()
        self.watchers = Watchers(node, sm)
        self.heartbeat_producer: HeartbeatProducer | None = None
        self.events_publisher = self.liveness_consumer = None
        self.connection_loss = ConnectionLossLane(node, sm, self.liveness, self.propose_election, self.live_now_ms,
                                                  self.now_ms)
        if cfg.kafka_bootstrap:
            from .ingest import HeartbeatProducer
            from .kafka_bridge import EventsPublisher, LivenessConsumer

            self.heartbeat_producer = HeartbeatProducer(cfg.kafka_bootstrap, cfg.topics.heartbeats)
            self.events_publisher = EventsPublisher(self, cfg.kafka_bootstrap, cfg.topics)
            self.liveness_consumer = LivenessConsumer(self, cfg.kafka_bootstrap, cfg.topics.liveness)
        self.requests: BrokerRequests = cfg.make_requests(node, sm, self.liveness, cfg, self.heartbeat_producer)
        self.scan = InactiveMasterScan(node, sm, self.liveness, self.requests.elect_master, cfg.scan_interval_s,
                                       self.live_now_ms, getattr(self.requests, "scan_elections_in_flight", 1),
                                       not getattr(self.requests, "scan_at_fixed_rate", False))
        self.tier = None
        if cfg.tier is not None:
            from electra.tiering.uploader import TierUploader

            self.tier = TierUploader(node, sm, self.journal, cfg.tier)
        self.dashboard = DashboardFeed(self)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start the background pieces (on the running event loop)."""
        if self.heartbeat_producer is not None:
            self.heartbeat_producer.start()
        self.requests.start()
        self.connection_loss.start(self.now_ms())  # before the liveness consumer: what it replays is not new
        for piece in (self.events_publisher, self.liveness_consumer, self.scan, self.tier):
            if piece is not None:
                piece.start()

    async def stop(self) -> None:
        await self.dashboard.stop()
        if self.tier is not None:
            await self.tier.stop()
        await self.scan.stop()
        await self.connection_loss.stop()
        await self.requests.stop()
        for piece in (self.events_publisher, self.liveness_consumer):
            if piece is not None:
                await piece.stop()
        if self.heartbeat_producer is not None:
            await asyncio.to_thread(self.heartbeat_producer.close)

    # ------------------------------------------------------------------ what the other pieces read
    @property
    def journal(self):
        return self.watchers.journal

    @property
    def elections(self) -> dict[str, int]:
        return getattr(self.requests, "elections", {})

    @property
    def heartbeats_received(self) -> int:
        return getattr(self.requests, "heartbeats_received", 0)

    def now_ms(self) -> int:
        return self.requests.now_ms()

    def live_now_ms(self) -> int:
        """The instant liveness is judged at (`LivenessTable.judge_at`: the clock, or the job's data horizon)."""
        return self.liveness.judge_at(self.now_ms())

    def leader_address(self) -> str | None:
        return self.requests.leader_address()

    async def elect_master(self, cluster: str, name: str, broker_id: int, designate: bool = False,
                           unclean: bool = False) -> dict:
        return await self.requests.elect_master(cluster, name, broker_id, designate, unclean)

    async def propose_election(self, cluster: str, name: str, expected_master_epoch: int,
                               live: list[BrokerLiveInfo], judged_at_ms: int | None = None) -> dict:
        return await self.requests.propose_election(cluster, name, expected_master_epoch, live, judged_at_ms)

    async def transfer_leadership(self, to: int | None) -> dict[str, Any]:
        """An operator's leadership transfer (before maintenance on the leader's host): to node `to`, or to the
        most caught-up follower. NotLeader on a follower (redirected), ProposalTimeout if it did not move."""
        node = self.node
        if node.role != Role.LEADER:
            raise NotLeader(node.leader_id)
        me = node.cfg.node_id
        if to == me:  # idempotent: a script that asks for the leader it already has succeeds
            return {"code": int(Code.SUCCESS), "remark": f"node {me} leads already", "leader": me,
                    "leaderAddress": self.http_peers.get(me)}
        if to is not None and to not in node.cfg.peers:
            return {"code": int(Code.CONTROLLER_INVALID_REQUEST),
                    "remark": f"cannot transfer to node {to}: no such node in this group ({sorted(node.cfg.peers)})"}
        if len(node.cfg.peers) == 1:
            return {"code": int(Code.CONTROLLER_INVALID_REQUEST), "remark": "this node is alone in its group"}
        target = to if to is not None else node.best_transferee()
        if target is None:  # a 503 to retry: followers may be back in a moment
            raise ProposalDropped("no follower has been heard from within an election timeout: nobody to hand over to")
        await node.transfer_leadership(target, node.election_timeout_s)
        return {"code": int(Code.SUCCESS), "remark": f"node {target} leads now", "leader": target,
                "leaderAddress": self.http_peers.get(target)}

    def pipeline_status(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.events_publisher is not None:
            out["events_published_index"] = self.events_publisher.published_index
            out["events"] = dict(self.events_publisher.stats)
        if self.liveness_consumer is not None:
            out["liveness"] = dict(self.liveness_consumer.stats)
            out["connection_loss"] = dict(self.connection_loss.stats)
            out["connection_loss_timing"] = self.connection_loss.timings()
            out["disconnect_grace_ms"] = self.liveness.disconnect_grace_ms  # the job's, as it stated (None: not yet)
        if self.heartbeat_producer is not None:
            out["heartbeats"] = dict(self.heartbeat_producer.stats)
        return out

    def metadata(self) -> dict[str, Any]:
        st = self.node.status()
        return {**st, "leader_address": self.leader_address(), "pipeline": self.pipeline_status(),
                "http_peers": {str(k): v for k, v in sorted(self.http_peers.items())},
                "is_leader": self.node.role == Role.LEADER, "broker_sets": len(self.sm.sets),
                # alive at the instant liveness-dependent commands are judged at; `known_brokers` also
                # counts those whose heartbeats stopped (forgotten a minute past their timeout)
                "live_brokers": self.liveness.alive_count(self.live_now_ms()),
                "known_brokers": len(self.liveness), **self.requests.status()}
