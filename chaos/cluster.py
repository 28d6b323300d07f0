"""The controller group under test: real `electra node` processes, started the way `electra up` starts them.

`ChaosCluster` is a `LocalStack` (so secure by default, the same command line as
operators run) whose nodes dial their higher-id peers through the fault proxies
(chaos/proxy.py), whose data directories may sit on small tmpfs mounts (a real
ENOSPC, root only), whose clock may be under libfaketime (when installed) and whose
fsyncs go through a small LD_PRELOAD shim (chaos/diskshim.c, when a C compiler is there) that can
slow them and logs what was synced, so a power cut can drop the rest.
It owns process-level faults: SIGKILL, SIGSTOP/SIGCONT, restart, a torn log tail.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from electra.consensus.runtime import CLOCK_RATE_ENV
from electra.local_ports import free_ports
from electra.local_stack import LocalStack, StackConfig

from .proxy import ProxyHub

FAKETIME_LIBS = ("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
                 "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
                 "/usr/lib/faketime/libfaketime.so.1")
TMPFS_SIZE = "64m"


def faketime_library() -> str | None:
    return next((p for p in FAKETIME_LIBS if os.path.exists(p)), None)


def can_mount() -> bool:
    return os.geteuid() == 0 and shutil.which("mount") is not None


def c_compiler() -> str | None:
    return shutil.which("cc") or shutil.which("gcc")


def build_disk_shim(out_dir: Path) -> Path | None:
    """Compile chaos/diskshim.c (slow fsync, synced sizes logged) into `out_dir`; None if impossible."""
    cc = c_compiler()
    if cc is None:
        return None
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    so = Path(out_dir) / "diskshim.so"
    r = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(so), str(Path(__file__).with_name("diskshim.c")),
                        "-ldl"], capture_output=True, text=True, timeout=60)
    return so if r.returncode == 0 else None


def last_synced_sizes(sync_log: Path) -> dict[str, int]:
    """The size of each file at its last fsync, from the disk shim's log."""
    sizes: dict[str, int] = {}
    if sync_log.exists():
        for line in sync_log.read_text(errors="replace").splitlines():
            size, _, path = line.partition("\t")
            if path and size.isdigit():
                sizes[path] = int(size)
    return sizes


class ChaosCluster(LocalStack):
    def __init__(self, data_dir: Path, *, nodes: int = 3, seed: int = 0, tick_ms: int = 50, secure: bool = True,
                 tmpfs: bool = False, faketime: bool = False, disk_shim: bool = False,
                 fsync_delay_ms: int = 0, election_jitter_ticks: int | None = None,
                 clock_rate: bool = False) -> None:
        ports = free_ports(2 * nodes + nodes * (nodes - 1) // 2)
        super().__init__(StackConfig(data_dir=Path(data_dir), nodes=nodes, raft_port=0, http_port=0,
                                     tier_uri=None, tick_ms=tick_ms, secure=secure))
        self.ids = list(range(1, nodes + 1))
        self.raft_ports = {i: ports[i - 1] for i in self.ids}
        self.endpoints = {i: f"127.0.0.1:{ports[nodes + i - 1]}" for i in self.ids}
        self.raft_peers = ",".join(f"{i}=127.0.0.1:{self.raft_ports[i]}" for i in self.ids)
        self.hub = ProxyHub(seed)
        proxy_ports = iter(ports[2 * nodes:])
        for lo in self.ids:
            for hi in self.ids:
                if lo < hi:
                    self.hub.add(lo, hi, next(proxy_ports), self.raft_ports[hi])
        self.faketime_lib = faketime_library() if faketime else None
        self.clock_files = {i: Path(data_dir) / f"clock-node{i}" for i in self.ids}
        # The test-only monotonic clock rate of each node (consensus/runtime.py's RatedClock), None: real time.
        self.rate_files = {i: Path(data_dir) / f"clock-rate-node{i}" for i in self.ids} if clock_rate else None
        self.disk_shim = build_disk_shim(Path(data_dir)) if disk_shim else None
        self.disk_delay_files = {i: Path(data_dir) / f"fsync-delay-ms-node{i}" for i in self.ids}
        self.sync_logs = {i: Path(data_dir) / f"synced-node{i}.log" for i in self.ids}
        self.fsync_delay_ms = fsync_delay_ms  # every node's disk, the whole run (0: as fast as it is)
        self.election_jitter_ticks = election_jitter_ticks  # None: the node's default
        if self.disk_shim is not None:
            for i in self.ids:
                self.set_fsync_delay(i, fsync_delay_ms)
        self.mounted: list[Path] = []
        if tmpfs and can_mount():
            for i in self.ids:
                d = self.data_dir(i)
                d.mkdir(parents=True, exist_ok=True)
                r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "tmpfs", str(d)],
                                   capture_output=True, text=True, timeout=30)
                if r.returncode == 0:
                    self.mounted.append(d)
        self.paused: set[int] = set()

    # ------------------------------------------------------------------ LocalStack hooks
    def node_peers(self, i: int) -> str:
        """Node i dials each higher peer through that pair's proxy (lower ids dial, see consensus/transport.py)."""
        parts = []
        for k in self.ids:
            port = self.raft_ports[k] if k <= i else self.hub.link(i, k).listen_port
            parts.append(f"{k}=127.0.0.1:{port}")
        return ",".join(parts)

    def node_args(self, i: int) -> list[str]:
        # Liveness-triggered elections would change the state without a client operation in the
        # history; the workload drives every election itself.
        args = ["--inactive-master-scan-ms", "0"]
        if self.election_jitter_ticks is not None:
            args += ["--election-jitter-ticks", str(self.election_jitter_ticks)]
        return args

    def node_env(self, i: int) -> dict[str, str]:
        env: dict[str, str] = {}
        preload = []
        if self.disk_shim is not None:
            preload.append(str(self.disk_shim))
            env["ELECTRA_SLOW_DISK_FILE"] = str(self.disk_delay_files[i])
            env["ELECTRA_SYNCED_LOG"] = str(self.sync_logs[i])
        if self.faketime_lib is not None:
            f = self.clock_files[i]
            if not f.exists():
                f.write_text("+0\n")
            preload.append(self.faketime_lib)
            # Only the wall clock moves: monotonic time (Raft's timers, asyncio and uvloop) stays real, as on
            # a host whose NTP steps the clock. The offset file is re-read at most once a second: with
            # FAKETIME_NO_CACHE every time.time() reads it (measured: 26 us instead of 0.6 us per call).
            env.update({"FAKETIME_TIMESTAMP_FILE": str(f), "FAKETIME_CACHE_DURATION": "1",
                        "FAKETIME_DONT_FAKE_MONOTONIC": "1", "FAKETIME_DONT_RESET": "1"})
        if preload:
            env["LD_PRELOAD"] = " ".join(preload)
        if self.rate_files is not None:
            if not self.rate_files[i].exists():
                self.set_clock_rate(i, 1.0)
            env[CLOCK_RATE_ENV] = str(self.rate_files[i])
        return env

    def set_clock_rate(self, i: int, rate: float) -> None:
        """Node i's monotonic clock (its leases and its timers) runs at `rate` from now on (seen within 50 ms)."""
        assert self.rate_files is not None, "the cluster was started without clock rates"
        self.rate_files[i].parent.mkdir(parents=True, exist_ok=True)
        self.rate_files[i].write_text(f"{rate}\n")

    # ------------------------------------------------------------------ lifecycle
    def data_dir(self, i: int) -> Path:
        return Path(self.cfg.data_dir) / f"node{i}"

    def start(self) -> None:
        for i in self.ids:
            self.start_node(i)

    def alive(self, i: int) -> bool:
        p = self.procs.get(f"node{i}")
        return p is not None and p.poll() is None

    def pid(self, i: int) -> int:
        return self.procs[f"node{i}"].pid

    def kill(self, *ids: int) -> None:
        """SIGKILL these nodes at once (all signals first, then the waits), as a power cut would."""
        procs = [p for i in ids if (p := self.procs.get(f"node{i}")) is not None and p.poll() is None]
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGKILL)
                os.kill(p.pid, signal.SIGCONT)  # a stopped process dies only once continued
        for p in procs:
            p.wait(timeout=10)
        self.paused.difference_update(ids)

    def pause(self, i: int) -> None:
        if self.alive(i):
            os.kill(self.pid(i), signal.SIGSTOP)
            self.paused.add(i)

    def resume(self, i: int) -> None:
        if self.alive(i):
            os.kill(self.pid(i), signal.SIGCONT)
        self.paused.discard(i)

    def restart(self, i: int) -> None:
        self.kill(i)
        self.start_node(i)

    def ensure_running(self) -> list[int]:
        """Continue paused nodes and start dead ones; returns the ids started again."""
        started = []
        for i in self.ids:
            if i in self.paused:
                self.resume(i)
            if not self.alive(i):
                self.start_node(i)
                started.append(i)
        return started

    def exit_code(self, i: int) -> int | None:
        p = self.procs.get(f"node{i}")
        return None if p is None else p.poll()

    def tear_tail(self, i: int, max_bytes: int, rng) -> str:
        """A write torn by the crash of stopped node i: its newest log segment loses up to `max_bytes` of what it
        gained since its last fsync (the disk shim's log says where that was), or, when all of it was synced,
        ends in up to `max_bytes` of a record whose append the crash tore. Returns what was done.

        Only unsynced bytes: cutting synced ones is a lost disk, not a torn write, and the node refuses to
        start on it (its log mark says how far the log durably reached; docs/raft-engine.md)."""
        assert not self.alive(i), "tear the tail of a stopped node only"
        segs = sorted((self.data_dir(i) / "raft-log").glob("*.seg"))
        if not segs:
            return "no log segment"
        seg = segs[-1]
        size = seg.stat().st_size
        synced = last_synced_sizes(self.sync_logs[i]).get(str(seg), size)
        if size > synced:
            cut = min(size - synced, rng.randint(1, max_bytes))
            with open(seg, "r+b") as f:
                f.truncate(size - cut)
            return f"cut {cut} unsynced bytes"
        torn = rng.randint(1, max_bytes)  # a record header announcing more than the crash let through
        fragment = (torn + 64).to_bytes(4, "big") + rng.randbytes(max(0, torn - 4))
        with open(seg, "ab") as f:
            f.write(fragment[:torn])
        return f"{torn} bytes of a torn append"

    def set_clock_offset(self, i: int, offset_s: float) -> None:
        """Move node i's wall clock by `offset_s` from real time (libfaketime re-reads the file on every call)."""
        tmp = self.clock_files[i].with_suffix(".tmp")
        tmp.write_text(f"{offset_s:+.3f}\n")
        tmp.replace(self.clock_files[i])

    def lose_unsynced(self, i: int) -> int:
        """A power cut on stopped node i: every file the node fsynced loses what it gained since its last
        fsync (a SIGKILL alone keeps the page cache). Returns the bytes cut.

        Appends only: a file never fsynced, or overwritten in place, is left as it is, so this never
        destroys more than a real power cut would."""
        assert not self.alive(i), "cut the power of a stopped node only"
        cut = 0
        sizes = last_synced_sizes(self.sync_logs[i])
        for path, size in sizes.items():
            f = Path(path)
            try:
                now = f.stat().st_size
            except OSError:
                continue  # renamed or removed since
            if now > size:
                with open(f, "r+b") as fh:
                    fh.truncate(size)
                cut += now - size
        self.sync_logs[i].write_text("".join(f"{size}\t{path}\n" for path, size in sizes.items()))
        return cut

    def set_fsync_delay(self, i: int, delay_ms: int) -> None:
        """Every fsync of node i waits this long first (the slow-disk shim reads the file on each call)."""
        tmp = self.disk_delay_files[i].with_suffix(".tmp")
        tmp.write_text(f"{int(delay_ms)}\n")
        tmp.replace(self.disk_delay_files[i])

    def fill_disk(self, i: int) -> Path:
        """Fill node i's tmpfs data dir until ENOSPC; delete the returned file to free it."""
        filler = self.data_dir(i) / "chaos-filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            for chunk in (65536, 4096, 1):  # down to the last byte, so the node's next append fails
                with contextlib.suppress(OSError):
                    for _ in range(100_000):  # bounded: a 64 MiB tmpfs is full long before
                        os.write(fd, b"\0" * chunk)
        finally:
            os.close(fd)
        return filler

    def close(self) -> None:
        try:
            for i in self.ids:
                if i in self.paused:
                    self.resume(i)
            self.stop_all()
        finally:
            self.hub.close()
            for d in self.mounted:
                subprocess.run(["umount", "-l", str(d)], capture_output=True, timeout=30)

    def wait_exit(self, i: int, timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            code = self.exit_code(i)
            if code is not None:
                return code
            time.sleep(0.05)
        return None
