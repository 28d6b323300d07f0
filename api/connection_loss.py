"""The leader's connection-loss lane: a crashed master's set re-elected within milliseconds, not a micro-batch.

An ingest worker that sees a broker's session connection end writes a `disconnected` record to
the heartbeats topic (for the streaming job) and to the liveness topic, which every controller
node follows (`LivenessConsumer`); it writes each session's opening heartbeat there too, so a
broker that reconnects (to any worker) is seen as quickly as its disconnect. Through the job, a
crash costs the wait for the next micro-batch plus that batch (about 1.6 s at 1,000 sets on two
cores, docs/failover-signal.md); here it costs a Kafka round trip and a Raft commit. This is
RocketMQ's own path: `BrokerHousekeepingService.onChannelClose` removes the broker from the
controller's live table and triggers an election at once.

A disconnect counts at its instant plus the job's grace (the job's liveness records state its
`--disconnect-grace-ms`; a goodbye counts at once): unless a heartbeat stamped after the
disconnect has arrived by then (a new session's, or the job's) and unless the broker has opened
a newer session elsewhere since the one that ended, every node marks the broker not
alive from that instant (`LivenessTable.disconnect`), so its broker- and admin-triggered requests
stop counting it; and the leader, when it was its set's master and another broker is alive,
proposes the same command the job would (`propose_election`: the set's heartbeat snapshot without
the master, fenced by the master epoch it saw). The job's own proposal for that crash, a batch
later, is then refused as fenced, and whichever arrives first wins without a second election.

The lane leaves a disconnect to the job when it cannot follow the job's rule or trust the job's
view: before any job record has stated the grace; when the record is a replay (from before this
node began to follow the topic, or older than MAX_AGE_MS on arrival: the consumer re-followed
the topic); and when the job's last view (its data horizon) is older than STALE_VIEW_TIMEOUTS of
the replicas' heartbeat timeouts (the job is stopped or far behind: a replica alive there may have
died since without a session record saying so) and stays so for MAX_AGE_MS after the disconnect counts,
unless some replicas' own sessions vouch for them (`LivenessTable.session_vouches`): then it elects among
those at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from electra.consensus.core import Role
from electra.consensus.errors import ProposalTimeout
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
    at_ms: int  # the ingest worker's clock when the connection ended (silent: when the silence was judged)
    reason: str  # records.CONNECTION_LOST, records.SHUTDOWN, or records.SILENT (a `silent` record)
    opened_ms: int | None = None  # when that session opened (records of earlier versions: unknown)
    last_heard_ms: int | None = None  # silent: the session's last heartbeat

    @staticmethod
    def from_record(d: dict) -> Disconnected:
        """InvalidHeartbeat (a ValueError) names the bad field."""
        v = records.validate_disconnected(d)
        opened = d.get(records.SESSION_OPENED)
        return Disconnected(v["clusterName"], v["brokerName"], v["brokerId"], v["ts"], v["reason"],
                            opened if type(opened) is int and 0 < opened <= v["ts"] else None)

    @staticmethod
    def from_silent(d: dict) -> Disconnected:
        """A `silent` record (a session that carried no heartbeat for the broker's timeout: a hang) as the
        disconnect it amounts to; InvalidHeartbeat (a ValueError) names the bad field."""
        v = records.validate_silent(d)
        return Disconnected(v["clusterName"], v["brokerName"], v["brokerId"], v["ts"], records.SILENT,
                            v[records.SESSION_OPENED], v[records.LAST_HEARD])

    @property
    def gone_from_ms(self) -> int:
        """From when the broker is not alive unless a heartbeat stamped later says otherwise."""
        return self.at_ms if self.last_heard_ms is None else self.last_heard_ms

    def what(self) -> str:
        if self.reason == records.SILENT:
            return f"sent no heartbeat on its session for {(self.at_ms - self.gone_from_ms) / 1000:.1f} s"
        return f"lost its connection ({self.reason})"


@dataclass(frozen=True, slots=True)
class Connected:
    """A session's opening heartbeat from the liveness topic (`records.connected_record`)."""

    cluster: str
    name: str
    info: BrokerLiveInfo

    @staticmethod
    def from_record(d: dict) -> Connected:
        """InvalidHeartbeat (a ValueError) names the bad field."""
        hb = records.validate_connected(d)
        return Connected(hb["clusterName"], hb["brokerName"], BrokerLiveInfo(
            hb["brokerId"], hb["brokerAddr"], hb["ts"], hb["heartbeatTimeoutMillis"], hb["epoch"], hb["maxOffset"],
            hb["confirmOffset"], hb["electionPriority"]))


@dataclass(frozen=True, slots=True)
class Unvouched:
    """An `unvouched` record (`records.unvouched_record`): the session opened at `opened_ms` no longer speaks for
    its broker (its worker closed it, or did not report its silence). Only `LivenessTable.session_vouches` changes."""

    cluster: str
    name: str
    broker_id: int
    opened_ms: int

    @staticmethod
    def from_record(d: dict) -> Unvouched:
        """InvalidHeartbeat (a ValueError) names the bad field."""
        v = records.validate_unvouched(d)
        return Unvouched(v["clusterName"], v["brokerName"], v["brokerId"], v[records.SESSION_OPENED])


def _no_later_than(d: Disconnected, now_ms: int) -> Disconnected:
    """`d` dated no later than its arrival here (`now_ms`): a record from an ingest worker whose clock runs ahead
    would otherwise mark the broker gone until this clock reaches it, refusing all its heartbeats meanwhile."""
    ahead = d.at_ms - now_ms
    if ahead <= 0:
        return d
    last = None if d.last_heard_ms is None else d.last_heard_ms - ahead
    return replace(d, at_ms=now_ms, last_heard_ms=last)


MAX_AGE_MS = 5_000  # a disconnect older than this when it arrives (a replay after the consumer re-followed
#                    the topic, a consumer far behind) only updates the table: its crash is the job's
COVER_RECHECK_S = 0.1  # a silence or crash waiting for the job's view is looked at again this often (and
#                         whenever the job's records move the view: `on_view`)
# The job's view is stale past this many of the live replicas' smallest heartbeat timeout. Not one: the view
# lags by a trigger interval and a batch (2.5-3.5 s on a loaded 2-core machine, against the bench's 3 s
# timeout), and replicas' own deaths reach the lane sooner than the job's view, by their session records: a
# crash's `disconnected` and a hang's `silent` mark the table (a silence that waits for the job's first view
# makes the replica no candidate meanwhile: `_candidates`). The bound is for a replica that died with no such
# record; past it, replicas their own sessions vouch for are still candidates (`_vouched`).
STALE_VIEW_TIMEOUTS = 2


class ConnectionLossLane:
    """One node's lane: every node keeps its table right; only the leader proposes elections."""

    def __init__(self, node: RaftNode, sm: ControllerStateMachine, liveness: LivenessTable,
                 propose_election: ProposeElection, live_now_ms: Callable[[], int],
                 now_ms: Callable[[], int]) -> None:
        self.node = node
        self.sm = sm
        self.liveness = liveness
        self.propose_election = propose_election
        self.live_now_ms = live_now_ms  # the instant the table's records are judged at (the job's data horizon)
        self.now_ms = now_ms
        self.since_ms: int | None = None  # records stamped before this were replayed: table only
        self.stats = {  # records taken, then what became of them (docs/failover-signal.md has the table)
            "disconnects": 0, "silences": 0, "left_to_job": 0, "not_covered": 0, "reconnected": 0, "superseded": 0,
            "replayed": 0, "stale_view": 0, "by_session": 0,
            "no_live_replica": 0, "proposed": 0, "elected": 0, "fenced": 0, "not_elected": 0, "failed": 0,
            "unknown": 0}
        self._electing: set[str] = set()  # sets with a proposal of this lane in flight
        # (record's way here, proposal to answer) in ms, of the last elections: where a lane failover's time goes
        self._timings: deque[tuple[int, float]] = deque(maxlen=256)
        self._tasks: set[asyncio.Task] = set()
        # every hold's timer, by hold id: a grace to wait out, or the fallback recheck of a wait for the view
        self._held: dict[int, asyncio.TimerHandle] = {}
        # the holds that wait for the job's view (looked at again as soon as it moves: `on_view`): the record,
        # its arrival, and the outcome counted if the wait ends without an election of this lane
        self._view_waits: dict[int, tuple[Disconnected, int, str]] = {}
        # (cluster, set, id) of silences waiting for the job's view
        self._pending_silent: set[tuple[str, str, int]] = set()
        self._next_hold = 0
        self._stopped = False

    def start(self, now_ms: int) -> None:
        """Records stamped from `now_ms` on are new: the lane may act on them."""
        self.since_ms = now_ms

    async def stop(self) -> None:
        self._stopped = True  # records still arriving from the liveness consumer start nothing now
        for h in self._held.values():
            h.cancel()
        self._held.clear()
        self._view_waits.clear()
        self._pending_silent.clear()
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

    def grace_ms(self, d: Disconnected) -> int | None:
        """How long after its instant the job's rule makes this disconnect count (None: the rule is not known
        here yet; the job's liveness records state it)."""
        if d.reason == records.SHUTDOWN:
            return 0
        grace = self.liveness.disconnect_grace_ms
        if d.reason == records.SILENT:  # it waited out the timeout already: no grace, once the job is heard from
            return None if grace is None else 0
        return grace

    def on_disconnects(self, found: list[Disconnected], now_ms: int) -> None:
        """Records taken from the liveness topic, after the batch they came in was applied (on the loop);
        `now_ms`: this node's clock. Each counts at its instant plus the job's grace: at once, or once the
        grace has passed without a heartbeat from the broker stamped after the disconnect."""
        for d in found:
            self.stats["silences" if d.reason == records.SILENT else "disconnects"] += 1
            grace = self.grace_ms(d)
            if grace is None or self._stopped:
                self.stats["left_to_job"] += 1
                continue
            d = _no_later_than(d, now_ms)
            wait_s = (d.at_ms + grace - now_ms) / 1000
            if wait_s <= 0:
                self._counts(d, now_ms)
            else:
                self._hold(wait_s, d, now_ms)

    def _hold(self, wait_s: float, d: Disconnected, arrived_at_ms: int) -> int:
        """Look at `d` again in `wait_s` (a grace to wait out, a job's view to catch up)."""
        self._next_hold += 1
        self._held[self._next_hold] = asyncio.get_running_loop().call_later(
            wait_s, self._held_over, self._next_hold, d, arrived_at_ms)
        return self._next_hold

    def _held_over(self, hold: int, d: Disconnected, arrived_at_ms: int) -> None:
        self._held.pop(hold, None)
        waited = self._view_waits.pop(hold, None)
        if not self._stopped:
            self._counts(d, arrived_at_ms, None if waited is None else waited[2])

    def _wait_view(self, d: Disconnected, arrived_at_ms: int, outcome: str) -> None:
        """Look at `d` again when the job's view moves (`on_view`), or in COVER_RECHECK_S if it does not. `outcome`:
        what is counted if the wait ends with the set elected by someone else (the job) or this node not leading."""
        self._view_waits[self._hold(COVER_RECHECK_S, d, arrived_at_ms)] = (d, arrived_at_ms, outcome)

    def _within_wait(self, d: Disconnected) -> bool:
        """Whether `d` may still wait for the job's view: up to MAX_AGE_MS after it counts (its grace included)."""
        return self.now_ms() - d.at_ms - (self.grace_ms(d) or 0) <= MAX_AGE_MS

    def on_view(self) -> None:
        """The job's records moved its view here (the liveness consumer, after applying them): what waits for
        the view is looked at now rather than at its next recheck, up to COVER_RECHECK_S later."""
        if not self._view_waits or self._stopped:
            return
        waits, self._view_waits = self._view_waits, {}
        for hold, (d, arrived_at_ms, outcome) in waits.items():
            handle = self._held.pop(hold, None)
            if handle is not None:
                handle.cancel()
            self._counts(d, arrived_at_ms, outcome)

    def _counts(self, d: Disconnected, arrived_at_ms: int, waited: str | None = None) -> None:
        """The disconnect counts now: the broker is gone from the table, and the leader elects if it was a master.
        `waited`: looked at again after waiting for the job's view (the outcome to count if it ends here)."""
        if d.reason == records.SILENT:  # (set again below while it waits for the job's view: on every other path gone)
            self._pending_silent.discard((d.cluster, d.name, d.broker_id))
        newest = self.liveness.session_opened_at(d.cluster, d.name, d.broker_id)
        if d.opened_ms is not None and newest is not None and newest > d.opened_ms:
            # an older session of the broker, ended after it opened a newer one on another ingest worker (one
            # worker supersedes its own sessions; this is the same rule across workers)
            self.stats["superseded"] += 1
            return
        replayed = self.since_ms is None or d.at_ms < self.since_ms or arrived_at_ms - d.at_ms > MAX_AGE_MS
        if d.reason == records.SILENT:
            if replayed:  # (a silence changes the table only once the job has given a view: a replay, never)
                self.stats["replayed"] += 1
                return
            if self.liveness.horizon_ms is None:  # no view of the job's yet
                self._wait_for_view(d, arrived_at_ms)  # (the table is not changed meanwhile)
                return
        if not self.liveness.disconnect(d.cluster, d.name, d.broker_id, d.gone_from_ms, d.at_ms):
            self.stats["reconnected"] += 1  # a heartbeat stamped after it is here (a new session, the job's)
            return
        if replayed:
            self.stats["replayed"] += 1
            return
        bs = self.sm.sets.get(d.name)
        if (self.node.role != Role.LEADER or bs is None or bs.cluster != d.cluster or bs.master_id != d.broker_id
                or d.name in self._electing):
            if waited is not None and d.name not in self._electing:  # while it waited: the job elected, or this
                self.stats[waited] += 1  # node stopped leading (a follower never waits: it returns above at once)
            return
        live = self._candidates(d.cluster, d.name)
        at = self.live_now_ms()
        alive = [b for b in live if b.alive_at(at)]
        if not alive:
            # Nobody to elect at the job's view. That view may be part of a batch: its records come in several
            # polls, and the first moves the horizon past replicas whose own records are still on their way. So
            # wait for the view as for a stale one; then, as the job: nothing proposed (the job looks again when a
            # heartbeat arrives).
            if self._within_wait(d):
                self._wait_view(d, arrived_at_ms, "no_live_replica")
                return
            self.stats["no_live_replica"] += 1
            log.warning("set %s: master %d %s and no other broker is alive: nothing to elect yet; the "
                        "streaming job proposes once a replica heartbeats", d.name, d.broker_id, d.what())
            return
        if self._stale(at, alive):
            # The job's last view (the data horizon) is old: a replica judged alive there may have died since.
            # Those whose own sessions vouch for them now are elected from at once: a crash would have ended the
            # session, a hang made it silent, each with a record (on a loaded machine the job's batches grew to
            # 4-6 s and every crash waited seconds for a fresh view). Otherwise look again every COVER_RECHECK_S,
            # as for a silence (a slow batch or two: the next batch's records bring a fresh view); a job stopped
            # or far behind decides once it has a fresh view: left to it after MAX_AGE_MS.
            live = self._vouched(d, alive)
            if live:
                self.stats["by_session"] += 1
            elif self._within_wait(d):
                self._wait_view(d, arrived_at_ms, "stale_view")
                return
            else:
                self.stats["stale_view"] += 1
                log.warning("set %s: master %d %s, but the streaming job's last view of the replicas is %.1f s "
                            "old and no replica's session vouches for it: left to the job (is it running?)",
                            d.name, d.broker_id, d.what(), (self.now_ms() - at) / 1000)
                return
        self._electing.add(d.name)
        task = asyncio.ensure_future(self._elect(d, bs.master_epoch, live, at, arrived_at_ms - d.at_ms))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _candidates(self, cluster: str, name: str) -> list[BrokerLiveInfo]:
        """The set's brokers in the table, less those whose silence waits for the job's view: such a broker is not
        alive by its own session (a hung replica must not be elected while the view is old)."""
        return [b for b in self.liveness.group(cluster, name).values()
                if (cluster, name, b.broker_id) not in self._pending_silent]

    def _vouched(self, d: Disconnected, alive: list[BrokerLiveInfo]) -> list[BrokerLiveInfo]:
        """Of the replicas alive at the job's view, those whose own session vouches for them now
        (`LivenessTable.session_vouches`: its opening seen here, no end or silence since). The set's records are
        keyed by the set on the liveness topic, one partition: a session record produced before this
        disconnect's was taken before it, but for the moments the two spent on their ways from different workers."""
        return [b for b in alive if self.liveness.session_vouches(d.cluster, d.name, b.broker_id)]

    def _stale(self, horizon_ms: int, alive: list[BrokerLiveInfo]) -> bool:
        """Whether the job's view at `horizon_ms` is too old to judge these live brokers by (STALE_VIEW_TIMEOUTS)."""
        return self.now_ms() - horizon_ms > STALE_VIEW_TIMEOUTS * min(b.timeout_ms for b in alive)

    def _wait_for_view(self, d: Disconnected, arrived_at_ms: int) -> None:
        """A silence counts once the job's view is here at all: before the job's first liveness records the table
        holds only sessions' openings, and every broker would look silent since (the first version of this lane
        failed over every master of a test whose brokers paused while the job started). Until then it is looked
        at again every COVER_RECHECK_S, the broker is no candidate, and after MAX_AGE_MS it is left to the job
        (`not_covered`).

        It no longer waits for the view to reach the session's last heartbeat (until 2026-11-29 it did, to see a
        heartbeat on another path: another worker, a connection without a session). A session is its broker's
        channel: the broker heartbeats on it, and a broker that reconnects opens a new session, which supersedes
        the silent one (its `connected` record arrives within milliseconds); a broker that spreads its heartbeats
        over other connections must not open one (docs/failover-signal.md). The wait cost every hang the job's
        lag, which on a loaded machine was several times the heartbeat timeout."""
        if self.now_ms() - d.at_ms > MAX_AGE_MS:
            self.stats["not_covered"] += 1
            log.warning("set %s: master %d %s, but the streaming job's view of the set is not fresh enough: left to "
                        "the job", d.name, d.broker_id, d.what())
            return
        self._pending_silent.add((d.cluster, d.name, d.broker_id))  # not a candidate meanwhile
        self._wait_view(d, arrived_at_ms, "not_covered")

    async def _elect(self, d: Disconnected, master_epoch: int, live: list[BrokerLiveInfo], at_ms: int,
                     arrived_ms: int) -> None:
        self.stats["proposed"] += 1
        t0 = time.perf_counter()
        try:
            res = await self.propose_election(d.cluster, d.name, master_epoch, live, at_ms)
        except asyncio.CancelledError:
            raise
        except ProposalTimeout as exc:  # it may still commit; if not, the job's proposal follows a batch later
            self.stats["unknown"] += 1
            log.warning("set %s: master %d %s; the election's outcome is not known: %s", d.name, d.broker_id,
                        d.what(), exc)
            return
        except Exception as exc:  # not leading any more, stopping: the job's proposal follows a batch later
            self.stats["failed"] += 1
            log.warning("set %s: master %d %s but the election failed: %s; the streaming job proposes one in "
                        "its next batch", d.name, d.broker_id, d.what(), exc)
            return
        finally:
            self._electing.discard(d.name)
        code = res.get("code")
        if code == Code.SUCCESS:
            self.stats["elected"] += 1
            self._timings.append((arrived_ms, (time.perf_counter() - t0) * 1000))
            log.info("set %s: master %d %s; broker %s elected", d.name, d.broker_id, d.what(),
                     (res.get("header") or {}).get("masterBrokerId"))
        elif code == Code.CONTROLLER_FENCED_MASTER_EPOCH:
            self.stats["fenced"] += 1  # someone (the job, an operator) elected first
        else:
            self.stats["not_elected"] += 1
            log.warning("set %s: master %d %s; no election: %s", d.name, d.broker_id, d.what(),
                        res.get("remark"))
