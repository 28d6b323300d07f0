"""Typed errors a caller of the Raft engine can act on.

Each says whether the outcome of the request is known: a caller may retry a
`NotLeader` or `ProposalDropped` safely, while `ProposalTimeout` and `NodeStopped`
mean the command may or may not have been committed.
"""

from __future__ import annotations


class RaftError(Exception):
    """Base class of every error the engine reports to callers."""

    outcome_known = True


class NotLeader(RaftError):
    """This node is not the leader; `leader_id` is the best hint (0 = unknown)."""

    def __init__(self, leader_id: int = 0, leader_addr: str | None = None) -> None:
        self.leader_id = leader_id
        self.leader_addr = leader_addr
        super().__init__(f"not the leader (leader hint: {leader_id or 'unknown'})")


class ProposalDropped(RaftError):
    """The leader refused the proposal before appending it (e.g. leadership transfer)."""


class NoQuorum(ProposalDropped):
    """This leader has heard from no quorum for an election timeout: it took no new proposal (never
    appended) and cannot confirm a read; the others may be electing a new leader, so try another node."""


class LeadershipLost(RaftError):
    """The entry was overwritten by a new leader: it was definitely not committed."""


class ProposalTimeout(RaftError):
    """No result within the deadline; the command may still commit later."""

    outcome_known = False


class QuorumLost(RaftError):
    """The leader stepped down, or has heard from no quorum for an election timeout, before the entry
    committed: a later leader may still commit it or drop it, so the outcome is unknown. Answered at
    once (as etcd answers a leader change) rather than at the proposal's deadline, so the caller can
    look for the new leader sooner."""

    outcome_known = False


class NodeStopped(RaftError):
    """The node shut down before the result was known; the command may have committed."""

    outcome_known = False


class FollowerBehind(RaftError):
    """A follower read was refused at once: this node is too far behind its leader, or has
    not heard from one recently. Retry on `leader_id` (0 = unknown) or another node."""

    def __init__(self, reason: str, leader_id: int = 0) -> None:
        self.leader_id = leader_id
        super().__init__(f"{reason} (leader hint: {leader_id or 'unknown'})")


class ReadTimeout(RaftError):
    """A read could not be confirmed before its deadline; reads change nothing, so retry."""


class DiskFailure(RaftError):
    """The node could not make its log durable (ENOSPC, EIO, a failed fsync) and stopped.

    Fail-stop: after a failed write or fsync the kernel may have dropped the dirty pages,
    so nothing written since the last good fsync can be trusted and nothing is retried.
    Pending requests fail with this error; the command may or may not have committed on
    the other members. The host process exits (see `electra node`).
    """

    outcome_known = False
    advice = "free space or fix the disk, then restart: the node recovers its log and catches up from the leader"


class LogDiverged(DiskFailure):
    """The leader's log contradicts an entry this node has committed: its data dir is not this cluster's
    log (a bad bootstrap, a data dir copied from another node or cluster). Fail-stop, as on a disk fault."""

    advice = ("this node's data dir contradicts the cluster's committed log: move it aside and restart the node "
              "with an empty one (it catches up from the leader)")
