"""What the simulator's clients do: a workload is a state machine, its operations and their model.

A client operation either goes through the log (`command`, proposed with
`RaftNode.propose_future`) or is a read (`read`, run by `RaftNode.read` in one of
its modes); the history records it under a key of the workload's linearizability
model (consensus/linearizability.py). Two workloads: `KVWorkload` (the KV register,
here) and `ControllerWorkload` (the real controller state machine, simcontroller.py).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from .kv import KVStateMachine, encode_get, encode_put
from .linearizability import REGISTER, Model
from .node import StateMachine

READ_MODES = ("linearizable", "lease", "follower")  # RaftNode.read modes the clients use; "log" reads propose


@dataclass
class ClientOp:
    key: str  # the linearizability key (a KV key, a broker set)
    kind: str  # a kind of the workload's model
    value: Any  # the op's input as the history records it
    mode: str  # "log" for commands, else the read mode
    command: bytes | None = None
    read: Callable[[Any], Any] | None = None


class Invariants(Protocol):
    """Workload-specific checks after every command a replica applies."""

    def after_apply(self, replica: tuple[int, int], sm: Any, index: int, command: bytes) -> str | None:
        """A violation's description, or None. `replica` is (node id, incarnation)."""
        ...

    def after_restore(self, replica: tuple[int, int], sm: Any) -> None:
        """A snapshot replaced the replica's whole state (commands in between were never seen)."""
        ...


class Workload(Protocol):
    name: str
    model: Model

    def state_machine(self) -> StateMachine: ...

    def next_op(self, rng: random.Random, op_id: int, now_ms: int) -> ClientOp: ...

    def invariants(self) -> Invariants | None: ...


class KVWorkload:
    """Puts of unique values and gets in every mode, over a few keys."""

    name = "kv"
    model = REGISTER

    def __init__(self, keys: int = 3, get_ratio: float = 0.5) -> None:
        self.keys = keys
        self.get_ratio = get_ratio

    def state_machine(self) -> StateMachine:
        return KVStateMachine()

    def next_op(self, rng: random.Random, op_id: int, now_ms: int) -> ClientOp:
        key = f"k{rng.randrange(self.keys)}"
        if rng.random() >= self.get_ratio:
            return ClientOp(key, "put", op_id, "log", command=encode_put(key, op_id))
        mode = rng.choice(("log", *READ_MODES))
        if mode == "log":
            return ClientOp(key, "get", None, mode, command=encode_get(key))
        return ClientOp(key, "get", None, mode, read=lambda sm: sm.data.get(key))

    def invariants(self) -> Invariants | None:
        return None
