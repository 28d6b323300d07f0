"""`electra bench dashboard`: what dashboard viewers cost the node that serves them, and the leader.

Starts 3 `electra node` controller processes on loopback, registers `--sets` broker
sets of 3 (then stops the brokers, so the nodes are otherwise idle), and measures the
CPU time of a follower and of the leader (from /proc) over `--window` seconds with 0,
1 and `--viewers` SSE viewers on the follower's `/v1/dashboard/stream`, plus the bytes
each viewer receives. Per-viewer CPU is the slope between 1 and N viewers; the feed's
own cost (one frame per second, whatever the number of viewers) is 1 viewer minus none.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

from electra.cli_args import Parser
from electra.interrupts import run_async

from .common import bench_credentials, result_line, start_controller_processes, stop_processes

TICKS = os.sysconf("SC_CLK_TCK")
TICK_MS = 1000 / TICKS  # /proc counts CPU time in these steps (10 ms)
MIN_WINDOW_S = 5.0


def per_viewer_cpu(one: float, many: float, viewers: int, window: float) -> tuple[float, str | None]:
    """CPU ms per second per viewer, the slope from 1 viewer to `viewers`, and a note when it is within the
    measurement's resolution: each CPU rate comes from two /proc readings in TICK_MS steps, so the difference of
    two rates is uncertain by up to 2 ticks per `window`, divided by the viewers added. A negative slope within
    that is 0 (a window of 2 s with 2 viewers printed -5.000); one beyond it is the machine's noise, nan."""
    slope = (many - one) / (viewers - 1)
    resolution = 2 * TICK_MS / window / (viewers - 1)
    if slope < -resolution:
        return float("nan"), (f"cpu_ms_per_s_per_viewer: the follower's CPU fell by {-slope:.3f} ms/s per viewer "
                              f"added, beyond the measurement's resolution (±{resolution:.3f}): the machine's noise "
                              "exceeded the viewers' cost; a longer --window or more --viewers")
    if abs(slope) <= resolution:
        return max(slope, 0.0), (f"cpu_ms_per_s_per_viewer: {slope:.3f} ms/s is within the measurement's resolution "
                                 f"(±{resolution:.3f}: /proc counts CPU in {TICK_MS:g} ms steps, over --window "
                                 f"{window:g} s and {viewers - 1} viewers added)"
                                 + ("; reported as 0" if slope < 0 else ""))
    return slope, None


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def _session(creds):
    """An HTTP session with the observer's token and the cluster CA (the nodes are secure)."""
    import aiohttp

    return aiohttp.ClientSession(headers=creds.headers(),
                                 connector=aiohttp.TCPConnector(ssl=creds.ssl_context() or False))


async def _viewer(endpoint: str, received: list[int], i: int, stop: asyncio.Event, creds) -> None:
    async with _session(creds) as s, s.get(f"{creds.scheme}://{endpoint}/v1/dashboard/stream") as r:
        async for chunk in r.content.iter_any():
            received[i] += len(chunk)
            if stop.is_set():
                return


async def _measure(endpoint: str, pids: dict[str, int], viewers: int, window: float, creds) -> dict:
    received = [0] * viewers
    stop = asyncio.Event()
    tasks = [asyncio.create_task(_viewer(endpoint, received, i, stop, creds)) for i in range(viewers)]
    await asyncio.sleep(3.0 if viewers else 1.0)  # connect, first frames
    start_bytes = list(received)
    cpu0 = {k: cpu_seconds(p) for k, p in pids.items()}
    t0 = time.monotonic()
    await asyncio.sleep(window)
    dt = time.monotonic() - t0
    cpu = {k: (cpu_seconds(p) - cpu0[k]) / dt * 1000 for k, p in pids.items()}  # ms of CPU per second
    per_viewer_bytes = [(b - a) / dt for a, b in zip(start_bytes, received, strict=True)]
    stop.set()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return {"cpu_ms_per_s": cpu,
            "bytes_per_s_per_viewer": sum(per_viewer_bytes) / viewers if viewers else 0.0}


async def _run(args: argparse.Namespace, endpoints: list[str], procs, creds) -> dict:
    from electra.api.client import ControllerClient
    from electra.broker_simulator import BrokerFleet

    observer = creds.credentials("observer")
    client = ControllerClient(endpoints, credentials=observer)
    try:
        deadline = time.monotonic() + 30
        while (leader := await client.find_leader()) is None:
            assert time.monotonic() < deadline, "no leader within 30 s"
            await asyncio.sleep(0.2)
    finally:
        await client.close()
    follower = next(i for i in range(1, len(endpoints) + 1) if i != leader)
    fleet = BrokerFleet(endpoints, args.sets, 3, cluster="bench", poll_s=3600,
                        credentials=creds.credentials("broker"))
    t0 = time.monotonic()
    try:
        await fleet.start(progress=True)
    finally:  # the brokers stop: only the dashboard works now (interrupted too: the fleet's sessions closed)
        await fleet.stop()
    print(f"  {args.sets} broker sets registered in {time.monotonic() - t0:.1f}s; leader node {leader}, "
          f"viewers on node {follower}", flush=True)
    pids = {"follower": procs[follower - 1].pid, "leader": procs[leader - 1].pid}
    ep = endpoints[follower - 1]
    await asyncio.sleep(5.0)  # let the registration's applies, snapshots and fsyncs settle
    out = {}
    for n in (0, 1, args.viewers, "0 again"):  # idle twice: the spread shows the machine's noise
        out[n] = await _measure(ep, pids, 0 if n == "0 again" else n, args.window, observer)
        print(f"  {n!s:>7} viewers: follower {out[n]['cpu_ms_per_s']['follower']:.1f} ms CPU/s, leader "
              f"{out[n]['cpu_ms_per_s']['leader']:.1f} ms CPU/s, {out[n]['bytes_per_s_per_viewer']:.0f} B/s per viewer",
              flush=True)
    import json

    async with _session(observer) as s, s.get(f"{observer.scheme}://{ep}/v1/dashboard/frame") as r:
        frame = await r.json()
    print("  frame bytes by part: " + ", ".join(f"{k} {len(json.dumps(v, separators=(',', ':')))}"
                                             for k, v in frame.items()), flush=True)
    return out


def main(argv: list[str]) -> int:
    p = Parser(prog="electra bench dashboard", description=__doc__)
    p.add_argument("--sets", type=int, minimum=1, maximum=100_000, default=1000,
                   help="broker sets (of 3 brokers) registered first")
    p.add_argument("--viewers", type=int, minimum=2, default=20,
                   help="SSE viewers in the last measurement (default 20; at least 2: the per-viewer cost is the "
                        "slope between 1 viewer and this many)")
    p.add_argument("--window", type=float, minimum=MIN_WINDOW_S, default=10.0,
                   help=f"seconds each measurement lasts (default 10; at least {MIN_WINDOW_S:g}: /proc counts CPU "
                        f"in {TICK_MS:g} ms steps, so each CPU figure is uncertain by {TICK_MS:g} ms per window, "
                        f"{TICK_MS / MIN_WINDOW_S:g} ms/s at {MIN_WINDOW_S:g} s; a per-viewer figure within that "
                        "is flagged on stderr)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="electra-bench-dashboard-") as tmp:
        procs, endpoints = start_controller_processes(tmp, ("--tick-ms", "100"))
        try:
            out = run_async(_run(args, endpoints, procs, bench_credentials(tmp)))
        finally:
            stop_processes(procs)
    n = args.viewers
    f = {k: v["cpu_ms_per_s"]["follower"] for k, v in out.items()}
    idle = (f[0] + f["0 again"]) / 2
    per_viewer, note = per_viewer_cpu(f[1], f[n], n, args.window)
    if note:
        print(note, file=sys.stderr)
    print(result_line(sets=args.sets, viewers=n, follower_idle_cpu_ms_per_s=round(idle, 1),
                      follower_idle_spread_ms_per_s=round(abs(f[0] - f["0 again"]), 1),
                      feed_cpu_ms_per_s=round(f[1] - idle, 1), cpu_ms_per_s_per_viewer=round(per_viewer, 2),
                      bytes_per_s_per_viewer=round(out[n]["bytes_per_s_per_viewer"]),
                      leader_cpu_ms_per_s_no_viewer=round(out[0]["cpu_ms_per_s"]["leader"], 1),
                      leader_cpu_ms_per_s_with_viewers=round(out[n]["cpu_ms_per_s"]["leader"], 1)))
    return 0
