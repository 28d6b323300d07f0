"""Linearizability checker for key-value register histories.

A history of put/get/cas operations is linearizable if some total order of the
operations respects real time (an op that returned before another was invoked
comes first) and replays correctly on a single register per key. Keys are
independent (P-compositionality), so each key is checked alone, which keeps the
search small. The search is Wing & Gong's with Lowe's memoisation, as in
Porcupine: walk the time-ordered list of call/return events, tentatively
linearize an op at its call event, backtrack when a return event is reached for
an op not yet linearized, and never revisit a (linearized set, state) pair.

Ops whose outcome is unknown (a client timed out) may take effect at any point
after their call, or never; ops that definitely failed are dropped.

What one key's state is and how an op changes it is a `Model`: `REGISTER` (the KV
state machine's put/get/cas) here; the simulator's controller workload supplies one
that steps the real controller state machine over one broker set (simcontroller.py).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class Op:
    process: int
    key: str
    kind: str  # one of the model's kinds: "put" | "get" | "cas" for REGISTER
    value: Any  # put: value; cas: (expected, new); get: None
    call: float
    ret: float  # math.inf when unknown
    output: Any  # get: value read; cas: bool; put: None
    status: str  # "ok" | "unknown"
    op_id: Any = None


@dataclass
class CheckResult:
    ok: bool
    key: str | None = None
    explanation: str = ""
    timed_out: bool = False


@dataclass(frozen=True)
class Model:
    """A sequential specification of one key: `step(state, op) -> (consistent?, new state)`.

    `reads` are kinds that never change the state: when their outcome is unknown they
    constrain nothing and are dropped. States must be hashable after `_freeze`.
    """

    kinds: frozenset[str]
    reads: frozenset[str]
    step: Callable[[Any, Op], tuple[bool, Any]]


class History:
    """Builds ops from invoke/ok/fail/unknown events as a client library observes them."""

    def __init__(self, model: Model | None = None) -> None:
        self.model = model or REGISTER
        self._open: dict[Any, dict[str, Any]] = {}
        self._done: list[Op] = []

    def invoke(self, op_id: Any, process: int, key: str, kind: str, value: Any, t: float) -> None:
        if kind not in self.model.kinds:
            raise ValueError(f"unknown op kind {kind!r}")
        if op_id in self._open:
            raise ValueError(f"op {op_id!r} invoked twice")
        self._open[op_id] = {"process": process, "key": key, "kind": kind, "value": value, "call": t}

    def ok(self, op_id: Any, output: Any, t: float) -> None:
        o = self._open.pop(op_id)
        self._done.append(Op(o["process"], o["key"], o["kind"], o["value"], o["call"], t, output, "ok", op_id))

    def fail(self, op_id: Any, t: float | None = None) -> None:
        self._open.pop(op_id)  # definitely did not take effect: irrelevant to linearizability

    def unknown(self, op_id: Any, t: float | None = None) -> None:
        o = self._open.pop(op_id)
        self._done.append(Op(o["process"], o["key"], o["kind"], o["value"], o["call"], math.inf, None,
                             "unknown", op_id))

    def ops(self) -> list[Op]:
        pending = [Op(o["process"], o["key"], o["kind"], o["value"], o["call"], math.inf, None, "unknown", i)
                   for i, o in self._open.items()]
        return self._done + pending


def _register_step(state: Any, op: Op) -> tuple[bool, Any]:
    """Apply `op` to a register holding `state`: (consistent?, new state)."""
    if op.kind == "put":
        return True, op.value
    if op.kind == "get":
        return (op.status != "ok" or op.output == state), state
    expected, new = op.value
    if op.status != "ok":
        # An unknown cas that fails changes nothing, which is the same as never linearizing it.
        return state == expected, new
    if op.output:
        return state == expected, new
    return state != expected, state


REGISTER = Model(frozenset({"put", "get", "cas"}), frozenset({"get"}), _register_step)


class _Node:
    __slots__ = ("op", "idx", "is_call", "match", "prev", "next")

    def __init__(self, op: Op | None, idx: int, is_call: bool) -> None:
        self.op = op
        self.idx = idx
        self.is_call = is_call
        self.match: _Node | None = None  # call -> its return node (None for unknown ops)
        self.prev: _Node = self  # every node but the list's head is linked to a predecessor
        self.next: _Node | None = None


def _check_key(ops: list[Op], initial: Any, deadline: float, model: Model) -> tuple[bool, str, bool]:
    # Unknown reads constrain nothing and change nothing.
    ops = [op for op in ops if not (op.kind in model.reads and op.status != "ok")]
    step = model.step
    events: list[tuple[float, int, _Node]] = []
    for i, op in enumerate(ops):
        call = _Node(op, i, True)
        events.append((op.call, 0, call))
        if op.ret != math.inf:
            ret = _Node(op, i, False)
            call.match = ret
            events.append((op.ret, 1, ret))  # at equal times ops overlap: calls sort first
    events.sort(key=lambda e: (e[0], e[1]))
    head = _Node(None, -1, False)
    prev = head
    for _, _, node in events:
        prev.next = node
        node.prev = prev
        prev = node

    def lift(c: _Node) -> None:
        c.prev.next = c.next
        if c.next:
            c.next.prev = c.prev
        r = c.match
        if r is not None:
            r.prev.next = r.next
            if r.next:
                r.next.prev = r.prev

    def unlift(c: _Node) -> None:
        r = c.match
        if r is not None:
            r.prev.next = r
            if r.next:
                r.next.prev = r
        c.prev.next = c
        if c.next:
            c.next.prev = c

    state = initial
    linearized = 0
    cache: set[tuple[int, Any]] = set()
    stack: list[tuple[_Node, Any]] = []
    best_depth, best_block = -1, None
    steps = 0
    entry = head.next
    while entry is not None:
        steps += 1
        if steps % 4096 == 0 and time.monotonic() > deadline:
            return False, "search timed out", True
        if entry.is_call:
            assert entry.op is not None  # only the list's head has no op
            ok, new_state = step(state, entry.op)
            if ok:
                new_lin = linearized | (1 << entry.idx)
                key = (new_lin, _freeze(new_state))
                if key not in cache:
                    cache.add(key)
                    stack.append((entry, state))
                    state, linearized = new_state, new_lin
                    lift(entry)
                    entry = head.next
                    continue
            entry = entry.next
        else:
            if len(stack) > best_depth:
                best_depth, best_block = len(stack), entry.op
            if not stack:
                return False, _explain(best_block, best_depth), False
            entry, state = stack.pop()
            linearized &= ~(1 << entry.idx)
            unlift(entry)
            entry = entry.next
    return True, "", False


def _freeze(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _freeze(x)) for k, x in v.items()))
    return v


def _explain(op: Op | None, depth: int) -> str:
    if op is None:
        return "no consistent order exists"
    what = f"{op.kind}({op.value!r})" + (f" -> {op.output!r}" if op.kind != "put" else "")
    return (f"op {op.op_id!r} of process {op.process}: {what} during [{op.call}, {op.ret}] cannot be placed; "
            f"the longest consistent prefix had {depth} ops")


def check(history: list[Op] | History, initial: Any = None, timeout_s: float = 30.0,
          model: Model | None = None) -> CheckResult:
    """Check every key; report the first key that is not linearizable (never ok when unproven)."""
    if model is None:
        model = history.model if isinstance(history, History) else REGISTER
    ops = history.ops() if isinstance(history, History) else list(history)
    by_key: dict[str, list[Op]] = {}
    for op in ops:
        by_key.setdefault(op.key, []).append(op)
    deadline = time.monotonic() + timeout_s
    for key in sorted(by_key, key=str):
        ok, why, timed_out = _check_key(by_key[key], initial, deadline, model)
        if not ok:
            return CheckResult(False, key, why, timed_out)
    return CheckResult(True)
