"""`electra bench ingest`: heartbeats per second per API core.

Starts one controller node process (a single-member cluster: heartbeats never
touch Raft) and drives `POST /v1/heartbeat` from a separate load process with
`--concurrency` requests in flight for `--duration` seconds, as `--brokers`
distinct brokers. The API process's CPU time is read from /proc, so the result
is heartbeats per second per core the API actually used, whether or not the
load generator could saturate it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .common import free_ports, result_line, stop_processes


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _load(ep: str, brokers: int, concurrency: int, duration: float) -> tuple[int, int]:
    import aiohttp

    ok = errors = 0
    stop = time.monotonic() + duration
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as http:
        async def worker(w: int) -> None:
            nonlocal ok, errors
            k = w
            while time.monotonic() < stop:
                b = k % brokers
                k += concurrency
                body = {"clusterName": "bench", "brokerName": f"set-{b // 3}", "brokerId": b % 3 + 1,
                        "brokerAddr": f"10.0.{b // 250 % 250}.{b % 250}:10911", "epoch": 1, "maxOffset": k}
                try:
                    async with http.post(f"http://{ep}/v1/heartbeat", json=body) as r:
                        await r.read()
                        ok += r.status == 200
                        errors += r.status != 200
                except aiohttp.ClientError:
                    errors += 1

        await asyncio.gather(*(worker(w) for w in range(concurrency)))
    return ok, errors


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="electra bench ingest", description=__doc__)
    p.add_argument("--brokers", type=int, default=30_000)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--duration", type=float, default=10.0)
    args = p.parse_args(argv)
    raft, http = free_ports(2)
    ep = f"127.0.0.1:{http}"
    print(f"bench ingest: one controller API process, {args.concurrency} heartbeats in flight from a separate "
          f"process, {args.brokers} distinct brokers, {args.duration:.0f}s", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        proc = subprocess.Popen([sys.executable, "-m", "electra.cli", "--log-level", "WARNING", "node", "--id", "1",
                                 "--peers", f"1=127.0.0.1:{raft}", "--http-addr", ep, "--data-dir", tmp],
                                stdout=subprocess.DEVNULL)
        try:
            time.sleep(2.0)
            asyncio.run(_load(ep, args.brokers, args.concurrency, 1.0))  # warm-up
            cpu0, t0 = _cpu_seconds(proc.pid), time.monotonic()
            ok, errors = asyncio.run(_load(ep, args.brokers, args.concurrency, args.duration))
            cpu = _cpu_seconds(proc.pid) - cpu0
            wall = time.monotonic() - t0
        finally:
            stop_processes([proc])
    rate = ok / wall
    cores = cpu / wall
    print(f"  {rate:,.0f} heartbeats/s accepted, {errors} errors; API process used {cores:.2f} cores", flush=True)
    print(result_line(hb_ingest_per_s_per_core=round(rate / max(cores, 1e-9)), hb_per_s=round(rate),
                      api_cores_used=round(cores, 2)))
    return 0
