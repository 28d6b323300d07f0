"""The controller state machine as a model for the linearizability checker (one broker set per key).

The checker (consensus/linearizability.py) needs `step(state, op) -> (consistent?, new
state)`. A controller's answer may depend on something no client sees: the heartbeat
table of the node that proposed the command (who is alive decides an election and an
alter of the sync-state set). So the model is nondeterministic, and as in Porcupine its
state is the *set* of concrete states the history allows: each op maps every concrete
state to the outcomes it could have, keeps those matching what the client was told, and
the op is consistent if any remains. An op with an unknown outcome keeps them all.

A concrete state mirrors state/machine.py's `BrokerSet` for what the workload touches:
`(broker ids, next broker id, master, master epoch, sync-state set, its epoch)`, or
`None` while the set does not exist. The workload gives each broker id one fixed address
and register check code, so addresses need no tracking. Elections follow
state/elect_policy.py with liveness unknown: any member of the sync-state set may win,
the old master may be kept, or nobody is electable.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

from electra.consensus.linearizability import Model, Op
from electra.state.codes import Code

WRITES = ("apply_broker_id", "register", "elect", "alter_sss")
READS = ("replica_info", "next_broker_id")


class SetState(NamedTuple):
    brokers: frozenset[int]
    next_id: int
    master: int | None
    epoch: int
    sss: frozenset[int]
    sss_epoch: int


INITIAL: frozenset = frozenset({None})  # the set of possible states: the broker set does not exist yet

Outcome = tuple[dict[str, Any], Any]  # (what the answer must match, the state after)


def _outcomes(s: SetState | None, kind: str, a: dict[str, Any]) -> Iterator[Outcome]:
    C = Code
    if kind == "apply_broker_id":
        bid = a["bid"]
        if s is None:
            if bid != 1:
                yield {"code": C.CONTROLLER_BROKER_ID_INVALID}, s
            else:
                yield {"code": C.SUCCESS}, SetState(frozenset({1}), 2, None, 0, frozenset(), 0)
        elif bid in s.brokers:
            yield {"code": C.SUCCESS}, s
        else:
            yield {"code": C.SUCCESS}, s._replace(brokers=s.brokers | {bid}, next_id=s.next_id + 1)
    elif kind == "register":
        if s is None or a["bid"] not in s.brokers:
            yield {"code": C.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED}, s
        else:
            seen = {"code": C.SUCCESS, "sss": sorted(s.sss), "sse": s.sss_epoch}
            yield {**seen, "master": None}, s  # the master is named only while alive
            if s.master is not None:
                yield {**seen, "master": s.master, "mepoch": s.epoch}, s
    elif kind == "elect":
        yield from _elect(s, a["bid"], a.get("designate", False))
    elif kind == "alter_sss":
        yield from _alter(s, a)
    elif kind == "replica_info":
        if s is None:
            yield {"code": C.CONTROLLER_BROKER_METADATA_NOT_EXIST}, s
        else:
            yield {"code": C.SUCCESS, "master": s.master, "mepoch": s.epoch, "sss": sorted(s.sss),
                   "sse": s.sss_epoch}, s
    elif kind == "next_broker_id":
        yield {"code": C.SUCCESS, "next": 1 if s is None else s.next_id}, s
    else:
        raise ValueError(f"the controller model has no operation {kind!r}")


def _elected(s: SetState, new: int) -> Outcome:
    after = s._replace(master=new, epoch=s.epoch + 1, sss=frozenset({new}), sss_epoch=s.sss_epoch + 1)
    return {"code": Code.SUCCESS, "master": new, "mepoch": after.epoch, "sse": after.sss_epoch}, after


def _elect(s: SetState | None, bid: int, designate: bool) -> Iterator[Outcome]:
    C = Code
    if s is None:
        yield {"code": C.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED}, s
        return
    if s.epoch == 0:  # the first broker to ask becomes master, if it is a member
        if bid not in s.brokers:
            yield {"code": C.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED}, s
        else:
            yield _elected(s, bid)
        return
    still = {"code": C.CONTROLLER_MASTER_STILL_EXIST, "master": s.master, "mepoch": s.epoch}
    yield {"code": C.CONTROLLER_ELECT_MASTER_FAILED}, s  # nobody electable is alive
    if designate:
        if bid == s.master:
            yield still, s
        elif bid in s.sss:
            yield _elected(s, bid)
        return
    if s.master in s.sss:
        yield still, s  # the old master is alive
    for m in sorted(s.sss - {s.master}):
        yield _elected(s, m)


def _alter(s: SetState | None, a: dict[str, Any]) -> Iterator[Outcome]:
    C = Code
    new = frozenset(a["sss"])
    if s is None or new == s.sss:
        yield {"code": C.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED}, s
        return
    if s.master is None or s.master != a["master"]:
        yield {"code": C.CONTROLLER_INVALID_MASTER}, s
        return
    if a["mepoch"] != s.epoch:
        yield {"code": C.CONTROLLER_FENCED_MASTER_EPOCH}, s
        return
    if a["sse"] != s.sss_epoch:
        yield {"code": C.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH}, s
        return
    for r in sorted(new):
        if r not in s.brokers:
            yield {"code": C.CONTROLLER_INVALID_REPLICAS}, s
            return
        yield {"code": C.CONTROLLER_BROKER_NOT_ALIVE}, s  # r's heartbeat may have lapsed on the proposer
    if s.master not in new:
        yield {"code": C.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED}, s
        return
    after = s._replace(sss=new, sss_epoch=s.sss_epoch + 1)
    yield {"code": C.SUCCESS, "sse": after.sss_epoch}, after


def _matches(expected: dict[str, Any], out: dict[str, Any]) -> bool:
    return all(out.get(k) == v for k, v in expected.items())


def step(states: frozenset, op: Op) -> tuple[bool, frozenset]:
    """The checker's model step over the set of possible states (see the module docstring)."""
    after = set()
    known = op.status == "ok"
    for s in states:
        for expected, s2 in _outcomes(s, op.kind, op.value):
            if not known or _matches(expected, op.output or {}):
                after.add(s2)
    return bool(after), frozenset(after)


def describe(states: frozenset) -> str:
    return "; ".join("absent" if s is None else
                     f"brokers={sorted(s.brokers)} next={s.next_id} master={s.master}@{s.epoch} "
                     f"sss={sorted(s.sss)}@{s.sss_epoch}" for s in sorted(states, key=str))


MODEL = Model(kinds=frozenset(WRITES + READS), reads=frozenset(READS), step=step)
