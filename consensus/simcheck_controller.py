"""Controller invariants, checked on every replica after every command it applies.

* one master per broker set and master epoch, across all replicas and all time (a set
  whose data is cleaned away and registered again starts over: its lifetime is named by
  the log index that created it);
* a set's master epoch and sync-state-set epoch never go back along the log;
* a broker id, once bound to a register check code, keeps it until the set's data
  is cleaned: ids are unique to one broker.

The replication checker (simcheck.py) adds what holds for any state machine:
replicas that applied the same log agree, no acknowledged request is lost.
"""

from __future__ import annotations

from typing import Any

from electra.state import commands as C
from electra.state.machine import ControllerStateMachine


class ControllerInvariants:
    def __init__(self) -> None:
        self.master_of: dict[tuple[str, int, int], int | None] = {}  # (set, born at, master epoch) -> master
        # (node, incarnation, set) -> (born at, master epoch, sync-state-set epoch, id -> check code);
        # born at is the index that created the set, 0 when unknown (the replica restored a snapshot)
        self.seen: dict[tuple[int, int, str], tuple[int, int, int, dict[int, str]]] = {}

    def after_restore(self, replica: tuple[int, int], sm: Any) -> None:
        for key in [k for k in self.seen if k[:2] == replica]:
            del self.seen[key]
        for name, bs in sm.sets.items():  # sets of unknown birth: the commands before are not seen
            self.seen[(*replica, name)] = (0, bs.master_epoch, bs.sync_state_set_epoch,
                                           {i: c for i, (_, c) in bs.brokers.items()})

    def after_apply(self, replica: tuple[int, int], sm: Any, index: int, command: bytes) -> str | None:
        assert isinstance(sm, ControllerStateMachine)
        try:
            cmd = C.decode(command)
        except ValueError:
            return None  # a malformed command changes nothing
        if isinstance(cmd, C.ReadEvent):
            return None  # a read barrier (legacy architecture) changes nothing
        name = cmd.name
        bs = sm.sets.get(name)
        key = (*replica, name)
        if bs is None:
            self.seen.pop(key, None)
            return None
        before = self.seen.get(key)
        born = before[0] if before is not None else index  # absent until this command created it
        if bs.master_id is not None and born:
            known = self.master_of.setdefault((name, born, bs.master_epoch), bs.master_id)
            if known != bs.master_id:
                return (f"two masters of {name} in master epoch {bs.master_epoch}: broker {known} and "
                        f"broker {bs.master_id} (node {replica[0]}, index {index})")
        codes = {i: c for i, (_, c) in bs.brokers.items()}
        self.seen[key] = (born, bs.master_epoch, bs.sync_state_set_epoch, codes)
        if before is None:
            return None
        _, m0, s0, codes0 = before
        if bs.master_epoch < m0 or bs.sync_state_set_epoch < s0:
            return (f"epochs of {name} went back on node {replica[0]} at index {index}: master {m0} -> "
                    f"{bs.master_epoch}, sync state set {s0} -> {bs.sync_state_set_epoch}")
        if not isinstance(cmd, C.CleanBrokerData):
            for i, code in codes0.items():
                if i in codes and codes[i] != code:
                    return f"broker id {i} of {name} rebound from {code!r} to {codes[i]!r} at index {index}"
                if i not in codes:
                    return f"broker id {i} of {name} vanished at index {index} without a clean"
        return None
