"""The one public view of a broker set: what every reader outside the state machine sees.

The journal (and through it the Kafka events topic and the Delta events table),
the watchers of a set, the dashboard and the tier's time travel all show a broker
set as this view, in one wire form (`to_public`, RocketMQ's camelCase names).
It leaves out what only the state machine needs (register check codes, the next
broker id). A view is immutable: taken right after an event, it stays the state
at that log position.
"""

from __future__ import annotations

from typing import Any

import msgspec


class BrokerSetView(msgspec.Struct, frozen=True, rename="camel", gc=False):
    """Untracked by the cyclic GC (`gc=False`): it holds only strings, numbers, a tuple and a dict of
    them, so it is in no reference cycle, and the event journal keeps up to 200,000 views."""

    cluster_name: str
    broker_name: str
    master_broker_id: int | None
    master_address: str | None
    master_epoch: int
    sync_state_set: tuple[int, ...]  # sorted
    sync_state_set_epoch: int
    brokers: dict[int, str]  # broker id -> address, by id

    def to_public(self) -> dict[str, Any]:
        """The wire form: `clusterName`, `brokerName`, `masterBrokerId`, ... with broker ids as string keys."""
        out: dict[str, Any] = msgspec.to_builtins(self, str_keys=True)
        out["syncStateSet"] = list(self.sync_state_set)  # a JSON array, also before JSON encoding
        return out

    def role_fields(self) -> dict[str, Any]:
        """The master and sync-state set, as a set's watchers receive them with each event."""
        return {"masterBrokerId": self.master_broker_id, "masterAddress": self.master_address,
                "masterEpoch": self.master_epoch, "syncStateSet": list(self.sync_state_set),
                "syncStateSetEpoch": self.sync_state_set_epoch}


# What watchers receive for a set that no longer exists.
NO_SET_ROLE_FIELDS: dict[str, Any] = {"masterBrokerId": None, "masterAddress": None, "masterEpoch": None,
                                      "syncStateSet": [], "syncStateSetEpoch": None}


def public(view: BrokerSetView | None) -> dict[str, Any] | None:
    """`view.to_public()`, or None for a set that does not exist (was removed)."""
    return None if view is None else view.to_public()
