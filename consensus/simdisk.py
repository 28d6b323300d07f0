"""The simulator's disk: a `Files` whose writes are durable only once synced, and its faults.

`LogStorage` and `SnapshotStore` run on it unchanged (consensus/files.py), so the
production record format, replay and recovery are what the simulator exercises.
Each file keeps what reads see (the page cache) and what survives a crash (the
bytes as of its last sync); each directory keeps its durable names (as of its last
`sync_dir`). Faults, each at a rate the simulator draws per seed:

* latency: every disk operation the driver hands to its executor takes time, one
  at a time, so a crash can land between a write and its fsync;
* lost unsynced writes: a crash keeps only synced bytes and synced names;
* torn writes: a crash may keep a prefix of an unsynced append, its last bytes garbage, or
  all of it with whole pages in its middle lost (read back as zeros) while later ones
  survived: Linux writes a file's dirty pages back in no particular order (ext4 unwritten
  extents, XFS);
* fsync failure (EIO): the dirty pages are dropped, as Linux does, and the call raises;
* ENOSPC: a write raises before changing anything;
* corruption: a byte flips inside synced data (bit rot), which recovery must refuse
  rather than replay.
"""

from __future__ import annotations

import asyncio
import errno
import io
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TypeVar

from .simloop import Gate

T = TypeVar("T")


@dataclass
class DiskFaults:
    """Per-seed fault rates of one disk (probabilities per operation, per crash)."""

    latency_ms: tuple[float, float] = (0.2, 3.0)
    torn_write: float = 0.0  # a crash keeps a torn prefix of the unsynced tail
    fsync_failure: float = 0.0  # per sync
    enospc: float = 0.0  # per write
    faults_on: bool = True  # off in the liveness phase: only latency remains
    lost_pages: float = 0.5  # of torn tails: some whole pages before the last one are lost (zeros)
    # The unit written back or not: 4 KiB pages (or their 512-byte sectors) on a real disk, scaled down like the
    # simulator's batches (tens to hundreds of bytes): any unsynced bytes may be lost, in any order.
    page_bytes: int = 32


class _Inode:
    __slots__ = ("data", "synced")

    def __init__(self) -> None:
        self.data = bytearray()  # what reads see
        self.synced = b""  # what survives a crash


class _Handle:
    def __init__(self, disk: SimFiles, inode: _Inode, append: bool) -> None:
        self.disk = disk
        self.inode = inode
        self.append = append
        self.pos = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        self.disk._maybe_fail("enospc", errno.ENOSPC, "No space left on device")
        b = bytes(data)
        buf = self.inode.data
        if self.append:
            buf += b
        else:
            end = self.pos + len(b)
            if len(buf) < end:
                buf.extend(bytes(end - len(buf)))
            buf[self.pos:end] = b
            self.pos = end
        return len(b)

    def seek(self, offset: int) -> int:
        self.pos = offset
        return offset

    def sync(self) -> None:
        ino = self.inode
        if self.disk.faults.faults_on and self.disk.rng.random() < self.disk.faults.fsync_failure:
            ino.data = bytearray(ino.synced)  # the kernel dropped the dirty pages (fsyncgate)
            self.disk.counts["fsync_failures"] += 1
            raise OSError(errno.EIO, "Input/output error (simulated fsync failure)")
        if self.disk.in_flight is not None:
            self.disk.in_flight.append((ino, bytes(ino.data)))  # durable when the operation completes
        else:
            ino.synced = bytes(ino.data)

    def close(self) -> None:
        pass


class SimFiles:
    """One node's disk; survives the node's crashes (unlike everything else of it)."""

    def __init__(self, rng: random.Random, faults: DiskFaults) -> None:
        self.rng = rng
        self.faults = faults
        self.names: dict[Path, _Inode] = {}
        self.durable: dict[Path, _Inode] = {}
        self.corrupted: list[str] = []  # what bit rot this disk suffered (a refusal to start is then right)
        self.counts = {"torn_tails": 0, "lost_pages": 0, "fsync_failures": 0, "enospc": 0}
        # Syncs issued by the executor's operation under way: durable only when it completes.
        self.in_flight: list[tuple[_Inode, bytes]] | None = None

    def _maybe_fail(self, kind: str, code: int, text: str) -> None:
        if self.faults.faults_on and self.rng.random() < getattr(self.faults, kind):
            self.counts[kind] += 1
            raise OSError(code, f"{text} (simulated)")

    def _inode(self, path: Path) -> _Inode:
        ino = self.names.get(path)
        if ino is None:
            raise FileNotFoundError(errno.ENOENT, "No such file", str(path))
        return ino

    # ------------------------------------------------------------------ Files
    def mkdir(self, path: Path) -> None:
        pass  # directories always exist: `Files.mkdir` is durable on return (consensus/files.py)

    def listdir(self, path: Path) -> list[Path]:
        return [p for p in self.names if p.parent == path]

    def exists(self, path: Path) -> bool:
        return path in self.names

    def size(self, path: Path) -> int:
        return len(self._inode(path).data)

    def read_bytes(self, path: Path) -> bytes:
        return bytes(self._inode(path).data)

    def open_read(self, path: Path) -> BinaryIO:
        return io.BytesIO(self.read_bytes(path))

    def open_append(self, path: Path, *, create: bool) -> _Handle:
        if create:
            if path in self.names:
                raise FileExistsError(errno.EEXIST, "File exists", str(path))
            self.names[path] = _Inode()
        return _Handle(self, self._inode(path), append=True)

    def open_write(self, path: Path) -> _Handle:
        ino = self.names.get(path)
        if ino is None:
            ino = self.names[path] = _Inode()
        ino.data = bytearray()
        return _Handle(self, ino, append=False)

    def truncate(self, path: Path, size: int) -> None:
        ino = self._inode(path)
        del ino.data[size:]
        ino.synced = ino.synced[:size]

    def _settle_syncs(self) -> None:
        """An fsync returned before the rename or directory sync that follows it: its data is durable."""
        if self.in_flight:
            for ino, data in self.in_flight:
                if ino.data.startswith(data):
                    ino.synced = data
            self.in_flight.clear()

    def replace(self, src: Path, dst: Path) -> None:
        self._settle_syncs()
        self.names[dst] = self._inode(src)
        del self.names[src]

    def unlink(self, path: Path) -> None:
        self.names.pop(path, None)

    def sync_dir(self, path: Path) -> None:
        self._settle_syncs()
        for p in [p for p in self.durable if p.parent == path]:
            del self.durable[p]
        for p, ino in self.names.items():
            if p.parent == path:
                self.durable[p] = ino

    # ------------------------------------------------------------------ faults
    def crash(self) -> None:
        """Power loss: unsynced names and bytes are gone; an unsynced append may survive torn.

        Torn: the file's size grew to all of the unsynced append, and some whole pages before its
        last one never reached the disk (they read back as zeros) while the later ones did; or a
        prefix of it reached the disk, its last sector half-written. Synced bytes are never touched."""
        self.names = dict(self.durable)
        for ino in self.names.values():
            tail = len(ino.data) - len(ino.synced)
            appended = tail > 0 and ino.data.startswith(ino.synced)
            if appended and self.faults.faults_on and self.rng.random() < self.faults.torn_write:
                torn = bytearray(ino.data)
                if not (self.rng.random() < self.faults.lost_pages and self._lose_pages(torn, len(ino.synced))):
                    keep = self.rng.randrange(1, tail + 1)
                    del torn[len(ino.synced) + keep:]
                    for k in range(self.rng.randrange(0, min(keep, 8) + 1)):  # the last sector half-written
                        torn[-1 - k] = self.rng.randrange(256)
                ino.data = torn
                ino.synced = bytes(torn)
                self.counts["torn_tails"] += 1
            else:
                ino.data = bytearray(ino.synced)

    def _lose_pages(self, torn: bytearray, synced: int) -> bool:
        """Zero some whole pages of the unsynced bytes `torn[synced:]`, never its last page (written back out of
        order: a later page reached the disk, an earlier one did not). False if it spans no two pages."""
        page = self.faults.page_bytes
        pages = list(range(synced // page, (len(torn) - 1) // page))  # every page but the last
        if not pages:
            return False
        for p in sorted(self.rng.sample(pages, self.rng.randrange(1, min(len(pages), 4) + 1))):
            lo, hi = max(p * page, synced), (p + 1) * page  # a page holding synced bytes keeps them
            torn[lo:hi] = bytes(hi - lo)
        self.counts["lost_pages"] += 1
        return True

    def rot(self, suffix: str, detectable: Callable[[bytes, int], bool] | None = None) -> bool:
        """Flip one byte in the synced data of one `suffix` file.

        `detectable(data, offset)` says where damage can be told from a torn write (for the
        log: a complete batch follows); bit rot elsewhere is beyond what the format promises.
        """
        files = sorted(p for p, ino in self.durable.items() if p.suffix == suffix and len(ino.synced) >= 128)
        if not files:
            return False
        path = self.rng.choice(files)
        ino = self.durable[path]
        for _ in range(10):
            at = self.rng.randrange(len(ino.synced))
            if detectable is None or detectable(ino.synced, at):
                break
        else:
            return False
        flipped = bytearray(ino.synced)
        flipped[at] ^= 1 << self.rng.randrange(8)
        ino.synced = bytes(flipped)
        if len(ino.data) > at:
            ino.data[at] = flipped[at]
        self.corrupted.append(f"{path.name}@{at}")
        return True


class SimDiskExecutor:
    """The driver's disk executor: one operation at a time, each taking a drawn latency.

    An operation's writes reach the page cache when it starts; its syncs become durable,
    and its result reaches the driver, when it completes. A power loss in between loses
    (or tears) what it wrote, as a crash during a real fsync does.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, gate: Gate, rng: random.Random, faults: DiskFaults,
                 queue: list[float], files: SimFiles) -> None:
        self.files = files
        self.loop = loop
        self.gate = gate
        self.rng = rng
        self.faults = faults
        self._free_at = queue  # shared with the process's other executor: one disk

    async def run(self, fn: Callable[[], T]) -> T:
        fut: asyncio.Future[T] = self.loop.create_future()
        lo, hi = self.faults.latency_ms
        now = self.loop.time()
        done = max(now, self._free_at[0]) + self.rng.uniform(lo, hi) / 1000.0
        self._free_at[0] = done

        self.files.in_flight = []
        try:
            result: T | None = fn()
            error: Exception | None = None
        except Exception as exc:
            result, error = None, exc
        syncs, self.files.in_flight = self.files.in_flight, None

        def complete() -> None:
            for ino, data in syncs:
                if ino.data.startswith(data):  # not truncated or rewritten meanwhile
                    ino.synced = data
            if fut.done():
                return
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(result)  # type: ignore[arg-type]

        self.gate.call_later(done - now, complete)
        return await fut

    def shutdown(self) -> None:
        pass
