"""The durable log: round trips, overwrite semantics, segments, torn tails, corruption."""

from __future__ import annotations

import errno
import os
import threading

import pytest

from electra.consensus.errors import DiskFailure
from electra.consensus.storage import CorruptLogError, LogStorage


def reopen(path, **kw):
    s = LogStorage(path, **kw)
    return s, s.open()


def test_round_trip_entries_and_hard_state(tmp_path):
    s, rec = reopen(tmp_path)
    assert (rec.term, rec.vote, rec.last_index) == (0, 0, 0)
    s.save_hard_state(3, 2)
    s.append(1, [1, 1, 3], [b"a", b"b", b"c"])
    s.sync()
    s.close()
    _, rec = reopen(tmp_path)
    assert (rec.term, rec.vote) == (3, 2)
    assert rec.terms == [1, 1, 3] and rec.datas == [b"a", b"b", b"c"] and rec.first_index == 1


def test_later_record_replaces_the_suffix(tmp_path):
    s, _ = reopen(tmp_path)
    s.append(1, [1] * 10, [b"%d" % i for i in range(1, 11)])
    s.append(6, [2, 2], [b"x", b"y"])
    s.close()
    _, rec = reopen(tmp_path)
    assert rec.terms == [1] * 5 + [2, 2]
    assert rec.datas[-3:] == [b"5", b"x", b"y"]


def test_gap_is_refused(tmp_path):
    s, _ = reopen(tmp_path)
    s.append(1, [1], [b"a"])
    with pytest.raises(ValueError):
        s.append(3, [1], [b"c"])


def test_segments_roll_over_and_reopen(tmp_path):
    s, _ = reopen(tmp_path, segment_bytes=2000)
    for i in range(1, 201):
        s.append(i, [1], [b"x" * 50])
        s.sync()
    s.save_hard_state(5, 1)
    s.close()
    assert len(list(tmp_path.glob("*.seg"))) > 3
    _, rec = reopen(tmp_path, segment_bytes=2000)
    assert rec.last_index == 200 and rec.term == 5


def _records(data):
    """(start, end, kind) of each whole record of a segment, in order."""
    out, pos = [], 0
    while pos + 8 <= len(data):
        length = int.from_bytes(data[pos:pos + 4], "big")
        if length == 0 or pos + 8 + length > len(data):
            break
        out.append((pos, pos + 8 + length, data[pos + 9]))  # a msgpack array's first item: the kind (< 128)
        pos += 8 + length
    return out


def _last_entries_end(data):
    """Where the last ENTRIES record ends (a batch-end record follows it: each sync's write ends with one)."""
    return max(end for _, end, kind in _records(data) if kind == 1)


def _write_some(path, n=20):
    s, _ = reopen(path)
    for i in range(1, n + 1):
        s.append(i, [1], [b"entry-%d" % i])
        s.sync()
    s.close()
    return next(path.glob("*.seg"))


@pytest.mark.parametrize("damage", ["cut-mid-record", "garbage", "zeros", "flip-last"])
def test_torn_tail_is_truncated_and_the_log_stays_usable(tmp_path, damage):
    seg = _write_some(tmp_path)
    data = bytearray(seg.read_bytes())
    good_size = len(data)
    last = _last_entries_end(data)  # the last entry's record, then its sync's batch-end record
    if damage == "cut-mid-record":
        data = data[:last - 5]
    elif damage == "garbage":
        data += b"\x00\x00\x01\x00garbage"
    elif damage == "zeros":
        data += bytes(4096)
    else:
        data[last - 2] ^= 0xFF
    seg.write_bytes(bytes(data))
    s, rec = reopen(tmp_path)
    want = 19 if damage in ("cut-mid-record", "flip-last") else 20
    assert rec.last_index == want
    assert seg.stat().st_size <= good_size
    s.append(want + 1, [2], [b"after"])
    s.close()
    _, rec = reopen(tmp_path)
    assert rec.last_index == want + 1 and rec.datas[-1] == b"after"


def test_corruption_before_the_tail_refuses_to_start(tmp_path):
    seg = _write_some(tmp_path)
    data = bytearray(seg.read_bytes())
    data[len(data) // 3] ^= 0xFF
    seg.write_bytes(bytes(data))
    with pytest.raises(CorruptLogError) as info:
        reopen(tmp_path)
    assert seg.name in str(info.value) and "offset" in str(info.value)


@pytest.mark.parametrize("damage", ["emptied", "cut-inside-the-header", "header-flipped"])
@pytest.mark.parametrize("segments", ["only", "newest", "oldest"])
def test_a_segment_without_its_term_and_vote_refuses_to_start(tmp_path, damage, segments):
    """Every segment is born with the hard state (term, vote); one without it lost them and its entries. Starting
    anyway (term 0, no vote) dropped acknowledged entries in silence and could vote twice in a term."""
    s, _ = reopen(tmp_path, segment_bytes=10_000 if segments == "only" else 500)
    s.save_hard_state(7, 2)
    for i in range(1, 40):
        s.append(i, [7], [b"y" * 40])
        s.sync()
    s.close()
    segs = sorted(tmp_path.glob("*.seg"))
    assert (len(segs) == 1) == (segments == "only")
    seg = segs[0] if segments == "oldest" else segs[-1]
    data = bytearray(seg.read_bytes())
    if damage == "emptied":
        data = bytearray()
    elif damage == "cut-inside-the-header":
        data = data[:5]
    else:
        data[9] ^= 0xFF
    seg.write_bytes(bytes(data))
    with pytest.raises(CorruptLogError, match="term and vote") as info:
        reopen(tmp_path, segment_bytes=500)
    assert seg.name in str(info.value)


def test_a_segment_start_a_crash_interrupted_is_dropped(tmp_path):
    """The header is written under a temporary name and renamed into place: a leftover of it held nothing."""
    s, _ = reopen(tmp_path)
    s.save_hard_state(3, 1)
    s.append(1, [3], [b"a"])
    s.close()
    (tmp_path / f"{2:020d}.seg.tmp").write_bytes(b"\x00\x00")
    _, rec = reopen(tmp_path)
    assert (rec.term, rec.vote, rec.last_index) == (3, 1, 1)
    assert not list(tmp_path.glob("*.tmp"))


def test_corruption_in_an_older_segment_refuses_to_start(tmp_path):
    s, _ = reopen(tmp_path, segment_bytes=500)
    for i in range(1, 60):
        s.append(i, [1], [b"y" * 40])
        s.sync()
    s.close()
    first = sorted(tmp_path.glob("*.seg"))[0]
    data = bytearray(first.read_bytes())
    data[-3] ^= 0xFF  # last record of an old segment: not a torn tail, later segments exist
    first.write_bytes(bytes(data))
    with pytest.raises(CorruptLogError, match=first.name):
        reopen(tmp_path, segment_bytes=500)


def test_compaction_marker_survives_and_old_segments_go(tmp_path):
    s, _ = reopen(tmp_path, segment_bytes=600)
    for i in range(1, 101):
        s.append(i, [1], [b"z" * 40])
        s.sync()
    before = len(list(tmp_path.glob("*.seg")))
    s.compact(80, 1)
    for i in range(101, 121):
        s.append(i, [1], [b"z" * 40])
        s.sync()
    s.close()
    assert len(list(tmp_path.glob("*.seg"))) < before
    _, rec = reopen(tmp_path, segment_bytes=600)
    assert (rec.snapshot_index, rec.snapshot_term, rec.first_index, rec.last_index) == (80, 1, 81, 120)
    assert len(rec.terms) == 40


def test_no_fsync_mode_round_trips(tmp_path):
    s, _ = reopen(tmp_path, fsync=False)
    s.append(1, [1, 1], [b"a", b"b"])
    s.close()
    _, rec = reopen(tmp_path, fsync=False)
    assert rec.datas == [b"a", b"b"]


def test_appends_during_a_concurrent_sync_are_not_lost(tmp_path):
    s, _ = reopen(tmp_path)
    stop = threading.Event()

    def syncer():
        for _ in range(400):
            if stop.is_set():
                return
            s.sync()

    t = threading.Thread(target=syncer)
    t.start()
    for i in range(1, 201):
        s.append(i, [1], [b"%d" % i])
    stop.set()
    t.join(timeout=30)
    s.close()
    _, rec = reopen(tmp_path)
    assert rec.datas == [b"%d" % i for i in range(1, 201)]


def test_reset_replaces_the_whole_log_and_survives_segment_rolls(tmp_path):
    s, _ = reopen(tmp_path, segment_bytes=400)
    s.append(1, [1] * 5, [b"a"] * 5)
    s.reset(100, 3)
    s.append(101, [3, 3], [b"x", b"y"])
    for i in range(103, 130):
        s.append(i, [3], [b"q" * 30])
        s.sync()
    s.close()
    _, rec = reopen(tmp_path, segment_bytes=400)
    assert (rec.snapshot_index, rec.snapshot_term, rec.last_index) == (100, 3, 129)
    assert rec.datas[:2] == [b"x", b"y"]


def test_a_missing_middle_segment_refuses_to_start(tmp_path):
    s, _ = reopen(tmp_path, segment_bytes=400)
    for i in range(1, 80):
        s.append(i, [1], [b"m" * 30])
        s.sync()
    s.close()
    segs = sorted(tmp_path.glob("*.seg"))
    assert len(segs) >= 4
    segs[1].unlink()
    with pytest.raises(CorruptLogError, match="misses entries"):
        reopen(tmp_path, segment_bytes=400)


# ---------------------------------------------------------------------------- disk faults
def test_a_short_write_is_completed_not_taken_as_done(tmp_path, monkeypatch):
    """A full-ish disk returns short writes; every byte must still reach the file."""
    s, _ = reopen(tmp_path)
    real_write = os.write

    def short_write(fd, data):
        return real_write(fd, bytes(data)[:max(1, len(data) // 3)])

    monkeypatch.setattr(os, "write", short_write)
    s.append(1, [1, 1, 1], [b"a" * 100, b"b" * 100, b"c" * 100])
    s.save_hard_state(1, 1)
    s.sync()
    monkeypatch.undo()
    s.close()
    _, rec = reopen(tmp_path)
    assert rec.datas == [b"a" * 100, b"b" * 100, b"c" * 100] and (rec.term, rec.vote) == (1, 1)


def test_enospc_fails_the_sync_for_good_and_the_partial_record_is_dropped(tmp_path, monkeypatch):
    s, _ = reopen(tmp_path)
    s.append(1, [1], [b"durable"])
    s.sync()
    real_write = os.write
    calls = []

    def full_disk(fd, data):
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, bytes(data)[:7])  # the disk fills up mid-record
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full_disk)
    s.append(2, [1], [b"x" * 200])
    with pytest.raises(DiskFailure, match="No space left"):
        s.sync()
    assert s.failed is not None
    n = len(calls)
    with pytest.raises(DiskFailure, match="failed earlier"):
        s.sync()  # never written or fsynced again, even once space is back
    assert len(calls) == n
    monkeypatch.undo()
    s.close()  # closing a failed log does not try to write
    _, rec = reopen(tmp_path)  # restart: the torn partial record is dropped, the acked entry kept
    assert rec.datas == [b"durable"]


def test_a_failed_fsync_is_never_retried(tmp_path, monkeypatch):
    s, _ = reopen(tmp_path)
    syncs = []

    def bad_fsync(fd):
        syncs.append(fd)
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", bad_fsync)
    s.append(1, [1], [b"a"])
    with pytest.raises(DiskFailure, match="Input/output error"):
        s.sync()
    monkeypatch.undo()  # the disk "recovers": a retried fsync would now succeed without the data
    with pytest.raises(DiskFailure):
        s.sync()
    s.append(2, [1], [b"b"])
    with pytest.raises(DiskFailure):
        s.sync()
    assert len(syncs) == 1


def test_vote_floor_travels_with_the_hard_state_across_segments(tmp_path):
    s, _ = reopen(tmp_path, segment_bytes=400)
    s.save_hard_state(4, 2)
    s.save_vote_floor(500, 3)
    s.reset(0, 0)
    for i in range(1, 40):
        s.append(i, [4], [b"w" * 30])
        s.sync()
    s.save_hard_state(5, 0)
    s.compact(30, 4)
    for i in range(40, 70):
        s.append(i, [5], [b"w" * 30])
        s.sync()
    s.close()
    assert not (tmp_path / f"{1:020d}.seg").exists()  # the segment that first recorded it is gone
    _, rec = reopen(tmp_path, segment_bytes=400)
    assert (rec.term, rec.vote, rec.vote_floor) == (5, 0, (500, 3))


@pytest.mark.parametrize("damage", ["segments-deleted", "log-directory-deleted", "cut-after-the-first-record"])
def test_a_log_that_lost_the_term_it_had_synced_refuses_to_start(tmp_path, damage):
    """Segments deleted, or the only one cut right after its first (complete) record: replay alone sees a log that
    never held more, and the node started at term 0 with no vote and no entries, which let a stale peer and it
    elect a leader without acknowledged entries. The term mark beside the log says what the log had reached."""
    import shutil

    log_dir = tmp_path / "raft-log"
    s, _ = reopen(log_dir)
    s.save_hard_state(3, 2)
    s.append(1, [3] * 5, [b"e"] * 5)
    s.sync()
    s.close()
    assert (tmp_path / "raft-log.term").exists()
    segs = sorted(log_dir.glob("*.seg"))
    if damage == "segments-deleted":
        for seg in segs:
            seg.unlink()
    elif damage == "log-directory-deleted":
        shutil.rmtree(log_dir)
    else:
        first = segs[0].read_bytes()
        length = int.from_bytes(first[:4], "big")
        segs[0].write_bytes(first[:8 + length])  # the first record (term 0, no vote) whole, nothing after it
    with pytest.raises(CorruptLogError, match="had synced term 3") as info:
        reopen(log_dir)
    assert "refusing to start" in str(info.value)


def test_the_term_mark_follows_the_synced_term_and_a_fresh_log_needs_none(tmp_path):
    log_dir = tmp_path / "raft-log"
    s, rec = reopen(log_dir)
    assert rec.term == 0 and not (tmp_path / "raft-log.term").exists()  # nothing reached: no mark
    s.save_hard_state(1, 1)
    assert not (tmp_path / "raft-log.term").exists()  # not synced yet: the mark never runs ahead of the log
    s.sync()
    s.save_hard_state(4, 0)
    s.sync()
    s.close()
    s, rec = reopen(log_dir)
    assert rec.term == 4 and s._read_term_mark() == (4, 0)  # no clock: the committed index is not marked
    s.close()
    (tmp_path / "raft-log.term").write_bytes(b"\x00\x00\x00\x09garbage!!")
    with pytest.raises(CorruptLogError, match="term mark"):
        reopen(log_dir)
    (tmp_path / "raft-log.term").unlink()  # a log from before the mark: opens as it did
    _, rec = reopen(log_dir)
    assert rec.term == 4


def test_a_log_cut_before_its_marked_committed_index_refuses_to_start_and_a_torn_tail_does_not(tmp_path):
    """A cut in the middle of the newest segment looks like a torn tail to replay; a torn write only loses entries
    never synced, which lie beyond every marked committed index. So a log ending before its mark lost synced,
    committed entries (found by probing: most of a node's log dropped with one WARNING)."""
    now = [0.0]
    log_dir = tmp_path / "raft-log"
    s, _ = reopen(log_dir, clock=lambda: now[0])
    s.save_hard_state(2, 1)
    for i in range(1, 201):
        s.append(i, [2], [b"x" * 100])
        s.note_commit(i - 3)  # the commit index trails the log
        now[0] += 0.1  # ten syncs a second: about one mark a second
        s.sync()
        s.write_mark()  # as the host does after each sync
    s.append(201, [2], [b"unsynced"])  # then a write the crash tears
    s.close()
    term, commit = s._read_term_mark()
    assert term == 2 and 180 <= commit <= 197
    [seg] = sorted(log_dir.glob("*.seg"))
    whole = seg.read_bytes()
    seg.write_bytes(whole[:_last_entries_end(whole) - 5])  # a torn tail: the last entry, maybe never synced
    _, rec = reopen(log_dir)
    assert rec.last_index == 200
    seg.write_bytes(whole[:len(whole) // 2])  # cut in the middle: the torn-tail rule would drop half the log
    with pytest.raises(CorruptLogError, match=f"had synced committed entries up to {commit}"):
        reopen(log_dir)


def test_a_reset_below_the_marked_index_lowers_the_mark_first(tmp_path):
    """A node whose newest snapshot is damaged goes back to an older one (under a vote floor): its next start must
    not refuse the log it reset on purpose."""
    now = [0.0]
    log_dir = tmp_path / "raft-log"
    s, _ = reopen(log_dir, clock=lambda: now[0])
    s.save_hard_state(1, 1)
    s.append(1, [1] * 50, [b"e"] * 50)
    s.note_commit(50)
    now[0] = 5.0
    s.sync()
    assert s._read_term_mark() == (0, 0) and s.mark_pending  # due: the host writes it off the sync's path
    s.write_mark()
    assert s._read_term_mark() == (1, 50)
    s.reset(20, 1)
    s.sync()
    s.close()
    s, rec = reopen(log_dir)
    assert rec.last_index == 20 and s._read_term_mark() == (1, 20)


def test_a_mark_write_that_keeps_failing_is_logged_once_per_hundred(tmp_path, caplog, monkeypatch):
    """QA: on a full disk the mark write failed 30-80 times a second, each a WARNING, until the fail-stop."""
    import logging

    s = LogStorage(tmp_path / "raft-log", fsync=False)
    s.open()

    def full(*_a):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(s, "_write_term_mark", full)
    with caplog.at_level(logging.WARNING, logger="electra.consensus.storage"):
        for _ in range(150):
            s._pending_mark = (2, 10)
            s.write_mark()
        monkeypatch.setattr(s, "_write_term_mark", lambda *_a: None)
        s.write_mark()  # the mark stayed due: written now
    said = [r.getMessage() for r in caplog.records if r.name == "electra.consensus.storage"]
    assert len(said) == 3 and "1 in a row" in said[0] and "101 in a row" in said[1], said
    assert "written again after 150 failures" in said[2]
    s.close()


# ---------------------------------------------------------------------------- batches: a sync's write ends with one
PAGE = 4096


def _synced_then_torn(log_dir, later_batch=False):
    """One synced entry, then one sync's write of a ~12 KB record and a small one (two Readies) that a power loss
    during its fdatasync left with the page at offset 4096, wholly inside the big record, never written back
    (zeros) while the later page and the file size survived. `later_batch`: that sync completed, and a later one
    did too, so the damage hit synced bytes: corruption. Returns (segment, synced size)."""
    s, _ = reopen(log_dir)
    s.save_hard_state(1, 1)
    s.append(1, [1], [b"a"])
    s.sync()  # synced, acknowledged
    [seg] = sorted(log_dir.glob("*.seg"))
    synced = seg.stat().st_size
    s.append(2, [1] * 40, [b"x" * 300] * 40)  # ~12 KB record
    s.append(42, [1], [b"y"])  # a small record after it
    s.sync()  # what the page cache held when the power failed (here: or a completed sync)
    if later_batch:
        s.append(43, [1], [b"z"])
        s.sync()
    s.close()
    data = bytearray(seg.read_bytes())
    assert synced < PAGE and len(data) > 3 * PAGE - 100  # the big record spans the page at 4096 whole
    data[PAGE:2 * PAGE] = bytes(PAGE)
    seg.write_bytes(bytes(data))
    return seg, synced


def test_a_torn_sync_with_a_lost_middle_page_is_a_torn_tail(tmp_path):
    """Linux writes a file's dirty pages back in no order: a crash during one sync can lose a middle page of its
    write while a later page, holding a complete record, survives. Only that unsynced, unacknowledged write is
    lost; recovery refused it as mid-log corruption ("restore this node from a peer")."""
    log_dir = tmp_path / "raft-log"
    seg, synced = _synced_then_torn(log_dir)
    s, rec = reopen(log_dir)
    assert (rec.term, rec.vote, rec.last_index, rec.datas) == (1, 1, 1, [b"a"])
    assert seg.stat().st_size == synced  # the torn write is cut off: later writes do not land after it
    s.append(2, [2], [b"after"])
    s.close()
    _, rec = reopen(log_dir)
    assert rec.datas == [b"a", b"after"]


def test_damage_followed_by_a_complete_later_batch_is_corruption(tmp_path):
    """A later sync's batch is written only once the earlier one's fsync returned: if it is there whole, the
    damaged bytes had been synced (and maybe acknowledged). Refused as before, saying why."""
    log_dir = tmp_path / "raft-log"
    seg, _ = _synced_then_torn(log_dir, later_batch=True)
    with pytest.raises(CorruptLogError, match="before a complete batch written after it was synced") as info:
        reopen(log_dir)
    assert seg.name in str(info.value) and "offset" in str(info.value)


def _old_format_log(log_dir, torn_after):
    """A log as the version before batch-end records wrote it (the same records, none of kind 6): one synced
    entry, then a sync's write of a ~12 KB record, a small one and, if `torn_after` is False, another sync's;
    the page at 4096 zeroed."""
    from electra.consensus.storage import _record

    log_dir.mkdir(parents=True)
    head = _record((2, 1, 1))
    synced = head + _record((1, 1, [1], [b"a"]))
    tail = _record((1, 2, [1] * 40, [b"x" * 300] * 40)) + _record((1, 42, [1], [b"y"]))
    data = bytearray(synced + tail)
    if not torn_after:
        data += _record((1, 43, [1], [b"z"]))
    data[PAGE:2 * PAGE] = bytes(PAGE)
    seg = log_dir / f"{1:020d}.seg"
    seg.write_bytes(bytes(data))
    return seg, len(synced)


@pytest.mark.parametrize("torn_after", [True, False])
def test_a_log_of_the_previous_format_recovers_as_before(tmp_path, torn_after):
    """No batch-end records: the older rule (damage followed by an intact record is corruption) still decides, so
    an upgrade never refuses a log it accepted before, nor accepts one it refused. A clean torn tail is cut; the
    new version then writes into a new segment of its own format, where a lost middle page is a torn write."""
    log_dir = tmp_path / "raft-log"
    seg, synced = _old_format_log(log_dir, torn_after)
    with pytest.raises(CorruptLogError, match="before an intact record"):
        reopen(log_dir)
    whole = seg.read_bytes()
    seg.write_bytes(whole[:synced] + whole[synced:synced + 100])  # torn inside the big record: cut
    s, rec = reopen(log_dir)
    assert (rec.term, rec.vote, rec.datas) == (1, 1, [b"a"]) and seg.stat().st_size == synced
    assert seg.read_bytes() == whole[:synced]  # the old segment is never appended to
    s.append(2, [1] * 40, [b"x" * 300] * 40)
    s.append(42, [1], [b"y"])
    s.sync()
    s.close()
    segs = sorted(log_dir.glob("*.seg"))
    assert len(segs) == 2
    data = bytearray(segs[1].read_bytes())
    start = len(data) - 12_000
    page = (start // PAGE + 1) * PAGE  # a page wholly inside the big record
    data[page:page + PAGE] = bytes(PAGE)
    segs[1].write_bytes(bytes(data))
    _, rec = reopen(log_dir)
    assert rec.datas == [b"a"]


def test_every_sync_write_and_segment_header_ends_with_a_batch_end(tmp_path):
    """Hard-state-only syncs, resets, compaction markers and segment headers are batches like entries."""
    from electra.consensus.storage import BATCH_END

    s, _ = reopen(tmp_path, segment_bytes=600)
    s.save_hard_state(2, 1)
    s.sync()
    for i in range(1, 30):
        s.append(i, [2], [b"b" * 40])
        if i == 20:
            s.compact(10, 2)
        s.sync()
    s.reset(40, 3)
    s.sync()
    s.close()
    for seg in sorted(tmp_path.glob("*.seg")):
        data = seg.read_bytes()
        recs = _records(data)
        assert recs[-1][1] == len(data) and recs[-1][2] == BATCH_END  # whole records, a batch end last
        kinds = [kind for _, _, kind in recs]
        assert kinds[kinds.index(BATCH_END) - 1] in (2, 3, 4)  # the header: hard state [+ marker], a batch
    _, rec = reopen(tmp_path, segment_bytes=600)
    assert (rec.term, rec.snapshot_index, rec.last_index) == (2, 40, 40)
