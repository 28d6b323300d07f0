"""Raft wire messages: one typed class per message kind, and their msgpack encoding.

Each kind has its own named fields (`Append.prev_index`, `Heartbeat.leader_commit`,
`SnapChunk.size`, ...), so no field means one thing for one kind and another thing for
the next. Entries travel as two parallel lists (`ent_terms`, `ent_data`) rather than a
list of objects: a batch of thousands of 64-byte commands then encodes as two flat
msgpack arrays, which is the cheapest form CPython can produce and parse.

On the wire every kind is the same 17-slot msgpack array as before the kinds had their
own classes (see `SLOTS`): a kind fills the slots its `WIRE` table names and leaves the
others at their zero value, and a decoder ignores the slots a kind does not use. So the
format is unchanged and nodes of the two versions interoperate; docs/raft-engine.md has
the table of which field travels in which slot.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import IntEnum
from typing import Any, ClassVar

import msgpack

from .framing import MAX_FRAME

# Bounds on what a peer may send (docs/security.md, "Containment"). Indexes and offsets are
# int64 like every integer the log stores; terms stop at 2**62 so that a node at the highest
# acceptable term can still campaign (term + 1) without any encoder or peer overflowing.
MAX_INDEX = 2**63 - 1
MAX_TERM = 2**62
# A term more than this far beyond the receiver's is refused: legitimately it takes as many won
# elections while the receiver was cut off (days of back-to-back elections at >= 1 s each), and
# refusing it keeps a misbehaving peer from walking anyone's term up to MAX_TERM (2**42 messages).
MAX_TERM_JUMP = 1 << 20
MAX_ENTRIES = 1 << 16  # entries in one AppendEntries (RaftConfig.max_entries_per_msg must stay below)
_LIMITS: dict[str, Any] = {"max_str_len": 0, "max_map_len": 0, "max_ext_len": 0, "max_array_len": MAX_ENTRIES,
                           "max_bin_len": MAX_FRAME}


class MsgType(IntEnum):
    PRE_VOTE = 1
    PRE_VOTE_RESP = 2
    VOTE = 3
    VOTE_RESP = 4
    APP = 5  # AppendEntries
    APP_RESP = 6
    HEARTBEAT = 7
    HEARTBEAT_RESP = 8
    TIMEOUT_NOW = 9  # leadership transfer: campaign now, skipping PreVote and leases
    READ_INDEX = 10  # follower -> leader: confirm leadership and tell me the commit index
    READ_INDEX_RESP = 11
    SNAP = 12  # one chunk of an InstallSnapshot transfer (handled by the runtime, not the core)
    SNAP_RESP = 13


# The wire array: slot number -> its historical name (the names say nothing about a kind's fields).
SLOTS = ("type", "src", "dst", "term", "index", "log_term", "ent_terms", "ent_data", "commit", "reject",
         "hint_index", "hint_term", "context", "force", "offset", "chunk", "done")
_ZERO: tuple[Any, ...] = (0, 0, 0, 0, 0, 0, (), (), 0, False, 0, 0, 0, False, 0, b"", False)
_TYPES = frozenset(int(t) for t in MsgType)
_INT, _BYTES = {int}, {bytes}


@dataclass(slots=True, repr=False)
class Message:
    """What every kind has: sender, receiver, the sender's term. Instances are always of a kind below."""

    src: int
    dst: int
    term: int

    type: ClassVar[MsgType]
    # The wire slots of this kind's own fields, in field order (see SLOTS).
    WIRE: ClassVar[tuple[int, ...]] = ()
    _wire_fields: ClassVar[tuple[tuple[str, int], ...]] = ()

    def encode(self) -> bytes:
        slots = list(_ZERO)
        slots[0], slots[1], slots[2], slots[3] = int(self.type), self.src, self.dst, self.term
        for name, slot in self._wire_fields:
            slots[slot] = getattr(self, name)
        return msgpack.packb(slots, use_bin_type=True)  # type: ignore[no-any-return]

    @staticmethod
    def decode(buf: bytes) -> Message:
        """Decode one message of any kind; raises ValueError on anything malformed."""
        try:
            t = msgpack.unpackb(buf, raw=False, use_list=True, strict_map_key=True, **_LIMITS)
        except Exception as exc:  # msgpack raises several unrelated types
            raise ValueError(f"undecodable raft message: {type(exc).__name__}") from exc
        if not isinstance(t, list) or len(t) != len(SLOTS):
            raise ValueError("raft message must be a 17-field array")
        if type(t[0]) is not int or t[0] not in _TYPES:
            raise ValueError("raft message type must be a known message type number")
        # Every slot is checked, used by the kind or not: what a peer may send does not depend on it.
        if not all(type(t[i]) is int and 0 <= t[i] <= MAX_INDEX for i in (1, 2, 4, 8, 10, 12, 14)):
            raise ValueError("raft message ids, indexes and offsets must be integers in [0, 2**63)")
        if not all(type(t[i]) is int and 0 <= t[i] <= MAX_TERM for i in (3, 5, 11)):
            raise ValueError(f"raft message terms must be integers in [0, {MAX_TERM}]")
        if not all(type(t[i]) is bool for i in (9, 13, 16)):
            raise ValueError("raft message flags must be booleans")
        ent_terms, ent_data = t[6], t[7]
        if not isinstance(ent_terms, list) or not isinstance(ent_data, list):
            raise ValueError("raft message entries must be arrays")
        if len(ent_terms) != len(ent_data):
            raise ValueError("raft message entry terms and data differ in length")
        if type(t[15]) is not bytes:
            raise ValueError("raft message chunk must be binary")
        if ent_terms:  # whole-list checks in C: this runs for every entry the cluster replicates
            if set(map(type, ent_data)) != _BYTES:
                raise ValueError("raft message entry data must be binary")
            if set(map(type, ent_terms)) != _INT or min(ent_terms) < 0 or max(ent_terms) > MAX_TERM:
                raise ValueError(f"raft message entry terms must be integers in [0, {MAX_TERM}]")
        kind = KINDS[t[0]]
        return kind(t[1], t[2], t[3], *[t[slot] for slot in kind.WIRE])

    def __repr__(self) -> str:  # short form for logs and simulation traces
        parts = [f"<{self.type.name} {self.src}->{self.dst} t{self.term}"]
        for name, _ in self._wire_fields:
            v = getattr(self, name)
            if isinstance(v, list | bytes):
                if v:
                    parts.append(f"{name}={len(v)}")
            elif v:
                parts.append(f"{name}={v}")
        return " ".join(parts) + ">"


@dataclass(slots=True, repr=False)
class VoteRequest(Message):
    """PreVote or Vote: the candidate's last entry; `force` when a leadership transfer asked for it."""

    last_index: int = 0
    last_term: int = 0
    force: bool = False
    WIRE = (4, 5, 13)


@dataclass(slots=True, repr=False)
class PreVote(VoteRequest):
    """Would you vote for me at `term` (my term + 1)? Changes no term or vote anywhere."""

    type = MsgType.PRE_VOTE


@dataclass(slots=True, repr=False)
class Vote(VoteRequest):
    type = MsgType.VOTE


@dataclass(slots=True, repr=False)
class VoteResponse(Message):
    """A granted answer carries the request's term; a refusal carries the voter's own."""

    reject: bool = False
    WIRE = (9,)


@dataclass(slots=True, repr=False)
class PreVoteResp(VoteResponse):
    type = MsgType.PRE_VOTE_RESP


@dataclass(slots=True, repr=False)
class VoteResp(VoteResponse):
    type = MsgType.VOTE_RESP


@dataclass(slots=True, repr=False)
class Append(Message):
    """AppendEntries: the entries follow (prev_index, prev_term); `commit` is the leader's commit index."""

    type = MsgType.APP
    prev_index: int = 0
    prev_term: int = 0
    ent_terms: list[int] = field(default_factory=list)
    ent_data: list[bytes] = field(default_factory=list)
    commit: int = 0
    WIRE = (4, 5, 6, 7, 8)


@dataclass(slots=True, repr=False)
class AppendResp(Message):
    """Accepted: `index` is the last entry the follower now holds in agreement with the leader.

    Rejected: `index` is the `prev_index` it refused, and the hint says where to retry:
    (`hint_index`, `hint_term`) is the first entry of the follower's term at that point, or,
    with `hint_term == 0`, the follower's log ends at `hint_index - 1` (terms start at 1).
    """

    type = MsgType.APP_RESP
    index: int = 0
    reject: bool = False
    hint_index: int = 0
    hint_term: int = 0
    WIRE = (4, 9, 10, 11)


@dataclass(slots=True, repr=False)
class Heartbeat(Message):
    """`commit`: how far this follower may commit (at most its match); `leader_commit`: the
    leader's own commit index (for follower reads); `round`: the read/lease round it belongs to;
    `last_index`: the leader's last index (a rejoining node's vote floor; 0 from a leader that predates
    it, in an array slot older nodes leave at 0 and ignore)."""

    type = MsgType.HEARTBEAT
    commit: int = 0
    leader_commit: int = 0
    round: int = 0
    last_index: int = 0
    WIRE = (8, 4, 12, 10)


@dataclass(slots=True, repr=False)
class HeartbeatResp(Message):
    """`last_index`: the follower's last entry (answered after its writes are durable); `round` echoed."""

    type = MsgType.HEARTBEAT_RESP
    last_index: int = 0
    round: int = 0
    WIRE = (4, 12)


@dataclass(slots=True, repr=False)
class TimeoutNow(Message):
    """Leadership transfer: campaign now, skipping PreVote and leases."""

    type = MsgType.TIMEOUT_NOW


@dataclass(slots=True, repr=False)
class ReadIndex(Message):
    """Follower -> leader: confirm your leadership and tell me your commit index for read `batch`."""

    type = MsgType.READ_INDEX
    batch: int = 0
    WIRE = (12,)


@dataclass(slots=True, repr=False)
class ReadIndexResp(Message):
    """Leader -> follower: reads of `batch` may be served once `index` is applied."""

    type = MsgType.READ_INDEX_RESP
    index: int = 0
    batch: int = 0
    WIRE = (4, 12)


@dataclass(slots=True, repr=False)
class SnapChunk(Message):
    """One chunk of an InstallSnapshot transfer of the snapshot file (snap_index, snap_term).

    `size` is the whole file's size, `offset` this chunk's first byte, `done` marks the last chunk.
    """

    type = MsgType.SNAP
    snap_index: int = 0
    snap_term: int = 0
    size: int = 0
    offset: int = 0
    data: bytes = b""
    done: bool = False
    WIRE = (4, 5, 8, 14, 15, 16)


@dataclass(slots=True, repr=False)
class SnapResp(Message):
    """The receiver's answer to a chunk: the `offset` it expects next; `done` once the file is
    complete and verified; `reject` when it refuses the transfer (the leader starts over)."""

    type = MsgType.SNAP_RESP
    snap_index: int = 0
    snap_term: int = 0
    offset: int = 0
    done: bool = False
    reject: bool = False
    WIRE = (4, 5, 14, 16, 9)


KINDS: dict[int, type[Message]] = {}
for _kind in (PreVote, Vote, PreVoteResp, VoteResp, Append, AppendResp, Heartbeat, HeartbeatResp, TimeoutNow,
              ReadIndex, ReadIndexResp, SnapChunk, SnapResp):
    _own = [f.name for f in fields(_kind)][3:]
    if len(_own) != len(_kind.WIRE) or len(set(_kind.WIRE)) != len(_kind.WIRE) or min(_kind.WIRE, default=4) < 4:
        raise AssertionError(f"{_kind.__name__}: WIRE must give each of its fields its own free slot")
    _kind._wire_fields = tuple(zip(_own, _kind.WIRE, strict=True))
    KINDS[_kind.type] = _kind
if set(KINDS) != _TYPES:
    raise AssertionError("every message type needs exactly one class")
