"""A key-value register state machine: the engine's test and benchmark workload.

Commands are msgpack arrays `["put", key, value]`, `["get", key]` or
`["cas", key, expected, new]`; results are what a register model expects
(the linearizability checker uses the same model).
"""

from __future__ import annotations

from typing import Any, BinaryIO

import msgpack


def encode_put(key: str, value: Any) -> bytes:
    return _pack(["put", key, value])


def encode_get(key: str) -> bytes:
    return _pack(["get", key])


def encode_cas(key: str, expected: Any, new: Any) -> bytes:
    return _pack(["cas", key, expected, new])


def _pack(command: list[Any]) -> bytes:
    packed: bytes = msgpack.packb(command)  # msgpack has no type information
    return packed


class KVStateMachine:
    """Deterministic: the same commands in the same order give the same state."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}
        self.applied = 0

    def apply(self, index: int, command: bytes) -> Any:
        self.applied = index
        try:
            op = msgpack.unpackb(command)
        except Exception:
            return {"error": "undecodable command"}
        if not isinstance(op, list) or not op:
            return {"error": "command must be a non-empty array"}
        kind = op[0]
        if kind == "put" and len(op) == 3:
            self.data[op[1]] = op[2]
            return None
        if kind == "get" and len(op) == 2:
            return self.data.get(op[1])
        if kind == "cas" and len(op) == 4:
            if self.data.get(op[1]) == op[2]:
                self.data[op[1]] = op[3]
                return True
            return False
        return {"error": f"unknown command {kind!r}"}

    def snapshot(self, out: BinaryIO) -> None:
        out.write(msgpack.packb({"applied": self.applied, "data": self.data}))

    def restore(self, inp: BinaryIO) -> None:
        state = msgpack.unpackb(inp.read(), strict_map_key=False)
        self.applied, self.data = state["applied"], state["data"]


class CounterStateMachine:
    """Counts applied commands; the cheapest state machine, for throughput benchmarks."""

    def __init__(self) -> None:
        self.count = 0
        self.applied = 0

    def apply(self, index: int, command: bytes) -> int:
        self.applied = index
        self.count += 1
        return self.count

    def snapshot(self, out: BinaryIO) -> None:
        out.write(msgpack.packb([self.applied, self.count]))

    def restore(self, inp: BinaryIO) -> None:
        self.applied, self.count = msgpack.unpackb(inp.read())
