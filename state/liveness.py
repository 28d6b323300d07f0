"""Broker liveness: who sent a heartbeat recently, with what epoch, offsets and priority.

Liveness is not replicated state. A controller node keeps it from the heartbeats
it sees (today: the heartbeat endpoint of that node; later: the streaming job),
and every command whose outcome depends on liveness carries a copy of the
relevant group's records plus the proposer's clock (`now_ms`). Apply then
decides from the command alone, so every replica reaches the same result.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

DEFAULT_TIMEOUT_MS = 10_000
LOWEST_PRIORITY = 2**31 - 1  # RocketMQ's Integer.MAX_VALUE: lower numbers are preferred


@dataclass(frozen=True)
class BrokerLiveInfo:
    broker_id: int
    broker_addr: str
    last_update_ms: int
    timeout_ms: int = DEFAULT_TIMEOUT_MS
    epoch: int = -1
    max_offset: int = -1
    confirm_offset: int = -1
    priority: int = LOWEST_PRIORITY

    def alive_at(self, now_ms: int) -> bool:
        return self.last_update_ms + self.timeout_ms >= now_ms

    def to_wire(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_wire(d: dict) -> BrokerLiveInfo:
        return BrokerLiveInfo(**d)


class LivenessTable:
    """Heartbeats seen by this node, keyed by (cluster, broker set, broker id)."""

    def __init__(self) -> None:
        self._table: dict[tuple[str, str, int], BrokerLiveInfo] = {}

    def on_heartbeat(self, cluster: str, name: str, broker_id: int, addr: str, now_ms: int, *,
                     timeout_ms: int = DEFAULT_TIMEOUT_MS, epoch: int = -1, max_offset: int = -1,
                     confirm_offset: int = -1, priority: int = LOWEST_PRIORITY) -> None:
        """RocketMQ's update rule: offsets only move forward in (epoch, max offset) order.

        Unlike RocketMQ, the first heartbeat's confirm offset is kept and the address
        follows the broker (it may move after a restart).
        """
        key = (cluster, name, broker_id)
        prev = self._table.get(key)
        if prev is not None and not (epoch > prev.epoch or (epoch == prev.epoch and max_offset > prev.max_offset)):
            epoch, max_offset, confirm_offset = prev.epoch, prev.max_offset, prev.confirm_offset
        self._table[key] = BrokerLiveInfo(broker_id, addr, now_ms, timeout_ms, epoch, max_offset,
                                          confirm_offset, priority)

    def group(self, cluster: str, name: str) -> dict[int, BrokerLiveInfo]:
        return {k[2]: v for k, v in self._table.items() if k[0] == cluster and k[1] == name}

    def group_by_name(self, name: str) -> dict[int, BrokerLiveInfo]:
        return {k[2]: v for k, v in self._table.items() if k[1] == name}

    def expire(self, now_ms: int) -> list[tuple[str, str, int]]:
        """Forget brokers whose heartbeat timed out; returns their keys."""
        dead = [k for k, v in self._table.items() if not v.alive_at(now_ms)]
        for k in dead:
            del self._table[k]
        return dead

    def __len__(self) -> int:
        return len(self._table)
