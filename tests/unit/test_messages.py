"""The typed message kinds keep the wire format of the single-shape messages they replaced."""

from __future__ import annotations

import msgpack
import pytest

from electra.consensus.messages import (
    KINDS,
    SLOTS,
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
    SnapChunk,
    SnapResp,
    TimeoutNow,
    Vote,
    VoteResp,
)

# One message of every kind, and the wire slots (by their historical names) it must fill.
EXAMPLES: list[tuple[Message, dict[str, object]]] = [
    (PreVote(1, 2, 7, last_index=9, last_term=6), {"index": 9, "log_term": 6}),
    (Vote(1, 2, 7, last_index=9, last_term=6, force=True), {"index": 9, "log_term": 6, "force": True}),
    (PreVoteResp(2, 1, 7, reject=True), {"reject": True}),
    (VoteResp(2, 1, 7), {}),
    (Append(1, 2, 7, prev_index=5, prev_term=6, ent_terms=[7, 7], ent_data=[b"a", b"b"], commit=4),
     {"index": 5, "log_term": 6, "ent_terms": [7, 7], "ent_data": [b"a", b"b"], "commit": 4}),
    (AppendResp(2, 1, 7, index=5, reject=True, hint_index=3, hint_term=2),
     {"index": 5, "reject": True, "hint_index": 3, "hint_term": 2}),
    (Heartbeat(1, 2, 7, commit=3, leader_commit=4, round=11), {"commit": 3, "index": 4, "context": 11}),
    (HeartbeatResp(2, 1, 7, last_index=8, round=11), {"index": 8, "context": 11}),
    (TimeoutNow(1, 2, 7), {}),
    (ReadIndex(2, 1, 7, batch=3), {"context": 3}),
    (ReadIndexResp(1, 2, 7, index=12, batch=3), {"index": 12, "context": 3}),
    (SnapChunk(1, 2, 7, snap_index=500, snap_term=5, size=4096, offset=1000, data=b"xyz", done=True),
     {"index": 500, "log_term": 5, "commit": 4096, "offset": 1000, "chunk": b"xyz", "done": True}),
    (SnapResp(2, 1, 7, snap_index=500, snap_term=5, offset=1003, done=True, reject=False),
     {"index": 500, "log_term": 5, "offset": 1003, "done": True}),
]


def test_every_kind_has_an_example():
    assert {type(m) for m, _ in EXAMPLES} == set(KINDS.values())


@pytest.mark.parametrize(("msg", "slots"), EXAMPLES, ids=lambda v: type(v).__name__ if isinstance(v, Message) else "")
def test_each_kind_round_trips_through_the_unchanged_17_slot_array(msg, slots):
    raw = msgpack.unpackb(msg.encode())
    zero = {"ent_terms": [], "ent_data": [], "chunk": b"", "reject": False, "force": False, "done": False}
    expected = {name: zero.get(name, 0) for name in SLOTS} | {
        "type": int(msg.type), "src": msg.src, "dst": msg.dst, "term": msg.term} | slots
    assert dict(zip(SLOTS, raw, strict=True)) == expected
    assert Message.decode(msg.encode()) == msg


def test_a_decoder_ignores_slots_its_kind_does_not_use():
    raw = msgpack.unpackb(Heartbeat(1, 2, 7, round=3).encode())
    raw[SLOTS.index("offset")] = 99  # a snapshot chunk's field: no meaning for a heartbeat
    assert Message.decode(msgpack.packb(raw, use_bin_type=True)) == Heartbeat(1, 2, 7, round=3)
    assert MsgType(raw[0]) is MsgType.HEARTBEAT
