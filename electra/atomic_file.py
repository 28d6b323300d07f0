"""Replacing a small file so that readers and crashes see the old contents or the new, never a mix.

One way for every small file Electra rewrites (a data dir's claims, the tokens file, certificates and
keys): write a temporary file beside it with its final mode (a secret is never readable by others, not
even for an instant), fsync it, rename it over the old one, fsync the directory so the rename itself
survives a power loss. And one way to create directories that a crash cannot take back
(`make_dirs`): each new name is fsynced into its parent.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def replace_file(path: Path | str, data: bytes, *, mode: int = 0o644, owner: tuple[int, int] | None = None) -> None:
    """Atomically and durably make `path` hold `data`, with permission bits `mode`.

    `owner` (uid, gid) keeps a rewritten file's ownership when this process runs as another user
    (root rewriting a file the nodes read); without the right to change it, the file gets this
    process's ownership, as any new file would.
    """
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, mode)  # exactly `mode`, whatever the umask
        if owner is not None and owner != (os.geteuid(), os.getegid()):
            with contextlib.suppress(PermissionError):
                os.fchown(fd, *owner)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    sync_dir(path.parent)


def sync_dir(path: Path | str) -> None:
    """Make the names created, renamed or removed in directory `path` durable."""
    dfd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def make_dirs(path: Path | str) -> None:
    """`mkdir -p path`, durably: every directory this creates is fsynced into its parent, top down.

    Without it a power loss on a file system that does not order metadata could take back a directory
    created before a file in it was synced (a data dir's first vote, written and fsynced into a
    `raft-log/` whose own name never reached the disk)."""
    path = Path(path)
    new = [p for p in (path, *path.parents) if not os.path.lexists(p)]
    path.mkdir(parents=True, exist_ok=True)
    for created in reversed(new):
        sync_dir(created.parent)
