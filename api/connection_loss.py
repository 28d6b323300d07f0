"""The leader's connection-loss lane: a crashed master's set re-elected within milliseconds, not a micro-batch.

An ingest worker that sees a broker's session connection end writes a `disconnected` record to
the heartbeats topic (for the streaming job) and to the liveness topic, which every controller
node follows (`LivenessConsumer`). Through the job, a crash costs the wait for the next
micro-batch plus that batch (about 1.6 s at 1,000 sets on two cores, docs/failover-signal.md);
here it costs a Kafka round trip and a Raft commit. This is RocketMQ's own path:
`BrokerHousekeepingService.onChannelClose` removes the broker from the controller's live table and
triggers an election at once.

Every node marks the broker not alive from the record's instant (`LivenessTable.disconnect`), so
its broker- and admin-triggered requests stop counting a crashed broker as alive. The leader also
proposes an election when the broker is its set's master, the same command the job sends
(`propose_election`): the set's heartbeat snapshot without the crashed master, fenced by the
master epoch it saw. So the job's own proposal for that disconnect, a batch later, is refused as
fenced, and whichever arrives first wins without a second election.

The lane follows the job's rule, never a rule of its own:

* a goodbye (`shutdown`) counts at once, as in the job;
* a lost connection counts at once only while the job's liveness records state a grace of 0 (its
  default, RocketMQ's rule). With a grace, or before the job has stated one, the lane leaves lost
  connections to the job: judging whether the broker came back within the grace needs the
  heartbeats the job reads, which reach the nodes a batch later.

A record from before this node began to follow the topic (the replay at start) only updates the
table; it proposes nothing: that disconnect was the job's (or an earlier leader's) to act on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from electra.consensus.core import Role
from electra.consensus.node import RaftNode
from electra.state.codes import Code
from electra.state.liveness import BrokerLiveInfo, LivenessTable
from electra.state.machine import ControllerStateMachine
from electra.streaming import records

log = logging.getLogger("electra.api.connection_loss")

ProposeElection = Callable[[str, str, int, list[BrokerLiveInfo], int | None], Awaitable[dict]]


@dataclass(frozen=True, slots=True)
class Disconnected:
    """A `disconnected` record from the liveness topic (`records.validate_disconnected`)."""

    cluster: str
    name: str
    broker_id: int
    at_ms: int  # the ingest worker's clock when the connection ended
    reason: str  # records.CONNECTION_LOST or records.SHUTDOWN

    @staticmethod
    def from_record(d: dict) -> Disconnected:
        """InvalidHeartbeat (a ValueError) names the bad field."""
        v = records.validate_disconnected(d)
        return Disconnected(v["clusterName"], v["brokerName"], v["brokerId"], v["ts"], v["reason"])


class ConnectionLossLane:
    def __init__(self, node: RaftNode, sm: ControllerStateMachine, liveness: LivenessTable,
                 propose_election: ProposeElection, live_now_ms: Callable[[], int]) -> None:
        self.node = node
        self.sm = sm
        self.liveness = liveness
        self.propose_election = propose_election
        self.live_now_ms = live_now_ms
        self.since_ms: int | None = None  # records stamped before this were replayed: table only
        self.stats = {"disconnects": 0, "left_to_job": 0, "proposed": 0, "elected": 0, "fenced": 0,
                      "not_elected": 0, "no_live_replica": 0,
                      "failed": 0}
        self._electing: set[str] = set()  # sets with a proposal of this lane in flight
        # (record's way here, proposal to answer) in ms, of the last elections: where a lane failover's time goes
        self._timings: deque[tuple[int, float]] = deque(maxlen=256)
        self._tasks: set[asyncio.Task] = set()

    def start(self, now_ms: int) -> None:
        """Records stamped from `now_ms` on are new: the lane may act on them."""
        self.since_ms = now_ms

    async def stop(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def timings(self) -> dict[str, float]:
        """Over the lane's last elections (up to 256): how long its records took to arrive here from the
        ingest worker (`arrival_ms`, across two clocks) and its proposals to be answered (`elect_ms`)."""
        if not self._timings:
            return {}
        arrived = sorted(a for a, _ in self._timings)
        elect = sorted(e for _, e in self._timings)

        def pct(xs: list, q: float) -> float:
            return round(float(xs[min(len(xs) - 1, int(q * len(xs)))]), 1)

        return {"elections": len(arrived), "arrival_ms_p50": pct(arrived, 0.5), "arrival_ms_p99": pct(arrived, 0.99),
                "elect_ms_p50": pct(elect, 0.5), "elect_ms_p99": pct(elect, 0.99)}

    def counts_now(self, d: Disconnected) -> bool:
        """Whether the job's rule makes this disconnect count at its instant (see the module's docstring)."""
        return d.reason == records.SHUTDOWN or self.liveness.disconnect_grace_ms == 0

    def on_disconnects(self, found: list[Disconnected], now_ms: int) -> None:
        """Records taken from the liveness topic, after the batch they came in was applied (on the loop);
        `now_ms`: this node's clock."""
        for d in found:
            arrived_ms = now_ms - d.at_ms
            self.stats["disconnects"] += 1
            if not self.counts_now(d):
                self.stats["left_to_job"] += 1
                continue
            if not self.liveness.disconnect(d.cluster, d.name, d.broker_id, d.at_ms):
                continue  # a heartbeat from after the disconnect is here already: it reconnected
            if self.since_ms is None or d.at_ms < self.since_ms or self.node.role != Role.LEADER:
                continue
            bs = self.sm.sets.get(d.name)
            if bs is None or bs.cluster != d.cluster or bs.master_id != d.broker_id or d.name in self._electing:
                continue
            live = list(self.liveness.group(d.cluster, d.name).values())
            at = self.live_now_ms()
            if not any(b.alive_at(at) for b in live):  # as the job: nobody to elect, nothing proposed (it looks
                self.stats["no_live_replica"] += 1      # again when a heartbeat arrives)
                continue
            self._electing.add(d.name)
            task = asyncio.ensure_future(self._elect(d, bs.master_epoch, live, at, arrived_ms))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _elect(self, d: Disconnected, master_epoch: int, live: list[BrokerLiveInfo], at_ms: int,
                     arrived_ms: int) -> None:
        self.stats["proposed"] += 1
        t0 = time.perf_counter()
        try:
            res = await self.propose_election(d.cluster, d.name, master_epoch, live, at_ms)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # not leading any more, a timeout: the job's proposal follows a batch later
            self.stats["failed"] += 1
            log.warning("set %s: master %d lost its connection (%s) but the election failed: %s; the streaming "
                        "job proposes one in its next batch", d.name, d.broker_id, d.reason, exc)
            return
        finally:
            self._electing.discard(d.name)
        code = res.get("code")
        if code == Code.SUCCESS:
            self.stats["elected"] += 1
            self._timings.append((arrived_ms, (time.perf_counter() - t0) * 1000))
            log.info("set %s: master %d lost its connection (%s); broker %s elected", d.name, d.broker_id, d.reason,
                     (res.get("header") or {}).get("masterBrokerId"))
        elif code == Code.CONTROLLER_FENCED_MASTER_EPOCH:
            self.stats["fenced"] += 1  # someone (the job, an operator) elected first
        else:
            self.stats["not_elected"] += 1
            log.warning("set %s: master %d lost its connection (%s); no election: %s", d.name, d.broker_id,
                        d.reason, res.get("remark"))
