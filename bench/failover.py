"""`electra bench failover`: master failover through the whole heartbeat pipeline.

For each G in `--groups` (a comma list, smallest first), one fresh local stack
(embedded Kafka, 3 controller processes, an ingest process per node, the Spark job
in local mode) and G simulated broker sets x 3 replicas heartbeating every second
over HTTP. Once every set has a master and a full sync-state set, heartbeats are
counted for `--measure` seconds (heartbeats accepted per second, against the
3G/s offered), then `--kill` masters are killed, one every `--kill-every`
seconds. Failover time = the moment the controllers' replica info shows a new
master minus the killed master's last accepted heartbeat; the floor is the
heartbeat timeout (`--timeout-ms`). A size is sustained when at least 95% of the
offered heartbeats were accepted and every killed master was replaced.

The last line describes the largest sustained size:
`RESULT groups=<n> hb_per_s=<n> timeout_s=<x> failover_p50_s=<x> failover_p99_s=<x>`.
Everything (load generator included) shares this machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import urllib.request
from pathlib import Path

from .common import free_ports, percentile, result_line


def _ingest_accepted(endpoints: list[str], creds) -> int:
    total = 0
    for ep in endpoints:
        try:
            req = urllib.request.Request(f"{creds.scheme}://{ep}/metrics", headers=creds.headers())
            text = urllib.request.urlopen(req, timeout=2, context=creds.ssl_context()).read().decode()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith('electra_ingest_heartbeats{result="accepted"}'):
                total += int(float(line.split()[-1]))
    return total


async def _run_size(groups: int, args, tmp: Path) -> dict:
    from electra.api.client import ControllerClient
    from electra.broker_simulator import BrokerFleet
    from electra.local_stack import LocalStack, StackConfig

    ports = free_ports(9)
    stack = LocalStack(StackConfig(data_dir=tmp, trigger_ms=args.trigger_ms, log_level="WARNING",
                                   ingest_workers=args.ingest_workers, job_args=["--log-level", "INFO"]))
    stack.raft_peers = ",".join(f"{i}=127.0.0.1:{ports[i - 1]}" for i in (1, 2, 3))
    stack.endpoints = {i: f"127.0.0.1:{ports[2 + i]}" for i in (1, 2, 3)}
    stack.ingest_endpoints = {i: f"127.0.0.1:{ports[5 + i]}" for i in (1, 2, 3)}
    endpoints = list(stack.endpoints.values())
    ingest = list(stack.ingest_endpoints.values())
    out: dict = {"groups": groups}
    t0 = time.monotonic()
    stack.start_kafka()
    stack.start_controllers()
    stack.start_job()
    observer = stack.creds.credentials("observer")  # the stack is secure: brokers and the bench have their roles
    client = ControllerClient(endpoints, deadline_s=30, max_connections=64, credentials=observer)
    fleet = BrokerFleet(endpoints, groups, 3, heartbeat_s=1.0, poll_s=5.0, timeout_ms=args.timeout_ms,
                        credentials=stack.creds.credentials("broker"),
                        ingest_endpoints=ingest)
    try:
        await fleet.start()
        print(f"  G={groups}: {groups} sets registered in {time.monotonic() - t0:.0f}s; waiting for the job and "
              "full sync-state sets", flush=True)
        deadline = time.monotonic() + args.settle
        names = sorted(fleet.by_set)
        while True:
            full = sum(1 for b in fleet.brokers if b.role == "master" and len(b.sync_state_set) == 3)
            if full == groups:
                break
            if time.monotonic() > deadline:
                print(f"  G={groups}: only {full}/{groups} sets reached a sync-state set of 3", flush=True)
                break
            await asyncio.sleep(1.0)
        a0, m0 = _ingest_accepted(ingest, observer), time.monotonic()
        await asyncio.sleep(args.measure)
        hb_rate = (_ingest_accepted(ingest, observer) - a0) / (time.monotonic() - m0)
        out["hb_per_s"] = hb_rate
        out["offered_hb_per_s"] = 3 * groups
        print(f"  G={groups}: {hb_rate:,.0f} heartbeats/s accepted of {3 * groups:,} offered", flush=True)
        victims = [n for n in names if fleet.master_of(n) is not None
                   and len(fleet.master_of(n).sync_state_set) == 3][: args.kill]
        killed: dict[str, tuple[int, int, float]] = {}
        for name in victims:
            m = fleet.master_of(name)
            fleet.kill(name, m.broker_id)
            killed[name] = (m.broker_id, m.master_epoch, m.last_heartbeat_at)
            await asyncio.sleep(args.kill_every)
        failovers: dict[str, float] = {}
        deadline = time.monotonic() + args.timeout_ms / 1000 * 3 + 60
        while len(failovers) < len(killed) and time.monotonic() < deadline:
            for name, (old, epoch, last_hb) in killed.items():
                if name in failovers:
                    continue
                r = await client.replica_info(name)
                h = r.get("header") or {}
                if (h.get("masterEpoch") or 0) > epoch and h.get("masterBrokerId") not in (None, old):
                    failovers[name] = time.time() - last_hb
            await asyncio.sleep(0.05)
        times = sorted(failovers.values())
        out["replaced"], out["killed"] = len(times), len(killed)
        out["failover_p50_s"] = percentile(times, 0.5) if times else float("nan")
        out["failover_p99_s"] = percentile(times, 0.99) if times else float("nan")
        out["failover_max_s"] = times[-1] if times else float("nan")
        print(f"  G={groups}: {len(times)}/{len(killed)} masters replaced; failover p50 {out['failover_p50_s']:.2f}s "
              f"p99 {out['failover_p99_s']:.2f}s max {out['failover_max_s']:.2f}s "
              f"(timeout {args.timeout_ms / 1000:.1f}s)", flush=True)
        out["batch_ms"] = _batch_ms(stack.logs / "streaming.log")
        out["sustained"] = hb_rate >= 0.95 * 3 * groups and len(times) == len(killed) > 0
        return out
    finally:
        await fleet.stop()
        await client.close()
        stack.stop_all()


def _batch_ms(log: Path) -> float:
    """Median Spark batch duration from the job's per-batch log lines (after the first three)."""
    vals = []
    for line in log.read_text(errors="replace").splitlines():
        if " batch_ms=" in line:
            vals.append(float(line.split(" batch_ms=")[1].split()[0]))
    vals = sorted(vals[3:])
    return percentile(vals, 0.5) if vals else float("nan")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="electra bench failover", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--groups", default="100,300,1000", help="broker set counts to try, smallest first")
    p.add_argument("--kill", type=int, default=10, help="masters killed per size")
    p.add_argument("--kill-every", type=float, default=1.0)
    p.add_argument("--timeout-ms", type=int, default=3000, help="the brokers' heartbeatTimeoutMillis")
    p.add_argument("--trigger-ms", type=int, default=1000, help="the Spark job's trigger interval")
    p.add_argument("--ingest-workers", type=int, default=1, help="ingest worker processes per node")
    p.add_argument("--measure", type=float, default=15.0, help="seconds of heartbeat counting")
    p.add_argument("--settle", type=float, default=180.0, help="max seconds to wait for full sync-state sets")
    args = p.parse_args(argv)
    sizes = [int(g) for g in args.groups.split(",") if g.strip()]
    print(f"bench failover: sizes {sizes}, {args.kill} masters killed per size, heartbeat timeout "
          f"{args.timeout_ms} ms, trigger {args.trigger_ms} ms", flush=True)
    results = []
    for g in sizes:
        with tempfile.TemporaryDirectory(prefix=f"bench-failover-{g}-") as tmp:
            r = asyncio.run(_run_size(g, args, Path(tmp)))
        results.append(r)
        print(f"  G={g}: {'sustained' if r['sustained'] else 'NOT sustained'}; median Spark batch "
              f"{r['batch_ms']:.0f} ms", flush=True)
        if not r["sustained"]:
            break
    print(f"{'groups':>7} {'offered/s':>10} {'accepted/s':>10} {'replaced':>9} {'p50_s':>6} {'p99_s':>6} "
          f"{'batch_ms':>8}")
    for r in results:
        print(f"{r['groups']:>7} {r['offered_hb_per_s']:>10,} {r['hb_per_s']:>10,.0f} "
              f"{r['replaced']:>4}/{r['killed']:<4} {r['failover_p50_s']:>6.2f} {r['failover_p99_s']:>6.2f} "
              f"{r['batch_ms']:>8.0f}")
    ok = [r for r in results if r["sustained"]]
    best = ok[-1] if ok else results[-1]
    print(result_line(groups=best["groups"] if ok else 0, hb_per_s=round(best["hb_per_s"]),
                      timeout_s=args.timeout_ms / 1000, failover_p50_s=round(best["failover_p50_s"], 2),
                      failover_p99_s=round(best["failover_p99_s"], 2)))
    return 0
