"""`electra bench controller`: simulated brokers issuing the real request mix over HTTP.

Starts 3 `electra node` controller processes on loopback (fsync on), registers
`--brokers` brokers (sets of 3) the RocketMQ way, then runs every broker as a
closed loop for `--duration` seconds: register with a new address (a write
through the log), replica info (a consistent read), next broker id (a
consistent read), and a heartbeat to every controller once a second. Reports
throughput and p50/p99 latency per request type.

Each register changes the broker's address (its port, as `bench api`'s writes
do): a RegisterBroker with an unchanged address is answered by a linearizable
read and adds nothing to the log, so re-registering the same address measured
reads (write_per_s and write_p99_ms of runs before this change).
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

from electra.cli_args import Parser
from electra.interrupts import run_async

from .common import bench_credentials, percentile, result_line, start_controller_processes, stop_processes


def write_address(addr: str, n: int) -> str:
    """The address a broker registers with on its `n`-th write: `addr`'s host, another port each time (20000 up,
    never the 10911 the fleet registers with), so every RegisterBroker changes the address and is a log entry."""
    return f"{addr.rsplit(':', 1)[0]}:{20_000 + n % 40_000}"


async def _load(endpoints: list[str], brokers: int, duration: float, creds=None) -> dict:
    from electra.api.client import ControllerClient
    from electra.broker_simulator import BrokerFleet

    fleet = BrokerFleet(endpoints, max(1, brokers // 3), 3, cluster="bench", heartbeat_s=1.0, poll_s=3600,
                        credentials=creds.credentials("broker") if creds else None)
    try:
        t0 = time.monotonic()
        await fleet.start(progress=True)
        print(f"  {len(fleet.brokers)} brokers registered in {time.monotonic() - t0:.1f}s", flush=True)
        client: ControllerClient = fleet.client
        lat: dict[str, list[float]] = {"register": [], "replica_info": [], "next_broker_id": [], "heartbeat": []}
        errors = dict.fromkeys(lat, 0)
        stop = time.monotonic() + duration

        async def timed(kind: str, coro) -> None:
            t = time.perf_counter()
            try:
                res = await coro
                if res.get("code") != 0:
                    errors[kind] += 1
            except Exception:
                errors[kind] += 1
                return
            lat[kind].append(time.perf_counter() - t)

        async def broker_loop(b) -> None:
            next_hb = time.monotonic()
            writes = 0
            while time.monotonic() < stop:
                if time.monotonic() >= next_hb:
                    next_hb += 1.0
                    await timed("heartbeat", client.heartbeat(b.cluster, b.name, b.broker_id, b.addr, epoch=1,
                                                              maxOffset=b.max_offset))
                writes += 1  # a new address: a write through the log (the same one is answered by a read)
                b.addr = write_address(b.addr, writes)  # heartbeats then report the address registered last
                await timed("register", client.register(b.cluster, b.name, b.broker_id, b.addr))
                await timed("replica_info", client.replica_info(b.name))
                await timed("next_broker_id", client.next_broker_id(b.cluster, b.name))

        for t in fleet._tasks:  # the fleet's own background loops would add unmeasured traffic
            t.cancel()
        await asyncio.gather(*(broker_loop(b) for b in fleet.brokers))
    finally:  # cancelled too (an interrupt): the fleet's HTTP session closed, no 'Unclosed connector' dump
        await fleet.stop()
    return {"lat": lat, "errors": errors}


def main(argv: list[str]) -> int:
    p = Parser(prog="electra bench controller", description=__doc__)
    p.add_argument("--brokers", type=int, minimum=1, maximum=200_000, default=1000,
                   help="simulated brokers (default 1000)")
    p.add_argument("--duration", type=float, minimum=1, default=10.0, help="seconds measured (default 10)")
    args = p.parse_args(argv)
    print(f"bench controller: 3 controller processes (fsync on), {args.brokers} simulated brokers over HTTP, "
          f"{args.duration:.0f}s closed loop (register with a new address: a write / replica info / next id, "
          "heartbeats every second)",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-controller-") as tmp:
        procs, endpoints = start_controller_processes(Path(tmp))
        try:
            time.sleep(3.0)
            out = run_async(_load(endpoints, args.brokers, args.duration, bench_credentials(Path(tmp))))
        finally:
            stop_processes(procs)
    lat, errors = out["lat"], out["errors"]
    for kind, values in lat.items():
        values.sort()
        print(f"  {kind:>15}: {len(values) / args.duration:>9,.0f}/s  p50 {1000 * percentile(values, 0.5):7.1f} ms"
              f"  p99 {1000 * percentile(values, 0.99):7.1f} ms  errors {errors[kind]}", flush=True)
    writes = sorted(lat["register"])
    reads = len(lat["replica_info"]) + len(lat["next_broker_id"])
    print(result_line(brokers=args.brokers, write_per_s=round(len(writes) / args.duration),
                      read_per_s=round(reads / args.duration),
                      write_p99_ms=round(1000 * percentile(writes, 0.99), 1)))
    return 0
