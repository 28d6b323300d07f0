"""Typed results of the controller's requests, and their RocketMQ responses.

One result type per request, carrying the RocketMQ code and what the outcome
depends on (mostly the broker set's view right after it). `to_response()` gives
the response RocketMQ's controller sends for that request and code: `code`,
`remark`, `header` (RocketMQ's response header fields) and `body`; which header
fields and body a response has depends on the request and the code, and this
module is the one place that says so. Writes also carry the events they produced
(RocketMQ's event types, typed here too), which the state machine hands to its
listeners in their wire form (`to_public()`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeAlias

import msgspec

from .codes import Code
from .views import BrokerSetView

Event: TypeAlias = dict[str, Any]  # an event's wire form: `type`, `brokerName`, then its fields (camelCase)


class _Event(msgspec.Struct, frozen=True, omit_defaults=True, rename="camel", tag_field="type"):
    """RocketMQ's event types; `to_public()` is the wire form listeners, the journal and the tables get."""

    def to_public(self) -> Event:
        out: Event = msgspec.to_builtins(self)
        return out


class ApplyBrokerIdEvent(_Event, frozen=True, tag="ApplyBrokerId"):
    cluster_name: str
    broker_name: str
    broker_address: str
    register_check_code: str
    new_broker_id: int


class UpdateBrokerAddressEvent(_Event, frozen=True, tag="UpdateBrokerAddress"):
    cluster_name: str
    broker_name: str
    broker_address: str
    broker_id: int


class ElectMasterEvent(_Event, frozen=True, tag="ElectMaster"):
    broker_name: str
    new_master_elected: bool
    new_master_broker_id: int | None  # None: no candidate, the set is left without master
    master_epoch: int
    sync_state_set_epoch: int


class AlterSyncStateSetEvent(_Event, frozen=True, tag="AlterSyncStateSet"):
    broker_name: str
    new_sync_state_set: list[int]
    sync_state_set_epoch: int


class CleanBrokerDataEvent(_Event, frozen=True, tag="CleanBrokerData"):
    broker_name: str
    broker_id_set_to_clean: list[int] | None  # None: the whole set
    master_epoch: int | None = None  # set when the master was cleaned (its epoch moved on)


ControllerEvent: TypeAlias = (ApplyBrokerIdEvent | UpdateBrokerAddressEvent | ElectMasterEvent | AlterSyncStateSetEvent
                              | CleanBrokerDataEvent)


@dataclass(frozen=True, kw_only=True)
class Result:
    code: Code
    remark: str = ""

    @property
    def ok(self) -> bool:
        return self.code == Code.SUCCESS

    def header(self) -> dict[str, Any]:
        return {}

    def body(self) -> Any:
        return None

    def to_response(self) -> dict[str, Any]:
        return {"code": int(self.code), "remark": self.remark, "header": self.header(), "body": self.body()}


@dataclass(frozen=True, kw_only=True)
class WriteResult(Result):
    """The result of an applied command; a command that does not decode gets this base type (2005)."""

    events: tuple[ControllerEvent, ...] = ()


def _master_header(view: BrokerSetView) -> dict[str, Any]:
    return {"masterBrokerId": view.master_broker_id, "masterAddress": view.master_address,
            "masterEpoch": view.master_epoch, "syncStateSetEpoch": view.sync_state_set_epoch}


def _sync_state_body(view: BrokerSetView) -> dict[str, Any]:
    return {"syncStateSet": list(view.sync_state_set), "syncStateSetEpoch": view.sync_state_set_epoch}


# ---------------------------------------------------------------------- writes
@dataclass(frozen=True, kw_only=True)
class ApplyBrokerIdResult(WriteResult):
    """The request's cluster and set name, refused (2014) or not: RocketMQ builds its
    ApplyBrokerIdResponseHeader(clusterName, brokerName) before any check."""

    cluster_name: str
    broker_name: str

    def header(self) -> dict[str, Any]:
        return {"clusterName": self.cluster_name, "brokerName": self.broker_name}


_NO_MASTER: dict[str, Any] = dict.fromkeys(("masterBrokerId", "masterAddress", "masterEpoch", "syncStateSetEpoch"))


@dataclass(frozen=True, kw_only=True)
class RegisterBrokerResult(WriteResult):
    """The request's cluster and set name, refused (2010) or not (RocketMQ builds its
    RegisterBrokerToControllerResponseHeader(clusterName, brokerName) before any check); the
    master's fields null when refused or when the master is not alive."""

    cluster_name: str
    broker_name: str
    state: BrokerSetView | None = None  # the set after registering (None: refused)
    master_alive: bool = False  # the master is reported only while its heartbeat is fresh

    def header(self) -> dict[str, Any]:
        master = _master_header(self.state) if self.state is not None and self.master_alive else _NO_MASTER
        return {"clusterName": self.cluster_name, "brokerName": self.broker_name, **master}

    def body(self) -> Any:
        return None if self.state is None else _sync_state_body(self.state)


@dataclass(frozen=True, kw_only=True)
class ElectMasterResult(WriteResult):
    """SUCCESS: the new master; MASTER_STILL_EXIST and FENCED_MASTER_EPOCH: the current one; else nothing."""

    state: BrokerSetView | None = None

    def header(self) -> dict[str, Any]:
        return {} if self.state is None else _master_header(self.state)

    def body(self) -> Any:
        if self.state is None:
            return None
        sync_state_set = list(self.state.sync_state_set)
        if self.code == Code.SUCCESS:
            group = {"cluster": self.state.cluster_name, "brokerName": self.state.broker_name,
                     "brokerAddrs": dict(self.state.brokers)}
            return {"brokerMemberGroup": group, "syncStateSet": sync_state_set}
        if self.code == Code.CONTROLLER_MASTER_STILL_EXIST:
            return {"brokerMemberGroup": None, "syncStateSet": sync_state_set}
        return None


@dataclass(frozen=True, kw_only=True)
class AlterSyncStateSetResult(WriteResult):
    state: BrokerSetView | None = None  # the set after the change (None: refused)

    def header(self) -> dict[str, Any]:
        return {} if self.state is None else {"newSyncStateSetEpoch": self.state.sync_state_set_epoch}

    def body(self) -> Any:
        return None if self.state is None else _sync_state_body(self.state)


@dataclass(frozen=True, kw_only=True)
class CleanBrokerDataResult(WriteResult):
    pass


# ---------------------------------------------------------------------- reads
@dataclass(frozen=True, kw_only=True)
class NextBrokerIdResult(Result):
    cluster_name: str
    broker_name: str
    next_broker_id: int

    def header(self) -> dict[str, Any]:
        return {"clusterName": self.cluster_name, "brokerName": self.broker_name,
                "nextBrokerId": self.next_broker_id}


@dataclass(frozen=True, kw_only=True)
class ReplicaInfoResult(Result):
    state: BrokerSetView | None = None  # None: no such set

    def header(self) -> dict[str, Any]:
        if self.state is None:
            return {}
        return {"masterBrokerId": self.state.master_broker_id, "masterAddress": self.state.master_address,
                "masterEpoch": self.state.master_epoch}

    def body(self) -> Any:
        return None if self.state is None else _sync_state_body(self.state)


@dataclass(frozen=True)
class ReplicasInfo:
    """One set in GET_SYNC_STATE_DATA: its view and which of its brokers this node sees alive."""

    state: BrokerSetView
    alive: frozenset[int]

    def to_public(self) -> dict[str, Any]:
        st = self.state

        def ident(i: int) -> dict[str, Any]:
            return {"brokerName": st.broker_name, "brokerId": i, "brokerAddress": st.brokers.get(i),
                    "alive": i in self.alive}

        return {"masterBrokerId": st.master_broker_id, "masterAddress": st.master_address,
                "masterEpoch": st.master_epoch, "syncStateSetEpoch": st.sync_state_set_epoch,
                "inSyncReplicas": [ident(i) for i in st.sync_state_set if i in st.brokers],
                "notInSyncReplicas": [ident(i) for i in st.brokers if i not in st.sync_state_set]}


@dataclass(frozen=True, kw_only=True)
class SyncStateDataResult(Result):
    sets: dict[str, ReplicasInfo] = field(default_factory=dict)  # by set name; unknown names are left out

    def body(self) -> Any:
        return {"replicasInfoTable": {name: info.to_public() for name, info in self.sets.items()}}
