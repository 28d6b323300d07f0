"""`electra bench flood`: how late the leader's Raft ticks run while hostile HTTP clients flood it.

Three `electra node` processes (100 ms ticks, elections after 1-2 s). After a quiet
phase, a separate load process floods the leader's HTTP API for `--duration` seconds
with everything issue #15's probe used: bodies announcing 100 MB, heartbeats from
`--concurrency` clients, SSE watchers beyond the per-node cap, 10,000-set
sync-state reads and slowloris connections that never finish their heads. Each node
keeps how late its last 100 ticks ran (`tick_late_p99_ms`, `tick_late_max_ms` in
`/v1/admin/metadata`), so the figures below cover the quiet phase and the flood's last
10 s. Leadership changes during the flood are counted from the nodes' terms.
Last line: `RESULT flood_tick_late_p99_ms=<n> flood_tick_late_max_ms=<n> leader_changes=<n> ...`.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
import urllib.request
from pathlib import Path

from electra.cli_args import Parser

from .common import result_line, start_controller_processes, stop_processes


def _metadata(ep: str) -> dict | None:
    try:
        with urllib.request.urlopen(f"http://{ep}/v1/admin/metadata", timeout=2) as r:
            return json.loads(r.read())
    except OSError:
        return None


def _leader(endpoints: list[str], timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for ep in endpoints:
            md = _metadata(ep)
            if md and md["is_leader"] and md["commit_index"] >= 1:
                return {**md, "ep": ep}
        time.sleep(0.1)
    raise RuntimeError("no leader")


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def _flood(ep: str, duration: float, concurrency: int, counts: dict[str, int]) -> None:
    import logging

    import httpx

    logging.getLogger("httpx").setLevel(logging.WARNING)
    host, port = ep.split(":")
    stop = time.monotonic() + duration

    def count(status: int) -> None:
        key = "5xx_unintended" if status >= 500 and status not in (503, 504) else f"{status // 100}xx"
        counts[key] = counts.get(key, 0) + 1

    async def raw(data: bytes) -> None:
        try:
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(data)
            reply = await asyncio.wait_for(reader.read(200), 15)
            writer.close()
            if reply[:9] == b"HTTP/1.1 ":
                count(int(reply[9:12]))
        except (OSError, TimeoutError):
            counts["conn_errors"] = counts.get("conn_errors", 0) + 1

    async def big_bodies() -> None:
        head = (b"POST /v1/heartbeat HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 100000000\r\n\r\n")
        while time.monotonic() < stop:
            await raw(head + b"[" * (1 << 20))

    async def slowloris() -> None:
        while time.monotonic() < stop:
            await raw(b"POST /v1/heartbeat HTTP/1.1\r\nHost: x\r\nX-A: ")  # never finishes its head

    async def heartbeats(client: httpx.AsyncClient, k: int) -> None:
        while time.monotonic() < stop:
            body = {"clusterName": "c", "brokerName": f"flood-{k % 50}", "brokerAddr": f"10.9.0.{k % 250}:1",
                    "brokerId": 1 + k % 3, "epoch": 1, "maxOffset": k}
            try:
                count((await client.post("/v1/heartbeat", json=body)).status_code)
            except httpx.HTTPError:
                counts["conn_errors"] = counts.get("conn_errors", 0) + 1

    async def big_reads(client: httpx.AsyncClient) -> None:
        names = [f"flood-{k}" for k in range(10_000)]
        while time.monotonic() < stop:
            try:
                count((await client.post("/v1/admin/sync-state-data", json={"brokerNames": names})).status_code)
            except httpx.HTTPError:
                counts["conn_errors"] = counts.get("conn_errors", 0) + 1

    async def watcher(client: httpx.AsyncClient) -> None:
        try:
            async with client.stream("GET", "/v1/broker-sets/flood-0/watch") as resp:
                count(resp.status_code)
                if resp.status_code == 200:
                    await asyncio.sleep(max(0.0, stop - time.monotonic()))
        except httpx.HTTPError:
            counts["conn_errors"] = counts.get("conn_errors", 0) + 1

    limits = httpx.Limits(max_connections=concurrency + 400, max_keepalive_connections=concurrency + 400)
    async with httpx.AsyncClient(base_url=f"http://{ep}", timeout=20, limits=limits) as client:
        await asyncio.gather(*(big_bodies() for _ in range(4)), *(slowloris() for _ in range(50)),
                             *(heartbeats(client, k) for k in range(concurrency)),
                             *(big_reads(client) for _ in range(3)), *(watcher(client) for _ in range(300)))


def main(argv: list[str]) -> int:
    ap = Parser(prog="electra bench flood", description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, minimum=1, default=15.0, help="seconds of flood (default 15)")
    ap.add_argument("--concurrency", type=int, minimum=1, default=100, help="heartbeat clients (default 100)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="electra-flood-") as tmp:
        procs, endpoints = start_controller_processes(Path(tmp), ("--tick-ms", "100"))
        try:
            leader = _leader(endpoints)
            time.sleep(11)  # a quiet phase: 100 ticks with nothing but Raft
            quiet = _metadata(leader["ep"])
            term0 = quiet["term"]
            pid = procs[endpoints.index(leader["ep"])].pid
            counts: dict[str, int] = {}
            t0 = time.monotonic()
            asyncio.run(_flood(leader["ep"], args.duration, args.concurrency, counts))
            flood_s = time.monotonic() - t0
            after = _leader(endpoints)
            flood = _metadata(leader["ep"]) or {}
            print(f"quiet: tick lateness p99 {quiet['tick_late_p99_ms']} ms, max {quiet['tick_late_max_ms']} ms")
            print(f"flood ({flood_s:.1f}s): tick lateness p99 {flood.get('tick_late_p99_ms')} ms, "
                  f"max {flood.get('tick_late_max_ms')} ms; responses {counts}")
            print(f"leader {leader['node_id']} term {term0} -> leader {after['node_id']} term {after['term']}")
            print(result_line(flood_tick_late_p99_ms=flood.get("tick_late_p99_ms"),
                              flood_tick_late_max_ms=flood.get("tick_late_max_ms"),
                              quiet_tick_late_p99_ms=quiet["tick_late_p99_ms"],
                              leader_changes=after["term"] - term0,
                              http_5xx_unintended=counts.get("5xx_unintended", 0),
                              leader_peak_rss_mib=round(_peak_rss_mib(pid), 1)))
        finally:
            stop_processes(procs)
    return 0
