"""Worker processes for `electra bench raft`: one Raft member each, Electra or PySyncObj.

Every worker starts its node, waits until the agreed wall-clock start time, and
if it is the leader then drives the load itself: `--clients` concurrent clients,
each keeping exactly one 64-byte proposal in flight (a closed loop, callbacks
rather than coroutines so the load generator costs as little as possible, for
both systems alike). The leader prints `RESULT_JSON {...}`; followers print their
role and keep serving until the parent stops them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time
from pathlib import Path

from electra.cli_args import Parser


def _report(obj: dict) -> None:
    print("RESULT_JSON " + json.dumps(obj), flush=True)


def _summary(lat: list[float], done: int, seconds: float, **extra) -> dict:
    lat.sort()
    n = len(lat)
    return {
        "role": "leader", "commits": done, "seconds": seconds, "commits_per_s": done / seconds,
        "p50_ms": 1000 * lat[n // 2] if n else None, "p99_ms": 1000 * lat[min(n - 1, int(n * 0.99))] if n else None,
        **extra,
    }


# --------------------------------------------------------------------------- Electra
def electra_worker(args: argparse.Namespace) -> None:
    from electra.consensus.core import RaftConfig
    from electra.consensus.errors import RaftError
    from electra.consensus.kv import CounterStateMachine
    from electra.consensus.node import NodeConfig, RaftNode

    peers = {i + 1: ("127.0.0.1", p) for i, p in enumerate(args.ports)}
    cfg = NodeConfig(node_id=args.id, peers=peers, data_dir=Path(args.data_dir) / f"n{args.id}",
                     fsync=not args.no_fsync,
                     raft=RaftConfig(election_ticks=10, heartbeat_ticks=1, max_inflight=args.inflight))

    async def main() -> None:
        node = RaftNode(cfg, CounterStateMachine())
        await node.start()
        await asyncio.sleep(max(0.0, args.start_at - time.time()))
        for _ in range(50):  # give a late election a moment
            if node.leader_id:
                break
            await asyncio.sleep(0.1)
        if not node.is_leader:
            _report({"role": "follower", "id": args.id})
            await asyncio.Event().wait()
        cmd = os.urandom(args.size)
        lat: list[float] = []
        state = {"done": 0, "errors": 0, "measuring": False, "stop": False}
        loop = asyncio.get_running_loop()
        perf = time.perf_counter

        def issue() -> None:
            if state["stop"]:
                return
            t0 = perf()
            try:
                fut = node.propose_future(cmd)
            except RaftError:
                state["errors"] += 1
                loop.call_later(0.01, issue)
                return
            fut.add_done_callback(lambda f, t0=t0: finished(f, t0))

        def finished(fut: asyncio.Future, t0: float) -> None:
            if fut.exception() is not None:
                state["errors"] += 1
            elif state["measuring"]:
                state["done"] += 1
                lat.append(perf() - t0)
            issue()

        for _ in range(args.clients):
            issue()
        await asyncio.sleep(args.warmup)
        m0 = dict(node.metrics)
        state["measuring"] = True
        t0 = perf()
        await asyncio.sleep(args.duration)
        state["measuring"] = False
        elapsed = perf() - t0
        state["stop"] = True
        m1 = node.metrics
        batches = m1["batches"] - m0["batches"]
        fsyncs = m1["fsyncs"] - m0["fsyncs"]
        _report(_summary(lat, state["done"], elapsed, errors=state["errors"],
                         avg_batch=(m1["proposals"] - m0["proposals"]) / max(1, batches),
                         leader_fsyncs_per_s=fsyncs / elapsed, fsync=not args.no_fsync))
        await asyncio.sleep(0.5)
        await node.stop()

    asyncio.run(main())


# --------------------------------------------------------------------------- PySyncObj
def pysyncobj_worker(args: argparse.Namespace) -> None:
    from pysyncobj import SyncObj, SyncObjConf, replicated

    class Counter(SyncObj):
        def __init__(self, me: str, others: list[str], conf: SyncObjConf) -> None:
            super().__init__(me, others, conf=conf)
            self.value = 0

        @replicated
        def incr(self, payload: bytes) -> int:
            self.value += 1
            return self.value

    addrs = [f"127.0.0.1:{p}" for p in args.ports]
    me = addrs[args.id - 1]
    others = [a for a in addrs if a != me]
    conf = SyncObjConf(appendEntriesUseBatch=True, commandsQueueSize=max(100_000, args.clients * 4),
                       dynamicMembershipChange=False)
    obj = Counter(me, others, conf)
    time.sleep(max(0.0, args.start_at - time.time()))
    for _ in range(50):
        if obj._getLeader() is not None:
            break
        time.sleep(0.1)
    if not obj._isLeader():
        _report({"role": "follower", "id": args.id})
        threading.Event().wait()
    payload = os.urandom(args.size)
    lat: list[float] = []
    state = {"done": 0, "errors": 0, "measuring": False, "stop": False}
    lock = threading.Lock()
    perf = time.perf_counter

    def issue() -> None:
        if state["stop"]:
            return
        t0 = perf()
        obj.incr(payload, callback=lambda res, err, t0=t0: finished(err, t0))

    def finished(err, t0: float) -> None:
        with lock:
            if err != 0:  # FAIL_REASON.SUCCESS == 0
                state["errors"] += 1
            elif state["measuring"]:
                state["done"] += 1
                lat.append(perf() - t0)
        issue()

    for _ in range(args.clients):
        issue()
    time.sleep(args.warmup)
    state["measuring"] = True
    t0 = perf()
    time.sleep(args.duration)
    state["measuring"] = False
    elapsed = perf() - t0
    state["stop"] = True
    with lock:
        _report(_summary(lat, state["done"], elapsed, errors=state["errors"], fsync=False))
    sys.stdout.flush()
    os._exit(0)


def main(argv: list[str] | None = None) -> None:
    p = Parser()
    p.add_argument("system", choices=["electra", "pysyncobj"])
    p.add_argument("--id", type=int, required=True)
    p.add_argument("--ports", type=lambda s: [int(x) for x in s.split(",")], required=True)
    p.add_argument("--data-dir", required=True)
    p.add_argument("--start-at", type=float, required=True)
    p.add_argument("--clients", type=int, default=1000)
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--inflight", type=int, default=32)
    p.add_argument("--no-fsync", action="store_true")
    args = p.parse_args(argv)
    (electra_worker if args.system == "electra" else pysyncobj_worker)(args)


if __name__ == "__main__":
    main()
