"""Replacing a small file so that readers and crashes see the old contents or the new, never a mix.

One way for every small file Electra rewrites (a data dir's claims, the tokens file, certificates and
keys): write a temporary file beside it with its final mode (a secret is never readable by others, not
even for an instant), fsync it, rename it over the old one, fsync the directory so the rename itself
survives a power loss.
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
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
