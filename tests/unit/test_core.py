"""Unit tests of the pure Raft core, driven by a tiny synchronous network."""

from __future__ import annotations

import random

import pytest

from electra.consensus.core import RaftConfig, RaftCore, Role
from electra.consensus.errors import NotLeader, ProposalDropped
from electra.consensus.messages import Append, AppendResp, Heartbeat, Message, MsgType, PreVote, TimeoutNow, Vote


def frozen_clock() -> float:
    """These tests use no leases: time may stand still."""
    return 0.0


class Net:
    """Delivers messages in FIFO order; persistence is instant unless `hold_persist` is set."""

    def __init__(self, n: int = 3, **cfg) -> None:
        ids = list(range(1, n + 1))
        conf = RaftConfig(election_ticks=10, heartbeat_ticks=1, **cfg)
        self.cores = {i: RaftCore(i, ids, conf, rng=random.Random(i), clock=frozen_clock) for i in ids}
        self.queue: list[Message] = []
        self.cut: set[int] = set()  # isolated nodes
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
                if m.src in self.cut or m.dst in self.cut:
                    continue
                self.cores[m.dst].step(m)

    def tick(self, times: int = 1, only: list[int] | None = None) -> None:
        for _ in range(times):
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


def test_a_node_with_a_vote_floor_votes_as_if_it_still_held_its_lost_log():
    c = RaftCore(3, [1, 2, 3], RaftConfig(), term=4, vote=0, vote_floor=(10, 2), rng=random.Random(1),
                 clock=frozen_clock)
    assert c.last_index() == 0  # it holds nothing...
    c.step(Vote(1, 3, 5, last_index=9, last_term=2))
    rd = c.ready()
    assert [m.reject for m in rd.send_after_persist] == [True]  # ...but refuses a candidate behind 10/2
    c.step(Vote(2, 3, 6, last_index=3, last_term=3))  # a newer term's log is more up to date
    rd = c.ready()
    assert [m.reject for m in rd.send_after_persist] == [False] and c.vote == 2


def test_pre_votes_respect_the_vote_floor_too():
    c = RaftCore(3, [1, 2, 3], RaftConfig(), term=4, vote_floor=(10, 2), rng=random.Random(1), clock=frozen_clock)
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


def test_proposals_made_while_a_followers_window_is_full_go_in_one_append():
    """The default inflight window is the batching window: while two appends to a follower await
    its ack, further proposals (one per loop turn here) are held, and the ack frees a slot for one
    append carrying them all, rather than one append per proposal."""
    net = Net()
    leader = net.elect()
    net.tick(2)
    peer = next(p for p in net.cores if p != leader.id)
    apps = []
    for k in range(10):  # ten loop turns of proposals with no ack coming back
        leader.propose([b"c%d" % k])
        rd = leader.ready()
        apps += [m for m in rd.send_now if isinstance(m, Append) and m.dst == peer and m.ent_terms]
    assert len(apps) == RaftConfig().max_inflight == 2
    leader.step(AppendResp(peer, leader.id, leader.term, index=apps[0].prev_index + len(apps[0].ent_terms)))
    rd = leader.ready()
    held = [m for m in rd.send_now if isinstance(m, Append) and m.dst == peer]
    assert len(held) == 1 and held[0].ent_data == [b"c%d" % k for k in range(2, 10)]
