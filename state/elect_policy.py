"""RocketMQ's DefaultElectPolicy, made total and deterministic.

Candidates are the alive members of the sync-state set (then, with unclean
election enabled, every alive replica). A live old master is kept unless an admin
designates another broker; a designated broker wins only if it is a candidate.
Otherwise the best candidate has the highest heartbeat epoch, then the highest
max offset, then the lowest election priority. Unlike RocketMQ, offsets are
compared as 64-bit numbers (RocketMQ truncates the difference to an int) and
full ties go to the lowest broker id (RocketMQ keeps whichever a hash set
yields first), so every replica picks the same master.
"""

from __future__ import annotations

from collections.abc import Iterable

from .liveness import BrokerLiveInfo


def _try_elect(brokers: Iterable[int], live: dict[int, BrokerLiveInfo], now_ms: int, old_master: int | None,
               prefer: int | None) -> int | None:
    alive = sorted(b for b in brokers if b in live and live[b].alive_at(now_ms))
    if not alive:
        return None
    if old_master in alive and (prefer is None or prefer == old_master):
        return old_master
    if prefer is not None:
        return prefer if prefer in alive else None
    return min(alive, key=lambda b: (-live[b].epoch, -live[b].max_offset, live[b].priority, b))


def elect(sync_state_set: Iterable[int], all_replicas: Iterable[int] | None, old_master: int | None,
          prefer: int | None, live: dict[int, BrokerLiveInfo], now_ms: int) -> int | None:
    chosen = _try_elect(sync_state_set, live, now_ms, old_master, prefer)
    if chosen is None and all_replicas is not None:
        chosen = _try_elect(all_replicas, live, now_ms, old_master, prefer)
    return chosen
