"""The Raft protocol as a pure state machine: no sockets, no disk, no clocks.

Inputs are `tick()`, `step(message)`, `propose(commands)`, `transfer_leadership()`
and `persisted(index, term)`; outputs are collected by `ready()` as one `Ready`:
state to persist, messages to send (split into those that may leave at once and
those that must wait until the Ready's writes are durable) and committed entries
to apply. The asyncio runtime (`node.py`) and the simulator (`simulation.py`) both
drive this class, so everything proven in simulation is the code that runs.

Protocol features: randomized election timeouts, PreVote, CheckQuorum with
vote refusal while a leader is known (lease), a no-op entry on election, fast
conflict backtracking, per-follower pipelining with an inflight window, the
leader writing its own log in parallel with replication, leadership transfer.
"""

from __future__ import annotations

import bisect
import random
from collections import deque
from dataclasses import dataclass, field
from enum import IntEnum
from itertools import accumulate

from . import mutations
from .errors import NotLeader, ProposalDropped
from .messages import MAX_TERM, MAX_TERM_JUMP, Message, MsgType

NONE = 0  # node ids start at 1; 0 means "nobody"


class Role(IntEnum):
    FOLLOWER = 0
    PRE_CANDIDATE = 1
    CANDIDATE = 2
    LEADER = 3


@dataclass
class RaftConfig:
    """Timing is counted in ticks; the runtime decides how long a tick is."""

    election_ticks: int = 10  # timeouts are drawn from [election_ticks, 2 * election_ticks)
    heartbeat_ticks: int = 1
    max_entries_per_msg: int = 8192
    max_bytes_per_msg: int = 4 << 20
    max_inflight: int = 32  # AppendEntries in flight per follower (flow-control window)
    pre_vote: bool = True
    check_quorum: bool = True
    # Lease reads: how long after a heartbeat round's *send* time a quorum ack keeps this
    # leader sure that no other leader exists (seconds, on the driver's monotonic clock).
    # 0 disables them. Safe only below the followers' vote-refusal window (see docs).
    lease_s: float = 0.0


@dataclass
class Ready:
    """Everything the runtime must do after a batch of inputs, in this order:

    1. send `send_now`;
    2. persist `hard_state` and the entries (`entries_first` .. with `ent_terms`/`ent_data`),
       which replace any stored entries from `entries_first` on;
    3. once durable, send `send_after_persist` and call `core.persisted(last, term)`;
    4. apply the committed entries (durable on a quorum, not necessarily yet on this node).
    """

    hard_state: tuple[int, int] | None = None  # (term, vote) when changed
    entries_first: int = 0
    ent_terms: list[int] = field(default_factory=list)
    ent_data: list[bytes] = field(default_factory=list)
    send_now: list[Message] = field(default_factory=list)
    send_after_persist: list[Message] = field(default_factory=list)
    apply_first: int = 0
    apply_terms: list[int] = field(default_factory=list)
    apply_data: list[bytes] = field(default_factory=list)
    role_changed: bool = False
    read_states: list[tuple[int, int]] = field(default_factory=list)  # (ctx, read index) confirmed
    reads_dropped: list[int] = field(default_factory=list)  # ctx of local reads that lost their leader
    snapshot_requests: list[int] = field(default_factory=list)  # peers that need InstallSnapshot
    reset_to: tuple[int, int] | None = None  # (index, term): storage must drop its log, snapshot installed

    @property
    def persist_last(self) -> tuple[int, int]:
        """(index, term) of the last entry this Ready asks to persist, or (0, 0)."""
        if not self.ent_terms:
            return 0, 0
        return self.entries_first + len(self.ent_terms) - 1, self.ent_terms[-1]

    def needs_persist(self) -> bool:
        return self.hard_state is not None or bool(self.ent_terms) or self.reset_to is not None


class ProgressState(IntEnum):
    PROBE = 0  # one AppendEntries at a time until the match point is found
    REPLICATE = 1  # optimistic pipelining within the inflight window
    SNAPSHOT = 2  # the entries it needs are compacted: an InstallSnapshot transfer is under way


class Progress:
    """The leader's view of one follower."""

    __slots__ = ("match", "next", "state", "inflight", "probe_sent", "recent_active", "match_at_hb",
                 "sent_commit", "acked_round", "pending_snapshot")

    def __init__(self, next_index: int) -> None:
        self.match = 0
        self.next = next_index
        self.state = ProgressState.PROBE
        self.inflight: deque[int] = deque()  # last index carried by each unacknowledged append
        self.probe_sent = False
        self.recent_active = False
        self.match_at_hb = -1
        self.sent_commit = 0  # highest commit index this follower has been told
        self.acked_round = 0  # newest heartbeat round (read/lease confirmation) it answered
        self.pending_snapshot = 0  # snapshot index being installed on it

    def become_probe(self) -> None:
        self.state = ProgressState.PROBE
        self.next = self.match + 1
        self.inflight.clear()
        self.probe_sent = False

    def become_replicate(self) -> None:
        self.state = ProgressState.REPLICATE
        self.next = self.match + 1
        self.inflight.clear()


# Messages that carry the term of an exchange the receiver started or shares with its leader
# (as granted vote answers do): a term above the receiver's in them is never legitimate.
_ECHOED_TERM_TYPES = frozenset({MsgType.HEARTBEAT_RESP, MsgType.READ_INDEX_RESP, MsgType.READ_INDEX})

_SEND_NOW_TYPES = frozenset({MsgType.APP, MsgType.HEARTBEAT, MsgType.TIMEOUT_NOW, MsgType.PRE_VOTE,
                             MsgType.READ_INDEX, MsgType.READ_INDEX_RESP})


class RaftCore:
    """One Raft replica's protocol state. Not thread-safe; drive it from one thread."""

    def __init__(
        self,
        node_id: int,
        peers: list[int],
        config: RaftConfig | None = None,
        *,
        term: int = 0,
        vote: int = NONE,
        log_offset: int = 0,
        offset_term: int = 0,
        log_terms: list[int] | None = None,
        log_data: list[bytes] | None = None,
        commit: int = 0,
        applied: int = 0,
        snapshot: tuple[int, int] | None = None,
        vote_floor: tuple[int, int] = (0, 0),
        rng: random.Random | None = None,
    ) -> None:
        """Start from durable state (all of it is treated as persisted).

        `snapshot` is (index, term) of the newest local state-machine snapshot, which the
        driver has already restored: it is committed and applied. `vote_floor` is the
        (index, term) of the newest entry of a log this node lost (a damaged snapshot):
        it votes as if its log still ended there, so it never helps elect a candidate
        that misses entries it had acknowledged, and it does not campaign until its own
        log has caught up to that point.
        """
        if node_id not in peers:
            raise ValueError(f"node {node_id} is not in its own peer list {peers}")
        if node_id == NONE or len(set(peers)) != len(peers):
            raise ValueError("node ids must be unique and non-zero")
        self.id = node_id
        self.peers = sorted(peers)
        self.cfg = config or RaftConfig()
        self.rng = rng or random.Random()
        self.quorum = len(self.peers) // 2 + 1

        self.term = term
        self.vote = vote
        self.vote_floor = tuple(vote_floor)
        self.role = Role.FOLLOWER
        self.lead = NONE

        # The log: entry i (offset < i <= last) is log_terms[i - offset - 1].
        self.offset = log_offset
        self.offset_term = offset_term
        self.log_terms: list[int] = list(log_terms or [])
        self.log_data: list[bytes] = list(log_data or [])
        if len(self.log_terms) != len(self.log_data):
            raise ValueError("log terms and data differ in length")

        last = self.last_index()
        self.snap_index, self.snap_term = snapshot or (log_offset, offset_term)
        if self.snap_index < log_offset:
            raise ValueError(f"log compacted to {log_offset} but the newest snapshot is {self.snap_index}")
        self.commit = min(max(commit, self.snap_index), max(last, self.snap_index))
        self.applied_handed = max(applied, self.snap_index)  # entries handed out for applying
        self.stable = last  # entries known durable
        self.handed = last  # entries handed out for persisting

        self.elapsed = 0
        self.timeout = self._random_timeout()
        self.heartbeat_elapsed = 0
        self.votes: dict[int, bool] = {}
        self.progress: dict[int, Progress] = {}
        self.transferee = NONE
        self.transfer_elapsed = 0

        # Reads. `now` is the driver's monotonic clock (seconds), set before each input.
        self.now = 0.0
        self.read_round = 0  # every heartbeat broadcast is a numbered round
        self.confirmed_round = 0
        self.round_sent_at: dict[int, float] = {}
        self.lease_until = 0.0
        self._reads_unstarted: list[tuple[int, int]] = []  # (ctx, requester)
        self._reads_pending: deque[tuple[int, int, int, int]] = deque()  # (round, index, ctx, requester)
        self._read_states: list[tuple[int, int]] = []
        self._reads_dropped: list[int] = []
        # A follower batches its reads: one READ_INDEX per Ready, answered for all of them.
        self._follower_reads: list[int] = []
        self._follower_batches: dict[int, list[int]] = {}
        self._batch_ids = 0
        # A follower's view of its leader, for bounded-staleness follower reads.
        self.leader_commit = self.commit
        self.last_leader_contact = float("-inf")  # a restarted follower has heard from nobody
        self._snap_requests: list[int] = []
        self._reset_to: tuple[int, int] | None = None

        self.refused_terms = 0  # messages dropped for a term jump beyond MAX_TERM_JUMP
        self._msgs: list[Message] = []
        self._hard_dirty = False
        self._role_changed = False
        self._bcast_pending = False

    # ------------------------------------------------------------------ log helpers
    def last_index(self) -> int:
        return self.offset + len(self.log_terms)

    def last_term(self) -> int:
        return self.log_terms[-1] if self.log_terms else self.offset_term

    def term_at(self, index: int) -> int | None:
        """Term of the entry at `index`, or None if it is compacted away or absent."""
        if index == self.offset:
            return self.offset_term
        if index < self.offset or index > self.offset + len(self.log_terms):
            return None
        return self.log_terms[index - self.offset - 1]

    def _truncate_and_append(self, first: int, terms: list[int], datas: list[bytes]) -> None:
        """Replace everything from `first` on with the given entries."""
        cut = first - self.offset - 1
        if cut < len(self.log_terms):
            del self.log_terms[cut:]
            del self.log_data[cut:]
            if first <= self.commit:  # would violate Raft safety: committed entries never change
                raise AssertionError(f"node {self.id} truncating committed entry {first} <= {self.commit}")
            self.stable = min(self.stable, first - 1)
            self.handed = min(self.handed, first - 1)
        self.log_terms.extend(terms)
        self.log_data.extend(datas)

    # ------------------------------------------------------------------ state transitions
    def _random_timeout(self) -> int:
        e = self.cfg.election_ticks
        return e + self.rng.randrange(e)

    def _set_term(self, term: int) -> None:
        if term != self.term:
            self.term = term
            self.vote = NONE
            self._hard_dirty = True

    def _become_follower(self, term: int, lead: int) -> None:
        if self.role != Role.FOLLOWER or self.lead != lead:
            self._role_changed = True
        self._set_term(term)
        self.role = Role.FOLLOWER
        self.lead = lead
        self.elapsed = 0
        self.timeout = self._random_timeout()
        self.transferee = NONE
        self.progress = {}
        self._drop_reads()

    def _drop_reads(self) -> None:
        """A leader that steps down can confirm no read: fail its own, forget forwarded ones."""
        self._reads_dropped.extend(ctx for ctx, src in self._reads_unstarted if src == self.id)
        self._reads_dropped.extend(ctx for _, _, ctx, src in self._reads_pending if src == self.id)
        self._reads_dropped.extend(self._follower_reads)
        for ctxs in self._follower_batches.values():
            self._reads_dropped.extend(ctxs)
        self._follower_reads.clear()
        self._follower_batches.clear()
        self._reads_unstarted.clear()
        self._reads_pending.clear()
        self.round_sent_at.clear()
        self.lease_until = 0.0
    def _become_leader(self) -> None:
        self.role = Role.LEADER
        self.lead = self.id
        self._role_changed = True
        self.heartbeat_elapsed = 0
        self.elapsed = 0
        self.transferee = NONE
        self._drop_reads()
        self.confirmed_round = self.read_round
        nxt = self.last_index() + 1
        self.progress = {p: Progress(nxt) for p in self.peers}
        me = self.progress[self.id]
        me.match, me.next, me.state = self.stable, nxt, ProgressState.REPLICATE
        # A no-op of the new term lets earlier-term entries commit (Raft §5.4.2).
        self._append_as_leader([b""])
        self._maybe_commit()

    def _behind_vote_floor(self) -> bool:
        floor_index, floor_term = self.vote_floor
        return (self.last_term(), self.last_index()) < (floor_term, floor_index)

    def _campaign(self, pre: bool, force: bool = False) -> None:
        if self.term >= MAX_TERM:
            self.elapsed = 0  # peers refuse terms beyond MAX_TERM (docs/security.md); stay a follower
            return
        if self._behind_vote_floor():
            # It would not vote for a log like its own: it must not vote for itself either.
            self.elapsed = 0
            self.timeout = self._random_timeout()
            return
        if pre:
            self.role = Role.PRE_CANDIDATE
            vote_term = self.term + 1
            mtype = MsgType.PRE_VOTE
        else:
            self.role = Role.CANDIDATE
            self._set_term(self.term + 1)
            self.vote = self.id
            self._hard_dirty = True
            vote_term = self.term
            mtype = MsgType.VOTE
        self._role_changed = True
        self.lead = NONE
        self.elapsed = 0
        self.timeout = self._random_timeout()
        self.votes = {self.id: True}
        if self._tally() >= self.quorum:
            if pre:
                self._campaign(pre=False, force=force)
            else:
                self._become_leader()
            return
        li, lt = self.last_index(), self.last_term()
        for p in self.peers:
            if p != self.id:
                self._msgs.append(Message(mtype, self.id, p, vote_term, index=li, log_term=lt, force=force))

    def _tally(self) -> int:
        return sum(1 for v in self.votes.values() if v)

    # ------------------------------------------------------------------ inputs
    def tick(self) -> None:
        """Advance logical time by one tick."""
        self.elapsed += 1
        if self.role == Role.LEADER:
            self.heartbeat_elapsed += 1
            if self.heartbeat_elapsed >= self.cfg.heartbeat_ticks:
                self.heartbeat_elapsed = 0
                self._bcast_heartbeat()
            if self.transferee != NONE:
                self.transfer_elapsed += 1
                if self.transfer_elapsed >= self.cfg.election_ticks:
                    self.transferee = NONE  # give up; resume accepting proposals
            if self.elapsed >= self.cfg.election_ticks:
                self.elapsed = 0
                if self.cfg.check_quorum and not self._quorum_active():
                    self._become_follower(self.term, NONE)
            return
        if self.elapsed >= self.timeout:
            self._campaign(pre=self.cfg.pre_vote)

    def _quorum_active(self) -> bool:
        active = 0
        for pid, pr in self.progress.items():
            if pid == self.id or pr.recent_active:
                active += 1
            pr.recent_active = False
        return active >= self.quorum

    def propose(self, commands: list[bytes]) -> int:
        """Append commands as the leader; returns the index of the first one."""
        if self.role != Role.LEADER:
            raise NotLeader(self.lead)
        if self.transferee != NONE:
            raise ProposalDropped(f"leadership transfer to node {self.transferee} in progress")
        first = self.last_index() + 1
        self._append_as_leader(commands)
        return first

    def _append_as_leader(self, commands: list[bytes]) -> None:
        self.log_terms.extend([self.term] * len(commands))
        self.log_data.extend(commands)
        self._bcast_pending = True
        if len(self.peers) == 1:
            self._maybe_commit()

    def transfer_leadership(self, target: int) -> None:
        """Hand leadership to `target` once it has caught up (TimeoutNow)."""
        if self.role != Role.LEADER:
            raise NotLeader(self.lead)
        if target not in self.progress:
            raise ValueError(f"unknown node {target}")
        if target == self.id:
            return
        self.transferee = target
        self.transfer_elapsed = 0
        self.lease_until = 0.0  # the target may take over before any lease would end
        pr = self.progress[target]
        if pr.match == self.last_index():
            self._msgs.append(Message(MsgType.TIMEOUT_NOW, self.id, target, self.term))
        else:
            self._send_append(target, pr)

    def persisted(self, index: int, term: int) -> None:
        """The runtime made entries up to (index, term) durable."""
        if index > self.stable and self.term_at(index) == term:
            self.stable = index
            if self.role == Role.LEADER:
                self.progress[self.id].match = index
                self._maybe_commit()

    def step(self, m: Message) -> None:
        """Process one message from a peer."""
        if m.src not in self.peers or m.src == self.id:
            return
        if m.term > self.term:
            if m.term - self.term > MAX_TERM_JUMP:
                self.refused_terms += 1  # docs/security.md: a jump no real election history produces
                return
            if m.type in _ECHOED_TERM_TYPES or (not m.reject and (
                    m.type == MsgType.VOTE_RESP or (m.type == MsgType.PRE_VOTE_RESP and m.term != self.term + 1))):
                return  # these echo a term we sent; a higher one is forged or corrupt
            if m.type in (MsgType.PRE_VOTE, MsgType.VOTE):
                in_lease = (self.cfg.check_quorum and self.lead != NONE
                            and self.elapsed < self.cfg.election_ticks)
                if in_lease and not self._is_transfer_vote(m):
                    return  # we heard from a live leader recently: do not help unseat it
            if m.type == MsgType.PRE_VOTE or (m.type == MsgType.PRE_VOTE_RESP and not m.reject):
                pass  # pre-votes never change terms
            elif m.type in (MsgType.APP, MsgType.HEARTBEAT):
                self._become_follower(m.term, m.src)
            else:
                self._become_follower(m.term, NONE)
        elif m.term < self.term:
            if m.type in (MsgType.APP, MsgType.HEARTBEAT) and (self.cfg.check_quorum or self.cfg.pre_vote):
                # Tell a stale leader about the newer term so it steps down.
                self._msgs.append(Message(MsgType.APP_RESP, self.id, m.src, self.term))
            elif m.type == MsgType.PRE_VOTE:
                self._msgs.append(Message(MsgType.PRE_VOTE_RESP, self.id, m.src, self.term, reject=True))
            return

        t = m.type
        if t in (MsgType.PRE_VOTE, MsgType.VOTE):
            self._handle_vote_request(m)
        elif self.role == Role.LEADER:
            if t == MsgType.APP_RESP:
                if m.index > self.last_index() and not m.reject:
                    return  # acknowledges entries we never had: forged or corrupt
                self._handle_append_resp(m)
            elif t == MsgType.HEARTBEAT_RESP:
                self._handle_heartbeat_resp(m)
            elif t == MsgType.READ_INDEX:
                idx = self.lease_read_index()
                if idx is not None:  # one round trip instead of two while the lease holds
                    self._msgs.append(Message(MsgType.READ_INDEX_RESP, self.id, m.src, self.term,
                                              index=idx, context=m.context))
                else:
                    self._reads_unstarted.append((m.context, m.src))
        elif t in (MsgType.PRE_VOTE_RESP, MsgType.VOTE_RESP):
            self._handle_vote_resp(m)
        elif t == MsgType.APP:
            self._become_follower_of(m)
            self._handle_append(m)
        elif t == MsgType.HEARTBEAT:
            self._become_follower_of(m)
            self._handle_heartbeat(m)
        elif t == MsgType.TIMEOUT_NOW and self.role == Role.FOLLOWER:
            self._campaign(pre=False, force=True)
        elif t == MsgType.READ_INDEX_RESP:
            for ctx in self._follower_batches.pop(m.context, ()):
                self._read_states.append((ctx, m.index))

    def _is_transfer_vote(self, m: Message) -> bool:
        """Whether a `force` vote request is what a leadership transfer produces.

        The transferee campaigns from the leader's term on TimeoutNow, so its vote asks for
        exactly our term + 1; the leader itself honours it only from the node it is handing
        over to. Any other `force` flag is ignored, so a forged one cannot skip the lease.
        """
        if not m.force or m.term != self.term + 1:
            return False
        return self.role != Role.LEADER or m.src == self.transferee

    def _become_follower_of(self, m: Message) -> None:
        if self.role != Role.FOLLOWER or self.lead != m.src:
            self._become_follower(m.term, m.src)
        self.elapsed = 0
        self.last_leader_contact = self.now

    # ------------------------------------------------------------------ elections
    def _handle_vote_request(self, m: Message) -> None:
        pre = m.type == MsgType.PRE_VOTE
        floor_index, floor_term = self.vote_floor
        up_to_date = (m.log_term, m.index) >= max((self.last_term(), self.last_index()), (floor_term, floor_index))
        if pre:
            can_vote = m.term > self.term
        else:
            can_vote = self.vote == m.src or (self.vote == NONE and self.lead == NONE)
            if mutations.enabled("double_vote"):  # the deliberate bug: forget whom we voted for
                can_vote = self.lead == NONE
        resp_type = MsgType.PRE_VOTE_RESP if pre else MsgType.VOTE_RESP
        if can_vote and up_to_date:
            self._msgs.append(Message(resp_type, self.id, m.src, m.term))
            if not pre:
                self.vote = m.src
                self._hard_dirty = True
                self.elapsed = 0
        else:
            self._msgs.append(Message(resp_type, self.id, m.src, self.term, reject=True))

    def _handle_vote_resp(self, m: Message) -> None:
        if m.type == MsgType.PRE_VOTE_RESP:
            if self.role != Role.PRE_CANDIDATE or (not m.reject and m.term != self.term + 1):
                return
        elif self.role != Role.CANDIDATE:
            return
        self.votes.setdefault(m.src, not m.reject)
        granted = self._tally()
        if granted >= self.quorum:
            if self.role == Role.PRE_CANDIDATE:
                self._campaign(pre=False)
            else:
                self._become_leader()
        elif len(self.votes) - granted >= self.quorum:
            self._become_follower(self.term, NONE)

    # ------------------------------------------------------------------ follower side
    def _handle_append(self, m: Message) -> None:
        prev = m.index
        if prev < self.commit:
            # Already committed here; answer with what we know so the leader moves on (never
            # more than this log holds: the leader counts the answer as a replica).
            self._msgs.append(Message(MsgType.APP_RESP, self.id, m.src, self.term,
                                      index=min(self.commit, self.last_index())))
            return
        if self.term_at(prev) != m.log_term:
            self._reject_append(m)
            return
        n = len(m.ent_terms)
        last_new = prev + n
        if n:
            if prev == self.last_index():
                self.log_terms.extend(m.ent_terms)
                self.log_data.extend(m.ent_data)
            else:
                # Skip entries we already hold; truncate at the first conflict.
                k = 0
                last = self.last_index()
                while k < n and prev + 1 + k <= last and self.term_at(prev + 1 + k) == m.ent_terms[k]:
                    k += 1
                if k < n:
                    self._truncate_and_append(prev + 1 + k, m.ent_terms[k:], m.ent_data[k:])
        if m.commit > self.commit:
            self.commit = min(m.commit, last_new)
        if m.commit > self.leader_commit:
            self.leader_commit = m.commit
        self._msgs.append(Message(MsgType.APP_RESP, self.id, m.src, self.term, index=last_new))

    def _reject_append(self, m: Message) -> None:
        """Refuse an append that does not match; the hint says where to retry.

        `hint_term == 0` means "my log ends at `hint_index - 1`" (Raft terms start at 1):
        the leader may then lower even its recorded match for us, since we prove we lost
        entries (a torn log tail after a crash).
        """
        prev = m.index
        last = self.last_index()
        if prev > last:
            hint_index, hint_term = last + 1, 0
        else:
            hint_term = self.term_at(prev) or 0
            # Terms in a log never decrease, so the first entry of a term is a bisection away.
            pos = bisect.bisect_left(self.log_terms, hint_term, 0, prev - self.offset)
            hint_index = max(self.offset + pos + 1, self.commit + 1)
        self._msgs.append(Message(MsgType.APP_RESP, self.id, m.src, self.term, index=prev, reject=True,
                                  hint_index=hint_index, hint_term=hint_term))

    def _handle_heartbeat(self, m: Message) -> None:
        if m.commit > self.commit:
            self.commit = min(m.commit, self.last_index())
        if m.index > self.leader_commit:  # heartbeats carry the leader's own commit index in `index`
            self.leader_commit = m.index
        self._msgs.append(Message(MsgType.HEARTBEAT_RESP, self.id, m.src, self.term,
                                  index=self.last_index(), context=m.context))

    # ------------------------------------------------------------------ leader side
    def _handle_append_resp(self, m: Message) -> None:
        pr = self.progress[m.src]
        pr.recent_active = True
        if m.reject:
            if pr.state == ProgressState.SNAPSHOT:
                return
            follower_last = m.hint_index - 1 if m.hint_term == 0 else None
            if follower_last is not None and follower_last < pr.match:
                self._correct_match(m.src, pr, follower_last)
                return
            if pr.state == ProgressState.REPLICATE:
                if m.index <= pr.match:
                    return  # stale rejection of an old probe
            elif m.index != pr.next - 1:
                return  # rejection of an append we no longer wait for
            nxt = m.hint_index
            if m.hint_term:
                hi = max(0, min(m.index, self.last_index()) - self.offset)
                pos = bisect.bisect_right(self.log_terms, m.hint_term, 0, hi)
                if pos > 0 and self.log_terms[pos - 1] == m.hint_term:
                    nxt = self.offset + pos + 1
            pr.become_probe()
            pr.next = max(min(nxt, m.index), pr.match + 1)
            self._send_append(m.src, pr)
            return
        if m.index > pr.match:
            pr.match = m.index
            if pr.next <= m.index:
                pr.next = m.index + 1
            if pr.state == ProgressState.PROBE or (pr.state == ProgressState.SNAPSHOT
                                                   and m.index >= pr.pending_snapshot):
                pr.become_replicate()
            infl = pr.inflight
            while infl and infl[0] <= m.index:
                infl.popleft()
            if self._maybe_commit():
                self._bcast_pending = True  # followers learn the new commit index promptly
            if m.src == self.transferee and pr.match == self.last_index():
                self._msgs.append(Message(MsgType.TIMEOUT_NOW, self.id, m.src, self.term))
        elif pr.state == ProgressState.PROBE:
            pr.probe_sent = False
        if pr.next <= self.last_index():
            self._send_append(m.src, pr)

    def _correct_match(self, to: int, pr: Progress, follower_last: int) -> None:
        """The follower proved its log ends at `follower_last`, below its recorded match: it lost
        entries (a torn tail). Lower the match (the commit index never moves back, and a quorum
        still holds every committed entry) and probe from where its log really ends."""
        pr.match = follower_last
        pr.become_probe()
        self._send_append(to, pr)

    def _handle_heartbeat_resp(self, m: Message) -> None:
        pr = self.progress[m.src]
        pr.recent_active = True
        pr.probe_sent = False
        if m.context > pr.acked_round:
            pr.acked_round = m.context
            self._confirm_rounds()
        if pr.state == ProgressState.SNAPSHOT:
            return
        if m.index < pr.match:
            # Its log (answered after its writes were durable) ends below what it acknowledged:
            # it lost its tail in a crash. Correct the match and probe from its real end.
            self._correct_match(m.src, pr, m.index)
            pr.match_at_hb = pr.match
            return
        if pr.match < self.last_index():
            if pr.state == ProgressState.REPLICATE and pr.match == pr.match_at_hb:
                # No progress over a whole heartbeat round: appends or acks were lost.
                pr.become_probe()
            self._send_append(m.src, pr)
        pr.match_at_hb = pr.match

    def _maybe_commit(self) -> bool:
        matches = sorted((pr.match for pr in self.progress.values()), reverse=True)
        q = matches[self.quorum - 1]
        # Only entries of the current term commit by counting replicas (Raft §5.4.2).
        if q > self.commit and self.term_at(q) == self.term:
            self.commit = q
            return True
        return False

    def _send_append(self, to: int, pr: Progress) -> None:
        if pr.state == ProgressState.SNAPSHOT:
            return
        if pr.state == ProgressState.PROBE:
            if pr.probe_sent:
                return
        elif len(pr.inflight) >= self.cfg.max_inflight:
            return
        prev = pr.next - 1
        prev_term = self.term_at(prev)
        if prev_term is None:  # compacted away: only a snapshot can bring this follower up
            pr.state = ProgressState.SNAPSHOT
            pr.pending_snapshot = self.snap_index
            pr.inflight.clear()
            self._snap_requests.append(to)
            return
        lo = prev - self.offset
        hi = min(self.last_index() - self.offset, lo + self.cfg.max_entries_per_msg)
        terms = self.log_terms[lo:hi]
        datas = self.log_data[lo:hi]
        if len(datas) > 1 and sum(map(len, datas)) > self.cfg.max_bytes_per_msg:
            # Cut the batch at the byte budget (at least one entry) so every message fits a frame.
            n = max(1, bisect.bisect_right(list(accumulate(map(len, datas))), self.cfg.max_bytes_per_msg))
            terms, datas = terms[:n], datas[:n]
        pr.sent_commit = self.commit
        self._msgs.append(Message(MsgType.APP, self.id, to, self.term, index=prev, log_term=prev_term,
                                  ent_terms=terms, ent_data=datas, commit=self.commit))
        if pr.state == ProgressState.REPLICATE:
            if terms:
                pr.next = prev + len(terms) + 1
                pr.inflight.append(pr.next - 1)
        else:
            pr.probe_sent = True

    def _bcast_append(self) -> None:
        last = self.last_index()
        for pid, pr in self.progress.items():
            if pid == self.id:
                continue
            # Keep sending while the window allows: one Ready may carry several batches.
            while True:
                before = (pr.next, len(pr.inflight), pr.probe_sent)
                if pr.next > last and pr.sent_commit >= self.commit:
                    break  # nothing new, and the follower already knows the commit index
                self._send_append(pid, pr)
                if (pr.next, len(pr.inflight), pr.probe_sent) == before or pr.next > last:
                    break

    def _bcast_heartbeat(self) -> None:
        """Every broadcast is a numbered round: its quorum ack confirms reads and extends the lease."""
        self.read_round += 1
        self.round_sent_at[self.read_round] = self.now
        for pid, pr in self.progress.items():
            if pid != self.id:
                self._msgs.append(Message(MsgType.HEARTBEAT, self.id, pid, self.term, index=self.commit,
                                          commit=min(pr.match, self.commit), context=self.read_round))
        if len(self.peers) == 1:
            self._confirm_rounds()

    def _confirm_rounds(self) -> None:
        acked = sorted((self.read_round if pid == self.id else pr.acked_round)
                       for pid, pr in self.progress.items())
        r = acked[len(acked) - self.quorum]  # the newest round a quorum has answered
        if r <= self.confirmed_round:
            return
        self.confirmed_round = r
        sent = self.round_sent_at.get(r)
        if sent is not None and self.cfg.lease_s > 0 and self.transferee == NONE:
            self.lease_until = max(self.lease_until, sent + self.cfg.lease_s)
        for k in [k for k in self.round_sent_at if k <= r]:
            del self.round_sent_at[k]
        pending = self._reads_pending
        while pending and pending[0][0] <= r:
            _, index, ctx, src = pending.popleft()
            if src == self.id:
                self._read_states.append((ctx, index))
            else:
                self._msgs.append(Message(MsgType.READ_INDEX_RESP, self.id, src, self.term,
                                          index=index, context=ctx))

    # ------------------------------------------------------------------ reads
    def committed_in_term(self) -> bool:
        """A new leader knows the full commit index only once an entry of its term commits."""
        return self.term_at(self.commit) == self.term

    def read_index(self, ctx: int) -> None:
        """Start a ReadIndex read; its (ctx, index) comes back in `Ready.read_states`.

        On a follower the request goes to the leader (a follower read); on the leader
        all reads queued before the next heartbeat round share that round.
        """
        if self.role == Role.LEADER:
            self._reads_unstarted.append((ctx, self.id))
        elif self.lead != NONE:
            self._follower_reads.append(ctx)
        else:
            raise NotLeader(NONE)

    def lease_read_index(self) -> int | None:
        """The commit index if this leader's lease holds right now, else None (use ReadIndex)."""
        if (self.role == Role.LEADER and self.cfg.lease_s > 0 and self.transferee == NONE
                and self.now < self.lease_until and self.committed_in_term()):
            return self.commit
        return None

    # ------------------------------------------------------------------ snapshots
    def snapshot_taken(self, index: int, term: int) -> None:
        """The driver made a durable snapshot of the state machine at (index, term)."""
        if index > self.snap_index:
            self.snap_index, self.snap_term = index, term

    def compact_log(self, upto: int) -> None:
        """Forget entries up to `upto`; they must be covered by a durable snapshot."""
        upto = min(upto, self.snap_index, self.applied_handed, self.stable)
        if upto <= self.offset:
            return
        term = self.term_at(upto)
        cut = upto - self.offset
        del self.log_terms[:cut]
        del self.log_data[:cut]
        self.offset, self.offset_term = upto, term

    def snapshot_done(self, peer: int, ok: bool) -> None:
        """The driver finished (or gave up) sending a snapshot to `peer`."""
        pr = self.progress.get(peer) if self.role == Role.LEADER else None
        if pr is None or pr.state != ProgressState.SNAPSHOT:
            return
        snap = pr.pending_snapshot
        pr.become_probe()
        if ok:
            pr.next = max(pr.next, snap + 1)
        pr.probe_sent = True  # wait for the follower's ack or the next heartbeat before retrying

    def install_snapshot(self, index: int, term: int) -> bool:
        """A follower's driver restored the state machine from a snapshot at (index, term)."""
        if index <= self.commit:
            return False
        if self.term_at(index) != term:
            # Our log does not contain the snapshot's last entry: nothing in it can be kept.
            self.log_terms.clear()
            self.log_data.clear()
            self.offset, self.offset_term = index, term
            self.stable = self.handed = index
            self._reset_to = (index, term)
        self.commit = index
        self.leader_commit = max(self.leader_commit, index)
        self.applied_handed = max(self.applied_handed, index)
        self.snapshot_taken(index, term)
        if self.lead != NONE:
            self._msgs.append(Message(MsgType.APP_RESP, self.id, self.lead, self.term, index=index))
        return True

    # ------------------------------------------------------------------ output
    def has_ready(self) -> bool:
        return bool(self._msgs or self._hard_dirty or self._bcast_pending
                    or self.handed < self.last_index()
                    or self.applied_handed < self.commit
                    or self._read_states or self._reads_dropped or self._snap_requests
                    or self._reset_to is not None or self._follower_reads
                    or (self._reads_unstarted and self.role == Role.LEADER and self.committed_in_term()))

    def ready(self) -> Ready:
        """Collect the outputs accumulated since the last call."""
        if self._bcast_pending and self.role == Role.LEADER:
            self._bcast_append()
        self._bcast_pending = False
        if self._reads_unstarted and self.role == Role.LEADER and self.committed_in_term():
            # One heartbeat round confirms every read queued since the last one.
            self._bcast_heartbeat()
            rnd = self.read_round
            self._reads_pending.extend((rnd, self.commit, ctx, src) for ctx, src in self._reads_unstarted)
            self._reads_unstarted.clear()
            if len(self.peers) == 1:
                self._confirm_rounds()
        if self._follower_reads:
            if self.lead != NONE and self.role == Role.FOLLOWER:
                self._batch_ids += 1
                self._follower_batches[self._batch_ids] = self._follower_reads
                if len(self._follower_batches) > 1024:  # answers lost with their messages: give up
                    self._reads_dropped.extend(self._follower_batches.pop(next(iter(self._follower_batches))))
                self._msgs.append(Message(MsgType.READ_INDEX, self.id, self.lead, self.term,
                                          context=self._batch_ids))
            else:
                self._reads_dropped.extend(self._follower_reads)
            self._follower_reads = []
        rd = Ready()
        if self._reset_to is not None:
            rd.reset_to, self._reset_to = self._reset_to, None
        if self._hard_dirty:
            rd.hard_state = (self.term, self.vote)
            self._hard_dirty = False
        last = self.last_index()
        if self.handed < last:
            lo = self.handed - self.offset
            rd.entries_first = self.handed + 1
            rd.ent_terms = self.log_terms[lo:]
            rd.ent_data = self.log_data[lo:]
            self.handed = last
        msgs, self._msgs = self._msgs, []
        if rd.hard_state is not None:
            rd.send_after_persist = msgs
        else:
            for m in msgs:
                (rd.send_now if m.type in _SEND_NOW_TYPES else rd.send_after_persist).append(m)
        # Committed entries are durable on a quorum, so they may be applied before this node's
        # own write of them completes (the leader then answers one fsync sooner).
        upto = self.commit
        if self.applied_handed < upto:
            lo = self.applied_handed - self.offset
            rd.apply_first = self.applied_handed + 1
            rd.apply_terms = self.log_terms[lo:upto - self.offset]
            rd.apply_data = self.log_data[lo:upto - self.offset]
            self.applied_handed = upto
        rd.role_changed, self._role_changed = self._role_changed, False
        if self._read_states:
            rd.read_states, self._read_states = self._read_states, []
        if self._reads_dropped:
            rd.reads_dropped, self._reads_dropped = self._reads_dropped, []
        if self._snap_requests:
            rd.snapshot_requests, self._snap_requests = self._snap_requests, []
        return rd
