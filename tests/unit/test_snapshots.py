"""Snapshot files, the store's fallback on corruption, and resumable chunked transfer."""

from __future__ import annotations

import random

import pytest

from electra.consensus.snapshots import (
    HEADER,
    BytesSink,
    SnapshotError,
    SnapshotReceiver,
    SnapshotSender,
    SnapshotStore,
    make_blob,
    verify_blob,
)


def _write(store: SnapshotStore, index: int, payload: bytes):
    _, finish = store.create(index, 1, lambda out: out.write(payload))
    return finish()


def test_store_round_trip_and_keeps_the_newest(tmp_path):
    store = SnapshotStore(tmp_path, keep=2)
    for i in (10, 20, 30):
        _write(store, i, b"state-%d" % i)
    assert [p.name.split("-")[0].lstrip("0") for p in store.list()] == ["30", "20"]
    meta = store.latest()
    assert (meta.index, meta.term) == (30, 1)
    with store.open_data(meta) as f:
        assert f.read() == b"state-30"


def test_corrupt_newest_snapshot_falls_back_to_the_previous(tmp_path, caplog):
    store = SnapshotStore(tmp_path, keep=3)
    _write(store, 10, b"old state")
    m = _write(store, 20, b"new state")
    data = bytearray(m.path.read_bytes())
    data[-1] ^= 0xFF
    m.path.write_bytes(bytes(data))
    assert store.latest().index == 10
    assert "unusable" in caplog.text


def test_interrupted_write_leaves_only_a_temporary_file_that_is_ignored(tmp_path):
    store = SnapshotStore(tmp_path)
    _write(store, 10, b"good")
    tmp, _finish = store.create(20, 1, lambda out: out.write(b"half"))  # crash before finish()
    assert tmp.exists()
    store2 = SnapshotStore(tmp_path)  # restart
    assert not tmp.exists()
    assert store2.latest().index == 10


def test_blob_verification_rejects_damage():
    blob = make_blob(5, 2, b"x" * 100)
    assert verify_blob(blob).index == 5
    for bad in (blob[:-1], blob[:HEADER.size - 1], b"NOPE" + blob[4:], blob[:-1] + b"y"):
        with pytest.raises(SnapshotError):
            verify_blob(bad)


def _transfer(blob: bytes, loss: float, seed: int, corrupt_once: bool = False):
    rng = random.Random(seed)
    meta = verify_blob(blob)
    sender = SnapshotSender(1, 2, 7, meta, lambda off, n: blob[off:off + n], chunk_size=100)
    receiver = SnapshotReceiver(2, lambda i, t: BytesSink())
    got = None
    for _ in range(10_000):
        msg = sender.next_message()
        if corrupt_once and msg.done:
            msg.data = msg.data[:-1] + b"\x00"
            corrupt_once = False
        if rng.random() < loss:
            continue  # chunk lost: the sender times out and resends
        reply, done = receiver.on_chunk(msg, 7)
        if done is not None:
            got = done
        if rng.random() < loss:
            continue  # reply lost
        outcome = sender.on_response(reply)
        if outcome == "done":
            return got, sender
        assert outcome == "continue"
    raise AssertionError("transfer did not finish")


def test_chunked_transfer_survives_loss_and_resumes_at_the_receivers_offset():
    blob = make_blob(42, 3, bytes(range(256)) * 40)
    for seed in range(20):
        meta, sender = _transfer(blob, loss=0.3, seed=seed)
        assert (meta.index, meta.term, meta.size) == (42, 3, len(blob) - HEADER.size)


def test_corrupted_transfer_is_rejected_and_restarted():
    blob = make_blob(42, 3, b"z" * 1000)
    meta, sender = _transfer(blob, loss=0.0, seed=1, corrupt_once=True)
    assert meta.index == 42 and sender.restarts == 1


# ---------------------------------------------------------------------------- header integrity
@pytest.mark.parametrize("field_offset", [8, 16, 24, 32])  # index, term, size, data crc
def test_a_flipped_header_byte_makes_the_snapshot_unusable(tmp_path, field_offset):
    store = SnapshotStore(tmp_path)
    _write(store, 10, b"old")
    m = _write(store, 20, b"new")
    data = bytearray(m.path.read_bytes())
    data[field_offset + 7 if field_offset < 32 else field_offset] ^= 0x01  # low byte: e.g. index 20 -> 21
    m.path.write_bytes(bytes(data))
    with pytest.raises(SnapshotError, match="header checksum"):
        store.read_meta(m.path)
    assert store.latest().index == 10


def test_a_snapshot_whose_name_disagrees_with_its_header_is_refused(tmp_path):
    store = SnapshotStore(tmp_path)
    m = _write(store, 20, b"state")
    renamed = m.path.with_name(f"{99:020d}-{1:010d}.snap")
    m.path.rename(renamed)
    with pytest.raises(SnapshotError, match="file name"):
        store.read_meta(renamed)
    assert store.latest() is None


def test_version_1_files_are_refused_with_a_clear_error():
    import struct
    import zlib

    data = b"x" * 10
    v1 = struct.pack(">4sIQQQI", b"ESNP", 1, 5, 2, len(data), zlib.crc32(data)) + data
    with pytest.raises(SnapshotError, match="version 1 is not supported"):
        verify_blob(v1 + bytes(4))


# ---------------------------------------------------------------------------- temporary files
def test_a_failed_snapshot_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    store = SnapshotStore(tmp_path)
    tmp, finish = store.create(20, 1, lambda out: out.write(b"state"))

    def enospc(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("os.fsync", enospc)
    with pytest.raises(OSError):
        finish()
    assert not tmp.exists() and list(tmp_path.iterdir()) == []


def test_an_aborted_or_failed_transfer_leaves_no_temporary_file(tmp_path):
    store = SnapshotStore(tmp_path)
    blob = make_blob(42, 3, b"z" * 1000)
    meta = verify_blob(blob)
    sender = SnapshotSender(1, 2, 7, meta, lambda off, n: blob[off:off + n], chunk_size=100)
    receiver = SnapshotReceiver(2, store.receive_sink)
    for _ in range(3):  # a partial transfer, then the leader goes away
        reply, _ = receiver.on_chunk(sender.next_message(), 7)
        sender.on_response(reply)
    assert list(tmp_path.glob("*.tmp"))
    receiver.abort()
    assert list(tmp_path.iterdir()) == []

    class FullDisk:
        def __init__(self, index, term):
            self.sink = store.receive_sink(index, term)

        def write(self, offset, data):
            raise OSError(28, "No space left on device")

        def abort(self):
            self.sink.abort()

    receiver = SnapshotReceiver(2, FullDisk)
    sender = SnapshotSender(1, 2, 7, meta, lambda off, n: blob[off:off + n], chunk_size=100)
    reply, done = receiver.on_chunk(sender.next_message(), 7)
    assert reply.reject and done is None
    assert list(tmp_path.iterdir()) == []


def test_a_transfer_whose_file_cannot_be_created_is_refused_not_raised(tmp_path):
    """An unwritable snapshots directory or a full disk fails the receiver's file open itself: the chunk is refused
    as a failed write is (the leader retries later), not an exception out of the transport every few seconds."""
    blob = make_blob(42, 3, b"z" * 1000)
    meta = verify_blob(blob)

    def cannot_create(index, term):
        raise PermissionError(13, "Permission denied", str(tmp_path / "x.recv.tmp"))

    receiver = SnapshotReceiver(2, cannot_create)
    sender = SnapshotSender(1, 2, 7, meta, lambda off, n: blob[off:off + n], chunk_size=100)
    reply, done = receiver.on_chunk(sender.next_message(), 7)
    assert reply.reject and done is None and receiver.key is None


def test_a_snapshot_that_cannot_be_read_stops_the_start_instead_of_falling_back(tmp_path, monkeypatch):
    """A read error (EIO, EACCES) was taken for damage: the node fell back to an older snapshot and, with the log
    compacted past it, reset an intact log. Only damage the file proves is skipped now."""
    import errno

    store = SnapshotStore(tmp_path, keep=3)
    _write(store, 10, b"old state")
    newest = _write(store, 20, b"new state")
    real_open = store.files.open_read

    def failing(path):
        if path == newest.path:
            raise OSError(errno.EIO, "Input/output error")
        return real_open(path)

    monkeypatch.setattr(store.files, "open_read", failing)
    from electra.consensus.snapshots import SnapshotUnreadable

    with pytest.raises(SnapshotUnreadable, match=f"cannot read snapshot {newest.path} \\(Input/output error\\): "
                                                 "refusing"):
        store.latest()  # its own type: the tier's bootstrap passes it on as the data dir's, not the tier's, problem
