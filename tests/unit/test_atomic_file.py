"""electra/atomic_file.py: the one way small files are rewritten (data dir claims, tokens, certificates, keys)."""

from __future__ import annotations

import os
import stat

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
