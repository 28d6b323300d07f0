"""Replication checkers: what must hold for any state machine, whatever the faults.

The simulator feeds them from the outside of the real driver: every replica's state
machine is wrapped in a `RecordingStateMachine` (each applied command, each snapshot
taken or installed), and every role change is reported through
`RaftNode.on_role_change`. Checked as the run goes:

* election safety: at most one leader per term;
* lease safety: a leader answers from its lease only while no leader of a later term
  exists (what the lease promises, whether or not a stale value was read);
* leader completeness: a new leader holds every entry committed in an earlier term;
* state machine safety: no two replicas apply different commands at one index, and
  each replica applies in log order;
* replicas that applied the same log agree: every snapshot taken or installed at an
  index has the same bytes everywhere;
* a node refuses to start only when its disk really was damaged.

And at the end of the liveness phase: a leader, every live replica applied the same
index and holds the same state, and no acknowledged request is missing from the log.
"""

from __future__ import annotations

import hashlib
import io
from collections import Counter
from collections.abc import Callable
from typing import Any, BinaryIO

from .core import Role
from .node import RaftNode, StateMachine
from .simworkloads import Invariants


class Violation(AssertionError):
    pass


def state_digest(sm: StateMachine) -> str:
    out = io.BytesIO()
    sm.snapshot(out)
    return hashlib.blake2b(out.getvalue(), digest_size=12).hexdigest()


class ReplicationChecker:
    def __init__(self, on_violation: Callable[[str], None]) -> None:
        self.on_violation = on_violation  # the driver swallows exceptions in places: report first
        self.leader_of_term: dict[int, int] = {}
        self.applied: dict[int, tuple[int, bytes]] = {}  # index -> (term, command), from any replica
        self.digest_at: dict[int, str] = {}  # state-machine applied index -> state digest
        self.acked: Counter[bytes] = Counter()

    def fail(self, reason: str) -> None:
        self.on_violation(reason)
        raise Violation(reason)

    def on_role(self, node_id: int, node: RaftNode, role: Role, term: int) -> None:
        if role != Role.LEADER:
            return
        prev = self.leader_of_term.setdefault(term, node_id)
        if prev != node_id:
            self.fail(f"two leaders in term {term}: node {prev} and node {node_id}")
        core = node.core
        assert core is not None
        for index, (t, _) in self.applied.items():
            if t < term and index > core.offset and (index > core.last_index() or core.term_at(index) != t):
                self.fail(f"leader completeness: node {node_id} leads term {term} without committed "
                          f"entry {index} (term {t})")

    def on_lease_read(self, node_id: int, term: int) -> None:
        newer = [t for t in self.leader_of_term if t > term]
        if newer:
            self.fail(f"lease safety: node {node_id} served a lease read as leader of term {term} while node "
                      f"{self.leader_of_term[min(newer)]} already leads term {min(newer)}")

    def on_apply(self, node_id: int, index: int, term: int, command: bytes) -> None:
        prev = self.applied.setdefault(index, (term, command))
        if prev != (term, command):
            self.fail(f"state machine safety: node {node_id} applied ({index}, t{term}) but ({index}, t{prev[0]}) "
                      "was applied elsewhere" + (" with another command" if prev[1] != command else ""))

    def on_state(self, node_id: int, index: int, digest: str, how: str) -> None:
        known = self.digest_at.setdefault(index, digest)
        if known != digest:
            self.fail(f"replicas disagree: node {node_id}'s state after index {index} ({how}) differs from "
                      "another replica's at the same index")

    def on_acked(self, command: bytes) -> None:
        self.acked[command] += 1

    def final(self, nodes: dict[int, RaftNode]) -> None:
        """Liveness and durability once faults healed: `nodes` are the replicas that should be up."""
        leaders = [i for i, n in nodes.items() if n.is_leader]
        if len(leaders) != 1:
            self.fail(f"liveness: {len(leaders)} leaders after the faults healed (nodes {sorted(nodes)})")
        applied = {i: n.applied for i, n in nodes.items()}
        if len(set(applied.values())) != 1:
            self.fail(f"liveness: replicas did not converge after the faults healed: applied={applied}")
        digests = {i: state_digest(n.sm) for i, n in nodes.items()}
        if len(set(digests.values())) != 1:
            self.fail(f"replicas applied the same log but hold different states: {digests}")
        final = max(applied.values())
        in_log = Counter(cmd for i, (_, cmd) in self.applied.items() if i <= final)
        for cmd, n in self.acked.items():
            if in_log[cmd] < n:
                self.fail(f"an acknowledged request is not in the final log: {cmd[:80]!r}")


class RecordingStateMachine:
    """Wraps a replica's state machine; reports what the driver does with it to the checkers."""

    def __init__(self, inner: Any, node_id: int, incarnation: int, checker: ReplicationChecker,
                 invariants: Invariants | None) -> None:
        self.inner = inner
        self.node_id = node_id
        self.replica = (node_id, incarnation)
        self.checker = checker
        self.invariants = invariants
        self.term_of: Callable[[int], int | None] = lambda index: None
        self.last = 0

    def __getattr__(self, name: str) -> Any:  # reads (fn(sm)) see the real state machine
        return getattr(self.inner, name)

    def apply(self, index: int, command: bytes) -> Any:
        if index <= self.last:
            self.checker.fail(f"node {self.node_id} applied index {index} after {self.last}")
        self.last = index
        term = self.term_of(index)
        self.checker.on_apply(self.node_id, index, term if term is not None else -1, command)
        result = self.inner.apply(index, command)
        if self.invariants is not None:
            problem = self.invariants.after_apply(self.replica, self.inner, index, command)
            if problem:
                self.checker.fail(problem)
        return result

    def snapshot(self, out: BinaryIO) -> None:
        buf = io.BytesIO()
        self.inner.snapshot(buf)
        data = buf.getvalue()
        out.write(data)
        self.checker.on_state(self.node_id, self.inner.applied,
                              hashlib.blake2b(data, digest_size=12).hexdigest(), "snapshot taken")

    def restore(self, inp: BinaryIO) -> None:
        data = inp.read()
        self.inner.restore(io.BytesIO(data))
        self.last = max(self.last, self.inner.applied)
        if self.invariants is not None:
            self.invariants.after_restore(self.replica, self.inner)
        self.checker.on_state(self.node_id, self.inner.applied,
                              hashlib.blake2b(data, digest_size=12).hexdigest(), "snapshot restored")
