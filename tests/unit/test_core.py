"""Unit tests of the pure Raft core, driven by a tiny synchronous network."""

from __future__ import annotations

import random

import pytest

from electra.consensus.core import RaftConfig, RaftCore, Role
from electra.consensus.errors import NotLeader, ProposalDropped
from electra.consensus.messages import (
    Append,
    AppendResp,
    Heartbeat,
    Message,
    MsgType,
    PreVote,
    PreVoteResp,
    TimeoutNow,
    Vote,
)


def frozen_clock() -> float:
    """These tests use no leases: time may stand still."""
    return 0.0


class Net:
    """Delivers messages in FIFO order; persistence is instant unless `hold_persist` is set."""

    def __init__(self, n: int = 3, clock: ManualClock | None = None, **cfg) -> None:
        ids = list(range(1, n + 1))
        conf = RaftConfig(election_ticks=10, heartbeat_ticks=1, **cfg)
        self.clock = clock  # with RaftConfig.tick_s: every tick() moves it one tick on
        self.cores = {i: RaftCore(i, ids, conf, rng=random.Random(i), clock=clock or frozen_clock) for i in ids}
        self.queue: list[Message] = []
        self.cut: set[int] = set()  # isolated nodes
        self.deaf: set[int] = set()  # nodes that send but receive nothing
        self.applied: dict[int, list[bytes]] = {i: [] for i in ids}
        self.sent: list[Message] = []

    def drain(self, rounds: int = 200) -> None:
        for _ in range(rounds):
            for i, c in self.cores.items():
                while c.has_ready():
                    rd = c.ready()
                    self.queue.extend(rd.send_now)
                    self.queue.extend(rd.send_after_persist)
                    idx, term = rd.persist_last
                    if idx:
                        c.persisted(idx, term)
                    self.applied[i].extend(rd.apply_data)
            if not self.queue:
                return
            q, self.queue = self.queue, []
            for m in q:
                self.sent.append(m)
                if m.src in self.cut or m.dst in self.cut or m.dst in self.deaf:
                    continue
                self.cores[m.dst].step(m)

    def tick(self, times: int = 1, only: list[int] | None = None) -> None:
        for _ in range(times):
            if self.clock is not None:
                self.clock.now += self.cores[1].cfg.tick_s
            for i, c in self.cores.items():
                if only is None or i in only:
                    c.tick()
            self.drain()

    def leader(self) -> RaftCore | None:
        leaders = [c for c in self.cores.values() if c.role == Role.LEADER and c.id not in self.cut]
        return leaders[0] if leaders else None

    def elect(self) -> RaftCore:
        for _ in range(100):
            self.tick()
            if self.leader():
                return self.leader()
        raise AssertionError("no leader elected")


def test_elects_one_leader_and_commits_noop():
    net = Net()
    leader = net.elect()
    net.tick(2)
    assert sum(c.role == Role.LEADER for c in net.cores.values()) == 1
    assert all(c.term == leader.term for c in net.cores.values())
    # The leader's first entry is a no-op of its own term, committed everywhere.
    assert leader.log_terms == [leader.term] and leader.log_data == [b""]
    assert all(c.commit == 1 for c in net.cores.values())


def test_proposals_replicate_and_apply_in_order_everywhere():
    net = Net()
    leader = net.elect()
    first = leader.propose([b"a", b"b"])
    leader.propose([b"c"])
    assert first == 2
    net.drain()
    net.tick(2)
    for i in net.cores:
        assert net.applied[i] == [b"", b"a", b"b", b"c"]


def test_follower_rejects_proposals_with_leader_hint():
    net = Net()
    leader = net.elect()
    follower = next(c for c in net.cores.values() if c is not leader)
    with pytest.raises(NotLeader) as info:
        follower.propose([b"x"])
    assert info.value.leader_id == leader.id


def test_leader_does_not_count_itself_before_its_write_is_durable():
    net = Net()
    leader = net.elect()
    net.tick(2)
    idx = leader.propose([b"x"])
    rd = leader.ready()
    # AppendEntries leave before the leader's own fsync.
    assert any(m.type == MsgType.APP and m.ent_data == [b"x"] for m in rd.send_now)
    assert rd.persist_last == (idx, leader.term)
    for m in rd.send_now:
        net.cores[m.dst].step(m)
    acks = []
    for c in net.cores.values():
        if c is not leader:
            frd = c.ready()
            c.persisted(*frd.persist_last)
            acks += [m for m in frd.send_after_persist if m.type == MsgType.APP_RESP]
    assert len(acks) == 2
    leader.step(acks[0])
    assert leader.commit < idx  # one follower + an unpersisted leader is not a quorum
    assert not leader.ready().apply_terms
    leader.step(acks[1])
    assert leader.commit == idx  # both followers are: the entry is durable on a quorum
    assert leader.ready().apply_data[-1] == b"x"  # and may be applied before the leader's own fsync


def test_vote_and_term_changes_hold_every_message_until_persisted():
    net = Net()
    c = net.cores[1]
    for i in (2, 3):
        _up_for_an_election_timeout(net.cores[i])
    for _ in range(30):
        c.tick()
        if c.role == Role.PRE_CANDIDATE:
            break
    rd = c.ready()
    assert rd.hard_state is None  # PreVote changes nothing durable
    assert all(m.type == MsgType.PRE_VOTE for m in rd.send_now)
    for m in rd.send_now:
        net.cores[m.dst].step(m)
    for i in (2, 3):
        for m in net.cores[i].ready().send_after_persist:
            c.step(m)
    assert c.role == Role.CANDIDATE
    rd = c.ready()
    assert rd.hard_state == (c.term, 1)
    assert not rd.send_now and all(m.type == MsgType.VOTE for m in rd.send_after_persist)


def test_prevote_keeps_a_partitioned_node_from_inflating_terms():
    net = Net()
    leader = net.elect()
    term = leader.term
    isolated = next(i for i in net.cores if i != leader.id)
    net.cut = {isolated}
    net.tick(60)
    assert net.cores[isolated].term == term  # PreVote never succeeded, so the term never moved
    net.cut = set()
    net.tick(5)
    assert net.leader() is leader and leader.term == term


def test_check_quorum_makes_an_isolated_leader_step_down():
    net = Net()
    leader = net.elect()
    net.cut = {leader.id}
    net.tick(25)
    assert leader.role == Role.FOLLOWER
    others = [c for c in net.cores.values() if c is not leader]
    assert any(c.role == Role.LEADER for c in others)


def test_followers_in_lease_refuse_votes_from_a_disruptive_node():
    net = Net(pre_vote=False)
    leader = net.elect()
    net.tick(2)
    rogue = next(c for c in net.cores.values() if c is not leader)
    other = next(c for c in net.cores.values() if c not in (leader, rogue))
    msg = Vote(rogue.id, other.id, leader.term + 5, last_index=rogue.last_index(),
               last_term=rogue.last_term())
    other.step(msg)
    assert other.term == leader.term  # ignored: it heard from the leader within the election timeout
    assert not [m for m in other.ready().send_after_persist if m.type == MsgType.VOTE_RESP]


def test_fast_backtracking_skips_a_whole_divergent_term():
    net = Net()
    leader = net.elect()
    net.tick(2)
    f, g = (c for c in net.cores.values() if c is not leader)
    # f holds a long tail of entries from the old term that never committed.
    stale_term = leader.term
    f.log_terms.extend([stale_term] * 500)
    f.log_data.extend([b"junk"] * 500)
    f.handed = f.stable = f.last_index()
    net.cut = {f.id}
    leader.transfer_leadership(g.id)
    net.tick(2)
    assert g.role == Role.LEADER and g.term > stale_term
    g.propose([b"fresh"] * 10)
    net.drain()
    n_before = len(net.sent)
    net.cut = set()
    net.tick(3)
    appends = [m for m in net.sent[n_before:] if m.type == MsgType.APP and m.dst == f.id]
    assert f.log_data[-10:] == [b"fresh"] * 10
    assert f.last_index() == g.last_index()
    assert len(appends) < 10  # one hint jumps over 500 entries, not one round trip per entry


def test_leadership_transfer_moves_leadership_and_drops_proposals_meanwhile():
    net = Net()
    leader = net.elect()
    net.tick(2)
    target = next(i for i in net.cores if i != leader.id)
    net.cut = {target}
    leader.transfer_leadership(target)
    with pytest.raises(ProposalDropped):
        leader.propose([b"x"])
    net.cut = set()
    net.tick(3)
    assert net.cores[target].role == Role.LEADER
    assert leader.role == Role.FOLLOWER


def test_leadership_transfer_gives_up_after_an_election_timeout():
    net = Net()
    leader = net.elect()
    net.tick(2)
    target = next(i for i in net.cores if i != leader.id)
    net.cut = {target}
    leader.transfer_leadership(target)
    net.tick(12, only=[leader.id])
    leader.propose([b"accepted again"])


def test_stale_leader_learns_newer_term_from_a_rejection():
    net = Net()
    leader = net.elect()
    net.tick(2)
    f = next(c for c in net.cores.values() if c is not leader)
    f.step(Heartbeat(leader.id, f.id, leader.term))  # fine
    f._become_follower(leader.term + 3, 0)
    f.ready()
    f.step(Append(leader.id, f.id, leader.term, prev_index=0, prev_term=0))
    resp = f.ready().send_after_persist
    assert resp and resp[0].term == leader.term + 3
    leader.step(resp[0])
    assert leader.role == Role.FOLLOWER and leader.term == f.term


def test_single_node_cluster_commits_alone():
    c = RaftCore(1, [1], RaftConfig(election_ticks=5), clock=frozen_clock)
    for _ in range(20):
        c.tick()
    assert c.role == Role.LEADER
    c.propose([b"x"])
    rd = c.ready()
    c.persisted(*rd.persist_last)
    assert c.ready().apply_data == [b"", b"x"]


def test_constructor_rejects_bad_membership():
    with pytest.raises(ValueError):
        RaftCore(4, [1, 2, 3], clock=frozen_clock)
    with pytest.raises(ValueError):
        RaftCore(1, [1, 1, 2], clock=frozen_clock)


def test_message_codec_round_trip_and_rejects_garbage():
    m = Append(1, 2, 7, prev_index=5, prev_term=6, ent_terms=[7, 7], ent_data=[b"a", b"b"], commit=4)
    back = Message.decode(m.encode())
    assert back == m
    for bad in (b"", b"\x91\x01", b"\xc1", Append(1, 2, 3).encode()[:-1]):
        with pytest.raises(ValueError):
            Message.decode(bad)


def _restart(net: Net, node_id: int, keep: int) -> RaftCore:
    """Restart `node_id` from a durable log that kept only its first `keep` entries (a torn tail)."""
    old = net.cores[node_id]
    new = RaftCore(node_id, old.peers, old.cfg, term=old.term, vote=old.vote,
                   log_terms=old.log_terms[:keep], log_data=old.log_data[:keep], rng=random.Random(99),
                   clock=frozen_clock)
    net.cores[node_id] = new
    return new


def test_a_follower_that_lost_its_log_tail_catches_up_with_the_same_leader():
    net = Net()
    leader = net.elect()
    leader.propose([b"e%d" % i for i in range(50)])
    net.tick(3)
    f = next(c for c in net.cores.values() if c is not leader)
    assert f.last_index() == leader.last_index() == 51
    assert leader.progress[f.id].match == 51
    f = _restart(net, f.id, keep=30)  # the newest segment lost its tail while the node was down
    net.tick(5)
    assert leader.role == Role.LEADER and net.leader() is leader  # the same leader throughout
    assert f.last_index() == leader.last_index() and f.log_data == leader.log_data
    assert leader.progress[f.id].match == leader.last_index()
    # And the leader keeps replicating to it: new entries arrive too.
    leader.propose([b"after"])
    net.tick(2)
    assert f.log_data[-1] == b"after"


def test_a_rejection_from_a_follower_that_lost_its_tail_lowers_next_and_match():
    """The append path alone (heartbeats dropped) must bring it back: the rejection's hint
    carries the follower's last index and the leader probes below its recorded match."""
    net = Net()
    leader = net.elect()
    leader.propose([b"e%d" % i for i in range(20)])
    net.tick(3)
    f = next(c for c in net.cores.values() if c is not leader)
    f = _restart(net, f.id, keep=5)
    leader.propose([b"new"])
    seen_reject = False
    for _ in range(50):
        for c in net.cores.values():
            while c.has_ready():
                rd = c.ready()
                idx, term = rd.persist_last
                if idx:
                    c.persisted(idx, term)
                net.queue.extend(rd.send_now + rd.send_after_persist)
        if not net.queue:
            break
        q, net.queue = net.queue, []
        for m in q:
            if m.type not in (MsgType.HEARTBEAT, MsgType.HEARTBEAT_RESP):
                seen_reject |= isinstance(m, AppendResp) and m.reject and m.src == f.id
                net.cores[m.dst].step(m)
    assert seen_reject
    assert f.log_data == leader.log_data and leader.progress[f.id].match == leader.last_index()


def _up_for_an_election_timeout(c: RaftCore) -> RaftCore:
    """As if `c` had run past a started node's refusal window without its timer firing (no campaign)."""
    c._ticks = c.cfg.election_ticks
    return c


def test_a_node_with_a_vote_floor_votes_as_if_it_still_held_its_lost_log():
    c = _up_for_an_election_timeout(RaftCore(3, [1, 2, 3], RaftConfig(), term=4, vote=0, vote_floor=(10, 2),
                                             rng=random.Random(1), clock=frozen_clock))
    assert c.last_index() == 0  # it holds nothing...
    c.step(Vote(1, 3, 5, last_index=9, last_term=2))
    rd = c.ready()
    assert [m.reject for m in rd.send_after_persist] == [True]  # ...but refuses a candidate behind 10/2
    c.step(Vote(2, 3, 6, last_index=3, last_term=3))  # a newer term's log is more up to date
    rd = c.ready()
    assert [m.reject for m in rd.send_after_persist] == [False] and c.vote == 2


def test_pre_votes_respect_the_vote_floor_too():
    c = _up_for_an_election_timeout(RaftCore(3, [1, 2, 3], RaftConfig(), term=4, vote_floor=(10, 2),
                                             rng=random.Random(1), clock=frozen_clock))
    c.step(PreVote(1, 3, 5, last_index=9, last_term=2))
    rd = c.ready()
    assert [(m.type, m.reject) for m in rd.send_now + rd.send_after_persist] == [(MsgType.PRE_VOTE_RESP, True)]


def test_a_node_behind_its_vote_floor_does_not_campaign():
    c = RaftCore(1, [1, 2, 3], RaftConfig(election_ticks=10), term=4, vote_floor=(10, 2), rng=random.Random(1),
                 clock=frozen_clock)
    for _ in range(100):
        c.tick()
    assert c.role == Role.FOLLOWER and c.term == 4
    assert not [m for m in c.ready().send_now if m.type in (MsgType.PRE_VOTE, MsgType.VOTE)]
    c.step(TimeoutNow(2, 1, 4))  # not even when asked to take over
    assert c.role == Role.FOLLOWER and c.term == 4
    solo = RaftCore(1, [1], RaftConfig(), term=4, vote_floor=(10, 2), rng=random.Random(1), clock=frozen_clock)
    for _ in range(100):
        solo.tick()
    assert solo.role == Role.FOLLOWER, "a one-member group must not elect a node that lost its data"


class ManualClock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_lease_runs_on_the_injected_clock_from_the_rounds_send_time():
    net = Net(lease_s=1.0)
    clock = ManualClock()
    for c in net.cores.values():
        c.clock = clock
    leader = net.elect()
    net.tick(2)  # heartbeat rounds sent at 100.0 and answered by a quorum
    assert leader.lease_read_index() == leader.commit
    follower = next(c for c in net.cores.values() if c is not leader)
    assert follower.last_leader_contact == 100.0
    clock.now = 100.9
    assert leader.lease_read_index() == leader.commit  # 0.9 s after the round left: still held
    clock.now = 101.0
    assert leader.lease_read_index() is None  # lease_s after the send time: gone, until a new round
    net.tick()  # a round sent at 101.0
    assert leader.lease_read_index() == leader.commit
    clock.now = 101.5
    leader.transfer_leadership(follower.id)
    assert leader.lease_read_index() is None  # a transfer ends the lease at once


# ------------------------------------------------------------------ failover speed (docs/chaos.md, "Failover")
def test_reads_queued_while_a_read_round_is_out_wait_for_it_then_share_the_next_one():
    """At most one heartbeat round carrying reads is unconfirmed (etcd: one ReadIndex in flight): reads
    queued meanwhile start no round of their own; once it is confirmed, one round serves them all."""
    net = Net()
    leader = net.elect()
    net.tick(2)
    leader.read_index(1)
    rd = leader.ready()
    first = [m for m in rd.send_now if m.type == MsgType.HEARTBEAT]
    assert len(first) == 2  # a round for read 1
    for ctx in (2, 3, 4):
        leader.read_index(ctx)
    assert not leader.has_ready()  # no round for them while read 1's is out
    for m in first:
        net.cores[m.dst].step(m)
        answered = net.cores[m.dst].ready()
        for answer in answered.send_now + answered.send_after_persist:
            leader.step(answer)
    rd = leader.ready()
    assert [ctx for ctx, _ in rd.read_states] == [1]
    second = [m for m in rd.send_now if m.type == MsgType.HEARTBEAT]
    assert len(second) == 2 and second[0].round == first[0].round + 1  # one round for reads 2-4
    for m in second:
        net.cores[m.dst].step(m)
        answered = net.cores[m.dst].ready()
        for answer in answered.send_now + answered.send_after_persist:
            leader.step(answer)
    assert sorted(ctx for ctx, _ in leader.ready().read_states) == [2, 3, 4]


def test_a_read_round_that_is_never_answered_does_not_hold_later_reads_past_the_next_tick():
    net = Net()
    leader = net.elect()
    net.tick(2)
    leader.read_index(1)
    leader.ready()  # read 1's round is lost
    leader.read_index(2)
    assert not leader.has_ready()
    leader.tick()  # the tick's round confirms read 1; then read 2 gets a round of its own
    served: list[int] = []
    for _ in range(10):
        if not leader.has_ready():
            break
        rd = leader.ready()
        served += [ctx for ctx, _ in rd.read_states]
        for m in rd.send_now + rd.send_after_persist:
            net.cores[m.dst].step(m)
            answered = net.cores[m.dst].ready()
            for answer in answered.send_now + answered.send_after_persist:
                leader.step(answer)
    assert served == [1, 2]


def test_election_timeouts_are_drawn_from_the_configured_jitter():
    core = RaftCore(1, [1, 2, 3], RaftConfig(election_ticks=10, election_jitter_ticks=4), rng=random.Random(7),
                    clock=frozen_clock)
    drawn = {core._random_timeout() for _ in range(400)}
    assert drawn == {10, 11, 12, 13}
    classic = RaftCore(1, [1, 2, 3], RaftConfig(election_ticks=10), rng=random.Random(7), clock=frozen_clock)
    assert {classic._random_timeout() for _ in range(400)} == set(range(10, 20))


def test_a_leader_that_heard_from_no_quorum_for_an_election_timeout_takes_no_new_proposals():
    """It keeps its role until CheckQuorum's window ends (up to another timeout later: the lease is
    not shortened), but refuses proposals it could not commit, so clients go elsewhere at once."""
    net = Net()
    leader = net.elect()
    net.tick(3)  # mid-way through a CheckQuorum window
    net.cut = {leader.id}
    net.tick(9, only=[leader.id])
    assert leader.propose([b"x"]) > 0 and not leader.quorum_silent
    net.tick(1, only=[leader.id])
    assert leader.role == Role.LEADER and leader.quorum_silent
    with pytest.raises(ProposalDropped, match="no quorum"):
        leader.propose([b"y"])
    with pytest.raises(ProposalDropped, match="no quorum"):  # nor a ReadIndex read it could not confirm
        leader.read_index(1)
    net.cut = set()
    net.tick(1)  # heard from again: proposals are welcome
    assert not leader.quorum_silent and leader.propose([b"z"]) > 0


def test_a_pre_candidate_asks_again_each_tick_a_peer_that_dropped_its_request_in_lease():
    net = Net()
    leader = net.elect()
    net.tick(2)
    a, b = (c for c in net.cores.values() if c is not leader)
    net.cut = {leader.id}  # the leader is gone
    b.timeout = 1000  # b will not campaign itself
    while a.role != Role.PRE_CANDIDATE:
        net.tick(1, only=[a.id])
    assert b.role == Role.FOLLOWER and b.lead == leader.id  # b heard from the leader lately: it dropped the ask
    net.tick(10, only=[b.id])  # b's election timeout since the leader's last message runs out
    net.tick(1, only=[a.id])  # a asks again, without waiting for a whole new election timeout
    assert a.role == Role.LEADER and a.term == leader.term + 1


def test_two_pre_candidates_of_one_term_do_not_split_the_vote():
    net = Net()
    leader = net.elect()
    net.cut = {leader.id}
    a, b = sorted((c for c in net.cores.values() if c is not leader), key=lambda c: c.id)
    for c in (a, b):  # bring both to the tick before their timeouts, messages held
        while c.elapsed + 1 < c.timeout:
            c.tick()
    for c in (a, b):  # both time out in the same tick: their PreVotes cross
        c.tick()
    net.drain()
    assert a.role == Role.LEADER and b.role == Role.FOLLOWER and b.lead == a.id
    assert a.term == leader.term + 1


# ------------------------------------------------------------------ elapsed-time timers (RaftConfig.tick_s)
def _timed_net(clock: ManualClock) -> Net:
    return Net(clock=clock, tick_s=0.1)


def test_with_tick_s_late_ticks_do_not_stretch_the_election_timeout():
    """Each tick runs 0.3 s after the previous one (three intervals: a loaded machine): a follower whose
    timeout is 10-13 ticks campaigns once 1.0-1.3 s have passed, i.e. in its 4th or 5th tick, where
    counting ticks would wait 3-4 s."""
    clock = ManualClock()
    net = _timed_net(clock)
    leader = net.elect()
    net.tick(2)
    cut_at = clock.now
    net.cut = {leader.id}
    a, b = (c for c in net.cores.values() if c is not leader)
    ticks = 0
    while a.role == Role.FOLLOWER and b.role == Role.FOLLOWER:
        clock.now += 0.2  # net.tick adds the third 0.1 s
        ticks += 1
        net.tick(1, only=[a.id, b.id])
        assert ticks <= 5, "counted ticks, not elapsed time"
    assert clock.now - cut_at >= 1.0


def test_with_tick_s_a_follower_refuses_votes_for_the_election_timeout_of_its_clock_after_hearing_the_leader():
    """The lease's side of the argument: the refusal window is time since the leader's last message,
    whether or not a tick ran in between."""
    clock = ManualClock()
    net = _timed_net(clock)
    leader = net.elect()
    net.tick(1)
    voter = next(c for c in net.cores.values() if c is not leader)
    other = next(c for c in net.cores.values() if c not in (leader, voter))
    heard = voter.last_leader_contact
    ask = PreVote(other.id, voter.id, voter.term + 1, last_index=voter.last_index(), last_term=voter.last_term())
    clock.now = heard + 0.99
    voter.step(ask)
    assert not voter.ready().send_now + voter.ready().send_after_persist, "answered inside the refusal window"
    clock.now = heard + 1.0
    voter.step(ask)
    rd = voter.ready()
    assert [m.type for m in rd.send_now + rd.send_after_persist] == [MsgType.PRE_VOTE_RESP]


def test_with_tick_s_quorum_silence_is_measured_on_the_clock():
    clock = ManualClock()
    net = _timed_net(clock)
    leader = net.elect()
    net.tick(1)
    net.cut = {leader.id}
    clock.now += 0.85  # with net.tick's 0.1 s: 0.95 s of silence
    net.tick(1, only=[leader.id])
    assert not leader.quorum_silent
    # one late tick past the election timeout, not ten more ticks
    net.tick(1, only=[leader.id])
    assert leader.role == Role.LEADER and leader.quorum_silent


def test_with_tick_s_a_follower_says_when_its_election_timeout_runs_out():
    """The driver arms its next tick then, so the timeout is not rounded up to a whole tick."""
    clock = ManualClock()
    net = _timed_net(clock)
    leader = net.elect()
    net.tick(1)
    follower = next(c for c in net.cores.values() if c is not leader)
    assert leader.election_due_s() is None
    assert follower.election_due_s() == pytest.approx(follower.timeout * 0.1)
    net.cut = {leader.id}
    clock.now += follower.election_due_s() + 0.001  # as the driver arms it (floating point)
    follower.tick()
    assert follower.role == Role.PRE_CANDIDATE


def test_a_leader_stepping_down_by_check_quorum_hands_over_to_its_most_up_to_date_follower():
    """Its followers heard it until the end (they would refuse votes for another election timeout), but it
    heard none of them for a whole CheckQuorum window: it steps down and sends TimeoutNow, and a new
    leader is elected at once instead of an election timeout later."""
    net = Net()
    leader = net.elect()
    net.tick(2)
    term = leader.term
    net.deaf = {leader.id}
    for _ in range(25):
        net.tick(1)
        if leader.role != Role.LEADER:
            break  # in the tick it stepped down, before any follower's election timeout
    assert leader.role == Role.FOLLOWER
    new = net.leader()
    assert new is not None and new is not leader and new.term == term + 1


def test_answers_read_late_do_not_make_a_cut_off_leader_look_connected():
    """A leader whose process was stopped finds its followers' answers to its last round waiting when it
    wakes: they prove the followers heard it before the stop, not since. Quorum silence counts from when
    the answered round was sent, so the woken leader still refuses writes (clients go elsewhere)."""
    clock = ManualClock()
    net = _timed_net(clock)
    leader = net.elect()
    net.tick(1)
    clock.now += 0.1
    leader.tick()  # a heartbeat round, answered by both followers ...
    answers = []
    for m in leader.ready().send_now:
        net.cores[m.dst].step(m)
        rd = net.cores[m.dst].ready()
        answers += rd.send_now + rd.send_after_persist
    clock.now += 1.2  # ... while the leader's process is stopped, cut off
    assert [m.type for m in answers] == [MsgType.HEARTBEAT_RESP] * 2
    for m in answers:
        leader.step(m)
    leader.tick()
    assert leader.role == Role.LEADER and leader.quorum_silent


def test_a_follower_whose_committed_entry_has_another_term_than_the_leaders_says_it_diverged():
    """What a bad bootstrap left (QA): a snapshot at index N in a term the leader's log does not have at N. The
    follower's reject hint and the leader's back-off met at N forever (both at 100% CPU); now the follower
    refuses the append and reports the divergence, for its host to fail-stop (etcd's raft panics here)."""
    net = Net()
    leader = net.elect()
    leader.propose([b"e%d" % i for i in range(20)])
    net.tick(3)
    f = next(c for c in net.cores.values() if c is not leader)
    n = leader.last_index()
    assert f.log.commit == n
    wrong = leader.log.term_at(n) - 1
    bad = RaftCore(f.id, f.peers, f.cfg, term=f.term, vote=f.vote, log_offset=n, offset_term=wrong,
                   commit=n, applied=n, snapshot=(n, wrong), rng=random.Random(5), clock=frozen_clock)
    net.cores[f.id] = bad
    leader.propose([b"after"])
    sent_before = len(net.sent)
    net.tick(3)
    assert bad.diverged is not None and f"entry {n} is committed here in term {wrong}" in bad.diverged
    answers = [m for m in net.sent[sent_before:] if m.src == bad.id and m.type == MsgType.APP_RESP]
    assert answers == []  # no reject/hint ping-pong with the leader
    assert bad.last_index() == n


def test_a_restarted_follower_keeps_the_lease_promise_it_may_have_made_before_it_stopped():
    """A follower acks the leader's round (the leader's lease counts on it not voting for an election timeout),
    is killed and restarts at once with its durable term, vote and log. It used to vote for another candidate
    immediately (a fresh core knew no leader), so that candidate won while the old leader still served lease
    reads: stale reads. Now it refuses votes for an election timeout from its start."""
    clock = ManualClock()
    net = Net(clock=clock, tick_s=0.1, lease_s=0.81)
    leader = net.elect()
    net.tick(2)
    b, c = (x for x in net.cores.values() if x is not leader)
    net.cut = {c.id}  # c lost the leader: it will campaign; b refuses while in the leader's lease
    net.tick(3, only=[b.id, leader.id])
    acked_at = clock.now
    assert leader.lease_read_index() is not None
    old = net.cores[b.id]
    net.cores[b.id] = b = RaftCore(b.id, old.peers, old.cfg, term=old.term, vote=old.vote,
                                   log_terms=list(old.log_terms), log_data=list(old.log_data),
                                   rng=random.Random(99), clock=clock)
    net.cut = {leader.id}  # the old leader's next rounds do not reach b (nor c)
    c.timeout = c.cfg.election_ticks  # c campaigns at its first tick past the timeout
    c._timer_start = clock.now - c.cfg.election_ticks * c.cfg.tick_s
    while clock.now < acked_at + 0.8:
        net.tick(1, only=[b.id, c.id])
        if leader.lease_read_index() is not None:
            assert c.role != Role.LEADER, f"elected {clock.now - acked_at:.1f} s after b's ack, inside the lease"
    for _ in range(40):  # once b's window has passed, c is elected as before
        net.tick(1, only=[b.id, c.id])
    assert c.role == Role.LEADER and b.lead == c.id


def test_a_node_behind_its_vote_floor_still_votes_once_its_first_timeout_passed():
    """Its timer fires and finds it may not campaign (behind the floor): that ends the started node's refusal
    window too, or it would refuse every vote for ever (the timer reset each time)."""
    c = RaftCore(3, [1, 2, 3], RaftConfig(election_ticks=10), term=4, vote_floor=(10, 2), rng=random.Random(1),
                 clock=frozen_clock)
    for _ in range(100):  # until its timer fired and was reset: back inside what would be the window
        c.tick()
        if c._ticks > c.cfg.election_ticks and c.elapsed < c.cfg.election_ticks:
            break
    assert c.role == Role.FOLLOWER and c.elapsed < c.cfg.election_ticks
    c.step(Vote(2, 3, 6, last_index=3, last_term=3))
    assert [m.reject for m in c.ready().send_after_persist] == [False] and c.vote == 2


def test_a_node_restored_empty_with_rejoin_helps_elect_no_leader_missing_a_write_it_acknowledged():
    """Entry E commits on the leader and node 3 while node 2 lags. Node 3's data dir is emptied and it restarts;
    the leader dies. Restarted plainly (term 0, no vote, empty log), node 3 voted for node 2, which won without E:
    an acknowledged write lost. Rejoining, it votes for nobody until a leader brought it up to date."""
    from electra.consensus.core import REJOIN_FLOOR

    for rejoin in (False, True):
        net = Net(pre_vote=False)
        leader = net.elect()
        net.tick(2)
        lagging = next(c for c in net.cores.values() if c is not leader and c.id != 3)
        net.cut = {lagging.id}
        leader.propose([b"E"])
        net.tick(2)
        assert net.cores[3].commit >= leader.last_index()
        old = net.cores[3]
        net.cores[3] = RaftCore(3, old.peers, old.cfg, rng=random.Random(7), clock=frozen_clock,
                                vote_floor=REJOIN_FLOOR if rejoin else (0, 0))
        _up_for_an_election_timeout(net.cores[3])
        net.cut = {leader.id}
        net.tick(60, only=[lagging.id, 3])
        elected = net.leader()
        if not rejoin:  # the loss this guards against, shown on the same history
            assert elected is lagging and b"E" not in lagging.log_data
        else:
            assert elected is None and net.cores[3].term <= lagging.term


def test_a_rejoining_node_takes_a_current_leaders_last_index_as_its_floor_and_votes_once_caught_up():
    from electra.consensus.core import REJOIN_FLOOR

    net = Net()
    leader = net.elect()
    leader.propose([b"a", b"b"])
    net.tick(2)
    old = net.cores[3]
    net.cores[3] = c = _up_for_an_election_timeout(RaftCore(3, old.peers, old.cfg, rng=random.Random(7),
                                                            clock=frozen_clock, vote_floor=REJOIN_FLOOR))
    ask = PreVote(2, 3, leader.term + 1, last_index=leader.last_index(), last_term=leader.term)
    c.step(ask)
    rd = c.ready()
    assert [m.reject for m in rd.send_now + rd.send_after_persist] == [True]  # a floor above every log
    probes = []
    for _ in range(40):
        c.tick()
        rd = c.ready()
        assert rd.hard_state is None  # never campaigned
        probes.append([m for m in rd.send_now if isinstance(m, PreVote)])
    assert c.role == Role.FOLLOWER
    # asked only from the longest election timeout after its start on (2 x election_ticks with jitter None, + 1),
    # once any campaign it voted in before the wipe has ended; the core was started election_ticks ago
    first = next(i for i, sent in enumerate(probes) if sent)
    assert first == c.cfg.election_ticks and all(probes[first:])
    assert {(m.dst, m.term) for m in probes[-1]} == {(1, 0), (2, 0)}
    beat = Heartbeat(leader.id, 3, leader.term, commit=0, leader_commit=leader.commit, last_index=leader.last_index())
    c.step(beat)
    assert c.ready().send_after_persist == [] and c.vote_floor == REJOIN_FLOOR  # the others' terms not heard yet
    for p in (1, 2):  # their answers to its term probe
        c.step(PreVoteResp(p, 3, net.cores[p].term, reject=True))
    assert c.term_probe is None and c.term == leader.term
    c.ready()
    leader.propose([b"c"])  # appended, not yet committed: a floor at the commit index would miss it
    c.step(Heartbeat(leader.id, 3, leader.term, commit=0, leader_commit=leader.commit, last_index=leader.last_index()))
    rd = c.ready()
    assert rd.vote_floor == c.vote_floor == (leader.last_index(), leader.term) and rd.needs_persist()
    assert leader.last_index() > leader.commit
    net.tick(3)  # the leader brings it up to date
    assert c.last_index() == leader.last_index()
    net.cut = {leader.id}
    for _ in range(40):  # caught up past its floor: it campaigns again when its leader goes quiet
        net.tick(1, only=[3])
        if c.role != Role.FOLLOWER:
            break
    assert c.role in (Role.PRE_CANDIDATE, Role.CANDIDATE)


def test_a_rejoining_core_says_it_does_not_vote_until_it_caught_up():
    from electra.consensus.core import REJOIN_FLOOR

    c = RaftCore(3, [1, 2, 3], RaftConfig(), vote_floor=REJOIN_FLOOR, rng=random.Random(1), clock=frozen_clock)
    assert c.behind_vote_floor()
    assert not RaftCore(3, [1, 2, 3], RaftConfig(), rng=random.Random(1), clock=frozen_clock).behind_vote_floor()


def test_a_rejoining_node_acknowledges_no_stale_leader_before_a_quorum_told_it_their_terms():
    """A wiped node forgot its term too. Leader L (term 1) pauses; N wins term 2 with W and commits E on both; W is
    wiped and rejoins; N dies and L wakes. Learning from the first leader it heard, W took L's term-1 commit as its
    floor and acknowledged L's appends: L committed another entry at E's index (a conflict). Now W first asks the
    others for their terms, and with N silent it acknowledges nobody."""
    from electra.consensus.core import REJOIN_FLOOR

    net = Net()
    old = net.elect()
    net.tick(2)
    net.cut = {old.id}  # paused
    for _ in range(100):
        net.tick(1, only=[i for i in net.cores if i != old.id])
        if net.leader() is not None:
            break
    new = net.leader()
    assert new is not None and new.term > old.term
    new.propose([b"E"])
    net.tick(3, only=[i for i in net.cores if i != old.id])
    e_index, e_term = new.last_index(), new.term
    w = next(c for c in net.cores.values() if c not in (old, new))
    assert w.commit >= e_index
    net.cores[w.id] = w = RaftCore(w.id, w.peers, w.cfg, rng=random.Random(5), clock=frozen_clock,
                                   vote_floor=REJOIN_FLOOR)
    _up_for_an_election_timeout(w)
    net.cut = {new.id}  # the new leader dies; the old one wakes, still believing it leads term 1
    old.propose([b"stale"])
    for _ in range(60):
        net.tick(1, only=[old.id, w.id])
        conflicts = [i for i in range(1, min(old.commit, new.commit) + 1) if old.term_at(i) != new.term_at(i)]
        assert not conflicts, f"indexes {conflicts} committed in two terms"
    assert w.term_probe is not None and w.vote_floor == REJOIN_FLOOR  # still waiting for the dead leader's term
    net.cut = set()
    for _ in range(100):
        net.tick()
        if w.term_probe is None and not w.behind_vote_floor():
            break
    assert w.term_at(e_index) == e_term and net.leader() is not None
    assert all(c.term_at(e_index) == e_term for c in net.cores.values())


@pytest.mark.parametrize("n, answers", [(2, 1), (3, 2), (4, 2), (5, 3)])
def test_a_rejoining_nodes_term_probe_needs_answers_from_n_minus_quorum_plus_one_others(n, answers):
    """Enough to share a node with every quorum minus itself; a quorum of the others could never complete in a
    group of two (one other) and needed every other node in a group of four."""
    from electra.consensus.core import REJOIN_FLOOR
    from electra.consensus.messages import MAX_TERM_JUMP

    c = RaftCore(1, list(range(1, n + 1)), RaftConfig(), vote_floor=REJOIN_FLOOR, rng=random.Random(1),
                 clock=frozen_clock)
    c.step(PreVoteResp(2, 1, MAX_TERM_JUMP + 1, reject=True))  # a term it cannot take: not an answer
    assert c.term_probe is not None and c.term == 0
    for p in range(2, 2 + answers):
        assert c.term_probe is not None
        c.step(PreVoteResp(p, 1, 3, reject=True))
    assert c.term_probe is None and c.term == 3


def test_a_transfer_without_a_target_skips_a_follower_that_stopped_answering():
    """A follower that answered no heartbeat round for half an election timeout is no transferee; among equally
    caught-up ones the last heard from wins. Before, every follower passed (the driver compared `heard_at`, in
    ticks, with the clock in seconds) and the tie went to the higher id: a transfer chose a stopped follower."""
    clock = ManualClock()
    net = _timed_net(clock)
    leader = net.elect()
    net.tick(3)
    a, b = sorted(c.id for c in net.cores.values() if c is not leader)
    assert leader.best_transferee() == b  # both answer: the tie goes to the higher id
    net.deaf.add(b)  # stopped (SIGSTOP): it hears nothing and answers nothing
    net.tick(3)
    assert leader.best_transferee() == a  # as caught up, and heard from since
    net.deaf.add(a)
    net.tick(3)  # a silent for 0.3 s, b for 0.6 s: half an election timeout is 0.5 s
    assert leader.best_transferee() == a
    net.tick(3)
    assert leader.best_transferee() is None
    assert net.cores[a].best_transferee() is None  # not leading
