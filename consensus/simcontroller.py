"""The controller workload: RocketMQ controller requests against the real `ControllerStateMachine`.

Clients send the five write requests (apply broker id, register, elect master,
alter sync state set, clean broker data) with random, often conflicting, fields
and read replica info in every read mode, over a few broker sets. The
linearizability model is the state machine itself: one broker set's state is a
key (sets are independent), and an op is consistent when applying its command
to that state gives the response the client saw.
"""

from __future__ import annotations

import random
from typing import Any, cast

import msgspec

from electra.state import commands as C
from electra.state.liveness import BrokerLiveInfo
from electra.state.machine import BrokerSet, ControllerStateMachine
from electra.state.machine import _SetRecord as SetRecord

from .linearizability import Model, Op, _freeze
from .node import StateMachine
from .simcheck_controller import ControllerInvariants
from .simworkloads import READ_MODES, ClientOp, Invariants

CLUSTER = "sim"


def _addr(broker_id: int) -> str:
    return f"10.0.0.{broker_id}:10911"


def _state_machine_of(state: bytes | None, name: str) -> ControllerStateMachine:
    sm = ControllerStateMachine()
    if state is not None:
        sm.sets[name] = BrokerSet.from_wire(msgspec.msgpack.decode(state, type=SetRecord))
    return sm


def _frozen_set(sm: ControllerStateMachine, name: str) -> bytes | None:
    """The set's state as the search keeps it: its snapshot record's bytes (hashable, canonical)."""
    bs = sm.sets.get(name)
    return None if bs is None else msgspec.msgpack.encode(bs.to_wire())


def _step(state: Any, op: Op) -> tuple[bool, Any]:
    name = op.key
    sm = _state_machine_of(state, name)
    if op.kind == "read":
        return op.status != "ok" or _freeze(sm.get_replica_info(name)) == _freeze(op.output), state
    res = sm.apply(1, op.value)
    return op.status != "ok" or _freeze(res) == _freeze(op.output), _frozen_set(sm, name)


CONTROLLER_MODEL = Model(frozenset({"command", "read"}), frozenset({"read"}), _step)


class ControllerWorkload:
    name = "controller"
    model = CONTROLLER_MODEL

    def __init__(self, sets: int = 2, brokers: int = 3, read_ratio: float = 0.3) -> None:
        self.sets = sets
        self.brokers = brokers
        self.read_ratio = read_ratio
        self._issued: set[bytes] = set()  # every command sent so far (one workload per seed)

    def state_machine(self) -> StateMachine:
        return cast(StateMachine, ControllerStateMachine())

    def _live(self, rng: random.Random, now_ms: int) -> list[BrokerLiveInfo]:
        return [BrokerLiveInfo(i, _addr(i), now_ms if rng.random() < 0.7 else now_ms - 60_000,
                               epoch=rng.randrange(3), max_offset=rng.randrange(100), priority=rng.randrange(3))
                for i in range(1, self.brokers + 1) if rng.random() < 0.8]

    def next_op(self, rng: random.Random, op_id: int, now_ms: int) -> ClientOp:
        name = f"set{rng.randrange(self.sets)}"
        if rng.random() < self.read_ratio:
            mode = rng.choice(("log", *READ_MODES))
            if mode != "log":
                return ClientOp(name, "read", name, mode, read=lambda sm: sm.get_replica_info(name))
        r = 0.3 + 0.7 * rng.random()
        bid = rng.randrange(1, self.brokers + 1)
        live = self._live(rng, now_ms)
        if r < 0.45:
            cmd = C.apply_broker_id(CLUSTER, name, bid, f"{_addr(bid)};{rng.randrange(2)}", now_ms)
        elif r < 0.6:
            cmd = C.register_broker(CLUSTER, name, bid, _addr(bid), now_ms, live)
        elif r < 0.8:
            who = C.CONTROLLER_TRIGGER if rng.random() < 0.3 else bid
            cmd = C.elect_master(CLUSTER, name, who, now_ms, live, designate=rng.random() < 0.2)
        elif r < 0.95:
            members = [i for i in range(1, self.brokers + 1) if rng.random() < 0.6] or [bid]
            cmd = C.alter_sync_state_set(name, bid, rng.randrange(4), members, rng.randrange(4), now_ms, live)
        else:
            cmd = C.clean_broker_data(CLUSTER, name, [bid] if rng.random() < 0.7 else None,
                                      rng.random() < 0.5, now_ms, live)
        # Acknowledged commands are looked for in the final log by their bytes, so no two may be
        # equal. Commands are decoded strictly (no room for a tag), so a repeat of an earlier one
        # (same fields in the same millisecond) is not sent; that client reads instead.
        if cmd in self._issued:
            return ClientOp(name, "read", name, "linearizable", read=lambda sm: sm.get_replica_info(name))
        self._issued.add(cmd)
        return ClientOp(name, "command", cmd, "log", command=cmd)

    def invariants(self) -> Invariants | None:
        return ControllerInvariants()
