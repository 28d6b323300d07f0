"""`electra bench ingest`: heartbeats per second per API core, two ways, side by side in one run.

Both produce every heartbeat to Kafka (the embedded tansu):
* `ingest`: an `electra ingest` process (one worker; the hot path of the pipeline);
* `node`: a controller node's own FastAPI `POST /v1/heartbeat` with `--kafka-bootstrap`.

A separate load process keeps `--concurrency` requests in flight for `--duration`
seconds as `--brokers` distinct brokers. The server process's CPU time (its
worker children included) comes from /proc, so the result is heartbeats per second
per core the API actually used, whether or not the load generator saturated it
(the load generator, tansu and the server share this machine's cores).
Last line: `RESULT hb_ingest_per_s_per_core=<n> ...` (the `ingest` figure).
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

from electra.cli_args import Parser
from electra.local_ports import free_ports

from .common import result_line, stop_processes


def _cpu_seconds(pid: int) -> float:
    """CPU seconds of a process and its live children (uvicorn's workers)."""
    total = 0.0
    pids = [pid]
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        pids += [int(c) for c in children]
    except OSError:
        pass
    for p in pids:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


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
                    async with http.post(f"http://{ep}/v1/heartbeat", json=body,
                                         timeout=aiohttp.ClientTimeout(total=10)) as r:
                        await r.read()
                        ok += r.status == 200
                        errors += r.status != 200
                except (aiohttp.ClientError, TimeoutError):
                    errors += 1

        await asyncio.gather(*(worker(w) for w in range(concurrency)))
    return ok, errors


def _wait_http(ep: str, timeout: float = 30.0) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://{ep}/healthz", timeout=1).read()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{ep} did not answer /healthz within {timeout}s")


def _measure(name: str, cmd: list[str], ep: str, args) -> dict:
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_http(ep)
        asyncio.run(_load(ep, args.brokers, args.concurrency, 2.0))  # warm-up (producer metadata, JIT-free)
        cpu0, t0 = _cpu_seconds(proc.pid), time.monotonic()
        ok, errors = asyncio.run(_load(ep, args.brokers, args.concurrency, args.duration))
        cpu = _cpu_seconds(proc.pid) - cpu0
        wall = time.monotonic() - t0
    finally:
        stop_processes([proc])
    rate, cores = ok / wall, cpu / wall
    per_core = rate / max(cores, 1e-9)
    print(f"  {name:<6} {rate:>9,.0f} heartbeats/s accepted, {errors} errors, {cores:.2f} cores used "
          f"-> {per_core:,.0f} per core ({1e6 / per_core:.0f} us CPU per heartbeat)", flush=True)
    return {"rate": rate, "cores": cores, "per_core": per_core, "errors": errors}


def main(argv: list[str]) -> int:
    from electra.streaming.embedded_kafka import EmbeddedKafka
    from electra.streaming.kafka_io import ensure_topics
    from electra.streaming.records import Topics

    p = Parser(prog="electra bench ingest", description=__doc__,
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--brokers", type=int, minimum=1, maximum=1_000_000, default=30_000,
                   help="distinct brokers heartbeating (default 30000)")
    p.add_argument("--concurrency", type=int, minimum=1, default=64, help="connections (default 64)")
    p.add_argument("--duration", type=float, minimum=1, default=10.0, help="seconds measured (default 10)")
    args = p.parse_args(argv)
    print(f"bench ingest: {args.concurrency} heartbeats in flight from a separate process, {args.brokers} "
          f"distinct brokers, {args.duration:.0f}s per variant, Kafka = embedded tansu", flush=True)
    with EmbeddedKafka() as kafka, tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        ensure_topics(kafka.bootstrap, Topics().partitions())
        raft, http, ing = free_ports(3)
        py = [sys.executable, "-m", "electra.cli", "--log-level", "WARNING"]
        ingest = _measure("ingest", [*py, "ingest", "--listen", f"127.0.0.1:{ing}", "--kafka-bootstrap",
                                     kafka.bootstrap, "--workers", "1", "--insecure"], f"127.0.0.1:{ing}", args)
        node = _measure("node", [*py, "node", "--id", "1", "--peers", f"1=127.0.0.1:{raft}", "--http-addr",
                                 f"127.0.0.1:{http}", "--data-dir", tmp, "--kafka-bootstrap", kafka.bootstrap,
                                 "--insecure"],  # the same plaintext HTTP as the ingest side
                        f"127.0.0.1:{http}", args)
    print(result_line(hb_ingest_per_s_per_core=round(ingest["per_core"]), hb_per_s=round(ingest["rate"]),
                      api_cores_used=round(ingest["cores"], 2), node_api_per_s_per_core=round(node["per_core"]),
                      ratio=round(ingest["per_core"] / max(node["per_core"], 1e-9), 2)))
    return 0
