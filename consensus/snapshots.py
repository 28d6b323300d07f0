"""State-machine snapshots: the file format, the on-disk store, and chunked transfer.

A snapshot file is a 40-byte header (magic, version 2, Raft index and term, data
size, CRC-32 of the data, CRC-32 of the 36 header bytes before it) followed by
whatever the state machine streamed out. Every byte is under a checksum, and a
stored file's index and term must also match its name `<index>-<term>.snap`:
a flipped bit in the header can no longer make a node believe it holds a newer
state than it does. Version-1 files (no header checksum) are refused.
Files are written to a temporary name, fsynced and renamed, so a crash leaves
either the old set or the new one; temporary files are never trusted: they are
deleted when the store opens, when writing one fails, and when a transfer is
aborted. A file that fails verification is skipped and the previous snapshot is
used (the node decides what that means for its log, see `RaftNode.start`).

InstallSnapshot sends the snapshot *file* verbatim in chunks with byte offsets,
one chunk in flight per follower. The receiver answers every chunk with the
offset it expects next, so a transfer interrupted by a lost message or a
reconnect resumes where it stopped; the finished file is verified exactly like
a local one before it replaces anything. `SnapshotSender` and
`SnapshotReceiver` are pure (bytes in, messages out) so the simulator and the
asyncio runtime share them.
"""

from __future__ import annotations

import io
import logging
import os
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol, cast

from . import mutations
from .files import Files, OsFiles, WritableFile
from .messages import SnapChunk, SnapResp

MAGIC = b"ESNP"
VERSION = 2
HEADER = struct.Struct(">4sIQQQII")  # magic, version, index, term, data size, crc32(data), crc32(header)
_HEADER_BODY = HEADER.size - 4  # the bytes the header checksum covers
CHUNK_SIZE = 1 << 20
log = logging.getLogger("electra.consensus.snapshots")


class SnapshotError(Exception):
    """A snapshot file is missing, truncated or fails its checksum."""


class SnapshotUnreadable(OSError):
    """A local snapshot file could not be read (EIO, EACCES): not damage it proves, so the node does not start."""


@dataclass(frozen=True)
class SnapshotMeta:
    index: int
    term: int
    size: int  # bytes of state-machine data (the file is HEADER.size larger)
    crc: int
    path: Path | None = None

    @property
    def file_size(self) -> int:
        return HEADER.size + self.size

    def stored_path(self) -> Path:
        """The file of a snapshot in a `SnapshotStore` (a received or in-memory one has none)."""
        if self.path is None:
            raise SnapshotError(f"snapshot {self.index}-{self.term} has no file")
        return self.path


def pack_header(index: int, term: int, size: int, crc: int) -> bytes:
    body = HEADER.pack(MAGIC, VERSION, index, term, size, crc, 0)[:_HEADER_BODY]
    return body + struct.pack(">I", zlib.crc32(body))


def parse_header(head: bytes) -> tuple[int, int, int, int]:
    if len(head) < HEADER.size:
        raise SnapshotError("snapshot shorter than its header")
    magic, version, index, term, size, crc, head_crc = HEADER.unpack_from(head)
    if magic != MAGIC:
        raise SnapshotError(f"not an Electra snapshot (magic {magic!r})")
    if version != VERSION:
        raise SnapshotError(f"snapshot format version {version} is not supported (expected {VERSION})")
    if zlib.crc32(head[:_HEADER_BODY]) != head_crc:
        raise SnapshotError("snapshot header checksum mismatch")
    return index, term, size, crc


def key_from_name(path: Path) -> tuple[int, int]:
    """(index, term) encoded in a snapshot file name `<index>-<term>.snap[...]`."""
    try:
        index, term = path.name.split(".", 1)[0].split("-")
        return int(index), int(term)
    except ValueError:
        raise SnapshotError(f"{path.name} is not a snapshot file name (<index>-<term>.snap)") from None


def verify_blob(blob: bytes) -> SnapshotMeta:
    """Validate a whole snapshot file held in memory."""
    index, term, size, crc = parse_header(blob)
    data = memoryview(blob)[HEADER.size:]
    if len(data) != size:
        raise SnapshotError(f"snapshot data is {len(data)} bytes, header says {size}")
    if zlib.crc32(data) != crc:
        raise SnapshotError("snapshot checksum mismatch")
    return SnapshotMeta(index, term, size, crc)


def make_blob(index: int, term: int, data: bytes) -> bytes:
    return pack_header(index, term, len(data), zlib.crc32(data)) + data


class _CrcWriter(io.RawIOBase):
    """File wrapper that counts and checksums what the state machine streams into it."""

    def __init__(self, f: WritableFile) -> None:
        self.f = f
        self.crc = 0
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, b: bytes) -> int:  # type: ignore[override]  # state machines write bytes only
        self.crc = zlib.crc32(b, self.crc)
        self.size += len(b)
        return self.f.write(b)


class SnapshotStore:
    """A directory of snapshot files `<index>-<term>.snap`, newest `keep` retained."""

    def __init__(self, path: str | os.PathLike[str], *, keep: int = 3, fsync: bool = True,
                 files: Files | None = None) -> None:
        self.dir = Path(path)
        self.files: Files = files or OsFiles()
        self.keep = max(1, keep)
        self.fsync = fsync
        self.files.mkdir(self.dir)
        for tmp in self.files.listdir(self.dir):
            if tmp.suffix == ".tmp":
                self.files.unlink(tmp)  # an interrupted write or transfer; never trusted

    def _final_path(self, index: int, term: int) -> Path:
        return self.dir / f"{index:020d}-{term:010d}.snap"

    def list(self) -> list[Path]:
        return sorted((p for p in self.files.listdir(self.dir) if p.suffix == ".snap"), reverse=True)

    def read_meta(self, path: Path, verify: bool = True) -> SnapshotMeta:
        with self.files.open_read(path) as f:
            index, term, size, crc = parse_header(f.read(HEADER.size))
            if (index, term) != key_from_name(path):
                raise SnapshotError(f"{path}: header says index {index} term {term}, the file name disagrees")
            if verify:
                c, n = 0, 0
                while chunk := f.read(CHUNK_SIZE):
                    c = zlib.crc32(chunk, c)
                    n += len(chunk)
                if n != size:
                    raise SnapshotError(f"{path}: data is {n} bytes, header says {size}")
                if c != crc:
                    raise SnapshotError(f"{path}: checksum mismatch")
        return SnapshotMeta(index, term, size, crc, path)

    def latest(self) -> SnapshotMeta | None:
        """The newest snapshot that verifies; corrupt ones are logged and skipped.

        Only damage the file itself proves (header, size, checksum) is skipped. A read that fails
        (EIO, EACCES, too many open files) says nothing about the data, and falling back from an
        intact snapshot can reset an intact log behind it (`RaftNode` recovers a lost snapshot by
        resetting the log to an older one): OSError names the file and the node refuses to start."""
        for path in self.list():
            try:
                return self.read_meta(path)
            except (SnapshotError, struct.error) as exc:
                log.error("snapshot %s is unusable (%s); falling back to an older one", path, exc)
            except OSError as exc:
                raise SnapshotUnreadable(exc.errno, f"cannot read snapshot {path} ({exc.strerror or exc}): refusing "
                                         "to start rather than fall back past it; fix the disk or the file's "
                                         "permissions") from None
        return None

    def create(self, index: int, term: int,
               fill: Callable[[BinaryIO], None]) -> tuple[Path, Callable[[], SnapshotMeta]]:
        """Stream state into a temporary file now; return a finisher that makes it durable.

        `fill` runs on the caller's thread (the state must not change meanwhile); the
        finisher (fsync, header, rename, pruning) may run on a worker thread.
        """
        tmp = self.dir / f"{index:020d}-{term:010d}.snap.tmp"
        f = self.files.open_write(tmp)
        f.write(bytes(HEADER.size))
        w = _CrcWriter(f)
        try:
            fill(cast(BinaryIO, w))  # write() is all a state machine's snapshot uses
        except BaseException:
            f.close()
            self.files.unlink(tmp)
            raise

        def finish() -> SnapshotMeta:
            try:
                try:
                    f.seek(0)
                    f.write(pack_header(index, term, w.size, w.crc))
                    if self.fsync:
                        f.sync()
                finally:
                    f.close()
            except BaseException:
                self.files.unlink(tmp)  # e.g. ENOSPC: the half-written file is never used
                raise
            return self._install(tmp, SnapshotMeta(index, term, w.size, w.crc))

        return tmp, finish

    def _install(self, tmp: Path, meta: SnapshotMeta) -> SnapshotMeta:
        final = self._final_path(meta.index, meta.term)
        self.files.replace(tmp, final)
        if self.fsync:
            self.files.sync_dir(self.dir)
        for old in self.list()[self.keep:]:
            self.files.unlink(old)
        return SnapshotMeta(meta.index, meta.term, meta.size, meta.crc, final)

    def read_chunk(self, meta: SnapshotMeta, offset: int, n: int) -> bytes:
        with self.files.open_read(meta.stored_path()) as f:
            f.seek(offset)
            return f.read(n)

    def open_data(self, meta: SnapshotMeta) -> BinaryIO:
        f = self.files.open_read(meta.stored_path())
        f.seek(HEADER.size)
        return f

    # ------------------------------------------------------------------ receiving side
    def receive_sink(self, index: int, term: int) -> FileSink:
        return FileSink(self, index, term)


class Sink(Protocol):
    """Where an incoming transfer's bytes go (`FileSink`, `BytesSink`)."""

    def write(self, offset: int, data: bytes) -> None: ...

    def finish(self) -> SnapshotMeta: ...

    def abort(self) -> None: ...


class FileSink:
    """Where an incoming transfer lands: a temporary file, verified and renamed at the end."""

    def __init__(self, store: SnapshotStore, index: int, term: int) -> None:
        self.store = store
        self.tmp = store.dir / f"{index:020d}-{term:010d}.recv.tmp"
        self.f = store.files.open_write(self.tmp)

    def write(self, offset: int, data: bytes) -> None:
        self.f.seek(offset)
        self.f.write(data)

    def finish(self) -> SnapshotMeta:
        if self.store.fsync:
            self.f.sync()
        self.f.close()
        meta = self.store.read_meta(self.tmp, verify=not mutations.enabled("snapshot_apply_unverified"))
        return self.store._install(self.tmp, meta)

    def abort(self) -> None:
        """Drop the partial file (idempotent; also after a failed `finish`)."""
        self.f.close()
        self.store.files.unlink(self.tmp)


class BytesSink:
    """An in-memory sink, for tests (the simulator runs the FileSink over its simulated disk)."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def write(self, offset: int, data: bytes) -> None:
        end = offset + len(data)
        if len(self.buf) < end:
            self.buf.extend(bytes(end - len(self.buf)))
        self.buf[offset:end] = data

    def finish(self) -> SnapshotMeta:
        if mutations.enabled("snapshot_apply_unverified"):  # the deliberate bug: trust the header
            index, term, size, crc = parse_header(bytes(self.buf))
            return SnapshotMeta(index, term, size, crc)
        return verify_blob(bytes(self.buf))

    def abort(self) -> None:
        self.buf.clear()


class SnapshotSender:
    """Leader side of one transfer: which chunk to send next, given the follower's answers."""

    def __init__(self, me: int, peer: int, term: int, meta: SnapshotMeta,
                 read: Callable[[int, int], bytes], chunk_size: int = CHUNK_SIZE) -> None:
        self.me, self.peer, self.term = me, peer, term
        self.meta = meta
        self.read = read
        self.chunk_size = chunk_size
        self.offset = 0
        self.restarts = 0

    def next_message(self) -> SnapChunk:
        total = self.meta.file_size
        chunk = self.read(self.offset, min(self.chunk_size, total - self.offset))
        return SnapChunk(self.me, self.peer, self.term, snap_index=self.meta.index, snap_term=self.meta.term,
                         size=total, offset=self.offset, data=chunk, done=self.offset + len(chunk) >= total)

    def on_response(self, m: SnapResp) -> str:
        """'done', 'continue' or 'failed' (the follower rejected the finished file twice)."""
        if m.snap_index != self.meta.index or m.snap_term != self.meta.term:
            return "continue"  # an answer about some other transfer
        if m.done and not m.reject:
            return "done"
        if m.reject:
            self.restarts += 1
            self.offset = 0
            return "failed" if self.restarts > 1 else "continue"
        self.offset = min(m.offset, self.meta.file_size)
        return "continue"


class SnapshotReceiver:
    """Follower side: accepts chunks in order, answers with the next expected offset."""

    def __init__(self, me: int, new_sink: Callable[[int, int], Sink], max_bytes: int = 4 << 30) -> None:
        self.me = me
        self.new_sink = new_sink
        self.max_bytes = max_bytes  # the largest snapshot file accepted; a bigger transfer is refused
        self.key: tuple[int, int] | None = None
        self.sink: Sink | None = None
        self.expected = 0

    def on_chunk(self, m: SnapChunk, term: int) -> tuple[SnapResp, SnapshotMeta | None]:
        """Handle one chunk; returns the reply and, when complete and valid, the snapshot."""
        key = (m.snap_index, m.snap_term)
        if m.size > self.max_bytes or m.offset + len(m.data) > m.size:
            # Announced size over the limit, or a chunk past the announced end: refuse the transfer.
            if key == self.key:
                self.abort()
            return self._reply(m, term, 0, reject=True), None
        if key != self.key:
            if m.offset != 0:
                return self._reply(m, term, 0), None  # we have nothing of this one: start over
            self.abort()
            try:
                sink_for_key = self.new_sink(*key)
            except OSError as exc:  # the file cannot be created (full disk, unwritable directory): as a failed write
                log.warning("node %d: cannot store snapshot %s (%s); transfer refused", self.me, key, exc)
                return self._reply(m, term, 0, reject=True), None
            self.key, self.sink, self.expected = key, sink_for_key, 0
        if m.offset != self.expected:
            return self._reply(m, term, self.expected), None
        sink = self.sink
        assert sink is not None  # self.key names the transfer under way, and it has a sink
        try:
            sink.write(m.offset, m.data)
        except OSError as exc:  # e.g. a full disk: drop the partial file, the leader retries later
            log.warning("node %d: writing snapshot %s failed (%s); transfer aborted", self.me, key, exc)
            self.abort()
            return self._reply(m, term, 0, reject=True), None
        self.expected += len(m.data)
        if not m.done:
            return self._reply(m, term, self.expected), None
        self.key, self.sink = None, None
        try:
            meta = sink.finish()
        except (SnapshotError, OSError, struct.error) as exc:
            log.warning("node %d: received snapshot %s is invalid (%s); asking for it again", self.me, key, exc)
            sink.abort()
            return self._reply(m, term, 0, reject=True), None
        if (meta.index, meta.term) != key:
            return self._reply(m, term, 0, reject=True), None
        return SnapResp(self.me, m.src, term, snap_index=m.snap_index, snap_term=m.snap_term,
                        offset=self.expected, done=True), meta

    def _reply(self, m: SnapChunk, term: int, offset: int, reject: bool = False) -> SnapResp:
        return SnapResp(self.me, m.src, term, snap_index=m.snap_index, snap_term=m.snap_term,
                        offset=offset, reject=reject)

    def abort(self) -> None:
        if self.sink is not None:
            self.sink.abort()
        self.key, self.sink, self.expected = None, None, 0
