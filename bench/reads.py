"""`electra bench reads`: reads by mode against writes, and restart time with vs without snapshots.

Part 1 runs 3 node processes on loopback (fsync on). The same number of
concurrent clients runs, in turn: writes at the leader, ReadIndex reads at the
leader, lease reads at the leader, follower reads at a follower. During every
read phase a background writer keeps proposing at the leader, so reads are
measured against a moving commit index.

Part 2 builds a single node with `--entries` (1,000,000) applied KV commands twice, once
with snapshots every 15% of them (150,000) and once with snapshots off, and times a restart
of each until the state machine holds every entry again. The RESULT keys keep their names
(`restart_1m_*`) whatever `--entries` is.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from electra.cli_args import Parser
from electra.local_ports import free_ports

from .common import result_line, run_workers

PHASES = ("write", "readindex", "lease", "follower")


def _report(obj: dict) -> None:
    print("RESULT_JSON " + json.dumps(obj), flush=True)


async def _closed_loop(op, clients: int, seconds: float) -> tuple[int, int]:
    """Run `clients` coroutines calling `op()` back to back; count successes and errors."""
    done = errors = 0
    stop = time.perf_counter() + seconds

    async def client() -> None:
        nonlocal done, errors
        while time.perf_counter() < stop:
            try:
                await op()
                done += 1
                await asyncio.sleep(0)  # as a network request would, let other clients run
            except Exception:
                errors += 1
                await asyncio.sleep(0.005)

    await asyncio.gather(*(client() for _ in range(clients)))
    return done, errors


def _profiler(phase: str):
    """With ELECTRA_PROFILE=<phase>, profile the leader during that phase (where the time goes)."""
    if os.environ.get("ELECTRA_PROFILE") != phase:
        return None
    import cProfile

    prof = cProfile.Profile()
    prof.enable()
    return prof


def _profile_done(prof, phase: str) -> None:
    if prof is None:
        return
    import io
    import pstats

    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(18)
    print(f"profile of the leader during {phase}:\n{out.getvalue()}", flush=True)


def worker(args: argparse.Namespace) -> None:
    from electra.consensus.core import RaftConfig
    from electra.consensus.kv import CounterStateMachine
    from electra.consensus.node import NodeConfig, RaftNode

    peers = {i + 1: ("127.0.0.1", p) for i, p in enumerate(args.ports)}
    cfg = NodeConfig(node_id=args.id, peers=peers, data_dir=Path(args.data_dir) / f"n{args.id}",
                     raft=RaftConfig(election_ticks=10, heartbeat_ticks=1), follower_max_lag=100_000)

    async def main() -> None:
        node = RaftNode(cfg, CounterStateMachine())
        await node.start()
        await asyncio.sleep(max(0.0, args.start_at - time.time()))
        for _ in range(50):
            if node.leader_id:
                break
            await asyncio.sleep(0.1)
        leader_id = node.leader_id
        role = "leader" if node.is_leader else ("reader" if args.id == min(p for p in peers if p != leader_id)
                                                else "idle")
        cmd = b"x" * 64
        results: dict = {"role": role, "id": args.id}

        def read_count(sm):
            return sm.count

        for k, phase in enumerate(PHASES):
            begin = args.start_at + 1.0 + k * (args.duration + 1.0)
            await asyncio.sleep(max(0.0, begin - time.time()))
            if role == "leader" and phase == "write":
                n, err = await _closed_loop(lambda: node.propose(cmd), args.clients, args.duration)
                results["write"] = (n / args.duration, err)
            elif role == "leader" and phase in ("readindex", "lease"):
                mode = "linearizable" if phase == "readindex" else "lease"
                prof = _profiler(phase)
                bg = asyncio.ensure_future(_closed_loop(lambda: node.propose(cmd), args.bg_writers, args.duration))
                n, err = await _closed_loop(lambda m=mode: node.read(read_count, m), args.clients, args.duration)
                w, _ = await bg
                _profile_done(prof, phase)
                results[phase] = (n / args.duration, err)
                results[phase + "_bg_writes"] = w / args.duration
            elif role == "leader" and phase == "follower":
                w, _ = await _closed_loop(lambda: node.propose(cmd), args.bg_writers, args.duration)
                results["follower_bg_writes"] = w / args.duration
            elif role == "reader" and phase == "follower":
                n, err = await _closed_loop(lambda: node.read(read_count, "follower"), args.clients, args.duration)
                results["follower"] = (n / args.duration, err)
        results["metrics"] = node.metrics
        _report(results)
        await asyncio.sleep(1.0)
        await node.stop()

    asyncio.run(main())


def run_cluster(args: argparse.Namespace) -> dict:
    ports = free_ports(3)
    with tempfile.TemporaryDirectory(prefix="bench-reads-") as tmp:
        start_at = time.time() + args.settle
        cmds = [[sys.executable, "-m", "electra.bench.reads", "worker", "--id", str(i),
                 "--ports", ",".join(map(str, ports)), "--data-dir", tmp, "--start-at", str(start_at),
                 "--clients", str(args.clients), "--bg-writers", str(args.bg_writers),
                 "--duration", str(args.duration)] for i in (1, 2, 3)]
        total = args.settle + len(PHASES) * (args.duration + 1.0) + 60
        results = run_workers(cmds, timeout=total)
    merged: dict = {}
    for r in results:
        merged.update({k: v for k, v in r.items() if k in PHASES or k.endswith("_bg_writes")})
    missing = [p for p in PHASES if p not in merged]
    if missing:
        raise RuntimeError(f"phases without a result: {missing}; worker reports: {results}")
    return merged


async def _build(data_dir: Path, entries: int, snapshot_entries: int) -> None:
    from electra.consensus.core import RaftConfig
    from electra.consensus.kv import KVStateMachine, encode_put
    from electra.consensus.node import NodeConfig, RaftNode

    port = free_ports(1)[0]
    cfg = NodeConfig(node_id=1, peers={1: ("127.0.0.1", port)}, data_dir=data_dir, tick_s=0.01,
                     raft=RaftConfig(election_ticks=5), snapshot_entries=snapshot_entries,
                     snapshot_bytes=1 << 62)
    node = RaftNode(cfg, KVStateMachine())
    await node.start()
    while not (node.is_leader and node.core.committed_in_term()):
        await asyncio.sleep(0.01)
    cmds = [encode_put(f"key{k % 100_000}", k) for k in range(10_000)]
    step = 10_000
    for lo in range(0, entries, step):
        await asyncio.gather(*(node.propose_future(cmds[k]) for k in range(min(step, entries - lo))))
        if lo % 200_000 == 0:
            print(f"    building: {lo:,}/{entries:,} entries", flush=True)
    while node._snapshotting:
        await asyncio.sleep(0.05)
    await node.stop()


async def _restart(data_dir: Path, want_applied: int) -> tuple[float, dict]:
    from electra.consensus.core import RaftConfig
    from electra.consensus.kv import KVStateMachine
    from electra.consensus.node import NodeConfig, RaftNode

    port = free_ports(1)[0]
    cfg = NodeConfig(node_id=1, peers={1: ("127.0.0.1", port)}, data_dir=data_dir, tick_s=0.01,
                     raft=RaftConfig(election_ticks=5), snapshot_entries=10**12, snapshot_bytes=1 << 62)
    t0 = time.perf_counter()
    node = RaftNode(cfg, KVStateMachine())
    await node.start()
    loaded = time.perf_counter() - t0
    while node.applied < want_applied:
        await asyncio.sleep(0.001)
    total = time.perf_counter() - t0
    st = {"loaded_s": loaded, "snapshot_index": node.core.snap_index, "log_entries": node.core.last_index()
          - node.core.offset, "election_wait_s": None}
    await node.stop()
    return total, st


def restart_bench(entries: int) -> dict:
    out = {}
    # Snapshots every 15% of the entries (150,000 of 1,000,000) leave a real tail to replay from the log;
    # a fixed 150,000 took no snapshot at all below that, and the two restarts were the same.
    for label, snap_every in (("snapshot", max(1, entries * 15 // 100)), ("replay", 10**12)):
        with tempfile.TemporaryDirectory(prefix=f"bench-restart-{label}-") as tmp:
            print(f"  restart ({label}): writing {entries:,} entries through a single-node cluster", flush=True)
            asyncio.run(_build(Path(tmp), entries, snap_every))
            total, st = asyncio.run(_restart(Path(tmp), entries + 1))  # +1: the first no-op entry
            print(f"  restart ({label}): {total:.2f}s until all {entries:,} entries are applied "
                  f"(storage+snapshot load {st['loaded_s']:.2f}s, snapshot at {st['snapshot_index']:,}, "
                  f"{st['log_entries']:,} log entries kept)", flush=True)
            out[label] = total
    return out


def main(argv: list[str]) -> int:
    if argv and argv[0] == "worker":
        p = Parser()
        p.add_argument("--id", type=int, required=True)
        p.add_argument("--ports", type=lambda s: [int(x) for x in s.split(",")], required=True)
        p.add_argument("--data-dir", required=True)
        p.add_argument("--start-at", type=float, required=True)
        p.add_argument("--clients", type=int, default=200)
        p.add_argument("--bg-writers", type=int, default=20)
        p.add_argument("--duration", type=float, default=5.0)
        worker(p.parse_args(argv[1:]))
        return 0
    p = Parser(prog="electra bench reads", description=__doc__)
    p.add_argument("--clients", type=int, minimum=1, default=1000, help="concurrent clients (default 1000)")
    p.add_argument("--bg-writers", type=int, default=20, help="writers at the leader during read phases")
    p.add_argument("--duration", type=float, minimum=1, default=5.0, help="seconds per phase")
    p.add_argument("--settle", type=float, default=4.0, help="seconds between phases (default 4)")
    p.add_argument("--entries", type=int, minimum=1000, default=1_000_000,
                   help="entries for the restart measurement (default 1000000; snapshots every 15%% of them)")
    args = p.parse_args(argv)
    print(f"bench reads: 3 processes, fsync on, {args.clients} concurrent clients per phase, "
          f"{args.duration:g}s per phase, {args.bg_writers} background writers during reads", flush=True)
    r = run_cluster(args)
    for phase in PHASES:
        rate, err = r[phase]
        bg = r.get(f"{phase}_bg_writes")
        extra = f"  (background writes {bg:,.0f}/s)" if bg else ""
        print(f"  {phase:>10}: {rate:>10,.0f} ops/s  errors {err}{extra}", flush=True)
    restart = restart_bench(args.entries)
    print(f"  ratio readindex/write = {r['readindex'][0] / r['write'][0]:.2f}", flush=True)
    print(result_line(write_per_s=round(r["write"][0]), readindex_per_s=round(r["readindex"][0]),
                      lease_per_s=round(r["lease"][0]), follower_per_s=round(r["follower"][0]),
                      restart_1m_snapshot_s=round(restart["snapshot"], 2),
                      restart_1m_replay_s=round(restart["replay"], 2)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
