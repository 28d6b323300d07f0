"""The durable Raft log: append-only segment files of CRC-checked records.

Each record is `length (4 bytes, big-endian) | crc32 of payload (4) | payload`,
the payload a msgpack array whose first element is the record kind:

* ENTRIES `(1, first_index, terms, datas)`: replaces the log from `first_index`
  on. A truncation after a leader change is just a later record, so files are
  only ever appended to (and a torn tail truncated on recovery).
* HARD_STATE `(2, term, vote[, floor_index, floor_term])`: the last one wins. The
  optional vote floor is the newest entry of a log this node lost (see
  `RaftCore.vote_floor`); it travels with the hard state so every segment keeps it.
* COMPACTED `(3, index, term)`: entries up to `index` live in a snapshot.
* RESET `(4, index, term)`: an installed snapshot replaced the whole log.
* BATCH_END `(6, batch_start, records)`: ends every write a sync makes (one group
  commit: the Ready's HARD_STATE and ENTRIES, or one record set per Ready of the
  batch) and every segment header, in the same write: the batch is the `records`
  records from offset `batch_start` of the same file up to this one. Binaries from
  before 2026-11-29 do not know this kind and refuse a log that holds it ("unknown
  record kind 6"): a node cannot go back to an older version without a restore.

Every segment begins with the current hard state and compaction marker, so whole
segments that hold only compacted entries can be deleted without losing either.
A segment is born whole: its header is written and synced under a temporary name,
then renamed into place. So a segment that does not begin with a HARD_STATE record
(emptied, or damaged at its start) was never written that way: recovery refuses it,
since starting with term 0 and no vote could vote twice in a term this node already
voted in, and would silently drop the acknowledged entries it held.

How far the log had durably reached is also kept beside it, in `raft-log.term` (one record
`(5, term, commit)`, written whole under a temporary name and renamed): each time a higher term is
synced into the log, and at most once a second (the host's clock) as its committed entries grow.
`commit` is the node's commit index capped at the last index synced, so the mark holds only
committed entries the log durably held. A log that recovers to an older term, or that ends before
that index, lost synced records: its segments were deleted (`rm`, a restore that missed them), or
cut after a complete record, or cut in the middle and taken for a torn tail (a torn write only
loses what was never synced, which lies beyond every marked entry). Replay alone cannot tell
those from a log that never held more; recovery refuses them, as it refuses a damaged segment
start: starting over could vote twice in a term and help elect a leader without entries this
node acknowledged. The mark is written only after the log's own sync (by `write_mark`, which the
host runs off the sync's path), so it never runs ahead of the log, and a crash can only leave it
behind. Committed entries are never truncated (Raft), and
an installed snapshot replaces the log at or above the commit index, so a healthy log never ends
before its mark.

Damage in the newest segment: a torn write or corruption? A batch is written only after the
previous sync returned (syncs are one at a time, `sync()` rolls a segment only after its fsync,
`open()` fsyncs what it replayed before anything is written after it, a segment header is synced
before the segment is renamed into place, and a failed write or fsync stops all writing). So
everything before a complete batch (its BATCH_END verifies, and so does each of its records, from
its start exactly up to it) was durable when that batch was written: damage followed by a complete
batch hit synced, maybe acknowledged, bytes, and recovery refuses to start. Damage followed by none
lies in the last batch, whose fsync may never have returned: Linux writes a file's dirty pages back
in no particular order (ext4 unwritten extents, XFS), so a page in the middle of it can read back as
zeros while a later page, a complete record, and the file size survived. That is a torn write: the
segment is truncated at the damage, and only a sync that never returned is lost. Real damage in
that last batch (bit rot in the newest synced write) looks the same and is truncated too; the term
mark (below) still refuses a log that so lost marked committed entries or a synced term. A segment
an older version wrote (no BATCH_END) keeps the older rule: damage is a torn tail only if no intact
record follows it (or only zeros), so an upgrade never refuses a log it accepted before; `open()`
never appends to such a segment but starts a new one, one format per file.

Writes are buffered; `sync()` writes the buffer (looping over short writes) and
runs one `fdatasync` (group commit). Any failed write or fsync is final: the
storage refuses every later write and sync with `DiskFailure`, because after a
failed fsync the kernel may have dropped the dirty pages and a retry could
"succeed" without the data (fsyncgate). Nothing is acknowledged before `sync()`
returns, so a node that stops here has acknowledged nothing it does not hold.
`sync()` may run on a worker thread while the event loop keeps calling
`append()`: a lock swaps the buffer, so appends made during a sync land in the
next one.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack

from . import mutations
from .errors import DiskFailure
from .files import Files, OsFiles, WritableFile, write_all

ENTRIES, HARD_STATE, COMPACTED, RESET = 1, 2, 3, 4
BATCH_END = 6  # (6, batch_start, records): ends each write that a sync makes durable (see the module doc)
_HEADER = struct.Struct(">II")
_SUFFIX = ".seg"
_STARTING = ".seg.tmp"  # a segment whose header is being written (renamed into place once synced)
_TERM_MARK = ".term"  # beside the log directory: the term and committed index synced (see the module doc)


def term_mark_path(log_dir: Path) -> Path:
    """Where the log in `log_dir` keeps its term mark (`raft-log.term` beside `raft-log/`)."""
    return log_dir.with_name(log_dir.name + _TERM_MARK)
TERM_MARK = 5  # the mark's one record: (5, term, commit)
MARK_INTERVAL_S = 1.0  # the committed index is marked at most this often
log = logging.getLogger("electra.consensus.storage")


class CorruptLogError(Exception):
    """The log is damaged before its tail; starting would risk losing committed data."""


@dataclass
class RecoveredLog:
    term: int = 0
    vote: int = 0
    vote_floor: tuple[int, int] = (0, 0)  # (index, term) of the newest entry of a lost log
    snapshot_index: int = 0
    snapshot_term: int = 0
    terms: list[int] = field(default_factory=list)
    datas: list[bytes] = field(default_factory=list)

    @property
    def first_index(self) -> int:
        return self.snapshot_index + 1

    @property
    def last_index(self) -> int:
        return self.snapshot_index + len(self.terms)


def _valid_record_after(data: bytes, pos: int) -> bool:
    """Is there an intact record anywhere after `pos`? Then the damage is not a torn tail.

    Payloads are msgpack arrays of 3 to 5 items, so candidate starts are found with
    `bytes.find` on those header bytes rather than by trying every offset.
    """
    n = len(data)
    for marker in (b"\x93", b"\x94", b"\x95"):
        at = data.find(marker, pos + 1 + _HEADER.size)
        while at != -1:
            start = at - _HEADER.size
            length, crc = _HEADER.unpack_from(data, start)
            end = at + length
            if length > 0 and end <= n and zlib.crc32(data[at:end]) == crc:
                return True
            at = data.find(marker, at + 1)
    return False


def _batch_end_after(data: bytes, pos: int) -> bool:
    """Is there a complete batch after `pos`: a BATCH_END record whose batch, from its start offset up to it,
    is exactly its count of records that all verify? Then that batch was written after a sync that made the
    bytes at `pos` durable, and damage there is not a torn write."""
    at = data.find(b"\x93\x06", pos + 1 + _HEADER.size)  # a 3-item msgpack array of kind 6
    while at != -1:
        end = _verified_end(data, at - _HEADER.size)
        if end is not None:
            try:
                kind, start, count = msgpack.unpackb(data[at:end], raw=False, use_list=True)
            except Exception:
                kind = None
            if (kind == BATCH_END and type(start) is int and type(count) is int and pos < start < at
                    and count > 0 and _records_between(data, start, at - _HEADER.size) == count):
                return True
        at = data.find(b"\x93\x06", at + 1)
    return False


def _verified_end(data: bytes, start: int) -> int | None:
    """Where the record at `start` ends, if it is whole and its checksum verifies."""
    if start < 0 or len(data) - start < _HEADER.size:
        return None
    length, crc = _HEADER.unpack_from(data, start)
    end: int = start + _HEADER.size + length
    if length == 0 or end > len(data) or zlib.crc32(data[start + _HEADER.size:end]) != crc:
        return None
    return end


def _records_between(data: bytes, start: int, stop: int) -> int | None:
    """How many records, each verifying, lie exactly between `start` and `stop`; None if they do not chain."""
    count = 0
    while start < stop:
        end = _verified_end(data, start)
        if end is None or end > stop:
            return None
        start, count = end, count + 1
    return count


def _record(payload: tuple[Any, ...]) -> bytes:
    body: bytes = msgpack.packb(payload, use_bin_type=True)
    return _HEADER.pack(len(body), zlib.crc32(body)) + body


class LogStorage:
    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = True, segment_bytes: int = 64 << 20,
                 files: Files | None = None, clock: Callable[[], float] | None = None) -> None:
        self.dir = Path(path)
        self.files: Files = files or OsFiles()
        self.fsync = fsync
        self.segment_bytes = segment_bytes
        self._lock = threading.Lock()
        self._buf = bytearray()
        self._buf_records = 0  # records in `_buf` (its BATCH_END says how many)
        self._file: WritableFile | None = None
        self._seg_path: Path | None = None
        self._seg_size = 0
        self._seg_seq = 0
        # What the log holds, tracked for segment headers and compaction.
        self._term = 0
        self._vote = 0
        self._floor = (0, 0)
        self._snap = (0, 0)
        self._last_index = 0
        self._seg_max: dict[Path, int] = {}  # segment -> highest entry index written into it
        self._gap_until = 0
        self._failed: BaseException | None = None
        self._mark = term_mark_path(self.dir)
        self._marked_term = 0  # the term `_mark` holds
        self._marked_commit = 0  # the committed index `_mark` holds
        self._marked_at = float("-inf")  # when it was last written (`clock`)
        self._commit_hint = 0  # the host's commit index (`note_commit`)
        self._pending_mark: tuple[int, int] | None = None  # due since a sync, not yet written (`write_mark`)
        self._mark_failures = 0  # failed mark writes in a row (logged at the first and then every 100th)
        self._mark_lock = threading.Lock()
        self._clock = clock  # None: the committed index is never marked (the term still is)

    @property
    def last_index(self) -> int:
        return self._last_index

    # ------------------------------------------------------------------ recovery
    def open(self) -> RecoveredLog:
        self.files.mkdir(self.dir)
        names = self.files.listdir(self.dir)
        for p in names:
            if p.name.endswith(_STARTING):  # a segment start a crash interrupted: it held nothing yet
                self.files.unlink(p)
        segs = sorted(p for p in names if p.suffix == _SUFFIX and p.stem.isdigit())
        rec = RecoveredLog()
        self._gap_until = 0
        batched = False
        for k, seg in enumerate(segs):
            batched = self._replay(seg, rec, newest=(k == len(segs) - 1))
        if self._gap_until:
            raise CorruptLogError(f"Raft log in {self.dir} misses entries up to {self._gap_until} "
                                  "(a segment file was deleted or lost); refusing to start")
        self._marked_term, self._marked_commit = self._read_term_mark()
        if rec.last_index < self._marked_commit:
            raise CorruptLogError(
                f"Raft log in {self.dir} ends at index {rec.last_index}, but it had synced committed entries up to "
                f"{self._marked_commit} ({self._mark}): a segment was cut or deleted, and the cut taken for a torn "
                "tail (a torn write only loses entries never synced); refusing to start (starting so could help "
                "elect a leader without committed entries). Restore this node from a peer: move its data directory "
                "aside and start it empty with --rejoin, so the leader sends it a snapshot")
        if rec.term < self._marked_term:
            raise CorruptLogError(
                f"Raft log in {self.dir} ends in term {rec.term}, but this node had synced term "
                f"{self._marked_term} into it ({self._mark}): segments were deleted, or cut after a complete "
                f"record ({len(segs)} segment(s) left), and with them its vote and entries it may have "
                "acknowledged; refusing to start (starting so could vote twice in a term and help elect a leader "
                "without committed entries). Restore this node from a peer: move its data directory aside and "
                "start it empty with --rejoin, so the leader sends it a snapshot")
        self._term, self._vote, self._floor = rec.term, rec.vote, rec.vote_floor
        self._snap = (rec.snapshot_index, rec.snapshot_term)
        self._last_index = rec.last_index
        self._seg_seq = int(segs[-1].stem) if segs else 0
        if segs:
            self._open_segment(segs[-1], new=False)
            if self.fsync and self._file is not None:
                # What replay read may be only in the page cache (the process was killed, the machine kept
                # running): durable before this node acts on it, and before a batch is written after it.
                self._file.sync()
        if not segs or self._seg_size >= self.segment_bytes or not batched:
            self._roll()  # a segment written before BATCH_END records is never appended to: one format a file
        return rec

    def _replay(self, seg: Path, rec: RecoveredLog, newest: bool) -> bool:
        """Replay one segment into `rec`; True if it holds BATCH_END records (written by this version)."""
        data = self.files.read_bytes(seg)
        pos, n = 0, len(data)
        seg_max = 0
        batched = False
        if not self._begins_with_hard_state(data):
            raise CorruptLogError(
                f"Raft log segment {seg} ({n} bytes) does not begin with the node's term and vote: it was emptied "
                "or damaged at its start, and the entries and vote it held are lost; refusing to start (starting "
                "over could vote twice in one term). Restore this node from a peer: move its data directory "
                "aside and start it empty with --rejoin, so the leader sends it a snapshot")
        while pos < n:
            problem = None
            if n - pos < _HEADER.size:
                problem = "incomplete record header"
            else:
                length, crc = _HEADER.unpack_from(data, pos)
                end = pos + _HEADER.size + length
                if length == 0:
                    problem = "empty record"  # zero-filled space: crc32(b"") is 0, so check it explicitly
                elif end > n:
                    problem = f"record length {length} runs past the end of the file"
                elif zlib.crc32(data[pos + _HEADER.size:end]) != crc:
                    problem = "checksum mismatch"
            if problem is not None:
                if mutations.enabled("skip_torn_tail_truncation"):
                    break  # the deliberate bug: keep the torn bytes; later appends land after them
                if newest and self._torn(data, pos, batched):
                    log.warning("log %s: torn tail at offset %d (%s); dropping %d bytes", seg, pos, problem, n - pos)
                    self.files.truncate(seg, pos)
                    break
                if not newest:
                    where = "in a segment older than the newest (synced whole before the next one began)"
                elif _batch_end_after(data, pos):
                    where = "before a complete batch written after it was synced (not a torn write)"
                else:
                    where = "before an intact record (not a torn tail)"
                raise CorruptLogError(f"corrupt Raft log {seg} at offset {pos}: {problem}, {where}; refusing to "
                                      "start (restore this node from a peer or a snapshot)")
            try:
                body = msgpack.unpackb(data[pos + _HEADER.size:end], raw=False, use_list=True)
                seg_max = max(seg_max, self._apply_record(body, rec))
                batched = batched or body[0] == BATCH_END
            except CorruptLogError as exc:
                raise CorruptLogError(f"corrupt Raft log {seg} at offset {pos}: {exc}") from None
            except Exception as exc:
                raise CorruptLogError(f"corrupt Raft log {seg} at offset {pos}: undecodable record: {exc}") from None
            pos = end
        self._seg_max[seg] = seg_max
        return batched

    @staticmethod
    def _torn(data: bytes, pos: int, batched: bool) -> bool:
        """Is the damage at `pos` of the newest segment a write a crash tore (truncated), not corruption (refused)?

        A batch is written only after everything before it in its segment was durable. So damage followed by a
        complete batch hit durable bytes. Damage followed by none lies in the last batch, whose sync may never
        have returned: its pages reach the disk in any order, a middle one lost while later ones survive. A
        segment without BATCH_END records (an older version wrote it) keeps the older rule: torn only if no
        intact record follows, or all zeros."""
        if data.count(0, pos) == len(data) - pos:
            return True
        if _batch_end_after(data, pos):
            return False
        return batched or not _valid_record_after(data, pos)

    @staticmethod
    def _begins_with_hard_state(data: bytes) -> bool:
        """Does the segment's first record hold a HARD_STATE (as `_roll` writes every segment's header)?"""
        if len(data) < _HEADER.size:
            return False
        length, crc = _HEADER.unpack_from(data, 0)
        body = data[_HEADER.size:_HEADER.size + length]
        if length == 0 or len(body) < length or zlib.crc32(body) != crc:
            return False
        try:
            first = msgpack.unpackb(body, raw=False, use_list=True)
        except Exception:
            return False
        return isinstance(first, list) and bool(first) and first[0] == HARD_STATE

    def _apply_record(self, body: list[Any], rec: RecoveredLog) -> int:
        kind = body[0]
        if kind == ENTRIES:
            _, first, terms, datas = body
            if len(terms) != len(datas):
                raise CorruptLogError("entry record with mismatched terms and data")
            if first > rec.last_index + 1:
                # Only legal where older segments were deleted after compaction; a later
                # COMPACTED record must cover the gap (checked at the end of open()).
                self._gap_until = first - 1
                rec.terms.clear()
                rec.datas.clear()
                rec.snapshot_index, rec.snapshot_term = first - 1, -1
            skip = max(0, rec.snapshot_index + 1 - first)  # entries already folded into the snapshot
            cut = first + skip - rec.snapshot_index - 1
            del rec.terms[cut:]
            del rec.datas[cut:]
            rec.terms.extend(terms[skip:])
            rec.datas.extend(datas[skip:])
            return int(first) + len(terms) - 1
        if kind == HARD_STATE:
            _, rec.term, rec.vote, *floor = body
            rec.vote_floor = tuple(floor) if floor else (0, 0)
            return 0
        if kind == COMPACTED:
            _, index, term = body
            if index >= self._gap_until:
                self._gap_until = 0
            if index >= rec.snapshot_index:
                drop = min(len(rec.terms), index - rec.snapshot_index)
                del rec.terms[:drop]
                del rec.datas[:drop]
                rec.snapshot_index, rec.snapshot_term = index, term
            return 0
        if kind == RESET:
            _, index, term = body
            rec.terms.clear()
            rec.datas.clear()
            rec.snapshot_index, rec.snapshot_term = index, term
            self._gap_until = 0
            return 0
        if kind == BATCH_END:
            return 0
        raise CorruptLogError(f"unknown record kind {kind!r}")

    # ------------------------------------------------------------------ writing
    def append(self, first_index: int, terms: list[int], datas: list[bytes]) -> None:
        if not terms:
            return
        if first_index > self._last_index + 1:
            raise ValueError(f"gap: appending at {first_index} after last index {self._last_index}")
        if first_index <= self._snap[0]:
            raise ValueError(f"appending at {first_index}, inside the compacted prefix (<= {self._snap[0]})")
        rec = _record((ENTRIES, first_index, terms, datas))
        with self._lock:
            self._buf += rec
            self._buf_records += 1
            self._last_index = first_index + len(terms) - 1
            self._note_segment_max(self._last_index)

    def _note_segment_max(self, index: int) -> None:
        """The open segment now holds records up to `index` (compaction deletes a segment only below it)."""
        seg = self._seg_path
        assert seg is not None  # open() started a segment before anything is written
        self._seg_max[seg] = max(self._seg_max.get(seg, 0), index)

    def save_hard_state(self, term: int, vote: int) -> None:
        with self._lock:
            self._term, self._vote = term, vote
            self._buf += self._hard_state_record()
            self._buf_records += 1

    def save_vote_floor(self, index: int, term: int) -> None:
        """Remember (durably, with the hard state) the newest entry of a log this node lost."""
        with self._lock:
            self._floor = (index, term)
            self._buf += self._hard_state_record()
            self._buf_records += 1

    def _hard_state_record(self) -> bytes:
        if self._floor == (0, 0):
            return _record((HARD_STATE, self._term, self._vote))
        return _record((HARD_STATE, self._term, self._vote, *self._floor))

    def compact(self, upto_index: int, upto_term: int) -> None:
        """Record that entries up to `upto_index` are in a snapshot; delete covered segments at next sync."""
        with self._lock:
            if upto_index <= self._snap[0]:
                return
            self._snap = (upto_index, upto_term)
            self._buf += _record((COMPACTED, upto_index, upto_term))
            self._buf_records += 1

    def reset(self, index: int, term: int) -> None:
        """Drop the whole log: a snapshot at (index, term) replaced it (InstallSnapshot, or a node going back to
        an older snapshot of its own when the newest is damaged, under a vote floor). A reset below the marked
        committed index lowers the mark first: that node knows it went back, and the floor guards its votes."""
        if index < self._marked_commit and self.fsync:
            with self._lock:
                self._pending_mark = None  # due before the reset: it would raise the mark above the log again
            self._write_term_mark(self._marked_term, index)
        with self._lock:
            self._snap = (index, term)
            self._last_index = index
            self._buf += _record((RESET, index, term))
            self._buf_records += 1
            self._note_segment_max(index)

    @property
    def failed(self) -> BaseException | None:
        """The write or fsync error that made this storage refuse all further writes."""
        return self._failed

    def sync(self) -> None:
        """Make everything appended so far durable, or raise `DiskFailure` (then forever)."""
        if self._failed is not None:
            raise DiskFailure(f"the Raft log in {self.dir} failed earlier ({self._failed}); "
                              "refusing to write or fsync again")
        try:
            with self._lock:
                buf, self._buf = self._buf, bytearray()
                records, self._buf_records = self._buf_records, 0
                synced_term = self._term  # the newest hard state in `buf` (or synced before) holds it
                synced_commit = min(self._commit_hint, self._last_index)  # committed and in the log once synced
            assert self._file is not None, "sync() before open()"
            if buf:
                # The batch ends with where it began and how many records it holds, in the same write, so
                # recovery can tell a complete batch (written after the previous sync returned) from a torn one.
                buf += _record((BATCH_END, self._seg_size, records))
                write_all(self._file, buf)
                self._seg_size += len(buf)
            if self.fsync:
                self._file.sync()
                if synced_term > self._marked_term or (synced_commit > self._marked_commit and self._mark_due()):
                    with self._lock:  # written by `write_mark`, off this sync's path (acks and votes wait on it)
                        self._pending_mark = (max(synced_term, self._marked_term),
                                              max(synced_commit, self._marked_commit))
            if self._seg_size >= self.segment_bytes:
                with self._lock:
                    self._roll()
                self._delete_compacted()
        except OSError as exc:
            self._failed = exc
            raise DiskFailure(f"writing the Raft log in {self.dir} failed: {exc}") from exc

    def note_commit(self, index: int) -> None:
        """The host's commit index, for the mark (`sync` caps it at what the log holds synced)."""
        if index > self._commit_hint:
            self._commit_hint = index

    @property
    def mark_pending(self) -> bool:
        return self._pending_mark is not None

    def write_mark(self) -> None:
        """Write the mark `sync` found due, if any. The host runs this after the sync's messages left, on
        another thread than its log syncs: three more fsyncs on a vote's path made elections on a slow disk
        (800 ms a fsync) time out again and again. A failure is logged and the mark stays due: the log's own
        syncs say whether the disk failed."""
        with self._lock:
            pending, self._pending_mark = self._pending_mark, None
        if pending is None:
            return
        try:
            self._write_term_mark(*pending)
        except OSError as exc:
            with self._lock:
                if self._pending_mark is None:
                    self._pending_mark = pending
            self._mark_failures += 1
            if self._mark_failures % 100 == 1:  # a full disk failed it 30-80 times a second before the fail-stop
                log.warning("writing the log mark %s failed (%s; %d in a row); it is tried again after the next sync",
                            self._mark, exc, self._mark_failures)
            return
        if self._mark_failures:
            log.warning("the log mark %s is written again after %d failures", self._mark, self._mark_failures)
            self._mark_failures = 0

    def _mark_due(self) -> bool:
        return self._clock is not None and self._clock() - self._marked_at >= MARK_INTERVAL_S

    def _read_term_mark(self) -> tuple[int, int]:
        """The (term, committed index) in `raft-log.term`; (0, 0) if there is none (a log from before the mark,
        or one that never passed term 0). A mark of one version earlier holds the term only."""
        if not self.files.exists(self._mark):
            return 0, 0
        data = self.files.read_bytes(self._mark)
        try:
            length, crc = _HEADER.unpack_from(data, 0)
            body = data[_HEADER.size:_HEADER.size + length]
            if len(body) != length or zlib.crc32(body) != crc:
                raise ValueError("checksum mismatch")
            kind, term, *rest = msgpack.unpackb(body, raw=False, use_list=True)
            commit = rest[0] if rest else 0
            if kind != TERM_MARK or type(term) is not int or term < 0 or type(commit) is not int or commit < 0:
                raise ValueError("not a term mark")
        except (struct.error, ValueError, TypeError) as exc:
            raise CorruptLogError(f"the term mark {self._mark} is damaged ({exc}); refusing to start (restore this "
                                  "node from a peer: move its data directory aside and start it empty with "
                                  "--rejoin)") from None
        return int(term), int(commit)

    def _write_term_mark(self, term: int, commit: int) -> None:
        """Write the mark whole: under a temporary name, synced, renamed, the directory synced (one writer at a
        time: `write_mark` on the host's snapshot thread, `close` and `reset` on its log thread)."""
        with self._mark_lock:
            tmp = self._mark.with_name(self._mark.name + ".tmp")
            f = self.files.open_write(tmp)
            try:
                write_all(f, _record((TERM_MARK, term, commit)))
                f.sync()
            finally:
                f.close()
            self.files.replace(tmp, self._mark)
            self.files.sync_dir(self._mark.parent)
            self._marked_term, self._marked_commit = term, commit
            if self._clock is not None:
                self._marked_at = self._clock()

    def close(self) -> None:
        if self._file is not None:
            if self._failed is None:
                self.sync()
                if self.fsync:
                    self.write_mark()
            self._file.close()
            self._file = None

    # ------------------------------------------------------------------ segments
    def _roll(self) -> None:
        """Start a new segment, beginning with the current hard state and compaction marker.

        The header is written and synced under a temporary name and renamed into place, so
        no crash leaves a segment without it (recovery refuses one: `_begins_with_hard_state`)."""
        self._seg_seq += 1
        path = self.dir / f"{self._seg_seq:020d}{_SUFFIX}"
        head = self._hard_state_record()
        if self._snap[0]:
            head += _record((RESET if self._last_index == self._snap[0] else COMPACTED, *self._snap))
        head += _record((BATCH_END, 0, 2 if self._snap[0] else 1))  # the header is a batch: synced before renamed
        starting = self.dir / (path.name[:-len(_SUFFIX)] + _STARTING)
        f = self.files.open_write(starting)
        try:
            write_all(f, head)
            if self.fsync:
                f.sync()
        finally:
            f.close()
        self.files.replace(starting, path)
        if self.fsync:
            self.files.sync_dir(self.dir)
        self._open_segment(path, new=False)
        self._seg_max[path] = 0

    def _open_segment(self, path: Path, new: bool) -> None:
        if self._file is not None:
            self._file.close()
        self._file = self.files.open_append(path, create=new)
        self._seg_path = path
        self._seg_size = self.files.size(path)

    def _delete_compacted(self) -> None:
        """Delete the oldest segments whose entries all lie in the durable compacted prefix.

        The COMPACTED record that allows it is already synced into a newer segment, so
        replay meets it and accepts the missing prefix.
        """
        snap = self._snap[0]
        for seg in sorted(self._seg_max):
            if seg == self._seg_path or self._seg_max[seg] > snap:
                break  # only ever delete a prefix of the segments
            if self.files.exists(seg):
                self.files.unlink(seg)
                log.info("deleted compacted log segment %s", seg)
            del self._seg_max[seg]
