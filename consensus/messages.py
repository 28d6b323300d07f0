"""Raft wire messages and their compact msgpack encoding.

One `Message` class serves every message type (as in etcd's raftpb.Message) so the
core, the simulator and the TCP transport share one shape. Entries travel as two
parallel lists (`ent_terms`, `ent_data`) rather than a list of objects: a batch of
thousands of 64-byte commands then encodes as two flat msgpack arrays, which is the
cheapest form CPython can produce and parse.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

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
_LIMITS = {"max_str_len": 0, "max_map_len": 0, "max_ext_len": 0, "max_array_len": MAX_ENTRIES,
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


_TYPES = frozenset(int(t) for t in MsgType)
_INT, _BYTES = {int}, {bytes}


@dataclass(slots=True)
class Message:
    type: MsgType
    src: int
    dst: int
    term: int
    # AppendEntries: entries follow (index, log_term); for votes: candidate's last entry.
    index: int = 0
    log_term: int = 0
    ent_terms: list[int] = field(default_factory=list)
    ent_data: list[bytes] = field(default_factory=list)
    commit: int = 0
    # Responses: reject flag and fast-backtracking hints (conflict index / conflict term).
    reject: bool = False
    hint_index: int = 0
    hint_term: int = 0
    # Heartbeats echo `context` so the leader can tell which round a reply belongs to.
    context: int = 0
    # Vote requests sent because of a leadership transfer bypass leases.
    force: bool = False
    # InstallSnapshot chunks: byte offset, payload, last-chunk flag; total size in `commit`.
    offset: int = 0
    chunk: bytes = b""
    done: bool = False

    def encode(self) -> bytes:
        return msgpack.packb(
            (
                int(self.type),
                self.src,
                self.dst,
                self.term,
                self.index,
                self.log_term,
                self.ent_terms,
                self.ent_data,
                self.commit,
                self.reject,
                self.hint_index,
                self.hint_term,
                self.context,
                self.force,
                self.offset,
                self.chunk,
                self.done,
            ),
            use_bin_type=True,
        )

    @staticmethod
    def decode(buf: bytes) -> Message:
        """Decode one message; raises ValueError on anything malformed."""
        try:
            t = msgpack.unpackb(buf, raw=False, use_list=True, strict_map_key=True, **_LIMITS)
        except Exception as exc:  # msgpack raises several unrelated types
            raise ValueError(f"undecodable raft message: {type(exc).__name__}") from exc
        if not isinstance(t, list) or len(t) != 17:
            raise ValueError("raft message must be a 17-field array")
        if type(t[0]) is not int or t[0] not in _TYPES:
            raise ValueError("raft message type must be a known message type number")
        msg = Message(MsgType(t[0]), *t[1:])
        ints = (msg.src, msg.dst, msg.index, msg.commit, msg.hint_index, msg.context, msg.offset)
        if not all(type(v) is int and 0 <= v <= MAX_INDEX for v in ints):
            raise ValueError("raft message ids, indexes and offsets must be integers in [0, 2**63)")
        if not all(type(v) is int and 0 <= v <= MAX_TERM for v in (msg.term, msg.log_term, msg.hint_term)):
            raise ValueError(f"raft message terms must be integers in [0, {MAX_TERM}]")
        if not all(type(v) is bool for v in (msg.reject, msg.force, msg.done)):
            raise ValueError("raft message flags must be booleans")
        if not isinstance(msg.ent_terms, list) or not isinstance(msg.ent_data, list):
            raise ValueError("raft message entries must be arrays")
        if len(msg.ent_terms) != len(msg.ent_data):
            raise ValueError("raft message entry terms and data differ in length")
        if type(msg.chunk) is not bytes:
            raise ValueError("raft message chunk must be binary")
        if msg.ent_terms:  # whole-list checks in C: this runs for every entry the cluster replicates
            if set(map(type, msg.ent_data)) != _BYTES:
                raise ValueError("raft message entry data must be binary")
            if set(map(type, msg.ent_terms)) != _INT or min(msg.ent_terms) < 0 or max(msg.ent_terms) > MAX_TERM:
                raise ValueError(f"raft message entry terms must be integers in [0, {MAX_TERM}]")
        return msg

    def __repr__(self) -> str:  # short form for logs and simulation traces
        extra = f" ents={len(self.ent_terms)}" if self.ent_terms else ""
        rej = " REJECT" if self.reject else ""
        return (f"<{self.type.name} {self.src}->{self.dst} t{self.term} i{self.index}"
                f" lt{self.log_term} c{self.commit}{extra}{rej}>")
