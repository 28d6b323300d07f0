"""`electra bench raft`: commits/s and latency of a 3-process cluster, Electra vs PySyncObj.

Both systems run as 3 separate processes on loopback with the same closed-loop
workload: `--clients` concurrent clients at the leader, each with one 64-byte
proposal in flight. Electra runs with fsync on (unless --unsafe-no-fsync, which
is printed); PySyncObj never fsyncs (its journal is an un-synced mmap), which
favours it. The ratio compares the two measured in this one run.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time

from electra.cli_args import Parser
from electra.local_ports import free_ports

from .common import result_line, run_workers


def run_system(system: str, args: argparse.Namespace) -> dict:
    ports = free_ports(3)
    with tempfile.TemporaryDirectory(prefix=f"bench-{system}-") as tmp:
        start_at = time.time() + args.settle
        cmds = []
        for i in (1, 2, 3):
            cmd = [sys.executable, "-m", "electra.bench.raft_workers", system, "--id", str(i),
                   "--ports", ",".join(map(str, ports)), "--data-dir", tmp, "--start-at", str(start_at),
                   "--clients", str(args.clients), "--size", str(args.size), "--warmup", str(args.warmup),
                   "--duration", str(args.duration), "--inflight", str(args.inflight)]
            if args.unsafe_no_fsync:
                cmd.append("--no-fsync")
            cmds.append(cmd)
        results = run_workers(cmds, timeout=args.settle + args.warmup + args.duration + 60)
    leaders = [r for r in results if r.get("role") == "leader"]
    if len(leaders) != 1:
        raise RuntimeError(f"{system}: expected one leader report, got {results}")
    return leaders[0]


def main(argv: list[str]) -> int:
    p = Parser(prog="electra bench raft", description=__doc__)
    p.add_argument("--clients", type=int, minimum=1, default=1000, help="concurrent proposers (default 1000)")
    p.add_argument("--size", type=int, minimum=1, default=64, help="command size in bytes (default 64)")
    p.add_argument("--duration", type=float, minimum=1, default=10.0, help="seconds measured (default 10)")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds before measuring (default 2)")
    p.add_argument("--settle", type=float, default=4.0, help="seconds for processes to start and elect")
    p.add_argument("--inflight", type=int, minimum=1, default=32, help="AppendEntries in flight per follower")
    p.add_argument("--unsafe-no-fsync", action="store_true", help="no fsync (an upper bound, not a safe setting)")
    p.add_argument("--skip-pysyncobj", action="store_true", help="do not run the PySyncObj comparison")
    args = p.parse_args(argv)

    print(f"bench raft: 3 processes on loopback, {args.clients} concurrent clients, {args.size}-byte commands, "
          f"{args.duration:g}s measured after {args.warmup:g}s warm-up", flush=True)
    print(f"electra durability: {'UNSAFE no fsync' if args.unsafe_no_fsync else 'fsync before ack'}; "
          "pysyncobj durability: no fsync (un-synced mmap journal)", flush=True)
    e = run_system("electra", args)
    print(f"electra:   {e['commits_per_s']:>10,.0f} commits/s  p50 {e['p50_ms']:.1f} ms  p99 {e['p99_ms']:.1f} ms  "
          f"avg batch {e['avg_batch']:.0f}  leader fsyncs/s {e['leader_fsyncs_per_s']:.0f}  "
          f"errors {e['errors']}", flush=True)
    if args.skip_pysyncobj:
        s = {"commits_per_s": float("nan")}
    else:
        s = run_system("pysyncobj", args)
        print(f"pysyncobj: {s['commits_per_s']:>10,.0f} commits/s  p50 {s['p50_ms']:.1f} ms  "
              f"p99 {s['p99_ms']:.1f} ms  errors {s['errors']}", flush=True)
    ratio = e["commits_per_s"] / s["commits_per_s"] if s["commits_per_s"] else float("nan")
    print(result_line(commits_per_s=round(e["commits_per_s"]), p99_ms=round(e["p99_ms"], 2),
                      pysyncobj_per_s=round(s["commits_per_s"]) if s["commits_per_s"] == s["commits_per_s"]
                      else "nan", ratio=round(ratio, 2), fsync=not args.unsafe_no_fsync))
    return 0
