"""`electra bench flood`: how late the leader's Raft ticks run while hostile HTTP clients flood it.

Three `electra node` processes as deployed (HTTPS, role tokens; 100 ms ticks, elections after
1-2 s). After a quiet phase, the leader's HTTP API is flooded for `--duration` seconds with
everything issue #15's probe used, by holders of valid credentials (a broker token for the
heartbeats, an observer's for the reads and watchers: what reaches the handlers; an
anonymous client is refused before): bodies announcing 100 MB, heartbeats from
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
from electra.security.credentials import ClientCredentials

from .common import bench_credentials, result_line, start_controller_processes, stop_processes


class NoLeader(RuntimeError):
    pass


def _metadata(ep: str, creds: ClientCredentials) -> dict | None:
    req = urllib.request.Request(f"{creds.scheme}://{ep}/v1/admin/metadata", headers=creds.headers())
    try:
        with urllib.request.urlopen(req, timeout=2, context=creds.ssl_context()) as r:
            return json.loads(r.read())
    except OSError:
        return None


def _leader(endpoints: list[str], creds: ClientCredentials, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout  # bounded: a loaded machine imports and elects in seconds
    while time.monotonic() < deadline:
        for ep in endpoints:
            md = _metadata(ep, creds)
            if md and md["is_leader"] and md["commit_index"] >= 1:
                return {**md, "ep": ep}
        time.sleep(0.1)
    raise NoLeader(f"no controller reported itself leader within {timeout:.0f}s")


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def _flood(ep: str, duration: float, concurrency: int, counts: dict[str, int], broker: ClientCredentials,
                 observer: ClientCredentials) -> None:
    import logging

    import httpx

    logging.getLogger("httpx").setLevel(logging.WARNING)
    host, port = ep.split(":")
    stop = time.monotonic() + duration

    def count(status: int) -> None:
        key = "5xx_unintended" if status >= 500 and status not in (503, 504) else f"{status // 100}xx"
        counts[key] = counts.get(key, 0) + 1

    def until_stop() -> asyncio.Timeout:
        """A bound at the flood's end on one wait: the stop time is only checked between requests, and a
        slowloris waited its full 15 s (a 3 s flood took 11 s)."""
        return asyncio.timeout(max(0.0, stop - time.monotonic()))

    def failed(exc: BaseException) -> None:
        if not (isinstance(exc, TimeoutError) and time.monotonic() >= stop):  # cut short by the end: no error
            counts["conn_errors"] = counts.get("conn_errors", 0) + 1

    async def raw(data: bytes) -> None:
        try:
            async with asyncio.timeout(15), until_stop():
                reader, writer = await asyncio.open_connection(host, int(port), ssl=broker.ssl_context())
                try:
                    writer.write(data)
                    reply = await reader.read(200)
                finally:
                    writer.close()
            if reply[:9] == b"HTTP/1.1 ":
                count(int(reply[9:12]))
        except (OSError, TimeoutError) as exc:
            failed(exc)

    async def big_bodies() -> None:
        head = (b"POST /v1/heartbeat HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 100000000\r\n\r\n")
        while time.monotonic() < stop:
            await raw(head + b"[" * (1 << 20))

    async def slowloris() -> None:
        while time.monotonic() < stop:
            await raw(b"POST /v1/heartbeat HTTP/1.1\r\nHost: x\r\nX-A: ")  # never finishes its head

    async def heartbeats(client: httpx.AsyncClient, k: int) -> None:  # a broker's credential
        while time.monotonic() < stop:
            body = {"clusterName": "c", "brokerName": f"flood-{k % 50}", "brokerAddr": f"10.9.0.{k % 250}:1",
                    "brokerId": 1 + k % 3, "epoch": 1, "maxOffset": k}
            try:
                async with until_stop():
                    count((await client.post("/v1/heartbeat", json=body)).status_code)
            except (httpx.HTTPError, TimeoutError) as exc:
                failed(exc)

    async def big_reads(client: httpx.AsyncClient) -> None:
        names = [f"flood-{k}" for k in range(10_000)]
        while time.monotonic() < stop:
            try:
                async with until_stop():
                    count((await client.post("/v1/admin/sync-state-data", json={"brokerNames": names})).status_code)
            except (httpx.HTTPError, TimeoutError) as exc:
                failed(exc)

    async def watcher(client: httpx.AsyncClient) -> None:
        try:
            async with until_stop(), client.stream("GET", "/v1/broker-sets/flood-0/watch") as resp:
                count(resp.status_code)
                if resp.status_code == 200:
                    await asyncio.sleep(max(0.0, stop - time.monotonic()))
        except (httpx.HTTPError, TimeoutError) as exc:
            failed(exc)

    def client(creds: ClientCredentials, connections: int) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=f"{creds.scheme}://{ep}", timeout=20, headers=creds.headers(),
                                 verify=creds.ssl_context() or False,
                                 limits=httpx.Limits(max_connections=connections,
                                                     max_keepalive_connections=connections))

    async with client(broker, concurrency) as brokers, client(observer, 310) as observers:
        await asyncio.gather(*(big_bodies() for _ in range(4)), *(slowloris() for _ in range(50)),
                             *(heartbeats(brokers, k) for k in range(concurrency)),
                             *(big_reads(observers) for _ in range(3)), *(watcher(observers) for _ in range(300)))


def main(argv: list[str]) -> int:
    ap = Parser(prog="electra bench flood", description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, minimum=1, default=15.0, help="seconds of flood (default 15)")
    ap.add_argument("--concurrency", type=int, minimum=1, default=100, help="heartbeat clients (default 100)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="electra-flood-") as tmp:
        procs, endpoints = start_controller_processes(Path(tmp), ("--tick-ms", "100"))
        creds = bench_credentials(Path(tmp))
        broker, observer = creds.credentials("broker"), creds.credentials("observer")
        try:
            leader = _leader(endpoints, observer)
            time.sleep(11)  # a quiet phase: 100 ticks with nothing but Raft
            quiet = _metadata(leader["ep"], observer)
            if quiet is None:
                raise NoLeader(f"the leader at {leader['ep']} stopped answering before the flood")
            term0 = quiet["term"]
            pid = procs[endpoints.index(leader["ep"])].pid
            counts: dict[str, int] = {}
            t0 = time.monotonic()
            asyncio.run(_flood(leader["ep"], args.duration, args.concurrency, counts, broker, observer))
            flood_s = time.monotonic() - t0
            after = _leader(endpoints, observer)
            flood = _metadata(leader["ep"], observer) or {}
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
        except NoLeader as exc:
            print(f"error: {exc}")
            return 1
        finally:
            stop_processes(procs)
    return 0
