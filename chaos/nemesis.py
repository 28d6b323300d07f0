"""The seeded nemesis: which faults an episode gets, when, against whom, and how each is injected and healed.

A schedule depends only on (seed, episode number, fault kinds, node count), so a
failing episode replays with `--seed S --episode N`. Targets that depend on the
running cluster ("the leader") are resolved when the fault starts and recorded.

Kinds and what they need on this machine (`supported()` says which are skipped):
kill, pause (SIGSTOP/SIGCONT), partition, delay, loss (the peer-link proxies),
torn-tail (kill, cut the newest log segment's tail, restart), split-vote (5 nodes): always;
clock (wall-clock skew and jumps on one node): libfaketime (Debian `faketime`);
clock-rate (one node's monotonic clock, leases and timers, 8 % fast or slow): a test-only hook in the
node (consensus/runtime.py, RatedClock), always;
disk-full (ENOSPC on one node): root, for a tmpfs under each data dir;
slow-disk (every fsync of one node delayed) and power-loss (SIGKILL, then every
file loses what it gained since its last fsync): a C compiler for the LD_PRELOAD
shim chaos/diskshim.c (no dm-delay in this container's kernel, no FUSE layer here).
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .cluster import ChaosCluster, c_compiler, can_mount, faketime_library

KINDS = ("kill", "pause", "partition", "delay", "loss", "clock", "clock-rate", "disk-full", "torn-tail", "slow-disk",
         "power-loss", "split-vote")
SPLIT_VOTE_PAUSE_S = 1.2  # how long split-vote keeps the shared voters stopped
TARGETS = ("any", "leader", "minority", "majority", "all")  # "all": the whole group crashes (a power cut)
PARTITIONS = ("isolate-leader", "halves", "bridge", "ring", "one-way", "stalled-leader")
# stalled-leader stops the cut-off leader this long (a GC pause, a VM stall). At the default 100 ms tick: longer
# than a correct lease (0.81 s) and than the others' election timeouts (1.0-1.3 s), shorter than a lease without
# its margin (2.0 s). It wakes as a leader: the CheckQuorum window that ran out while it slept had heard from
# its followers before the stop, so the next check is an election timeout after it wakes (docs/chaos.md).
STALL_S = 1.2
STALL_PARTITION_S = STALL_S + 1.3  # cut off at least this long: past the end of a lease without its margin
EXCLUSIVE = ("torn-tail", "split-vote")  # loses unsynced bytes of one node: never combined with other crashes


MODES = {"kill": TARGETS, "pause": TARGETS, "power-loss": TARGETS, "partition": PARTITIONS, "split-vote": ("leader",)}
NODE_MODES = ("any", "leader")  # the kinds that hit one node


def parse_kind(entry: str) -> tuple[str, str | None]:
    """`kind` or `kind:mode` (e.g. `kill:leader`, `partition:one-way`): a mode pins what the nemesis picks."""
    kind, _, mode = entry.partition(":")
    if kind not in KINDS:
        raise ValueError(f"unknown fault kind {kind!r}; known: {', '.join(KINDS)}")
    modes = MODES.get(kind, NODE_MODES)
    if mode and mode not in modes:
        raise ValueError(f"fault {kind!r} has no mode {mode!r}; known: {', '.join(modes)}")
    return kind, mode or None


def supported(kinds: list[str], nodes: int = 3) -> tuple[list[str], dict[str, str]]:
    """The kinds (entries of `--faults`) this machine can inject, and why each other one is skipped."""
    skipped: dict[str, str] = {}
    for entry in kinds:
        k, _ = parse_kind(entry)
        if k == "clock" and faketime_library() is None:
            skipped[k] = "needs libfaketime (apt-get install faketime)"
        elif k == "disk-full" and not can_mount():
            skipped[k] = "needs root to mount a small tmpfs under each node's data dir"
        elif k == "split-vote" and nodes < 5:
            skipped[k] = "needs 5 nodes (--nodes 5): two candidates and the voters they share"
        elif k in ("slow-disk", "power-loss") and c_compiler() is None:
            skipped[k] = "needs a C compiler (cc) to build the disk shim chaos/diskshim.c"
    return [e for e in kinds if parse_kind(e)[0] not in skipped], skipped


@dataclass
class Fault:
    kind: str
    mode: str  # kill/pause: a TARGETS entry; partition: a PARTITIONS entry; others: "node"
    start: float  # seconds after the episode's workload starts
    end: float
    param: float = 0.0  # delay seconds, loss probability, clock offset seconds, bytes to tear
    seed: int = 0
    targets: list[int] = field(default_factory=list)  # resolved at start
    detail: str = ""
    undo: Any = None  # what heal() needs (filler files)

    def label(self) -> str:
        return f"{self.kind}({self.mode}{':' + ','.join(f'n{t}' for t in self.targets) if self.targets else ''})"


def schedule(seed: int, episode: int, kinds: list[str], nodes: int, mixed: bool,
             duration: tuple[float, float] = (1.0, 2.5)) -> list[Fault]:
    rng = random.Random(f"{seed}/{episode}")
    if mixed:
        pool = [e for e in kinds if parse_kind(e)[0] not in EXCLUSIVE]
        chosen = rng.sample(pool, k=min(len(pool), rng.randint(1, 3))) if pool else []
        if not chosen or (len(pool) < len(kinds) and rng.random() < 1 / len(kinds)):
            chosen = [rng.choice(kinds)]
    else:
        chosen = [kinds[episode % len(kinds)]]  # round robin: every kind in every run of len(kinds) episodes
    faults = []
    for entry in chosen:
        kind, pinned = parse_kind(entry)
        start = rng.uniform(0.3, 1.0)
        f = Fault(kind, "node", start, start + rng.uniform(*duration), seed=rng.randrange(1 << 30))
        f.mode = rng.choice(MODES.get(kind, NODE_MODES))
        if kind == "delay":
            f.param = rng.choice((0.05, 0.1, 0.2, 0.4))
        elif kind == "loss":
            f.param = rng.choice((0.02, 0.1, 0.3))
        elif kind == "clock":
            f.param = rng.choice((-1, 1)) * rng.choice((2.0, 30.0, 600.0))
        elif kind == "clock-rate":  # within the 10 % the lease assumes (NodeConfig.max_clock_drift)
            f.param = rng.choice((0.92, 0.96, 1.04, 1.08))
        elif kind == "torn-tail":
            f.param = rng.choice((1, 17, 200, 4096))
        elif kind == "slow-disk":
            f.param = rng.choice((20, 100, 500, 1500))  # milliseconds per fsync
        elif kind == "split-vote":  # the voters stop, then refuse for an election timeout: room for both
            f.end = max(f.end, f.start + SPLIT_VOTE_PAUSE_S + 2.5)
        if pinned:
            f.mode = pinned
        if kind == "partition" and f.mode == "stalled-leader":
            f.end = max(f.end, f.start + STALL_PARTITION_S)
        faults.append(f)
    return faults


def _pick(rng: random.Random, ids: list[int], leader: int | None, mode: str) -> list[int]:
    n = len(ids)
    if mode == "leader" and leader is not None:
        return [leader]
    if mode == "minority":
        return rng.sample(ids, (n - 1) // 2)
    if mode == "majority":
        return rng.sample(ids, n // 2 + 1)
    if mode == "all":
        return list(ids)
    return [rng.choice(ids)]


class Nemesis:
    def __init__(self, cluster: ChaosCluster) -> None:
        self.cluster = cluster

    def start(self, f: Fault, leader: int | None) -> None:
        c, rng, ids = self.cluster, random.Random(f.seed), self.cluster.ids
        if f.kind != "partition":
            f.targets = _pick(rng, ids, leader, f.mode)
        if f.kind == "kill":
            c.kill(*f.targets)
        elif f.kind == "power-loss":
            c.kill(*f.targets)  # all at once, as a power cut is, before any file is touched
            f.detail = f"{sum(c.lose_unsynced(i) for i in f.targets)} unsynced bytes lost"
        elif f.kind == "pause":
            for i in f.targets:
                c.pause(i)
        elif f.kind == "torn-tail":
            (i,) = f.targets
            c.kill(i)
            f.detail = c.tear_tail(i, int(f.param), rng)
        elif f.kind == "clock":
            c.set_clock_offset(f.targets[0], f.param)
            f.detail = f"wall clock {f.param:+.0f}s"
        elif f.kind == "clock-rate":
            c.set_clock_rate(f.targets[0], f.param)
            f.detail = f"monotonic clock x{f.param}"
        elif f.kind == "slow-disk":
            c.set_fsync_delay(f.targets[0], int(f.param))
            f.detail = f"fsync +{f.param:.0f} ms"
        elif f.kind == "disk-full":
            f.undo = c.fill_disk(f.targets[0])
            f.detail = "ENOSPC"
        elif f.kind in ("delay", "loss"):
            (i,) = f.targets
            for k in ids:
                if k != i:
                    if f.kind == "delay":
                        c.hub.set_delay(i, k, f.param)
                    else:
                        c.hub.set_loss(i, k, f.param)
            f.detail = f"{f.param * 1000:.0f} ms each way" if f.kind == "delay" else f"reset p={f.param}"
        elif f.kind == "partition":
            self._partition(f, rng, leader)
        elif f.kind == "split-vote":
            self._split_vote(f, leader)

    def _split_vote(self, f: Fault, leader: int | None) -> None:
        """Two candidates in one term, each with a quorum through the same voters: the worst case for a vote
        granted twice. The leader is killed; the two lowest-id survivors (whom the PreVote tie-break favours)
        are cut from each other; the other survivors, which had just heard from the leader, are stopped for
        a while. The two campaign and keep asking; the voters, continued, still refuse while their election
        timeout since the leader runs, then hear both within one tick. One vote each is a split vote (Raft
        retries), a vote granted twice is two leaders in one term. Needs 5 nodes."""
        c = self.cluster
        lead = leader if leader is not None else c.ids[-1]
        survivors = sorted(i for i in c.ids if i != lead)
        pair, voters = survivors[:2], survivors[2:]
        c.kill(lead)
        for v in voters:
            c.pause(v)
        c.hub.cut(pair[0], pair[1])
        c.hub.cut(pair[1], pair[0])

        def align() -> None:
            # The two candidates, already campaigning, are stopped for a moment too, and all four continue
            # together: each node's overdue tick then fires at once, so their ticks (and the candidates'
            # repeated asks) fall within milliseconds of each other from here on.
            for i in pair:
                c.pause(i)
            time.sleep(0.1)
            for i in [*voters, *pair]:
                c.resume(i)

        threading.Timer(SPLIT_VOTE_PAUSE_S - 0.1, align).start()
        f.targets = [lead]
        f.detail = f"n{lead} killed; n{pair[0]} - {voters} (stopped {SPLIT_VOTE_PAUSE_S}s) - n{pair[1]}"

    def _partition(self, f: Fault, rng: random.Random, leader: int | None) -> None:
        c, ids = self.cluster, list(self.cluster.ids)
        cuts: set[tuple[int, int]] = set()

        def apart(a: list[int], b: list[int]) -> None:
            cuts.update((x, y) for x in a for y in b)
            cuts.update((y, x) for x in a for y in b)

        lead = leader if leader is not None else rng.choice(ids)
        if f.mode in ("isolate-leader", "stalled-leader"):
            apart([lead], [i for i in ids if i != lead])
            f.targets, f.detail = [lead], f"n{lead} | rest"
            if f.mode == "stalled-leader":
                # Also stopped for a while (STALL_S): it wakes after the others elected a new leader and
                # took writes, still leading by its own CheckQuorum, its clock (its lease's) on time.
                c.pause(lead)
                threading.Timer(STALL_S, c.resume, (lead,)).start()
                f.detail += f", n{lead} stopped {STALL_S}s"
        elif f.mode == "halves":
            rng.shuffle(ids)
            small = ids[: (len(ids) - 1) // 2 or 1]
            apart(small, ids[len(small):])
            f.targets, f.detail = small, f"{small} | {sorted(ids[len(small):])}"
        elif f.mode == "bridge":
            rng.shuffle(ids)
            bridge, rest = ids[0], ids[1:]
            a, b = rest[: len(rest) // 2], rest[len(rest) // 2:]
            apart(a, b)
            f.targets, f.detail = [bridge], f"{sorted(a)} - n{bridge} - {sorted(b)}"
        elif f.mode == "ring":
            rng.shuffle(ids)
            n = len(ids)
            for x in range(n):
                for y in range(n):
                    if x != y and min((x - y) % n, (y - x) % n) > 1:
                        cuts.add((ids[x], ids[y]))
            f.targets, f.detail = ids, "ring " + "-".join(f"n{i}" for i in ids)
        elif f.mode == "one-way":
            others = [i for i in ids if i != lead]
            if rng.random() < 0.5:
                cuts.update((lead, o) for o in others)
                f.detail = f"n{lead} -> rest lost"
            else:
                cuts.update((o, lead) for o in others)
                f.detail = f"rest -> n{lead} lost"
            f.targets = [lead]
        for src, dst in sorted(cuts):
            c.hub.cut(src, dst)

    def heal(self, faults: list[Fault]) -> list[int]:
        """Undo everything: links, clocks, disks, paused and dead nodes. Returns the nodes started again."""
        c = self.cluster
        c.hub.heal_all()
        if c.faketime_lib:
            for i in c.ids:
                c.set_clock_offset(i, 0.0)
        if c.rate_files is not None:
            for i in c.ids:
                c.set_clock_rate(i, 1.0)
        if c.disk_shim:
            for i in c.ids:
                c.set_fsync_delay(i, c.fsync_delay_ms)
        for f in faults:
            if f.kind == "disk-full" and isinstance(f.undo, Path):
                f.undo.unlink(missing_ok=True)
                code = c.exit_code(f.targets[0])
                f.detail += f", node exited {code}" if code is not None else ", node ran on (no write hit ENOSPC)"
        return c.ensure_running()
