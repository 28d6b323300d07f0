"""Broker liveness: who sent a heartbeat recently, with what epoch, offsets and priority.

Liveness is not replicated state. A controller node keeps it from the heartbeats
it sees (today: the heartbeat endpoint of that node; later: the streaming job),
and every command whose outcome depends on liveness carries a copy of the
relevant group's records plus the proposer's clock (`now_ms`). Apply then
decides from the command alone, so every replica reaches the same result.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from .limits import BrokerIdField, Int32Field, Int64Field

DEFAULT_TIMEOUT_MS = 10_000
PIPELINE_LAG_BOUND_MS = 30_000  # judge no earlier than this before the clock, however far the job lags
LOWEST_PRIORITY = 2**31 - 1  # RocketMQ's Integer.MAX_VALUE: lower numbers are preferred
MAX_GONE = 65_536  # disconnected brokers remembered (`LivenessTable.disconnect`)


class BrokerLiveInfo(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One broker's latest heartbeat; the wire form (commands, liveness topic) is a map of these fields."""

    broker_id: BrokerIdField
    broker_addr: str
    last_update_ms: Int64Field
    timeout_ms: Int64Field = DEFAULT_TIMEOUT_MS
    epoch: Int32Field = -1
    max_offset: Int64Field = -1
    confirm_offset: Int64Field = -1
    priority: Int32Field = LOWEST_PRIORITY

    def alive_at(self, now_ms: int) -> bool:
        return self.last_update_ms + self.timeout_ms >= now_ms

    def to_wire(self) -> dict[str, Any]:
        # The streaming job calls this for every broker of every set in every batch: msgspec's
        # asdict is a shallow C copy (dataclasses.asdict deep-copied, ~40% of the operator's CPU).
        return msgspec.structs.asdict(self)

    @staticmethod
    def from_wire(d: Any) -> BrokerLiveInfo:
        """Decode and bound-check a record (liveness topic); ValueError names the bad field, never the value."""
        try:
            return msgspec.convert(d, BrokerLiveInfo)
        except msgspec.ValidationError as exc:
            raise ValueError(f"a broker liveness record: {exc}") from None


class LivenessTable:
    """Heartbeats seen by this node, by broker set name, then (cluster, broker id).

    Indexed by set name because every lookup is per set: the inactive-master scan and
    each command's liveness copy would otherwise scan every broker of the fleet.
    """

    def __init__(self, lag_bound_ms: int = PIPELINE_LAG_BOUND_MS) -> None:
        self._by_name: dict[str, dict[tuple[str, int], BrokerLiveInfo]] = {}
        self._count = 0
        self.lag_bound_ms = lag_bound_ms
        # The streaming job's data horizon as this node knows it: the newest ingest stamp among the
        # liveness records it took (api/kafka_bridge.LivenessConsumer); None while heartbeats come
        # straight to this node.
        self.horizon_ms: int | None = None
        # Brokers whose session connection ended (`disconnect`): (cluster, set, id) -> that instant. A record
        # stamped no later (the job's view of the broker before it crashed) does not bring it back.
        self._gone: dict[tuple[str, str, int], int] = {}
        # ... and, where it was noticed later than that (a silent session: at its timeout's end), that instant
        self._noticed: dict[tuple[str, str, int], int] = {}
        self._opened: dict[tuple[str, str, int], int] = {}  # (cluster, set, id) -> its newest session's opening
        # ... of those sessions, the ones no record has said ended or fell silent since (`session_vouches`)
        self._vouching: dict[tuple[str, str, int], int] = {}
        # The streaming job's grace for a lost connection, as its liveness records state it (None: not heard)
        self.disconnect_grace_ms: int | None = None
        # Called as (cluster, set, broker id, deadline ms) when a record makes a broker's deadline (last heartbeat
        # + timeout) earlier than it was, or names a broker first: a heartbeat with a shorter timeout. The
        # inactive-master scan's wake-up assumes that heartbeats only move deadlines later (api/inactive_scan.py).
        self.deadline_listeners: list[Callable[[str, str, int, int], None]] = []

    def advance_horizon(self, stamp_ms: int) -> None:
        """Records up to ingest stamp `stamp_ms` have arrived from the job (the horizon only moves forward)."""
        if self.horizon_ms is None or stamp_ms > self.horizon_ms:
            self.horizon_ms = stamp_ms

    def judge_at(self, now_ms: int) -> int:
        """The instant to judge this table's records at: the clock, or the job's data horizon.

        Records from the streaming job arrive a trigger interval plus a batch after their
        heartbeats were ingested. Judged at the clock, every broker would look that much older
        than it is, and with batches longer than the heartbeat timeout every broker dead: no
        replica could join a sync state set and no broker-triggered election would find a
        candidate. So, like the job itself (`streaming/detector.judge_at`), judge at the data
        horizon (the newest ingest stamp the job's records carried), never later than the clock,
        and never more than `lag_bound_ms` before it: a job that stopped does not keep brokers
        alive for ever.
        """
        if self.horizon_ms is None:
            return now_ms
        return min(now_ms, max(self.horizon_ms, now_ms - self.lag_bound_ms))

    def on_heartbeat(self, cluster: str, name: str, broker_id: int, addr: str, now_ms: int, *,
                     timeout_ms: int = DEFAULT_TIMEOUT_MS, epoch: int = -1, max_offset: int = -1,
                     confirm_offset: int = -1, priority: int = LOWEST_PRIORITY) -> None:
        """RocketMQ's update rule: offsets only move forward in (epoch, max offset) order.

        Unlike RocketMQ, the first heartbeat's confirm offset is kept and the address
        follows the broker (it may move after a restart).
        """
        prev = self._by_name.get(name, {}).get((cluster, broker_id))
        if prev is not None and not (epoch > prev.epoch or (epoch == prev.epoch and max_offset > prev.max_offset)):
            epoch, max_offset, confirm_offset = prev.epoch, prev.max_offset, prev.confirm_offset
        self.put(cluster, name, BrokerLiveInfo(broker_id, addr, now_ms, timeout_ms, epoch, max_offset,
                                               confirm_offset, priority))

    def disconnect(self, cluster: str, name: str, broker_id: int, at_ms: int, noticed_ms: int | None = None) -> bool:
        """RocketMQ's `onBrokerChannelClose`: the broker's session connection ended at `at_ms` (its ingest
        worker's clock), so it is not alive from then on, until a heartbeat stamped after `at_ms` arrives.
        `noticed_ms`: when that became known, if later (a silent session: `at_ms` is its last heartbeat).
        False: such a heartbeat is here already (it reconnected before this record arrived)."""
        group = self._by_name.get(name)
        key = (cluster, broker_id)
        info = group.get(key) if group is not None else None
        if info is not None and info.last_update_ms > at_ms:
            return False
        if group is not None and info is not None:
            del group[key]
            self._count -= 1
            if not group:
                del self._by_name[name]
        gone = (cluster, name, broker_id)
        at_ms = max(at_ms, self._gone.pop(gone, at_ms))
        if len(self._gone) >= MAX_GONE:  # bounded: the oldest goes (it only lets an older record count again)
            oldest = next(iter(self._gone))
            del self._gone[oldest]
            self._noticed.pop(oldest, None)
        self._gone[gone] = at_ms
        if noticed_ms is not None and noticed_ms > at_ms:
            self._noticed[gone] = noticed_ms
        else:
            self._noticed.pop(gone, None)
        return True

    def session_opened(self, cluster: str, name: str, broker_id: int, at_ms: int) -> None:
        """The broker opened a session (on some ingest worker) at `at_ms`: its newest one is remembered."""
        key = (cluster, name, broker_id)
        newest = max(at_ms, self._opened.pop(key, at_ms))
        if len(self._opened) >= MAX_GONE:  # bounded: the oldest goes
            del self._opened[next(iter(self._opened))]
        self._opened[key] = newest
        if newest == at_ms:  # the newest session: it vouches for its broker until it ends or falls silent
            self._vouching.pop(key, None)
            if len(self._vouching) >= MAX_GONE:
                del self._vouching[next(iter(self._vouching))]
            self._vouching[key] = at_ms

    def session_ended(self, cluster: str, name: str, broker_id: int, opened_ms: int | None) -> None:
        """The broker's session opened at `opened_ms` (None: not known) ended, or fell silent: it vouches no more
        (a newer session, opened since on another worker, still does)."""
        key = (cluster, name, broker_id)
        vouching = self._vouching.get(key)
        if vouching is not None and (opened_ms is None or opened_ms >= vouching):
            del self._vouching[key]

    def session_vouches(self, cluster: str, name: str, broker_id: int) -> bool:
        """Whether the broker is alive by its own session's word: this node saw its newest session open, and no
        record since has said that session ended or fell silent. Fresher than the streaming job's view (a hang
        is reported at its timeout's end, a crash at once), but only as reliable as the session records: a
        broker that died without one (its ingest worker crashed with it) still looks vouched for."""
        return (cluster, name, broker_id) in self._vouching

    def session_opened_at(self, cluster: str, name: str, broker_id: int) -> int | None:
        """When the broker's newest session seen here opened."""
        return self._opened.get((cluster, name, broker_id))

    def disconnected_at(self, cluster: str, name: str, broker_id: int) -> int | None:
        """When the broker's session connection ended, while no heartbeat since has brought it back."""
        return self._gone.get((cluster, name, broker_id))

    def disconnect_noticed_at(self, cluster: str, name: str, broker_id: int) -> int | None:
        """When that disconnect became known (a silence: its timeout's end; a lost connection: its instant)."""
        key = (cluster, name, broker_id)
        return self._noticed.get(key, self._gone.get(key))

    def put(self, cluster: str, name: str, info: BrokerLiveInfo) -> None:
        """Store a record as it is (the streaming job already applied the update rule)."""
        if self._gone:
            gone = (cluster, name, info.broker_id)
            at = self._gone.get(gone)
            if at is not None:
                if info.last_update_ms <= at:
                    return  # from before its connection ended
                del self._gone[gone]
                self._noticed.pop(gone, None)
        group = self._by_name.setdefault(name, {})
        key = (cluster, info.broker_id)
        prev = group.get(key)
        if prev is not None and prev.last_update_ms > info.last_update_ms:
            return  # an older view (e.g. replayed from the liveness topic) never replaces a newer one
        if prev is None:
            self._count += 1
        group[key] = info
        if self.deadline_listeners and (prev is None or info.timeout_ms < prev.timeout_ms):
            deadline = info.last_update_ms + info.timeout_ms
            if prev is None or deadline < prev.last_update_ms + prev.timeout_ms:
                for fn in self.deadline_listeners:
                    fn(cluster, name, info.broker_id, deadline)

    def group(self, cluster: str, name: str) -> dict[int, BrokerLiveInfo]:
        """The heartbeat records of set `name` in `cluster`, by broker id. A set belongs to one cluster: a broker
        heartbeating under another cluster's name is not alive in it (RocketMQ keys liveness by cluster too)."""
        return {k[1]: v for k, v in self._by_name.get(name, {}).items() if k[0] == cluster}

    def expire(self, now_ms: int) -> list[tuple[str, str, int]]:
        """Forget brokers whose heartbeat timed out; returns their keys."""
        dead = []
        for name, group in list(self._by_name.items()):
            for key, info in list(group.items()):
                if not info.alive_at(now_ms):
                    del group[key]
                    dead.append((key[0], name, key[1]))
            if not group:
                del self._by_name[name]
        self._count -= len(dead)
        return dead

    def __len__(self) -> int:
        """Brokers this table holds a record of, alive or not (`alive_count` counts the living)."""
        return self._count

    def alive_count(self, now_ms: int) -> int:
        """How many of the brokers held here are alive at `now_ms` (judge at `judge_at(clock)`)."""
        return sum(info.alive_at(now_ms) for group in self._by_name.values() for info in group.values())
