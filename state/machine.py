"""The controller's replicated state machine, with RocketMQ 5 controller semantics.

Per broker set it holds RocketMQ's `BrokerReplicaInfo` (broker ids, addresses,
register check codes, next id) and `SyncStateInfo` (master, master epoch,
sync-state set and its epoch). `apply()` decodes one typed command
(`commands.py`) and runs the handler of its type (`_HANDLERS`): it validates in
RocketMQ's order, with RocketMQ's response codes, against the state at that log
position, changes the state, and returns the request's typed result
(`results.py`) with the events it produced (RocketMQ's event types), which
watchers and the events topic consume. Apply depends on the command and the
state alone (the clock and liveness travel in the command), so every replica
reaches the same state. Reads (`get_next_broker_id`, `get_replica_info`,
`get_sync_state_data`) are plain functions over the state; the caller decides
their consistency (ReadIndex, follower or stale read). Outside readers see a set
through its public view (`view()`, `views.py`).

Where this deliberately differs from RocketMQ, docs/rocketmq-differences.md says
so and why.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, BinaryIO, TypeAlias

import msgspec

from electra.consensus import mutations

from . import commands as C
from .codes import Code
from .elect_policy import elect
from .liveness import BrokerLiveInfo
from .results import (
    AlterSyncStateSetEvent,
    AlterSyncStateSetResult,
    ApplyBrokerIdEvent,
    ApplyBrokerIdResult,
    CleanBrokerDataEvent,
    CleanBrokerDataResult,
    ElectMasterEvent,
    ElectMasterResult,
    Event,
    NextBrokerIdResult,
    RegisterBrokerResult,
    ReplicaInfoResult,
    ReplicasInfo,
    SyncStateDataResult,
    UpdateBrokerAddressEvent,
    WriteResult,
)
from .views import BrokerSetView

SNAPSHOT_VERSION = 1

LiveOf: TypeAlias = Callable[[str, str], dict[int, BrokerLiveInfo]]  # (cluster, set) -> heartbeat records


@dataclass
class BrokerSet:
    """Both of RocketMQ's per-set records; a set exists only with both (here: always together)."""

    cluster: str
    name: str
    next_broker_id: int = 1  # counts adds, as RocketMQ's nextAssignBrokerId does
    brokers: dict[int, tuple[str, str]] = field(default_factory=dict)  # id -> (address, register check code)
    master_id: int | None = None
    master_epoch: int = 0
    sync_state_set: set[int] = field(default_factory=set)
    sync_state_set_epoch: int = 0

    def address(self, broker_id: int | None) -> str | None:
        entry = self.brokers.get(broker_id) if broker_id is not None else None
        return entry[0] if entry else None

    def view(self) -> BrokerSetView:
        """The set's public view (state/views.py) as it is now."""
        return BrokerSetView(self.cluster, self.name, self.master_id, self.address(self.master_id),
                             self.master_epoch, tuple(sorted(self.sync_state_set)), self.sync_state_set_epoch,
                             {i: a for i, (a, _) in sorted(self.brokers.items())})

    def to_wire(self) -> _SetRecord:
        return _SetRecord(self.cluster, self.name, self.next_broker_id,
                          [(i, a, c) for i, (a, c) in sorted(self.brokers.items())],
                          self.master_id, self.master_epoch, sorted(self.sync_state_set), self.sync_state_set_epoch)

    @staticmethod
    def from_wire(w: _SetRecord) -> BrokerSet:
        return BrokerSet(w.cluster, w.name, w.next_broker_id, {i: (a, c) for i, a, c in w.brokers}, w.master_id,
                         w.master_epoch, set(w.sync_state_set), w.sync_state_set_epoch)


class _SetRecord(msgspec.Struct, array_like=True, frozen=True):
    """A broker set in a snapshot (format v1): a msgpack array of these fields, in this order."""

    cluster: str
    name: str
    next_broker_id: int
    brokers: list[tuple[int, str, str]]  # (id, address, register check code), by id
    master_id: int | None
    master_epoch: int
    sync_state_set: list[int]  # sorted
    sync_state_set_epoch: int


class _Snapshot(msgspec.Struct, frozen=True):
    """The snapshot (format v1): a msgpack map of these fields, sets by name."""

    version: int
    applied: int
    sets: list[_SetRecord]


_snapshot_encoder = msgspec.msgpack.Encoder()
_snapshot_decoder = msgspec.msgpack.Decoder(_Snapshot)


def _java(value: object) -> str:
    """A value as RocketMQ's remark prints it (Java's `null`, not Python's `None`)."""
    return "null" if value is None else str(value)


class ControllerStateMachine:
    def __init__(self) -> None:
        self.sets: dict[str, BrokerSet] = {}
        self.applied = 0
        self.apply_time_ms = 0  # the clock carried by the command being applied (0 if it has none)
        self._listeners: list[Callable[[int, Event], None]] = []
        self._restore_listeners: list[Callable[[int], None]] = []
        # While listeners hear a command's events: the set's view the command's result already holds
        # (views are immutable), so `view()` does not build a second one for the journal's entry.
        self._applied_view: BrokerSetView | None = None

    def on_event(self, fn: Callable[[int, Event], None]) -> None:
        """Call `fn(index, event)` for every event an applied command produces."""
        self._listeners.append(fn)

    def on_restore(self, fn: Callable[[int], None]) -> None:
        """Call `fn(applied_index)` whenever a snapshot replaces the whole state."""
        self._restore_listeners.append(fn)

    def cluster_of(self, name: str) -> str | None:
        """The cluster broker set `name` was created in, None if there is no such set (a credential's
        cluster scope is checked against it: security/auth.py, `authorize_set_clusters`)."""
        bs = self.sets.get(name)
        return None if bs is None else bs.cluster

    def view(self, name: str) -> BrokerSetView | None:
        """The public view of one broker set, None if there is no such set."""
        shared = self._applied_view
        if shared is not None and shared.broker_name == name:
            return shared
        bs = self.sets.get(name)
        return None if bs is None else bs.view()

    # ------------------------------------------------------------------ apply
    def apply(self, index: int, data: bytes) -> WriteResult:
        self.applied = index
        try:
            cmd = C.decode(data)
        except ValueError as exc:
            # A malformed command is rejected the same way on every replica.
            res = WriteResult(code=Code.CONTROLLER_INVALID_REQUEST, remark=f"invalid command: {exc}")
        else:
            self.apply_time_ms = cmd.now_ms
            res = _HANDLERS[type(cmd)](self, cmd)
        if res.events:
            # A result's `state` is its set's view right after the command: the listeners' too.
            self._applied_view = getattr(res, "state", None)
            try:
                for ev in res.events:
                    public = ev.to_public()
                    for fn in self._listeners:
                        fn(index, public)
            finally:
                self._applied_view = None
        return res

    def _apply_broker_id(self, cmd: C.ApplyBrokerId) -> ApplyBrokerIdResult:
        cluster, name, bid, code = cmd.cluster, cmd.name, cmd.broker_id, cmd.check_code

        def refused(remark: str) -> ApplyBrokerIdResult:
            return ApplyBrokerIdResult(code=Code.CONTROLLER_BROKER_ID_INVALID, remark=remark, cluster_name=cluster,
                                       broker_name=name)

        addr = code.split(";")[0]
        bs = self.sets.get(name)
        if bs is None:
            if bid != 1:
                return refused(f"Broker-set: {name} hasn't been registered in controller, but broker try to apply "
                               f"brokerId: {bid}")
            bs = self.sets[name] = BrokerSet(cluster, name)
        elif bid in bs.brokers and bs.brokers[bid][1] != code:
            return refused(f"Fail to apply brokerId: {bid} in broker-set: {name}")
        if bid in bs.brokers:  # a retry by the same broker changes nothing
            return ApplyBrokerIdResult(code=Code.SUCCESS, cluster_name=cluster, broker_name=name)
        bs.brokers[bid] = (addr, code)
        bs.next_broker_id += 1
        return ApplyBrokerIdResult(code=Code.SUCCESS, cluster_name=cluster, broker_name=name,
                                   events=(ApplyBrokerIdEvent(cluster, name, addr, code, bid),))

    def _register_broker(self, cmd: C.RegisterBroker) -> RegisterBrokerResult:
        cluster, name, bid, addr = cmd.cluster, cmd.name, cmd.broker_id, cmd.addr
        bs = self.sets.get(name)
        if bs is None:
            return RegisterBrokerResult(code=Code.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED, cluster_name=cluster,
                                        broker_name=name,
                                        remark=f"Broker-set: {name} hasn't been registered in controller")
        known = bs.brokers.get(bid)
        if known is None:
            return RegisterBrokerResult(code=Code.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED, cluster_name=cluster,
                                        broker_name=name,
                                        remark=f"BrokerId: {bid} hasn't been registered in broker-set: {name}")
        events: tuple[UpdateBrokerAddressEvent, ...] = ()
        if addr != known[0]:
            bs.brokers[bid] = (addr, known[1])
            events = (UpdateBrokerAddressEvent(bs.cluster, name, addr, bid),)
        master_alive = bs.master_id is not None and _alive_in(cmd.live, bs.master_id, cmd.now_ms)
        return RegisterBrokerResult(code=Code.SUCCESS, cluster_name=cluster, broker_name=name, state=bs.view(),
                                    master_alive=master_alive, events=events)

    def _elect_master(self, cmd: C.ElectMaster) -> ElectMasterResult:
        name, bid = cmd.name, cmd.broker_id
        bs = self.sets.get(name)
        if bs is None:
            return ElectMasterResult(code=Code.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED,
                                     remark="Broker hasn't been registered")
        live, now = C.live_by_id(cmd.live), cmd.now_ms
        expected = cmd.expected_master_epoch
        if expected is not None and expected != bs.master_epoch:
            # A proposal from the streaming job is about the master it saw; once the epoch moved on
            # (another election won, or the same proposal delivered twice) it is stale.
            return ElectMasterResult(
                code=Code.CONTROLLER_FENCED_MASTER_EPOCH, state=bs.view(),
                remark=f"Rejecting election because the current master epoch is {bs.master_epoch}, not {expected}")
        old = bs.master_id
        new: int | None = None
        if bs.master_epoch == 0 and bid != C.CONTROLLER_TRIGGER:
            # RocketMQ: the first broker to ask becomes master. We also require it to be a member.
            if bid not in bs.brokers:
                return ElectMasterResult(code=Code.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED,
                                         remark=f"BrokerId: {bid} hasn't been registered in broker-set: {name}")
            new = bid
        if new is None:
            prefer = bid if cmd.designate else None
            everyone = bs.brokers.keys() if cmd.unclean else None
            new = elect(bs.sync_state_set, everyone, old, prefer, live, now)
        if new is not None and new == old:
            return ElectMasterResult(code=Code.CONTROLLER_MASTER_STILL_EXIST, state=bs.view(),
                                     remark=f"The old master {_java(old)} is still alive, not need to elect new master "
                                            f"for broker {name}")
        if new is not None:
            bs.master_id = new
            if not mutations.enabled("elect_keeps_epoch"):  # the deliberate bug: two masters under one epoch
                bs.master_epoch += 1
            bs.sync_state_set = {new}
            bs.sync_state_set_epoch += 1
            ev = ElectMasterEvent(name, True, new, bs.master_epoch, bs.sync_state_set_epoch)
            return ElectMasterResult(code=Code.SUCCESS, state=bs.view(), events=(ev,))
        if bid == C.CONTROLLER_TRIGGER:
            # RocketMQ records the failed controller-triggered election: no master, epoch moves on.
            bs.master_id = None
            bs.master_epoch += 1
            return ElectMasterResult(code=Code.CONTROLLER_MASTER_NOT_AVAILABLE,
                                     remark="Old master has down and failed to elect a new broker master",
                                     events=(ElectMasterEvent(name, False, None, bs.master_epoch,
                                                              bs.sync_state_set_epoch),))
        return ElectMasterResult(code=Code.CONTROLLER_ELECT_MASTER_FAILED, remark="Failed to elect a new master")

    def _alter_sync_state_set(self, cmd: C.AlterSyncStateSet) -> AlterSyncStateSetResult:
        name = cmd.name
        new_set = set(cmd.new_set)

        def refused(code: Code, remark: str) -> AlterSyncStateSetResult:
            return AlterSyncStateSetResult(code=code, remark=remark)

        bs = self.sets.get(name)
        if bs is None:
            return refused(Code.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED, "Broker metadata is not existed")
        if new_set == bs.sync_state_set:
            return refused(Code.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED,
                           "The newSyncStateSet is equal with oldSyncStateSet, no needed to update syncStateSet")
        if bs.master_id is None or bs.master_id != cmd.master_id:
            return refused(Code.CONTROLLER_INVALID_MASTER,
                           f"Rejecting alter syncStateSet request because the current leader is:"
                           f"{{{_java(bs.master_id)}}}, not {{{_java(cmd.master_id)}}}")
        if cmd.master_epoch != bs.master_epoch:
            return refused(Code.CONTROLLER_FENCED_MASTER_EPOCH,
                           f"Rejecting alter syncStateSet request because the current master epoch is:"
                           f"{{{bs.master_epoch}}}, not {{{cmd.master_epoch}}}")
        if cmd.sync_state_set_epoch != bs.sync_state_set_epoch:
            return refused(Code.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH,
                           f"Rejecting alter syncStateSet request because the current syncStateSet epoch is:"
                           f"{{{bs.sync_state_set_epoch}}}, not {{{cmd.sync_state_set_epoch}}}")
        live, now = C.live_by_id(cmd.live), cmd.now_ms
        for r in sorted(new_set):
            if r not in bs.brokers:
                return refused(Code.CONTROLLER_INVALID_REPLICAS,
                               f"Rejecting alter syncStateSet request because the replicas {{{r}}} don't exist")
            if not _alive(live, r, now):
                return refused(Code.CONTROLLER_BROKER_NOT_ALIVE,
                               f"Rejecting alter syncStateSet request because the replicas {{{r}}} don't alive")
        if bs.master_id not in new_set:
            return refused(Code.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED,
                           f"Rejecting alter syncStateSet request because the newSyncStateSet don't contains "
                           f"origin leader {{{_java(bs.master_id)}}}")
        bs.sync_state_set = new_set
        bs.sync_state_set_epoch += 1
        ev = AlterSyncStateSetEvent(name, sorted(new_set), bs.sync_state_set_epoch)
        return AlterSyncStateSetResult(code=Code.SUCCESS, state=bs.view(), events=(ev,))

    def _clean_broker_data(self, cmd: C.CleanBrokerData) -> CleanBrokerDataResult:
        name = cmd.name
        ids = cmd.ids
        bs = self.sets.get(name)
        live, now = C.live_by_id(cmd.live), cmd.now_ms

        def refused(remark: str) -> CleanBrokerDataResult:
            return CleanBrokerDataResult(code=Code.CONTROLLER_INVALID_CLEAN_BROKER_METADATA, remark=remark)

        if not cmd.clean_living:
            if not ids and bs is not None and bs.master_id is not None:
                return refused(f"Broker {name} is still alive, clean up failure")
            if ids:
                for i in ids:
                    if _alive(live, i, now):
                        return refused(f"Broker [{name},  {i}] is still alive, clean up failure")
        if bs is None:
            return refused(f"Broker {name} is not existed,clean broker data failure.")
        if not ids:
            del self.sets[name]
            return CleanBrokerDataResult(code=Code.SUCCESS, events=(CleanBrokerDataEvent(name, None),))
        for i in ids:
            bs.brokers.pop(i, None)
            bs.sync_state_set.discard(i)
        fenced_epoch = None
        if bs.master_id in ids:
            # Differs from RocketMQ, which keeps a removed master's id: fence it with a new epoch.
            bs.master_id = None
            bs.master_epoch += 1
            fenced_epoch = bs.master_epoch
        if not bs.brokers:
            del self.sets[name]  # never half a set: RocketMQ could drop one of its two tables only
        return CleanBrokerDataResult(code=Code.SUCCESS, events=(CleanBrokerDataEvent(name, sorted(ids), fenced_epoch),))

    # ------------------------------------------------------------------ writes that change nothing
    def answer_without_write(self, data: bytes) -> WriteResult | None:
        """The answer of a RegisterBroker or ElectMaster command if applying it would change nothing, else None.

        Run under a linearizable read, this answers the request as applying it at that read's
        index would, without a log entry: RocketMQ writes a RegisterBroker only when the address
        changes, and an ElectMaster whose master is still alive (2011) or that is refused changes
        nothing either. The command runs against a copy of its broker set, so nothing here can
        change the replicated state; an outcome with events (a change) returns None: propose it.
        """
        cmd = C.decode(data)
        if not isinstance(cmd, C.RegisterBroker | C.ElectMaster):
            return None
        name = cmd.name
        real = self.sets.get(name)
        if real is not None:
            self.sets[name] = BrokerSet(real.cluster, real.name, real.next_broker_id, dict(real.brokers),
                                        real.master_id, real.master_epoch, set(real.sync_state_set),
                                        real.sync_state_set_epoch)
        try:
            res = _HANDLERS[type(cmd)](self, cmd)
        finally:
            if real is not None:
                self.sets[name] = real
            else:
                self.sets.pop(name, None)
        return None if res.events else res

    def _read_event(self, cmd: C.ReadEvent) -> WriteResult:
        return WriteResult(code=Code.SUCCESS)  # a read barrier: no state, no events

    # ------------------------------------------------------------------ reads
    def get_next_broker_id(self, cluster: str, name: str) -> NextBrokerIdResult:
        bs = self.sets.get(name)
        return NextBrokerIdResult(code=Code.SUCCESS, cluster_name=cluster, broker_name=name,
                                  next_broker_id=bs.next_broker_id if bs else 1)

    def get_replica_info(self, name: str) -> ReplicaInfoResult:
        state = self.view(name)
        if state is None:
            return ReplicaInfoResult(code=Code.CONTROLLER_BROKER_METADATA_NOT_EXIST,
                                     remark="Broker metadata is not existed")
        return ReplicaInfoResult(code=Code.SUCCESS, state=state)

    def get_sync_state_data(self, names: Iterable[str], live_of: LiveOf, now_ms: int) -> SyncStateDataResult:
        table: dict[str, ReplicasInfo] = {}
        for name in names:
            bs = self.sets.get(name)
            if bs is None:
                continue  # RocketMQ skips unknown names silently
            live = live_of(bs.cluster, name)
            table[name] = ReplicasInfo(bs.view(), frozenset(i for i in bs.brokers if _alive(live, i, now_ms)))
        return SyncStateDataResult(code=Code.SUCCESS, sets=table)

    def sets_needing_election(self, live_of: LiveOf, now_ms: int) -> list[str]:
        """RocketMQ's scanNeedReelectBrokerSets: a master that is not alive while some replica is."""
        out = []
        for name, bs in sorted(self.sets.items()):
            if bs.master_id is None:
                continue
            live = live_of(bs.cluster, name)
            if not _alive(live, bs.master_id, now_ms) and any(_alive(live, i, now_ms) for i in bs.brokers):
                out.append(name)
        return out

    # ------------------------------------------------------------------ snapshots
    def snapshot(self, out: BinaryIO) -> None:
        """A versioned, deterministic encoding: the same state always gives the same bytes."""
        out.write(_snapshot_encoder.encode(_Snapshot(SNAPSHOT_VERSION, self.applied,
                                                     [bs.to_wire() for _, bs in sorted(self.sets.items())])))

    def restore(self, inp: BinaryIO) -> None:
        try:
            state = _snapshot_decoder.decode(inp.read())
        except msgspec.DecodeError as exc:
            raise ValueError(f"not a controller snapshot (format v{SNAPSHOT_VERSION}): {exc}") from None
        if state.version != SNAPSHOT_VERSION:
            raise ValueError(f"unsupported controller snapshot version {state.version!r}")
        self.applied = state.applied
        self.sets = {w.name: BrokerSet.from_wire(w) for w in state.sets}
        for fn in self._restore_listeners:
            fn(self.applied)


# One handler per command type: apply dispatches on the decoded command's type.
_HANDLERS: dict[type[C.Command], Callable[[ControllerStateMachine, Any], WriteResult]] = {
    C.ApplyBrokerId: ControllerStateMachine._apply_broker_id,
    C.RegisterBroker: ControllerStateMachine._register_broker,
    C.ElectMaster: ControllerStateMachine._elect_master,
    C.AlterSyncStateSet: ControllerStateMachine._alter_sync_state_set,
    C.CleanBrokerData: ControllerStateMachine._clean_broker_data,
    C.ReadEvent: ControllerStateMachine._read_event,
}
assert set(_HANDLERS) == set(C.COMMAND_TYPES), "every command type needs its handler"


def _alive(live: dict[int, BrokerLiveInfo], broker_id: int, now_ms: int) -> bool:
    info = live.get(broker_id)
    return info is not None and info.alive_at(now_ms)


def _alive_in(live: list[BrokerLiveInfo], broker_id: int, now_ms: int) -> bool:
    """`_alive` over a command's records as they are (the last record of an id counts, as in `live_by_id`),
    for a handler that asks about one broker: no dict built per command."""
    for info in reversed(live):
        if info.broker_id == broker_id:
            return info.alive_at(now_ms)
    return False
