"""The simulator's network: per-seed drops, delays, duplicates, partitions and corrupted chunks.

Nodes send through a `SimTransport` (the runtime's transport interface); a message
arrives after a drawn delay at whatever incarnation of its destination is running
then, through that process's gate, unless a partition separates the two ends at
sending or at arrival. InstallSnapshot chunks may arrive with a flipped bit, which
the receiver's checksum must catch (TCP's own checksum is weak, and the snapshot
verification is the line of defence the mutation `snapshot_apply_unverified` removes).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass, replace

from .messages import Message, SnapChunk
from .simloop import Gate


@dataclass
class NetFaults:
    delay_ms: tuple[float, float] = (1.0, 8.0)
    drop: float = 0.0
    duplicate: float = 0.0
    long_delay: float = 0.0  # occasionally a message takes up to 100 ms more
    corrupt_chunk: float = 0.0  # a snapshot chunk arrives with one bit flipped
    faults_on: bool = True


class SimNetwork:
    def __init__(self, loop: asyncio.AbstractEventLoop, rng: random.Random, faults: NetFaults) -> None:
        self.loop = loop
        self.rng = rng
        self.faults = faults
        self.partition: dict[int, int] = {}  # node -> side; empty = fully connected
        # node -> (its running gate, its message handler); absent while the node is down
        self.endpoints: dict[int, tuple[Gate, Callable[[Message], None]]] = {}

    def connected(self, a: int, b: int) -> bool:
        return not self.partition or self.partition.get(a) == self.partition.get(b)

    def delay(self) -> float:
        lo, hi = self.faults.delay_ms
        d = self.rng.uniform(lo, hi)
        if self.faults.faults_on and self.rng.random() < self.faults.long_delay:
            d += self.rng.uniform(0, 100)
        return d / 1000.0

    def send(self, m: Message) -> None:
        f = self.faults
        if not self.connected(m.src, m.dst) or (f.faults_on and self.rng.random() < f.drop):
            return
        if isinstance(m, SnapChunk) and m.data and f.faults_on and self.rng.random() < f.corrupt_chunk:
            bad = bytearray(m.data)
            bad[self.rng.randrange(len(bad))] ^= 1 << self.rng.randrange(8)
            m = replace(m, data=bytes(bad))
        self.loop.call_later(self.delay(), self._arrive, m)
        if f.faults_on and self.rng.random() < f.duplicate:
            self.loop.call_later(self.delay() * 3, self._arrive, m)

    def _arrive(self, m: Message) -> None:
        ep = self.endpoints.get(m.dst)
        if ep is not None and self.connected(m.src, m.dst):
            gate, handler = ep
            gate.run_soon(handler, m)


class SimTransport:
    """The runtime's transport for one incarnation of one node."""

    def __init__(self, net: SimNetwork, node_id: int, gate: Gate, on_message: Callable[[Message], None]) -> None:
        self.net = net
        self.node_id = node_id
        self.gate = gate
        self.on_message = on_message
        self.stats: dict[str, int] = {"frames_sent": 0}

    async def start(self) -> None:
        self.net.endpoints[self.node_id] = (self.gate, self.on_message)

    async def stop(self) -> None:
        if self.net.endpoints.get(self.node_id, (None,))[0] is self.gate:
            del self.net.endpoints[self.node_id]

    def send(self, msg: Message) -> None:
        if self.gate.alive:
            self.stats["frames_sent"] += 1
            self.net.send(msg)

    def send_many(self, msgs: list[Message]) -> None:
        for m in msgs:
            self.send(m)
