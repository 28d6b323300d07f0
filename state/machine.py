"""The controller's replicated state machine, with RocketMQ 5 controller semantics.

Per broker set it holds RocketMQ's `BrokerReplicaInfo` (broker ids, addresses,
register check codes, next id) and `SyncStateInfo` (master, master epoch,
sync-state set and its epoch). `apply()` runs one command (see `commands.py`):
it validates in RocketMQ's order, with RocketMQ's response codes, against the
state at that log position, changes the state, and returns the response plus the
events it produced (RocketMQ's event types), which watchers and the events
topic consume. Reads (`get_next_broker_id`, `get_replica_info`,
`get_sync_state_data`) are plain functions over the state; the caller decides
their consistency (ReadIndex, follower or stale read).

Where this deliberately differs from RocketMQ, docs/rocketmq-differences.md says
so and why.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import msgpack

from . import commands as C
from .codes import Code
from .elect_policy import elect
from .liveness import BrokerLiveInfo

SNAPSHOT_VERSION = 1


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

    def to_wire(self) -> list:
        return [self.cluster, self.name, self.next_broker_id,
                [[i, a, c] for i, (a, c) in sorted(self.brokers.items())],
                self.master_id, self.master_epoch, sorted(self.sync_state_set), self.sync_state_set_epoch]

    @staticmethod
    def from_wire(w: list) -> BrokerSet:
        cluster, name, nxt, brokers, master, mepoch, sset, sepoch = w
        return BrokerSet(cluster, name, nxt, {i: (a, c) for i, a, c in brokers}, master, mepoch, set(sset), sepoch)


def result(code: Code, remark: str = "", header: dict | None = None, body: Any = None,
           events: list | None = None) -> dict:
    return {"code": int(code), "remark": remark, "header": header or {}, "body": body, "events": events or []}


class ControllerStateMachine:
    def __init__(self) -> None:
        self.sets: dict[str, BrokerSet] = {}
        self.applied = 0
        self.apply_time_ms = 0  # the clock carried by the command being applied (0 if it has none)
        self._listeners: list[Callable[[int, dict], None]] = []
        self._restore_listeners: list[Callable[[int], None]] = []

    def on_event(self, fn: Callable[[int, dict], None]) -> None:
        """Call `fn(index, event)` for every event an applied command produces."""
        self._listeners.append(fn)

    def on_restore(self, fn: Callable[[int], None]) -> None:
        """Call `fn(applied_index)` whenever a snapshot replaces the whole state."""
        self._restore_listeners.append(fn)

    # ------------------------------------------------------------------ apply
    def apply(self, index: int, data: bytes) -> dict:
        self.applied = index
        try:
            cmd = C.decode(data)
            self.apply_time_ms = int(cmd.get("now_ms") or 0)
            handler = getattr(self, "_" + cmd["op"])
            res = handler(cmd)
        except (ValueError, KeyError, TypeError) as exc:
            # A malformed command is rejected the same way on every replica.
            res = result(Code.CONTROLLER_INVALID_REQUEST, f"invalid command: {exc}")
        for ev in res["events"]:
            for fn in self._listeners:
                fn(index, ev)
        return res

    def _apply_broker_id(self, cmd: dict) -> dict:
        cluster, name, bid, code = cmd["cluster"], cmd["name"], int(cmd["broker_id"]), cmd["check_code"]
        addr = code.split(";")[0]
        header = {"clusterName": cluster, "brokerName": name}
        bs = self.sets.get(name)
        if bs is None:
            if bid != 1:
                return result(Code.CONTROLLER_BROKER_ID_INVALID,
                              f"Broker-set: {name} hasn't been registered in controller, but broker try to apply "
                              f"brokerId: {bid}")
            bs = self.sets[name] = BrokerSet(cluster, name)
        elif bid in bs.brokers and bs.brokers[bid][1] != code:
            return result(Code.CONTROLLER_BROKER_ID_INVALID, f"Fail to apply brokerId: {bid} in broker-set: {name}")
        events = []
        if bid not in bs.brokers:  # a retry by the same broker changes nothing
            bs.brokers[bid] = (addr, code)
            bs.next_broker_id += 1
            events.append({"type": "ApplyBrokerId", "clusterName": cluster, "brokerName": name,
                           "brokerAddress": addr, "registerCheckCode": code, "newBrokerId": bid})
        return result(Code.SUCCESS, header=header, events=events)

    def _register_broker(self, cmd: dict) -> dict:
        name, bid, addr = cmd["name"], int(cmd["broker_id"]), cmd["addr"]
        bs = self.sets.get(name)
        if bs is None:
            return result(Code.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED,
                          f"Broker-set: {name} hasn't been registered in controller")
        if bid not in bs.brokers:
            return result(Code.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED,
                          f"BrokerId: {bid} hasn't been registered in broker-set: {name}")
        live, now = C.live_of(cmd), cmd["now_ms"]
        header: dict[str, Any] = {"clusterName": bs.cluster, "brokerName": name, "masterBrokerId": None,
                                  "masterAddress": None, "masterEpoch": None, "syncStateSetEpoch": None}
        if bs.master_id is not None and _alive(live, bs.master_id, now):
            header.update(masterBrokerId=bs.master_id, masterAddress=bs.address(bs.master_id),
                          masterEpoch=bs.master_epoch, syncStateSetEpoch=bs.sync_state_set_epoch)
        events = []
        if addr != bs.address(bid):
            bs.brokers[bid] = (addr, bs.brokers[bid][1])
            events.append({"type": "UpdateBrokerAddress", "clusterName": bs.cluster, "brokerName": name,
                           "brokerAddress": addr, "brokerId": bid})
        body = {"syncStateSet": sorted(bs.sync_state_set), "syncStateSetEpoch": bs.sync_state_set_epoch}
        return result(Code.SUCCESS, header=header, body=body, events=events)

    def _elect_master(self, cmd: dict) -> dict:
        name, bid = cmd["name"], int(cmd["broker_id"])
        bs = self.sets.get(name)
        if bs is None:
            return result(Code.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED, "Broker hasn't been registered")
        live, now = C.live_of(cmd), cmd["now_ms"]
        expected = cmd.get("expected_master_epoch")
        if expected is not None and expected != bs.master_epoch:
            # A proposal from the streaming job is about the master it saw; once the epoch moved on
            # (another election won, or the same proposal delivered twice) it is stale.
            return result(Code.CONTROLLER_FENCED_MASTER_EPOCH,
                          f"Rejecting election because the current master epoch is {bs.master_epoch}, not {expected}",
                          header={"masterBrokerId": bs.master_id, "masterAddress": bs.address(bs.master_id),
                                  "masterEpoch": bs.master_epoch, "syncStateSetEpoch": bs.sync_state_set_epoch})
        old = bs.master_id
        new: int | None = None
        if bs.master_epoch == 0 and bid != C.CONTROLLER_TRIGGER:
            # RocketMQ: the first broker to ask becomes master. We also require it to be a member.
            if bid not in bs.brokers:
                return result(Code.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED,
                              f"BrokerId: {bid} hasn't been registered in broker-set: {name}")
            new = bid
        if new is None:
            prefer = bid if cmd.get("designate") else None
            everyone = bs.brokers.keys() if cmd.get("unclean") else None
            new = elect(bs.sync_state_set, everyone, old, prefer, live, now)
        if new is not None and new == old:
            header = {"masterBrokerId": old, "masterAddress": bs.address(old), "masterEpoch": bs.master_epoch,
                      "syncStateSetEpoch": bs.sync_state_set_epoch}
            return result(Code.CONTROLLER_MASTER_STILL_EXIST,
                          "The old master is still alive, no need to elect new master", header=header,
                          body={"brokerMemberGroup": None, "syncStateSet": sorted(bs.sync_state_set)})
        if new is not None:
            bs.master_id = new
            bs.master_epoch += 1
            bs.sync_state_set = {new}
            bs.sync_state_set_epoch += 1
            header = {"masterBrokerId": new, "masterAddress": bs.address(new), "masterEpoch": bs.master_epoch,
                      "syncStateSetEpoch": bs.sync_state_set_epoch}
            body = {"brokerMemberGroup": {"cluster": bs.cluster, "brokerName": name,
                                          "brokerAddrs": {i: a for i, (a, _) in sorted(bs.brokers.items())}},
                    "syncStateSet": [new]}
            ev = {"type": "ElectMaster", "brokerName": name, "newMasterElected": True, "newMasterBrokerId": new,
                  "masterEpoch": bs.master_epoch, "syncStateSetEpoch": bs.sync_state_set_epoch}
            return result(Code.SUCCESS, header=header, body=body, events=[ev])
        if bid == C.CONTROLLER_TRIGGER:
            # RocketMQ records the failed controller-triggered election: no master, epoch moves on.
            bs.master_id = None
            bs.master_epoch += 1
            ev = {"type": "ElectMaster", "brokerName": name, "newMasterElected": False, "newMasterBrokerId": None,
                  "masterEpoch": bs.master_epoch, "syncStateSetEpoch": bs.sync_state_set_epoch}
            return result(Code.CONTROLLER_MASTER_NOT_AVAILABLE,
                          "Old master has down and failed to elect a new broker master", events=[ev])
        return result(Code.CONTROLLER_ELECT_MASTER_FAILED, "Failed to elect a new master")

    def _alter_sync_state_set(self, cmd: dict) -> dict:
        name = cmd["name"]
        new_set = set(cmd["new_set"])
        bs = self.sets.get(name)
        if bs is None:
            return result(Code.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED, "Broker metadata is not existed")
        if new_set == bs.sync_state_set:
            return result(Code.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED,
                          "The newSyncStateSet is equal with oldSyncStateSet, no needed to update syncStateSet")
        if bs.master_id is None or bs.master_id != cmd["master_id"]:
            return result(Code.CONTROLLER_INVALID_MASTER,
                          f"Rejecting alter syncStateSet request because the current leader is:{bs.master_id}, "
                          f"not {cmd['master_id']}")
        if cmd["master_epoch"] != bs.master_epoch:
            return result(Code.CONTROLLER_FENCED_MASTER_EPOCH,
                          f"Rejecting alter syncStateSet request because the current master epoch is "
                          f"{bs.master_epoch}, not {cmd['master_epoch']}")
        if cmd["sync_state_set_epoch"] != bs.sync_state_set_epoch:
            return result(Code.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH,
                          f"Rejecting alter syncStateSet request because the current syncStateSet epoch is "
                          f"{bs.sync_state_set_epoch}, not {cmd['sync_state_set_epoch']}")
        live, now = C.live_of(cmd), cmd["now_ms"]
        for r in sorted(new_set):
            if r not in bs.brokers:
                return result(Code.CONTROLLER_INVALID_REPLICAS,
                              f"Rejecting alter syncStateSet request because the replicas {r} don't exist")
            if not _alive(live, r, now):
                return result(Code.CONTROLLER_BROKER_NOT_ALIVE,
                              f"Rejecting alter syncStateSet request because the replicas {r} don't alive")
        if bs.master_id not in new_set:
            return result(Code.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED,
                          f"Rejecting alter syncStateSet request because the newSyncStateSet don't contains "
                          f"origin leader {bs.master_id}")
        bs.sync_state_set = new_set
        bs.sync_state_set_epoch += 1
        ev = {"type": "AlterSyncStateSet", "brokerName": name, "newSyncStateSet": sorted(new_set),
              "syncStateSetEpoch": bs.sync_state_set_epoch}
        return result(Code.SUCCESS, header={"newSyncStateSetEpoch": bs.sync_state_set_epoch},
                      body={"syncStateSet": sorted(new_set), "syncStateSetEpoch": bs.sync_state_set_epoch},
                      events=[ev])

    def _clean_broker_data(self, cmd: dict) -> dict:
        name = cmd["name"]
        ids = cmd.get("ids")
        bs = self.sets.get(name)
        live, now = C.live_of(cmd), cmd["now_ms"]
        if not cmd.get("clean_living"):
            if not ids and bs is not None and bs.master_id is not None:
                return result(Code.CONTROLLER_INVALID_CLEAN_BROKER_METADATA,
                              f"Broker {name} is still alive, clean up failure")
            if ids:
                for i in ids:
                    if _alive(live, i, now):
                        return result(Code.CONTROLLER_INVALID_CLEAN_BROKER_METADATA,
                                      f"Broker [{name},  {i}] is still alive, clean up failure")
        if bs is None:
            return result(Code.CONTROLLER_INVALID_CLEAN_BROKER_METADATA,
                          f"Broker {name} is not existed,clean broker data failure.")
        ev = {"type": "CleanBrokerData", "brokerName": name, "brokerIdSetToClean": sorted(ids) if ids else None}
        if not ids:
            del self.sets[name]
            return result(Code.SUCCESS, events=[ev])
        for i in ids:
            bs.brokers.pop(i, None)
            bs.sync_state_set.discard(i)
        if bs.master_id in ids:
            # Differs from RocketMQ, which keeps a removed master's id: fence it with a new epoch.
            bs.master_id = None
            bs.master_epoch += 1
            ev["masterEpoch"] = bs.master_epoch
        if not bs.brokers:
            del self.sets[name]  # never half a set: RocketMQ could drop one of its two tables only
        return result(Code.SUCCESS, events=[ev])

    def _read_event(self, cmd: dict) -> dict:
        return result(Code.SUCCESS)  # a read barrier: no state, no events

    # ------------------------------------------------------------------ reads
    def get_next_broker_id(self, cluster: str, name: str) -> dict:
        bs = self.sets.get(name)
        return result(Code.SUCCESS, header={"clusterName": cluster, "brokerName": name,
                                            "nextBrokerId": bs.next_broker_id if bs else 1})

    def get_replica_info(self, name: str) -> dict:
        bs = self.sets.get(name)
        if bs is None:
            return result(Code.CONTROLLER_BROKER_METADATA_NOT_EXIST, "Broker metadata is not existed")
        return result(Code.SUCCESS, header={"masterBrokerId": bs.master_id, "masterAddress": bs.address(bs.master_id),
                                            "masterEpoch": bs.master_epoch},
                      body={"syncStateSet": sorted(bs.sync_state_set), "syncStateSetEpoch": bs.sync_state_set_epoch})

    def get_sync_state_data(self, names: Iterable[str], live_of: Callable[[str], dict[int, BrokerLiveInfo]],
                            now_ms: int) -> dict:
        table = {}
        for name in names:
            bs = self.sets.get(name)
            if bs is None:
                continue  # RocketMQ skips unknown names silently
            live = live_of(name)

            def ident(i: int, bs: BrokerSet = bs, live: dict = live) -> dict:
                return {"brokerName": bs.name, "brokerId": i, "brokerAddress": bs.address(i),
                        "alive": _alive(live, i, now_ms)}

            table[name] = {"masterBrokerId": bs.master_id, "masterAddress": bs.address(bs.master_id),
                           "masterEpoch": bs.master_epoch, "syncStateSetEpoch": bs.sync_state_set_epoch,
                           "inSyncReplicas": [ident(i) for i in sorted(bs.sync_state_set) if i in bs.brokers],
                           "notInSyncReplicas": [ident(i) for i in sorted(bs.brokers) if i not in bs.sync_state_set]}
        return result(Code.SUCCESS, body={"replicasInfoTable": table})

    def sets_needing_election(self, live_of: Callable[[str], dict[int, BrokerLiveInfo]], now_ms: int) -> list[str]:
        """RocketMQ's scanNeedReelectBrokerSets: a master that is not alive while some replica is."""
        out = []
        for name, bs in sorted(self.sets.items()):
            if bs.master_id is None:
                continue
            live = live_of(name)
            if not _alive(live, bs.master_id, now_ms) and any(_alive(live, i, now_ms) for i in bs.brokers):
                out.append(name)
        return out

    # ------------------------------------------------------------------ snapshots
    def snapshot(self, out: BinaryIO) -> None:
        """A versioned, deterministic encoding: the same state always gives the same bytes."""
        out.write(msgpack.packb({"version": SNAPSHOT_VERSION, "applied": self.applied,
                                 "sets": [bs.to_wire() for _, bs in sorted(self.sets.items())]}, use_bin_type=True))

    def restore(self, inp: BinaryIO) -> None:
        state = msgpack.unpackb(inp.read(), raw=False, strict_map_key=False)
        if state.get("version") != SNAPSHOT_VERSION:
            raise ValueError(f"unsupported controller snapshot version {state.get('version')!r}")
        self.applied = state["applied"]
        self.sets = {w[1]: BrokerSet.from_wire(w) for w in state["sets"]}
        for fn in self._restore_listeners:
            fn(self.applied)


def _alive(live: dict[int, BrokerLiveInfo], broker_id: int, now_ms: int) -> bool:
    info = live.get(broker_id)
    return info is not None and info.alive_at(now_ms)
