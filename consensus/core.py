"""The Raft protocol as a pure state machine: no sockets, no disk, no clock of its own.

Inputs are `tick()`, `step(message)`, `propose(commands)`, `transfer_leadership()`
and `persisted(index, term)`; outputs are collected by `ready()` as one `Ready`:
state to persist, messages to send (split into those that may leave at once and
those that must wait until the Ready's writes are durable) and committed entries
to apply. The asyncio runtime (`node.py`) and the simulator (`simulation.py`) both
drive this class, so everything proven in simulation is the code that runs.

Time comes from the `clock` given at construction (seconds, monotonic), as randomness
comes from the given `rng`: the runtime passes its real clock, the simulator each
node's simulated one. Timers are counted in ticks of `RaftConfig.tick_s` seconds: with
`tick_s` set (every runtime sets it), election timeouts, vote refusal after hearing a leader,
CheckQuorum and a leader's quorum silence measure elapsed time on the clock, and a tick only
checks them, so late ticks do not add up; without it (unit tests that tick by hand on a
frozen clock) they count ticks. Leases and the follower-read freshness check read the clock.

The parts live in their own modules, as in etcd's raft library: the log and its
cursors (`log.py`), each follower's progress and inflight window (`progress.py`),
the read-only machinery (`read_only.py`), the message kinds (`messages.py`). What a
node does with a message or a tick depends on its role; the handlers are chosen once,
when the role changes (`_set_role`).

Protocol features: randomized election timeouts, PreVote, CheckQuorum (handing over
to the most up-to-date follower on stepping down) with vote refusal while a leader is
known (lease), a no-op entry on election, fast conflict backtracking, per-follower
pipelining with an inflight window, the leader writing its own log in parallel with
replication, leadership transfer.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum, IntEnum

from . import mutations
from .errors import NoQuorum, NotLeader, ProposalDropped
from .log import RaftLog
from .messages import (
    MAX_TERM,
    MAX_TERM_JUMP,
    Append,
    AppendResp,
    Heartbeat,
    HeartbeatResp,
    Message,
    MsgType,
    PreVote,
    PreVoteResp,
    ReadIndex,
    ReadIndexResp,
    TimeoutNow,
    Vote,
    VoteRequest,
    VoteResp,
    VoteResponse,
)
from .progress import Progress, ProgressState, quorum_value
from .read_only import ReadOnly

__all__ = ["NONE", "REJOIN_FLOOR", "RaftConfig", "RaftCore", "Ready", "Role"]

NONE = 0  # node ids start at 1; 0 means "nobody"
# The vote floor of a node restored empty (`electra node --rejoin`): it acknowledged entries it no longer
# has, up to an index it does not know, so it votes for nobody and never campaigns until, once enough of the
# others told it their terms (`RaftCore.term_probe`), a leader's heartbeat names that leader's last index,
# which becomes its floor (`RaftCore._learn_floor`).
REJOIN_FLOOR = (MAX_TERM, MAX_TERM)


class Role(IntEnum):
    FOLLOWER = 0
    PRE_CANDIDATE = 1
    CANDIDATE = 2
    LEADER = 3


class _Poll(Enum):
    """Where an election stands after counting an answer."""

    PENDING = 0
    WON = 1
    LOST = 2


@dataclass
class RaftConfig:
    """Timing is counted in ticks; the runtime decides how long a tick is."""

    election_ticks: int = 10  # timeouts are drawn from [election_ticks, election_ticks + election_jitter_ticks)
    # How widely election timeouts are spread (None: election_ticks, the classic [e, 2e)). A narrower
    # spread elects sooner after a leader is lost; two followers still rarely fire within one
    # message round trip, because each node's ticks run on its own phase (docs/raft-engine.md).
    election_jitter_ticks: int | None = None
    heartbeat_ticks: int = 1
    max_entries_per_msg: int = 8192
    max_bytes_per_msg: int = 4 << 20
    max_inflight: int = 32  # AppendEntries in flight per follower (flow-control window)
    pre_vote: bool = True
    check_quorum: bool = True
    # Lease reads: how long after a heartbeat round's *send* time a quorum ack keeps this
    # leader sure that no other leader exists (seconds, on the core's clock).
    # 0 disables them. Safe only below the followers' vote-refusal window (see docs).
    lease_s: float = 0.0
    # How long a tick is (seconds on the core's clock). Set: timers measure elapsed time, a timeout of
    # n ticks lasting n * tick_s seconds however late the ticks run. None: timers count ticks.
    tick_s: float | None = None


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
    vote_floor: tuple[int, int] | None = None  # (index, term) when a rejoining node learned its floor
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
        return (self.hard_state is not None or bool(self.ent_terms) or self.reset_to is not None
                or self.vote_floor is not None)


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
        clock: Callable[[], float],
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

        `clock` returns the driver's monotonic time in seconds. `snapshot` is (index, term)
        of the newest local state-machine snapshot, which the driver has already restored:
        it is committed and applied. `vote_floor` is the (index, term) of the newest entry of
        a log this node lost (a damaged snapshot): it votes as if its log still ended there,
        so it never helps elect a candidate that misses entries it had acknowledged, and it
        does not campaign until its own log has caught up to that point.
        """
        if node_id not in peers:
            raise ValueError(f"node {node_id} is not in its own peer list {peers}")
        if node_id == NONE or len(set(peers)) != len(peers):
            raise ValueError("node ids must be unique and non-zero")
        self.id = node_id
        self.peers = sorted(peers)
        self.cfg = config or RaftConfig()
        self.clock = clock
        self.rng = rng or random.Random()
        self.quorum = len(self.peers) // 2 + 1

        self.term = term
        self.vote = vote
        self.vote_floor = (vote_floor[0], vote_floor[1])
        self._floor_dirty = False  # a rejoining node's floor, learned from its first leader, to persist
        # A rejoining node forgot its term too, so a stale leader (paused, partitioned) would look current to
        # it: it first asks the others for their terms (a PreVote of term 0, which every node refuses with
        # its own term) and acknowledges no leader until a quorum of them answered. Any quorum of the others
        # holds a node of every quorum that committed an entry, so its term is then at least that entry's,
        # and only a leader of a term that high, which holds every committed entry, can give it its floor.
        self.term_probe: set[int] | None = None  # the others that have not answered yet; None: not probing
        self._probe_heard: set[int] = set()
        if self.vote_floor == REJOIN_FLOOR:
            self.term_probe = {p for p in peers if p != node_id}
        self.lead = NONE
        # A node that has just started may have acknowledged a leader's heartbeat round an instant before it
        # stopped: that leader's lease counts on it not voting for an election timeout from that ack. It does
        # not know when that was, so it keeps the promise for an election timeout from its start (until it
        # hears a leader, campaigns itself, or the window passes), as if it had heard a leader at start.
        self._boot_quiet = True
        self.log = RaftLog(log_offset, offset_term, list(log_terms or []), list(log_data or []),
                           commit=commit, applied=applied, snapshot=snapshot)
        self.reads = ReadOnly(self.log.commit)

        self._ticks = 0  # ticks so far: the core's time when tick_s is None
        self._timer_start = self._now()  # when the election timer (CheckQuorum's window on a leader) was reset
        self._started_at = self._timer_start
        self.timeout = self._random_timeout()
        self.heartbeat_elapsed = 0
        self.votes: dict[int, bool] = {}
        self.campaign_force = False  # the running campaign is a leadership transfer's (TimeoutNow)
        self.progress: dict[int, Progress] = {}
        self.transferee = NONE
        self.transfer_elapsed = 0
        self._round_times: dict[int, float] = {}  # heartbeat rounds of the last election timeout -> when sent

        self._snap_requests: list[int] = []
        self.refused_terms = 0  # messages dropped for a term jump beyond MAX_TERM_JUMP
        # Set when a leader's log contradicts an entry committed here: this node's log cannot be
        # trusted (a bad bootstrap, a data dir copied from elsewhere). The host must fail-stop.
        self.diverged: str | None = None
        self._msgs: list[Message] = []
        self._hard_dirty = False
        self._role_changed = False
        self._bcast_pending = False
        self._set_role(Role.FOLLOWER)

    # ------------------------------------------------------------------ the log, as drivers see it
    def last_index(self) -> int:
        return self.log.last_index()

    def last_term(self) -> int:
        return self.log.last_term()

    def term_at(self, index: int) -> int | None:
        """Term of the entry at `index`, or None if it is compacted away or absent."""
        return self.log.term_at(index)

    @property
    def offset(self) -> int:
        """The last compacted index (entries up to it live only in a snapshot)."""
        return self.log.offset

    @property
    def log_terms(self) -> list[int]:
        return self.log.terms

    @property
    def log_data(self) -> list[bytes]:
        return self.log.data

    @property
    def commit(self) -> int:
        return self.log.commit

    @commit.setter
    def commit(self, index: int) -> None:
        self.log.commit = index

    @property
    def stable(self) -> int:
        return self.log.stable

    @stable.setter
    def stable(self, index: int) -> None:
        self.log.stable = index

    @property
    def handed(self) -> int:
        return self.log.handed

    @handed.setter
    def handed(self, index: int) -> None:
        self.log.handed = index

    @property
    def snap_index(self) -> int:
        return self.log.snap_index

    @property
    def read_round(self) -> int:
        return self.reads.round

    @property
    def leader_commit(self) -> int:
        """A follower's latest word of its leader's commit index (bounded-staleness reads)."""
        return self.reads.leader_commit

    @property
    def last_leader_contact(self) -> float:
        """When (on the clock) this node last heard from a leader it follows."""
        return self.reads.last_leader_contact

    # ------------------------------------------------------------------ time
    def _now(self) -> float:
        """The core's time in ticks: the clock over `tick_s`, or the ticks counted when it is unset."""
        tick_s = self.cfg.tick_s
        return self.clock() / tick_s if tick_s else float(self._ticks)

    @property
    def elapsed(self) -> float:
        """Ticks' worth of time since the election timer was reset (its last leader contact, vote or campaign)."""
        return self._now() - self._timer_start

    def _reset_timer(self) -> None:
        self._timer_start = self._now()

    def election_due_s(self) -> float | None:
        """Seconds on the clock until this node's election timeout runs out, for a driver that ticks once
        more at that moment instead of up to a tick later; None on a leader or when timers count ticks."""
        if self.role == Role.LEADER or not self.cfg.tick_s:
            return None
        return max(0.0, (self.timeout - self.elapsed) * self.cfg.tick_s)

    # ------------------------------------------------------------------ roles
    def _set_role(self, role: Role) -> None:
        """Choose the handlers of `role`: every role-dependent reaction goes through these."""
        self.role = role
        if role == Role.LEADER:
            self._step_role, self._tick_role, self._prepare_ready = (
                self._step_leader, self._tick_leader, self._prepare_leader)
        elif role == Role.FOLLOWER:
            self._step_role, self._tick_role, self._prepare_ready = (
                self._step_follower, self._tick_election, self._prepare_follower)
        else:
            self._step_role = self._step_pre_candidate if role == Role.PRE_CANDIDATE else self._step_candidate
            self._tick_role, self._prepare_ready = self._tick_election, self._prepare_candidate

    def _random_timeout(self) -> int:
        e = self.cfg.election_ticks
        jitter = self.cfg.election_jitter_ticks
        return e + self.rng.randrange(max(1, e if jitter is None else jitter))

    def _set_term(self, term: int) -> None:
        if term != self.term:
            self.term = term
            self.vote = NONE
            self._hard_dirty = True

    def _become_follower(self, term: int, lead: int) -> None:
        self._boot_quiet = False
        if self.role != Role.FOLLOWER or self.lead != lead:
            self._role_changed = True
        self._set_term(term)
        self._set_role(Role.FOLLOWER)
        self.lead = lead
        self._reset_timer()
        self.timeout = self._random_timeout()
        self.transferee = NONE
        self.progress = {}
        self.reads.drop_all(self.id)  # a leader that steps down can confirm no read

    def _become_leader(self) -> None:
        self._boot_quiet = False
        self._set_role(Role.LEADER)
        self.lead = self.id
        self._role_changed = True
        self.heartbeat_elapsed = 0
        self._reset_timer()
        self.transferee = NONE
        self.reads.drop_all(self.id)
        self.reads.confirmed_round = self.reads.round
        self._round_times = {}
        nxt = self.log.last_index() + 1
        self.progress = {p: Progress(nxt, self.cfg.max_inflight, heard_at=self._timer_start) for p in self.peers}
        me = self.progress[self.id]
        me.match, me.next, me.state = self.log.stable, nxt, ProgressState.REPLICATE
        # A no-op of the new term lets earlier-term entries commit (Raft §5.4.2).
        self._append_as_leader([b""])
        self._maybe_commit()

    def behind_vote_floor(self) -> bool:
        """Its log is behind its vote floor (`vote_floor`): it neither votes for a log like its own nor campaigns."""
        floor_index, floor_term = self.vote_floor
        return (self.log.last_term(), self.log.last_index()) < (floor_term, floor_index)

    def _campaign(self, pre: bool, force: bool = False) -> None:
        self._boot_quiet = False  # its own timeout passed without a leader (or it was asked to take over)
        if self.term >= MAX_TERM:
            self._reset_timer()  # peers refuse terms beyond MAX_TERM (docs/security.md); stay a follower
            return
        if self.behind_vote_floor():
            # It would not vote for a log like its own: it must not vote for itself either.
            self._reset_timer()
            self.timeout = self._random_timeout()
            return
        if pre:
            self._set_role(Role.PRE_CANDIDATE)
        else:
            self._set_role(Role.CANDIDATE)
            self._set_term(self.term + 1)
            self.vote = self.id
            self._hard_dirty = True
        self._role_changed = True
        self.lead = NONE
        self._reset_timer()
        self.timeout = self._random_timeout()
        self.votes = {self.id: True}
        self.campaign_force = force
        if self._tally() >= self.quorum:
            if pre:
                self._campaign(pre=False, force=force)
            else:
                self._become_leader()
            return
        self._request_votes()

    def _request_votes(self) -> None:
        """Ask every peer that has not answered this campaign for its (pre-)vote.

        Called when the campaign starts and again on every tick while it runs: a peer that still
        heard from the old leader within its election timeout drops the request without an answer
        (the lease rule), and may be free to answer one tick later. Asking again costs one small
        message per tick and spares the candidate a whole new election timeout."""
        pre = self.role == Role.PRE_CANDIDATE
        request: type[VoteRequest] = PreVote if pre else Vote
        vote_term = self.term + 1 if pre else self.term
        li, lt = self.log.last_index(), self.log.last_term()
        for p in self.peers:
            if p != self.id and p not in self.votes:
                self._msgs.append(request(self.id, p, vote_term, last_index=li, last_term=lt,
                                          force=self.campaign_force))

    def _tally(self) -> int:
        return sum(1 for v in self.votes.values() if v)

    # ------------------------------------------------------------------ inputs
    def tick(self) -> None:
        """Advance logical time by one tick."""
        self._ticks += 1
        self._tick_role()

    def _tick_election(self) -> None:
        if self.term_probe is not None:
            self._probe_terms()
        if self.elapsed >= self.timeout:
            self._campaign(pre=self.cfg.pre_vote)
        elif self.role in (Role.PRE_CANDIDATE, Role.CANDIDATE):
            self._request_votes()

    def _tick_leader(self) -> None:
        self.heartbeat_elapsed += 1
        if self.heartbeat_elapsed >= self.cfg.heartbeat_ticks:
            self.heartbeat_elapsed = 0
            self._bcast_heartbeat()
        if self.transferee != NONE:
            self.transfer_elapsed += 1
            if self.transfer_elapsed >= self.cfg.election_ticks:
                self.transferee = NONE  # give up; resume accepting proposals
        if self.elapsed >= self.cfg.election_ticks:
            self._reset_timer()
            if self.cfg.check_quorum and not self._quorum_active():
                self._step_down_handing_over()

    def _step_down_handing_over(self) -> None:
        """CheckQuorum: step down, and tell the most up-to-date follower to campaign at once (TimeoutNow).

        Its followers may still hear this leader until the step-down (a partition healed just before the
        window ended): they would refuse votes, and wait, for a whole election timeout after its last
        message. A forced campaign skips that refusal, which is safe here as in a leadership transfer:
        the refusal protects this leader's lease, and the lease ends as it steps down. If the follower
        is out of reach the message is lost and the followers' timeouts elect a leader as before."""
        best = max(((pr.match, -pid) for pid, pr in self.progress.items() if pid != self.id), default=(0, 0))
        self._become_follower(self.term, NONE)
        if best[1]:
            self._msgs.append(TimeoutNow(self.id, -best[1], self.term))

    def _quorum_active(self) -> bool:
        active = 0
        for pid, pr in self.progress.items():
            if pid == self.id or pr.recent_active:
                active += 1
            pr.recent_active = False
        return active >= self.quorum

    @property
    def quorum_silent(self) -> bool:
        """A leader that has heard from no quorum for a whole election timeout (checked at every call).

        A follower was last heard from when the newest heartbeat round it answered was sent: an answer
        proves nothing later than that, and answers read late (by a leader whose process was stopped, and
        finds them waiting when it wakes) must not make a cut-off leader look connected.

        By then the others may be electing a new leader. It keeps its role until CheckQuorum, whose
        window ends up to one more election timeout later, but takes no new proposals (ProposalDropped:
        certainly not appended, so a client tries another node) and the runtime answers the uncommitted
        ones as of unknown outcome, instead of letting their callers wait on a leader that cannot commit;
        ReadIndex reads likewise (its lease, while it holds, still answers lease reads).
        """
        if self.role != Role.LEADER or len(self.peers) == 1:
            return False
        since = self._now() - self.cfg.election_ticks
        heard = 0  # a loop, not sum() over a generator: the leader asks at every ReadIndex read
        for pid, pr in self.progress.items():
            if pid == self.id or pr.heard_at > since:
                heard += 1
        return heard < self.quorum

    def propose(self, commands: list[bytes]) -> int:
        """Append commands as the leader; returns the index of the first one."""
        if self.role != Role.LEADER:
            raise NotLeader(self.lead)
        if self.transferee != NONE:
            raise ProposalDropped(f"leadership transfer to node {self.transferee} in progress")
        if self.quorum_silent:
            raise NoQuorum(f"leader {self.id} has heard from no quorum for an election timeout")
        first = self.log.last_index() + 1
        self._append_as_leader(commands)
        return first

    def _append_as_leader(self, commands: list[bytes]) -> None:
        self.log.append([self.term] * len(commands), commands)
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
        self.reads.revoke_lease()  # the target may take over before any lease would end
        pr = self.progress[target]
        if pr.match == self.log.last_index():
            self._msgs.append(TimeoutNow(self.id, target, self.term))
        else:
            self._send_append(target, pr)

    def persisted(self, index: int, term: int) -> None:
        """The runtime made entries up to (index, term) durable."""
        if self.log.persisted(index, term) and self.role == Role.LEADER:
            self.progress[self.id].match = index
            self._maybe_commit()

    def step(self, m: Message) -> None:
        """Process one message from a peer."""
        if m.src not in self.peers or m.src == self.id:
            return
        if self.term_probe is not None and isinstance(m, PreVoteResp) and m.reject and \
                m.term - self.term <= MAX_TERM_JUMP:
            self._heard_for_probe(m.src)  # its term is adopted below, as any higher term is
        if m.term > self.term:
            if m.term - self.term > MAX_TERM_JUMP:
                self.refused_terms += 1  # docs/security.md: a jump no real election history produces
                return
            if m.type in _ECHOED_TERM_TYPES or (isinstance(m, VoteResponse) and not m.reject and (
                    isinstance(m, VoteResp) or m.term != self.term + 1)):
                return  # these echo a term we sent; a higher one is forged or corrupt
            if isinstance(m, VoteRequest):
                # A leader holds its lease until CheckQuorum steps it down (on a tick that may come a
                # little after its window ends on the clock); a follower for a timeout after last contact.
                in_lease = (self.cfg.check_quorum and (self.lead != NONE or self._boot_quiet)
                            and (self.role == Role.LEADER or self.elapsed < self.cfg.election_ticks))
                if in_lease and not self._is_transfer_vote(m):
                    return  # we heard from a live leader recently: do not help unseat it
            if isinstance(m, PreVote) or (isinstance(m, PreVoteResp) and not m.reject):
                pass  # pre-votes never change terms
            elif isinstance(m, Append | Heartbeat):
                self._become_follower(m.term, m.src)
            else:
                self._become_follower(m.term, NONE)
        elif m.term < self.term:
            if isinstance(m, Append | Heartbeat) and (self.cfg.check_quorum or self.cfg.pre_vote):
                # Tell a stale leader about the newer term so it steps down.
                self._msgs.append(AppendResp(self.id, m.src, self.term))
            elif isinstance(m, PreVote):
                self._msgs.append(PreVoteResp(self.id, m.src, self.term, reject=True))
            return
        if isinstance(m, VoteRequest):
            self._handle_vote_request(m)  # the same in every role
        else:
            self._step_role(m)

    def _step_leader(self, m: Message) -> None:
        if isinstance(m, AppendResp):
            if m.index > self.log.last_index() and not m.reject:
                return  # acknowledges entries we never had: forged or corrupt
            self._handle_append_resp(m)
        elif isinstance(m, HeartbeatResp):
            self._handle_heartbeat_resp(m)
        elif isinstance(m, ReadIndex):
            idx = self.lease_read_index()
            if idx is not None:  # one round trip instead of two while the lease holds
                self._msgs.append(ReadIndexResp(self.id, m.src, self.term, index=idx, batch=m.batch))
            else:
                self.reads.queue(m.batch, m.src)

    def _step_follower(self, m: Message) -> None:
        if isinstance(m, TimeoutNow):
            self._campaign(pre=False, force=True)
        else:
            self._step_replica(m)

    def _step_pre_candidate(self, m: Message) -> None:
        if isinstance(m, PreVoteResp):
            if not m.reject and m.term != self.term + 1:
                return  # a grant for some other pre-vote
            outcome = self._poll(m)
            if outcome is _Poll.WON:
                self._campaign(pre=False)
            elif outcome is _Poll.LOST:
                self._become_follower(self.term, NONE)
        else:
            self._step_replica(m)

    def _step_candidate(self, m: Message) -> None:
        if isinstance(m, VoteResp):
            outcome = self._poll(m)
            if outcome is _Poll.WON:
                self._become_leader()
            elif outcome is _Poll.LOST:
                self._become_follower(self.term, NONE)
        else:
            self._step_replica(m)

    def _step_replica(self, m: Message) -> None:
        """What every role but the leader does with a leader's messages."""
        if isinstance(m, Append | Heartbeat) and self.term_probe is not None:
            return  # rejoining: no leader is acknowledged before a quorum of the others told their terms
        if isinstance(m, Append):
            self._become_follower_of(m)
            self._handle_append(m)
        elif isinstance(m, Heartbeat):
            self._become_follower_of(m)
            if self.vote_floor == REJOIN_FLOOR and m.last_index:  # 0: a leader that predates it, or not a leader's
                self._learn_floor(m.last_index, m.term)
            self._handle_heartbeat(m)
        elif isinstance(m, ReadIndexResp):
            self.reads.answer_batch(m.batch, m.index)

    def _is_transfer_vote(self, m: VoteRequest) -> bool:
        """Whether a `force` vote request is what a leadership transfer produces.

        The transferee campaigns from the leader's term on TimeoutNow, so its vote asks for
        exactly our term + 1; the leader itself honours it only from the node it is handing
        over to. Any other `force` flag is ignored, so a forged one cannot skip the lease.
        """
        if not m.force or m.term != self.term + 1:
            return False
        return self.role != Role.LEADER or m.src == self.transferee

    def _heard_for_probe(self, src: int) -> None:
        assert self.term_probe is not None
        self.term_probe.discard(src)
        self._probe_heard.add(src)
        # n - quorum + 1 of the others share a node with every quorum minus this one (the quorum itself for an
        # odd group; one less for an even one, where the quorum of the others would be all of them or more)
        if len(self._probe_heard) >= len(self.peers) - self.quorum + 1:
            self.term_probe = None

    def _probe_terms(self) -> None:
        """Ask the others that have not answered for their terms (each tick, as `_request_votes` asks again),
        from the longest election timeout after its start on: a campaign it voted in before the wipe has then
        ended, won (its voters, a quorum, hold its term and some answer) or timed out (it cannot win that term
        any more). A candidate paused across that time is the case this does not cover."""
        assert self.term_probe is not None
        e, jitter = self.cfg.election_ticks, self.cfg.election_jitter_ticks
        if self._now() - self._started_at < e + max(1, e if jitter is None else jitter) + 1:
            return
        for p in sorted(self.term_probe):
            self._msgs.append(PreVote(self.id, p, 0, last_index=0, last_term=0))

    def _learn_floor(self, leader_last: int, term: int) -> None:
        """A rejoining node heard a leader's heartbeat since enough of the others told it their terms (so that
        leader's term is at least every committed entry's, and it holds them all): it may vote and campaign
        again once its own log holds the leader's whole log as of that heartbeat. Not only what the leader had
        committed: the leader still counts this node's acknowledgements from before the wipe until its first
        answer arrives, and may commit entries up to its last index with them. The entry there is of `term`,
        so the floor is exact; it is never lifted by a log missing an entry this node acknowledged."""
        self.vote_floor = (leader_last, term)
        self._floor_dirty = True

    def _become_follower_of(self, m: Append | Heartbeat) -> None:
        if self.role != Role.FOLLOWER or self.lead != m.src:
            self._become_follower(m.term, m.src)
        self._reset_timer()
        self.reads.last_leader_contact = self.clock()

    # ------------------------------------------------------------------ elections
    def _handle_vote_request(self, m: VoteRequest) -> None:
        pre = isinstance(m, PreVote)
        floor_index, floor_term = self.vote_floor
        mine = max((self.log.last_term(), self.log.last_index()), (floor_term, floor_index))
        up_to_date = (m.last_term, m.last_index) >= mine
        if pre:
            can_vote = m.term > self.term
        else:
            can_vote = self.vote == m.src or (self.vote == NONE and self.lead == NONE)
            if mutations.enabled("double_vote"):  # the deliberate bug: forget whom we voted for
                can_vote = self.lead == NONE
        answer = PreVoteResp if pre else VoteResp
        if can_vote and up_to_date:
            self._msgs.append(answer(self.id, m.src, m.term))
            if not pre:
                self.vote = m.src
                self._hard_dirty = True
                self._reset_timer()
            elif self.role == Role.PRE_CANDIDATE and m.term == self.term + 1 and m.src < self.id:
                # Two pre-candidates for the same term would both pass PreVote and split the real
                # vote; the one with the higher id steps back (its log is no newer), the other wins.
                self._become_follower(self.term, NONE)
        else:
            self._msgs.append(answer(self.id, m.src, self.term, reject=True))

    def _poll(self, m: VoteResponse) -> _Poll:
        """Count a (pre-)vote answer (the first one from each voter counts)."""
        self.votes.setdefault(m.src, not m.reject)
        granted = self._tally()
        if granted >= self.quorum:
            return _Poll.WON
        if len(self.votes) - granted >= self.quorum:
            return _Poll.LOST
        return _Poll.PENDING

    # ------------------------------------------------------------------ follower side
    def _handle_append(self, m: Append) -> None:
        log = self.log
        prev = m.prev_index
        if prev <= log.commit:
            mine = log.term_at(prev)
            if mine is not None and mine != m.prev_term:
                # Committed entries are in every later leader's log (Leader Completeness): a leader that
                # has another term at a committed index means this log is not the cluster's. Answering
                # would only loop (the leader backs off to the commit index, which "matches", and tries
                # again); refuse it and let the host stop (etcd's raft panics here).
                self.diverged = (f"entry {prev} is committed here in term {mine}, but leader {m.src} (term "
                                 f"{m.term}) has it in term {m.prev_term}")
                return
        if prev < log.commit:
            # Already committed here; answer with what we know so the leader moves on (never
            # more than this log holds: the leader counts the answer as a replica).
            self._msgs.append(AppendResp(self.id, m.src, self.term, index=min(log.commit, log.last_index())))
            return
        if log.term_at(prev) != m.prev_term:
            self._reject_append(m)
            return
        last_new = log.merge(prev, m.ent_terms, m.ent_data)
        if m.commit > log.commit:
            log.commit = min(m.commit, last_new)
        if m.commit > self.reads.leader_commit:
            self.reads.leader_commit = m.commit
        self._msgs.append(AppendResp(self.id, m.src, self.term, index=last_new))

    def _reject_append(self, m: Append) -> None:
        """Refuse an append that does not match; the hint says where to retry.

        `hint_term == 0` means "my log ends at `hint_index - 1`" (Raft terms start at 1):
        the leader may then lower even its recorded match for us, since we prove we lost
        entries (a torn log tail after a crash).
        """
        hint_index, hint_term = self.log.conflict_hint(m.prev_index)
        self._msgs.append(AppendResp(self.id, m.src, self.term, index=m.prev_index, reject=True,
                                     hint_index=hint_index, hint_term=hint_term))

    def _handle_heartbeat(self, m: Heartbeat) -> None:
        log = self.log
        if m.commit > log.commit:
            log.commit = min(m.commit, log.last_index())
        if m.leader_commit > self.reads.leader_commit:
            self.reads.leader_commit = m.leader_commit
        self._msgs.append(HeartbeatResp(self.id, m.src, self.term, last_index=log.last_index(), round=m.round))

    # ------------------------------------------------------------------ leader side
    def _handle_append_resp(self, m: AppendResp) -> None:
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
                after = self.log.after_term(m.hint_term, m.index)
                if after is not None:
                    nxt = after
            pr.become_probe()
            pr.next = max(min(nxt, m.index), pr.match + 1)
            self._send_append(m.src, pr)
            return
        if pr.acked(m.index):
            if self._maybe_commit():
                self._bcast_pending = True  # followers learn the new commit index promptly
            if m.src == self.transferee and pr.match == self.log.last_index():
                self._msgs.append(TimeoutNow(self.id, m.src, self.term))
        elif pr.state == ProgressState.PROBE:
            pr.probe_sent = False
        if pr.next <= self.log.last_index():
            self._send_append(m.src, pr)

    def _correct_match(self, to: int, pr: Progress, follower_last: int) -> None:
        """The follower proved its log ends at `follower_last`, below its recorded match: it lost
        entries (a torn tail). Lower the match (the commit index never moves back, and a quorum
        still holds every committed entry) and probe from where its log really ends."""
        pr.match = follower_last
        pr.become_probe()
        self._send_append(to, pr)

    def _handle_heartbeat_resp(self, m: HeartbeatResp) -> None:
        pr = self.progress[m.src]
        pr.recent_active = True
        sent = self._round_times.get(m.round)
        if sent is not None and sent > pr.heard_at:
            pr.heard_at = sent
        pr.probe_sent = False
        if m.round > pr.acked_round:
            pr.acked_round = m.round
            self._confirm_rounds()
        if pr.state == ProgressState.SNAPSHOT:
            return
        if m.last_index < pr.match:
            # Its log (answered after its writes were durable) ends below what it acknowledged:
            # it lost its tail in a crash. Correct the match and probe from its real end.
            self._correct_match(m.src, pr, m.last_index)
            pr.match_at_hb = pr.match
            return
        if pr.match < self.log.last_index():
            if pr.state == ProgressState.REPLICATE and pr.match == pr.match_at_hb:
                # No progress over a whole heartbeat round: appends or acks were lost.
                pr.become_probe()
            self._send_append(m.src, pr)
        pr.match_at_hb = pr.match

    def _maybe_commit(self) -> bool:
        q = quorum_value((pr.match for pr in self.progress.values()), self.quorum)
        # Only entries of the current term commit by counting replicas (Raft §5.4.2).
        if q > self.log.commit and self.log.term_at(q) == self.term:
            self.log.commit = q
            return True
        return False

    def _send_append(self, to: int, pr: Progress) -> None:
        if pr.paused():
            return
        log = self.log
        prev = pr.next - 1
        prev_term = log.term_at(prev)
        if prev_term is None:  # compacted away: only a snapshot can bring this follower up
            pr.become_snapshot(log.snap_index)
            self._snap_requests.append(to)
            return
        terms, data = log.entries_after(prev, self.cfg.max_entries_per_msg, self.cfg.max_bytes_per_msg)
        pr.sent_commit = log.commit
        self._msgs.append(Append(self.id, to, self.term, prev_index=prev, prev_term=prev_term,
                                 ent_terms=terms, ent_data=data, commit=log.commit))
        pr.sent(prev, len(terms))

    def _bcast_append(self) -> None:
        last = self.log.last_index()
        for pid, pr in self.progress.items():
            if pid == self.id:
                continue
            # Keep sending while the window allows: one Ready may carry several batches.
            while True:
                before = (pr.next, len(pr.inflight), pr.probe_sent)
                if pr.next > last and pr.sent_commit >= self.log.commit:
                    break  # nothing new, and the follower already knows the commit index
                self._send_append(pid, pr)
                if (pr.next, len(pr.inflight), pr.probe_sent) == before or pr.next > last:
                    break

    def _bcast_heartbeat(self) -> None:
        """Every broadcast is a numbered round: its quorum ack confirms reads and extends the lease."""
        rnd = self.reads.start_round(self.clock())
        now, times = self._now(), self._round_times
        times[rnd] = now
        while (oldest := next(iter(times))) != rnd and times[oldest] <= now - self.cfg.election_ticks:
            del times[oldest]  # answers to it could not end a quorum silence any more
        commit = self.log.commit
        for pid, pr in self.progress.items():
            if pid != self.id:
                self._msgs.append(Heartbeat(self.id, pid, self.term, commit=min(pr.match, commit),
                                            leader_commit=commit, round=rnd, last_index=self.log.last_index()))
        if len(self.peers) == 1:
            self._confirm_rounds()

    def _confirm_rounds(self) -> None:
        rnd = quorum_value((self.reads.round if pid == self.id else pr.acked_round
                            for pid, pr in self.progress.items()), self.quorum)
        lease_s = self.cfg.lease_s if self.transferee == NONE else 0.0
        for src, ctx, index in self.reads.confirm(rnd, self.id, lease_s):
            self._msgs.append(ReadIndexResp(self.id, src, self.term, index=index, batch=ctx))

    # ------------------------------------------------------------------ reads
    def committed_in_term(self) -> bool:
        """A new leader knows the full commit index only once an entry of its term commits."""
        return self.log.term_at(self.log.commit) == self.term

    def read_index(self, ctx: int) -> None:
        """Start a ReadIndex read; its (ctx, index) comes back in `Ready.read_states`.

        On a follower the request goes to the leader (a follower read); on the leader
        all reads queued before the next heartbeat round share that round.
        """
        if self.role == Role.LEADER:
            if self.quorum_silent:  # its round would not be answered
                raise NoQuorum(f"leader {self.id} has heard from no quorum for an election timeout")
            self.reads.queue(ctx, self.id)
        elif self.lead != NONE:
            self.reads.queue_follower(ctx)
        else:
            raise NotLeader(NONE)

    def best_transferee(self) -> int | None:
        """The most caught-up follower among those that answered a heartbeat round sent within the last half
        election timeout (ties: the one heard from last), for a leadership transfer with no target; None when
        this node does not lead or no follower qualifies.

        A follower is judged by `heard_at`, on the core's clock in ticks. (The driver used to compare it with
        the clock in seconds, which let every follower pass, and CheckQuorum's `recent_active`, which stays set
        for up to two election timeouts: a transfer went to a follower stopped seconds before.)"""
        if self.role != Role.LEADER:
            return None
        since = self._now() - self.cfg.election_ticks / 2
        best: tuple[int, float, int] | None = None
        for pid, pr in self.progress.items():
            if pid != self.id and pr.heard_at > since and (best is None or (pr.match, pr.heard_at, pid) > best):
                best = (pr.match, pr.heard_at, pid)
        return best[2] if best is not None else None

    def lease_read_index(self) -> int | None:
        """The commit index if this leader's lease holds right now, else None (use ReadIndex)."""
        if (self.role == Role.LEADER and self.cfg.lease_s > 0 and self.transferee == NONE
                and self.reads.lease_holds(self.clock()) and self.committed_in_term()):
            return self.log.commit
        return None

    # ------------------------------------------------------------------ snapshots
    def snapshot_taken(self, index: int, term: int) -> None:
        """The driver made a durable snapshot of the state machine at (index, term)."""
        self.log.snapshot_taken(index, term)

    def compact_log(self, upto: int) -> None:
        """Forget entries up to `upto`; they must be covered by a durable snapshot."""
        self.log.compact(upto)

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
        if index <= self.log.commit:
            return False
        self.log.restore(index, term)
        self.reads.leader_commit = max(self.reads.leader_commit, index)
        if self.lead != NONE:
            self._msgs.append(AppendResp(self.id, self.lead, self.term, index=index))
        return True

    # ------------------------------------------------------------------ output
    def has_ready(self) -> bool:
        log, reads = self.log, self.reads
        return bool(self._msgs or self._hard_dirty or self._bcast_pending
                    or log.handed < log.last_index()
                    or log.applied_handed < log.commit
                    or reads.has_output() or self._snap_requests
                    or log.pending_reset is not None or reads.has_follower_reads()
                    # only a leader has unstarted reads (stepping down drops them)
                    or (reads.round_due() and self.committed_in_term()))

    def _prepare_leader(self) -> None:
        if self._bcast_pending:
            self._bcast_append()
        if self.reads.round_due() and self.committed_in_term():
            # One heartbeat round confirms every read queued since the last one.
            self._bcast_heartbeat()
            self.reads.start_reads(self.log.commit)
            if len(self.peers) == 1:
                self._confirm_rounds()

    def _prepare_follower(self) -> None:
        if self.reads.has_follower_reads():
            if self.lead != NONE:
                batch = self.reads.take_follower_batch()
                self._msgs.append(ReadIndex(self.id, self.lead, self.term, batch=batch))
            else:
                self.reads.drop_follower_reads()

    def _prepare_candidate(self) -> None:
        self.reads.drop_follower_reads()  # reads queued as a follower have no leader to ask now

    def ready(self) -> Ready:
        """Collect the outputs accumulated since the last call."""
        self._prepare_ready()
        self._bcast_pending = False
        log = self.log
        rd = Ready()
        if log.pending_reset is not None:
            rd.reset_to, log.pending_reset = log.pending_reset, None
        if self._hard_dirty:
            rd.hard_state = (self.term, self.vote)
            self._hard_dirty = False
        if self._floor_dirty:
            rd.vote_floor, self._floor_dirty = self.vote_floor, False
        if log.has_unhanded():
            rd.entries_first, rd.ent_terms, rd.ent_data = log.take_unhanded()
        msgs, self._msgs = self._msgs, []
        if rd.hard_state is not None:
            rd.send_after_persist = msgs
        else:
            for m in msgs:
                (rd.send_now if m.type in _SEND_NOW_TYPES else rd.send_after_persist).append(m)
        # Committed entries are durable on a quorum, so they may be applied before this node's
        # own write of them completes (the leader then answers one fsync sooner).
        if log.applied_handed < log.commit:
            rd.apply_first, rd.apply_terms, rd.apply_data = log.take_committed()
        rd.role_changed, self._role_changed = self._role_changed, False
        if self.reads.has_output():
            rd.read_states = self.reads.take_confirmed()
            rd.reads_dropped = self.reads.take_dropped()
        if self._snap_requests:
            rd.snapshot_requests, self._snap_requests = self._snap_requests, []
        return rd
