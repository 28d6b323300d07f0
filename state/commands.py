"""The controller's log entries: one msgpack map per client request that writes.

A command carries everything its outcome depends on besides the replicated
state: the request's fields, and, where liveness matters, the proposer's clock
(`now_ms`) and the heartbeat records of that broker set (`live`). Apply
validates against the replicated state at that moment (compare-and-set), so two
conflicting requests proposed concurrently have exactly one winner.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgpack

from .limits import ints_within_int64, is_int32
from .liveness import BrokerLiveInfo

APPLY_BROKER_ID = "apply_broker_id"
REGISTER_BROKER = "register_broker"
ELECT_MASTER = "elect_master"
ALTER_SYNC_STATE_SET = "alter_sync_state_set"
CLEAN_BROKER_DATA = "clean_broker_data"
READ_EVENT = "read_event"  # a read barrier in the log (the legacy architecture's reads, api/legacy.py)
OPS = (APPLY_BROKER_ID, REGISTER_BROKER, ELECT_MASTER, ALTER_SYNC_STATE_SET, CLEAN_BROKER_DATA, READ_EVENT)
_INT32_FIELDS = ("master_epoch", "sync_state_set_epoch", "expected_master_epoch")  # Java int fields
CONTROLLER_TRIGGER = -1  # broker id of an election the controller itself triggers


def _live(live: dict[int, BrokerLiveInfo] | Iterable[BrokerLiveInfo]) -> list[dict]:
    infos = live.values() if isinstance(live, dict) else live
    return [i.to_wire() for i in sorted(infos, key=lambda i: i.broker_id)]


def _pack(d: dict) -> bytes:
    return msgpack.packb(d, use_bin_type=True)


def apply_broker_id(cluster: str, name: str, broker_id: int, check_code: str, now_ms: int = 0) -> bytes:
    return _pack({"op": APPLY_BROKER_ID, "cluster": cluster, "name": name, "broker_id": broker_id,
                  "check_code": check_code, "now_ms": now_ms})


def register_broker(cluster: str, name: str, broker_id: int, addr: str, now_ms: int, live) -> bytes:
    return _pack({"op": REGISTER_BROKER, "cluster": cluster, "name": name, "broker_id": broker_id,
                  "addr": addr, "now_ms": now_ms, "live": _live(live)})


def elect_master(cluster: str, name: str, broker_id: int, now_ms: int, live, *, designate: bool = False,
                 unclean: bool = False, expected_master_epoch: int | None = None) -> bytes:
    """`broker_id` is the requesting broker, the admin's choice (`designate`), or CONTROLLER_TRIGGER.

    `expected_master_epoch` fences a proposal to the master epoch its proposer saw (the
    streaming job's elections): applied against any other epoch it changes nothing.
    """
    cmd = {"op": ELECT_MASTER, "cluster": cluster, "name": name, "broker_id": broker_id,
           "designate": designate, "unclean": unclean, "now_ms": now_ms, "live": _live(live)}
    if expected_master_epoch is not None:
        cmd["expected_master_epoch"] = expected_master_epoch
    return _pack(cmd)


def alter_sync_state_set(name: str, master_id: int, master_epoch: int, new_set: Iterable[int],
                         sync_state_set_epoch: int, now_ms: int, live) -> bytes:
    return _pack({"op": ALTER_SYNC_STATE_SET, "name": name, "master_id": master_id,
                  "master_epoch": master_epoch, "new_set": sorted(set(new_set)),
                  "sync_state_set_epoch": sync_state_set_epoch, "now_ms": now_ms, "live": _live(live)})


def clean_broker_data(cluster: str | None, name: str, ids: Iterable[int] | None, clean_living: bool,
                      now_ms: int, live) -> bytes:
    return _pack({"op": CLEAN_BROKER_DATA, "cluster": cluster, "name": name,
                  "ids": None if ids is None else sorted(set(ids)), "clean_living": clean_living,
                  "now_ms": now_ms, "live": _live(live)})


def read_event() -> bytes:
    """RocketMQ's READ_EVENT with `isProcessReadEvent`: an entry that changes nothing; once applied, a
    read of the state is linearizable. Only the legacy architecture writes it (docs/architectures.md)."""
    return _pack({"op": READ_EVENT})


def decode(data: bytes) -> dict:
    """Decode a command; raises ValueError for anything that is not one."""
    try:
        cmd = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as exc:
        raise ValueError(f"undecodable controller command: {exc}") from exc
    if not isinstance(cmd, dict) or cmd.get("op") not in OPS:
        raise ValueError("not a controller command")
    # The last line of defence against numbers no Java broker can hold (state/limits.py).
    if not ints_within_int64(cmd):
        raise ValueError("an integer field is outside Java's long range")
    for key in _INT32_FIELDS:
        if cmd.get(key) is not None and not is_int32(cmd[key]):
            raise ValueError(f"{key}: an int32 is required")
    live_of(cmd)  # every liveness record, used or not, within its types
    return cmd


def live_of(cmd: dict) -> dict[int, BrokerLiveInfo]:
    return {d["broker_id"]: BrokerLiveInfo.from_wire(d) for d in cmd.get("live") or ()}
