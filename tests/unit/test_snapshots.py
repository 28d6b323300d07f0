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
            msg.chunk = msg.chunk[:-1] + b"\x00"
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
