"""The `electra` command: run nodes, a local cluster, simulations and benchmarks."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def parse_peers(text: str) -> dict[int, tuple[str, int]]:
    """Parse `1=127.0.0.1:7001,2=127.0.0.1:7002` into {1: ("127.0.0.1", 7001), ...}."""
    peers: dict[int, tuple[str, int]] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            ident, addr = part.split("=", 1)
            host, port = addr.rsplit(":", 1)
            node_id = int(ident)
            peers[node_id] = (host, int(port))
        except ValueError:
            raise argparse.ArgumentTypeError(f"bad peer {part!r}: expected ID=HOST:PORT") from None
        if node_id <= 0:
            raise argparse.ArgumentTypeError(f"bad peer {part!r}: node ids start at 1")
    if not peers:
        raise argparse.ArgumentTypeError("at least one peer is required")
    return peers


def parse_addr(text: str) -> tuple[str, int]:
    try:
        host, port = text.rsplit(":", 1)
        return host, int(port)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad address {text!r}: expected HOST:PORT") from None


# --------------------------------------------------------------------------- electra node
def cmd_node(args: argparse.Namespace) -> int:
    from electra.consensus.kv import CounterStateMachine, KVStateMachine
    from electra.consensus.node import NodeConfig, RaftNode
    from electra.consensus.service import ClientService

    if args.id not in args.peers:
        print(f"error: --id {args.id} is not among --peers {sorted(args.peers)}", file=sys.stderr)
        return 2
    if args.unsafe_no_fsync:
        logging.warning("UNSAFE: fsync is off; acknowledged writes can be lost on power failure")
    cfg = NodeConfig(node_id=args.id, peers=args.peers, data_dir=Path(args.data_dir),
                     tick_s=args.tick_ms / 1000, fsync=not args.unsafe_no_fsync,
                     snapshot_entries=args.snapshot_entries, compaction_slack=args.compaction_slack)
    sm = KVStateMachine() if args.state_machine == "kv" else CounterStateMachine()

    async def main() -> None:
        node = RaftNode(cfg, sm)
        await node.start()
        service = ClientService(node, *args.client_addr)
        await service.start()
        print(f"node {args.id} raft={args.peers[args.id][0]}:{args.peers[args.id][1]} "
              f"client={service.host}:{service.port} data={args.data_dir}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await service.stop()
        await node.stop()

    try:
        asyncio.run(main())
    except Exception as exc:  # startup errors (corrupt log, port in use) get one clear line
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


# --------------------------------------------------------------------------- electra up
def cmd_up(args: argparse.Namespace) -> int:
    """Start a local cluster of `--nodes` processes; Ctrl-C stops them all."""
    base = Path(args.data_dir)
    n = args.nodes
    peers = ",".join(f"{i}=127.0.0.1:{args.raft_port + i - 1}" for i in range(1, n + 1))
    procs: list[subprocess.Popen] = []
    for i in range(1, n + 1):
        cmd = [sys.executable, "-m", "electra.cli", "--log-level", args.log_level, "node", "--id", str(i),
               "--peers", peers,
               "--client-addr", f"127.0.0.1:{args.client_port + i - 1}",
               "--data-dir", str(base / f"node{i}"), "--state-machine", "kv"]
        procs.append(subprocess.Popen(cmd))
    print(f"started {n} nodes; raft peers {peers}; client ports {args.client_port}..{args.client_port + n - 1}")
    print("waiting for a leader ...", flush=True)
    try:
        leader = asyncio.run(_wait_for_leader(args.client_port, n, timeout=30))
        print(f"leader elected: node {leader}. Ctrl-C stops the cluster.", flush=True)
        if args.demo_writes:
            asyncio.run(_demo_writes(args.client_port, n, args.demo_writes))
            if args.exit_after_demo:
                return 0
        while all(p.poll() is None for p in procs):
            time.sleep(0.5)
        print("a node exited; stopping the cluster", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


async def _wait_for_leader(client_port: int, n: int, timeout: float) -> int:
    from electra.consensus.client import RaftClient

    client = RaftClient({i: ("127.0.0.1", client_port + i - 1) for i in range(1, n + 1)}, timeout=1.0)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            for i in range(1, n + 1):
                try:
                    st = await client.status(i)
                except (OSError, TimeoutError):
                    continue
                if st["role"] == "leader":
                    return i
            await asyncio.sleep(0.2)
        raise TimeoutError(f"no leader within {timeout}s")
    finally:
        await client.close()


async def _demo_writes(client_port: int, n: int, count: int) -> None:
    from electra.consensus.client import RaftClient
    from electra.consensus.kv import encode_put

    client = RaftClient({i: ("127.0.0.1", client_port + i - 1) for i in range(1, n + 1)})
    t0 = time.monotonic()
    try:
        step = max(1, count // 10)
        for done in range(0, count, step):
            await asyncio.gather(*(client.propose(encode_put(f"demo{k}", k))
                                   for k in range(done, min(count, done + step))))
            print(f"  demo writes: {min(count, done + step)}/{count}", flush=True)
    finally:
        await client.close()
    print(f"demo: {count} replicated writes in {time.monotonic() - t0:.2f}s", flush=True)


# --------------------------------------------------------------------------- electra sim
def cmd_sim(args: argparse.Namespace) -> int:
    from electra.consensus.simulation import SimConfig, SimulationFailure, run_seed

    seeds = [args.seed] if args.seed is not None else range(args.start, args.start + args.seeds)
    cfg = SimConfig(nodes=args.nodes, duration_ms=args.duration_ms)
    t0 = time.monotonic()
    failures = 0
    total = len(seeds)
    for k, seed in enumerate(seeds, 1):
        try:
            run_seed(seed, cfg)
        except SimulationFailure as exc:
            failures += 1
            print(f"FAIL {exc}", flush=True)
            print(f"replay with: electra sim --seed {seed} --nodes {args.nodes} --duration-ms {args.duration_ms}")
            if not args.keep_going:
                break
        if k % max(1, total // 10) == 0 or k == total:
            print(f"  {k}/{total} seeds, {failures} failed, {time.monotonic() - t0:.1f}s", flush=True)
    print(f"{total - failures} passed, {failures} failed")
    return 1 if failures else 0


# --------------------------------------------------------------------------- electra bench
def cmd_bench(args: argparse.Namespace, extra: list[str]) -> int:
    from electra.bench import run_benchmark

    return run_benchmark(args.name, extra)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="electra", description=__doc__)
    p.add_argument("--log-level", default=os.environ.get("ELECTRA_LOG_LEVEL", "INFO"))
    sub = p.add_subparsers(dest="cmd", required=True)

    n = sub.add_parser("node", help="run one Raft node")
    n.add_argument("--id", type=int, required=True)
    n.add_argument("--peers", type=parse_peers, required=True, help="ID=HOST:PORT,... raft addresses of all members")
    n.add_argument("--client-addr", type=parse_addr, default=("127.0.0.1", 0))
    n.add_argument("--data-dir", required=True)
    n.add_argument("--state-machine", choices=["kv", "counter"], default="kv")
    n.add_argument("--tick-ms", type=int, default=100)
    n.add_argument("--snapshot-entries", type=int, default=100_000, help="snapshot every N applied entries")
    n.add_argument("--compaction-slack", type=int, default=5000, help="log entries kept behind a snapshot")
    n.add_argument("--unsafe-no-fsync", action="store_true", help="benchmarks only: acks before data is durable")
    n.set_defaults(fn=cmd_node)

    u = sub.add_parser("up", help="run a local cluster (Ctrl-C stops it)")
    u.add_argument("--nodes", type=int, default=3, choices=[1, 3, 5])
    u.add_argument("--data-dir", default=".electra/local")
    u.add_argument("--raft-port", type=int, default=7101)
    u.add_argument("--client-port", type=int, default=7201)
    u.add_argument("--demo-writes", type=int, default=1000, help="replicated writes to issue once a leader exists")
    u.add_argument("--exit-after-demo", action="store_true")
    u.set_defaults(fn=cmd_up)

    s = sub.add_parser("sim", help="deterministic simulation with fault injection")
    s.add_argument("--seeds", type=int, default=100)
    s.add_argument("--start", type=int, default=0)
    s.add_argument("--seed", type=int, help="replay exactly one seed")
    s.add_argument("--nodes", type=int, default=3)
    s.add_argument("--duration-ms", type=int, default=3000)
    s.add_argument("--keep-going", action="store_true")
    s.set_defaults(fn=cmd_sim)

    b = sub.add_parser("bench", help="run a benchmark from bench/ (ends with a RESULT line)")
    b.add_argument("name")
    b.set_defaults(fn=None)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.cmd == "bench":
        return cmd_bench(args, extra)
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
