"""The controller's log entries: one typed command per RocketMQ request that writes.

A command carries everything its outcome depends on besides the replicated
state: the request's fields, and, where liveness matters, the proposer's clock
(`now_ms`) and the heartbeat records of that broker set (`live`). Apply
validates against the replicated state at that moment (compare-and-set), so two
conflicting requests proposed concurrently have exactly one winner.

Encoding (format v1, unchanged since the first release): one msgpack map per
command, the request type under `op`, then the fields under the names below, in
this order; `expected_master_epoch` is left out when there is none. msgspec
writes exactly the bytes the earlier dict-based encoder wrote, so logs and
snapshots written by any version decode here (tests/unit/test_commands.py
replays a log written by that encoder). Decoding checks every field's type and
RocketMQ's Java integer ranges (state/limits.py) and refuses unknown requests and
unknown fields: a command either decodes completely or is refused the same way
on every replica. A change of layout needs a new `op` (or a new format), never a
silent change of an existing one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TypeAlias

import msgspec

from .limits import Int32Field, Int64Field
from .liveness import BrokerLiveInfo

CONTROLLER_TRIGGER = -1  # broker id of an election the controller itself triggers


class _Command(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True, tag_field="op"):
    """Base of every command: tagged by `op`, strict on decode."""


class ApplyBrokerId(_Command, frozen=True, tag="apply_broker_id"):
    """RocketMQ APPLY_BROKER_ID: claim `broker_id` in a set (the first claim of a new set creates it)."""

    cluster: str
    name: str
    broker_id: Int64Field
    check_code: str  # RocketMQ's registerCheckCode, "address;timestamp"
    now_ms: Int64Field


class RegisterBroker(_Command, frozen=True, tag="register_broker"):
    """RocketMQ REGISTER_BROKER_TO_CONTROLLER: a broker with an id (re)joins, possibly at a new address."""

    cluster: str
    name: str
    broker_id: Int64Field
    addr: str
    now_ms: Int64Field
    live: list[BrokerLiveInfo]


class ElectMaster(_Command, frozen=True, tag="elect_master"):
    """RocketMQ CONTROLLER_ELECT_MASTER, from a broker, an admin (`designate`) or the controller.

    `broker_id` is the requesting broker, the admin's choice (`designate`), or
    CONTROLLER_TRIGGER. `expected_master_epoch` fences a proposal to the master epoch
    its proposer saw (the streaming job's elections): applied against any other epoch
    it changes nothing.
    """

    cluster: str
    name: str
    broker_id: Int64Field
    designate: bool
    unclean: bool
    now_ms: Int64Field
    live: list[BrokerLiveInfo]
    expected_master_epoch: Int32Field | None = None


class AlterSyncStateSet(_Command, frozen=True, tag="alter_sync_state_set"):
    """RocketMQ CONTROLLER_ALTER_SYNC_STATE_SET, fenced by the master and both epochs the master saw."""

    name: str
    master_id: Int64Field
    master_epoch: Int32Field
    new_set: list[Int64Field]
    sync_state_set_epoch: Int32Field
    now_ms: Int64Field
    live: list[BrokerLiveInfo]


class CleanBrokerData(_Command, frozen=True, tag="clean_broker_data"):
    """RocketMQ CLEAN_BROKER_DATA: forget some brokers (`ids`) or the whole set (`ids` None)."""

    cluster: str | None
    name: str
    ids: list[Int64Field] | None
    clean_living: bool
    now_ms: Int64Field
    live: list[BrokerLiveInfo]


class ReadEvent(_Command, frozen=True, tag="read_event"):
    """RocketMQ's READ_EVENT: a read barrier in the log that changes nothing (the legacy architecture's reads,
    api/legacy.py). Encoded as `{"op": "read_event"}`: it carries no clock, so `now_ms` is always 0."""

    now_ms: Int64Field = 0


Command: TypeAlias = ApplyBrokerId | RegisterBroker | ElectMaster | AlterSyncStateSet | CleanBrokerData | ReadEvent
COMMAND_TYPES: tuple[type[Command], ...] = (ApplyBrokerId, RegisterBroker, ElectMaster, AlterSyncStateSet,
                                            CleanBrokerData, ReadEvent)

_encoder = msgspec.msgpack.Encoder()
_decoder: msgspec.msgpack.Decoder[Command] = msgspec.msgpack.Decoder(Command)

Live: TypeAlias = Mapping[int, BrokerLiveInfo] | Iterable[BrokerLiveInfo]


def _live(live: Live) -> list[BrokerLiveInfo]:
    """Liveness records sorted by broker id: the same view always encodes to the same bytes."""
    infos = live.values() if isinstance(live, Mapping) else live
    return sorted(infos, key=lambda i: i.broker_id)


def live_by_id(live: Iterable[BrokerLiveInfo]) -> dict[int, BrokerLiveInfo]:
    """A command's liveness records by broker id (apply's lookups)."""
    return {info.broker_id: info for info in live}


def encode(cmd: Command) -> bytes:
    return _encoder.encode(cmd)


def decode(data: bytes) -> Command:
    """Decode a command; ValueError (naming the field, never its value) for anything that is not one."""
    try:
        return _decoder.decode(data)
    except msgspec.DecodeError as exc:
        reason = str(exc)
        if reason.endswith("at `$.op`"):  # msgspec quotes the unknown tag: name the field only
            reason = "unknown request type - at `$.op`"
        raise ValueError(f"not a controller command: {reason}") from None


# ---------------------------------------------------------------------- builders (the callers' entry points)
def apply_broker_id(cluster: str, name: str, broker_id: int, check_code: str, now_ms: int = 0) -> bytes:
    return encode(ApplyBrokerId(cluster, name, broker_id, check_code, now_ms))


def register_broker(cluster: str, name: str, broker_id: int, addr: str, now_ms: int, live: Live) -> bytes:
    return encode(RegisterBroker(cluster, name, broker_id, addr, now_ms, _live(live)))


def elect_master(cluster: str, name: str, broker_id: int, now_ms: int, live: Live, *, designate: bool = False,
                 unclean: bool = False, expected_master_epoch: int | None = None) -> bytes:
    return encode(ElectMaster(cluster, name, broker_id, designate, unclean, now_ms, _live(live),
                              expected_master_epoch))


def alter_sync_state_set(name: str, master_id: int, master_epoch: int, new_set: Iterable[int],
                         sync_state_set_epoch: int, now_ms: int, live: Live) -> bytes:
    return encode(AlterSyncStateSet(name, master_id, master_epoch, sorted(set(new_set)), sync_state_set_epoch,
                                    now_ms, _live(live)))


def clean_broker_data(cluster: str | None, name: str, ids: Iterable[int] | None, clean_living: bool,
                      now_ms: int, live: Live) -> bytes:
    return encode(CleanBrokerData(cluster, name, None if ids is None else sorted(set(ids)), clean_living, now_ms,
                                  _live(live)))


def read_event() -> bytes:
    """RocketMQ's READ_EVENT with `isProcessReadEvent`: an entry that changes nothing; once applied, a
    read of the state is linearizable. Only the legacy architecture writes it (docs/architectures.md)."""
    return encode(ReadEvent())
