"""electra/atomic_file.py: the one way small files are rewritten (data dir claims, tokens, certificates, keys)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from electra.atomic_file import replace_file


def test_replace_file_sets_the_mode_whatever_the_umask_and_leaves_no_temp_file(tmp_path):
    old = os.umask(0o077)
    try:
        replace_file(tmp_path / "public", b"a" * 100_000)
        replace_file(tmp_path / "secret", b"k", mode=0o600)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "public").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "secret").stat().st_mode) == 0o600
    assert (tmp_path / "public").read_bytes() == b"a" * 100_000
    replace_file(tmp_path / "secret", b"new", mode=0o600)
    assert (tmp_path / "secret").read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["public", "secret"]


def test_replace_file_keeps_the_owner_it_is_given(tmp_path):
    target = tmp_path / "tokens.json"
    replace_file(target, b"{}", owner=(4242, 4243))
    st = target.stat()
    if os.geteuid() == 0:  # root can give the file away (the tests run as root here)
        assert (st.st_uid, st.st_gid) == (4242, 4243)
    else:  # anyone else keeps their own ownership, as for any new file
        assert (st.st_uid, st.st_gid) == (os.geteuid(), os.getegid())


def test_new_directories_are_synced_into_their_parents_top_down(tmp_path, monkeypatch):
    """A data dir, its `raft-log/` and `snapshots/` were created with mkdir alone: a power loss on a file system
    that does not order metadata could take a directory back after a file in it was fsynced (a first vote)."""
    from electra import atomic_file
    from electra.consensus.data_dir_claims import lock_data_dir
    from electra.consensus.files import OsFiles

    synced: list = []
    real = atomic_file.sync_dir
    monkeypatch.setattr(atomic_file, "sync_dir", lambda p: synced.append(Path(p)) or real(p))
    atomic_file.make_dirs(tmp_path / "a" / "b" / "c")
    assert synced == [tmp_path, tmp_path / "a", tmp_path / "a" / "b"]
    synced.clear()
    atomic_file.make_dirs(tmp_path / "a" / "b")  # nothing new: nothing to sync
    assert synced == []
    OsFiles().mkdir(tmp_path / "node" / "raft-log")
    assert synced == [tmp_path, tmp_path / "node"]
    synced.clear()
    os.close(lock_data_dir(tmp_path / "other"))
    assert synced[:1] == [tmp_path]  # the data dir's own name, before any file in it
