"""What a peer may send: decode bounds on Raft messages and the core's refusal of impossible messages."""

from __future__ import annotations

import msgpack
import pytest
from test_core import ManualClock, Net

from electra.consensus.core import Role
from electra.consensus.messages import (
    MAX_TERM,
    Append,
    AppendResp,
    Heartbeat,
    HeartbeatResp,
    Message,
    MsgType,
    PreVoteResp,
    ReadIndex,
    ReadIndexResp,
    Vote,
    VoteResp,
)


def _fields(**over):
    m = Vote(1, 2, 3)
    t = list(msgpack.unpackb(m.encode()))
    names = ["type", "src", "dst", "term", "index", "log_term", "ent_terms", "ent_data", "commit", "reject",
             "hint_index", "hint_term", "context", "force", "offset", "chunk", "done"]
    for k, v in over.items():
        t[names.index(k)] = v
    return msgpack.packb(t, use_bin_type=True)


@pytest.mark.parametrize("over", [
    {"term": 2**64 - 1}, {"term": MAX_TERM + 1}, {"log_term": 2**63}, {"hint_term": MAX_TERM + 1},
    {"index": 2**63}, {"commit": 2**64 - 1}, {"offset": -1}, {"ent_terms": [MAX_TERM + 1], "ent_data": [b"x"]},
    {"force": 1}, {"reject": "yes"}, {"done": None}, {"type": 99}, {"type": True}, {"chunk": "text"},
])
def test_decode_rejects_fields_outside_their_bounds(over):
    with pytest.raises(ValueError):
        Message.decode(_fields(**over))


def test_decode_accepts_the_bounds_themselves():
    m = Message.decode(_fields(term=MAX_TERM, index=2**63 - 1, ent_terms=[MAX_TERM], ent_data=[b"x"]))
    assert m.term == MAX_TERM and m.last_index == 2**63 - 1


def test_decode_refuses_huge_containers_and_types_raft_never_sends():
    bomb = msgpack.packb([5, 1, 2, 3, 0, 0, [0] * 70_000, [b""] * 70_000] + [0] * 9)
    for buf in (bomb, msgpack.packb({"a": 1}), msgpack.packb(["x" * 10] * 17), b"\xc1", b""):
        with pytest.raises(ValueError) as info:
            Message.decode(buf)
        assert len(str(info.value)) < 200  # errors never quote the input


def _in_lease():
    net = Net()
    leader = net.elect()
    net.tick(2)
    follower = next(c for c in net.cores.values() if c is not leader)
    return net, leader, follower


def test_forged_force_vote_far_ahead_changes_no_term():
    net, leader, follower = _in_lease()
    term = leader.term
    for target in net.cores.values():
        target.step(Vote(follower.id, target.id if target is not follower else leader.id,
                         term + 1000, last_index=10**6, last_term=term + 1000, force=True))
    net.drain()
    assert {c.term for c in net.cores.values()} == {term}
    assert leader.role == Role.LEADER


def test_forged_vote_between_the_leaders_window_end_and_its_next_tick_changes_no_term():
    """With elapsed-time timers the leader's CheckQuorum window can end on the clock a little before the
    tick that checks it; a forged higher-term vote landing in that gap must not unseat a live leader."""
    clock = ManualClock()
    net = Net(clock=clock, tick_s=0.1)
    leader = net.elect()
    net.tick(1)
    follower = next(c for c in net.cores.values() if c is not leader)
    term = leader.term
    clock.now += leader.cfg.election_ticks * 0.1  # the window is over; its tick has not run yet
    leader.step(Vote(follower.id, leader.id, term + 1000, last_index=10**6, last_term=term + 1000, force=True))
    assert leader.role == Role.LEADER and leader.term == term


def test_forced_vote_is_honoured_by_the_leader_only_from_its_transferee():
    net, leader, follower = _in_lease()
    other = next(c for c in net.cores.values() if c not in (leader, follower))
    term = leader.term
    leader.step(Vote(follower.id, leader.id, term + 1, last_index=leader.last_index(),
                     last_term=leader.last_term(), force=True))
    assert leader.role == Role.LEADER and leader.term == term  # no transfer under way: ignored
    leader.transfer_leadership(other.id)
    leader.step(Vote(follower.id, leader.id, term + 1, last_index=leader.last_index(),
                     last_term=leader.last_term(), force=True))
    assert leader.term == term  # not the transferee: ignored
    net.drain()
    net.tick(3)
    assert net.leader().id == other.id  # the real transfer still works


def test_forged_higher_term_replies_do_not_unseat_the_leader():
    net, leader, follower = _in_lease()
    term = leader.term
    for forged in (HeartbeatResp(follower.id, leader.id, term + 5, last_index=1, round=1),
                   ReadIndexResp(follower.id, leader.id, term + 5, index=1, batch=1),
                   ReadIndex(follower.id, leader.id, term + 5, batch=1), VoteResp(follower.id, leader.id, term + 5)):
        leader.step(forged)
    leader.step(PreVoteResp(follower.id, leader.id, term + 5))
    assert leader.role == Role.LEADER and leader.term == term


def test_append_ack_beyond_the_leaders_log_is_ignored():
    net, leader, follower = _in_lease()
    commit = leader.commit
    leader.step(AppendResp(follower.id, leader.id, leader.term, index=2**63 - 1))
    net.drain()
    assert leader.progress[follower.id].match <= leader.last_index()
    assert leader.commit == commit


def test_append_batches_are_cut_at_the_byte_budget():
    net = Net(max_bytes_per_msg=1000)
    leader = net.elect()
    net.tick(2)
    leader.propose([b"x" * 300] * 10 + [b"y" * 5000])
    net.drain()
    net.tick(3)
    apps = [m for m in net.sent if m.type == MsgType.APP and m.ent_data]
    assert apps and all(len(m.ent_data) == 1 or sum(map(len, m.ent_data)) <= 1000 for m in apps)
    assert all(net.applied[i][-1] == b"y" * 5000 for i in net.cores)


def test_terms_jumping_further_than_any_election_history_are_refused():
    from electra.consensus.messages import MAX_TERM_JUMP

    net, leader, follower = _in_lease()
    term = follower.term
    follower.step(Heartbeat(leader.id, follower.id, term + MAX_TERM_JUMP + 1))
    follower.step(Append(leader.id, follower.id, MAX_TERM, prev_index=0, prev_term=0))
    assert follower.term == term and follower.refused_terms == 2
    follower.step(Heartbeat(leader.id, follower.id, term + MAX_TERM_JUMP))
    assert follower.term == term + MAX_TERM_JUMP  # within the bound: ordinary Raft
