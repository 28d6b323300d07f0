"""The file layer under the Raft log and the snapshot store.

`LogStorage` and `SnapshotStore` never call `os` or `open` themselves: they go through
a `Files`, so the same record format, replay and recovery code runs on the real disk
(`OsFiles`, here) and on the simulator's disk (`consensus/simdisk.py`), where writes
are durable only once synced and a crash loses, tears or corrupts the rest.

The operations are the few the two stores need, with POSIX meaning: a file opened for
append only grows; `sync()` is fdatasync/fsync; a new, renamed or deleted name is
durable only after `sync_dir()` of its directory. `mkdir()` is durable when it returns
(`OsFiles` syncs each directory it creates into its parent), which is why the simulator's
disk has no directory for a crash to lose.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO, Protocol

from electra.atomic_file import make_dirs, sync_dir


class WritableFile(Protocol):
    """An open file being written: append-only (`Files.open_append`) or random access (`open_write`)."""

    def write(self, data: bytes | bytearray | memoryview) -> int:
        """Write some bytes; returns how many (a short count means: call again with the rest)."""
        ...

    def seek(self, offset: int) -> int: ...

    def sync(self) -> None:
        """Make what was written durable (fdatasync); raises OSError (EIO, ENOSPC) when it cannot."""
        ...

    def close(self) -> None: ...


class Files(Protocol):
    def mkdir(self, path: Path) -> None:
        """Create `path` and its parents if missing."""
        ...

    def listdir(self, path: Path) -> list[Path]: ...

    def exists(self, path: Path) -> bool: ...

    def size(self, path: Path) -> int: ...

    def read_bytes(self, path: Path) -> bytes: ...

    def open_read(self, path: Path) -> BinaryIO: ...

    def open_append(self, path: Path, *, create: bool) -> WritableFile:
        """Open for appending; `create` makes a new file and fails if one exists."""
        ...

    def open_write(self, path: Path) -> WritableFile:
        """Create (or truncate) `path` for random-access writes."""
        ...

    def truncate(self, path: Path, size: int) -> None:
        """Cut `path` to `size` bytes, durably."""
        ...

    def replace(self, src: Path, dst: Path) -> None: ...

    def unlink(self, path: Path) -> None:
        """Remove `path` if it exists."""
        ...

    def sync_dir(self, path: Path) -> None:
        """Make the names created, renamed or removed in directory `path` durable."""
        ...


def write_all(f: WritableFile, data: bytes | bytearray | memoryview) -> None:
    """Write every byte or raise: a short write (a full disk) is never taken as done."""
    view = memoryview(data)
    while view:
        n = f.write(view)
        if n <= 0:
            raise OSError(f"write returned {n} with {len(view)} bytes left")
        view = view[n:]


class _AppendFd:
    """An O_APPEND descriptor: unbuffered writes, fdatasync."""

    def __init__(self, path: Path, create: bool) -> None:
        flags = os.O_WRONLY | os.O_APPEND | (os.O_CREAT | os.O_EXCL if create else 0)
        self.fd = os.open(path, flags, 0o644)

    def write(self, data: bytes | bytearray | memoryview) -> int:
        return os.write(self.fd, data)

    def seek(self, offset: int) -> int:
        raise OSError("an append-only file cannot seek")

    def sync(self) -> None:
        os.fdatasync(self.fd)

    def close(self) -> None:
        os.close(self.fd)


class _RandomFile:
    """A buffered read-write file; `sync` flushes then fsyncs."""

    def __init__(self, path: Path) -> None:
        self.f = open(path, "w+b")  # noqa: SIM115 - closed by close()

    def write(self, data: bytes | bytearray | memoryview) -> int:
        return self.f.write(data)

    def seek(self, offset: int) -> int:
        return self.f.seek(offset)

    def sync(self) -> None:
        self.f.flush()
        os.fsync(self.f.fileno())

    def close(self) -> None:
        self.f.close()


class OsFiles:
    """The real file system."""

    def mkdir(self, path: Path) -> None:
        try:
            make_dirs(path)
        except FileExistsError:  # a file stands where a directory must be: say which, not "File exists"
            blocked = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), path)
            raise NotADirectoryError(f"{blocked} exists and is not a directory") from None

    def listdir(self, path: Path) -> list[Path]:
        return list(path.iterdir())

    def exists(self, path: Path) -> bool:
        return path.exists()

    def size(self, path: Path) -> int:
        return path.stat().st_size

    def read_bytes(self, path: Path) -> bytes:
        return path.read_bytes()

    def open_read(self, path: Path) -> BinaryIO:
        return open(path, "rb")  # noqa: SIM115 - the caller closes it

    def open_append(self, path: Path, *, create: bool) -> WritableFile:
        return _AppendFd(path, create)

    def open_write(self, path: Path) -> WritableFile:
        return _RandomFile(path)

    def truncate(self, path: Path, size: int) -> None:
        with open(path, "r+b") as f:
            f.truncate(size)
            f.flush()
            os.fsync(f.fileno())

    def replace(self, src: Path, dst: Path) -> None:
        os.replace(src, dst)

    def unlink(self, path: Path) -> None:
        path.unlink(missing_ok=True)

    def sync_dir(self, path: Path) -> None:
        sync_dir(path)
