"""`electra report performance`: the old (RocketMQ 5) and the new architecture, side by side.

For each architecture (`electra node --architecture legacy|new`, docs/architectures.md) and each
broker count of the sweep, three fresh controller processes (fsync on, plaintext loopback HTTP:
TLS would cost both the same) serve one load-generator process (bench/broker_load.py): the
brokers register, heartbeat every second, and repeat their controller requests back to back for
`--duration` seconds. At the largest count a failover storm follows: 20% of the masters die at
once and the report times how long until every affected set has a new master committed.

Writes `performance.html` (self-contained: inline SVG, no script, no network), `performance.md`
and `performance.json` into `--out`, and ends with one line
`RESULT brokers=<n> new_per_s=<n> old_per_s=<n> new_vs_old=<x> new_p99_ms=<x> old_p99_ms=<x> storm_recovery_s=<x>`.
etcd is left out: no etcd launcher exists in this project yet, and etcd has no equivalent of
the broker requests beyond a plain KV put/range (see `electra bench api` when it lands).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from importlib import metadata as pkg
from pathlib import Path

from . import report_html as R
from .broker_load import BrokerLoad, HttpConn, Samples, get
from .common import percentile, process_tree_cpu_s, result_line, start_controller_processes, stop_processes

ARCHS = ("new", "legacy")
CONTROLLER_KINDS = ("replica_info", "alter_sync_state_set")  # the measured phase's controller requests


def _parse_sweep(text: str) -> list[int]:
    try:
        points = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad --brokers {text!r}: expected counts like 10,100,1000") from None
    if not points or points[0] < 3:
        raise argparse.ArgumentTypeError("--brokers: every point needs at least 3 brokers (one set)")
    return points


async def _find_leader(endpoints: list[str], timeout_s: float = 30.0) -> str:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        for ep in endpoints:
            conn = HttpConn()
            try:
                status, body = await conn.call(get(ep, "/v1/admin/metadata"), ep)
                if status == 200 and json.loads(body).get("is_leader"):
                    return ep
            except (OSError, ValueError):
                pass
            finally:
                conn.close()
        await asyncio.sleep(0.2)
    raise TimeoutError(f"no controller leader among {endpoints} within {timeout_s:.0f}s")


def _stats(samples: Samples, kinds: tuple[str, ...], seconds: float) -> dict:
    lat = sorted(lat for k in kinds for _, lat in samples.done.get(k, ()))
    return {"count": len(lat), "per_s": len(lat) / seconds if seconds else 0.0,
            "p50_ms": 1000 * percentile(lat, 0.5), "p99_ms": 1000 * percentile(lat, 0.99),
            "failed": sum(samples.failed.get(k, 0) for k in kinds),
            "cdf": [(1000 * lat[min(len(lat) - 1, int(q * len(lat)))], q)
                    for q in [i / 200 for i in range(200)]] if lat else []}


async def _drive(leader: str, brokers: int, args, storm: bool, server_pids: list[int]) -> dict:
    load = BrokerLoad(leader, brokers, heartbeat_timeout_ms=args.heartbeat_timeout_ms)
    load.follow_leader()
    load.start_heartbeats()
    register_s = await load.register_all()
    load.closed_loop = True
    load.samples = Samples(time.perf_counter())
    cpu = (time.process_time(), sum(process_tree_cpu_s(p) for p in server_pids))
    load.start_brokers()
    await asyncio.sleep(args.duration)
    cpu = (time.process_time() - cpu[0], sum(process_tree_cpu_s(p) for p in server_pids) - cpu[1])
    measured = load.samples
    out = {"brokers": len(load.brokers), "sets": len(load.sets), "register_s": register_s,
           "controller": _stats(measured, CONTROLLER_KINDS, args.duration),
           "heartbeat": _stats(measured, ("heartbeat",), args.duration),
           "load_cpu_s": cpu[0], "server_cpu_s": cpu[1], "failures": dict(measured.failure_statuses),
           "leader_changes": load.leader_changes}
    if storm:
        load.closed_loop = False  # brokers back to their real periods, then the storm
        await asyncio.sleep(2.0)
        load.samples = Samples(time.perf_counter())
        result = await load.storm(args.storm_fraction, args.storm_limit_s)
        s = load.samples
        timeline = {}
        for kind in ("heartbeat", "replica_info", "alter_sync_state_set", "elect_master"):
            for t, _ in s.done.get(kind, ()):
                b = int((t - result["t_kill"]) * 2) / 2
                timeline[b] = timeline.get(b, 0) + 1
        rec = sorted(result["recovered"].values())
        out["failures"].update({f"storm {k}": v for k, v in s.failure_statuses.items()})
        out["storm"] = {"sets": result["sets"], "unrecovered": len(result["unrecovered"]),
                        "recovery_s": round(max(rec), 2) if rec and not result["unrecovered"] else None,
                        "recovered_at": rec, "requests_per_s": sorted((t, 2 * n) for t, n in timeline.items())}
    await load.stop()
    return out


def _run_point(arch: str, brokers: int, args, storm: bool, tmp: Path) -> dict:
    extra = ("--architecture", arch, "--inactive-master-scan-ms", str(args.scan_ms))
    procs, endpoints = start_controller_processes(tmp / f"{arch}-{brokers}", extra, secure=False)
    try:
        leader = asyncio.run(_find_leader(endpoints))
        return asyncio.run(_drive(leader, brokers, args, storm, [p.pid for p in procs]))
    finally:
        stop_processes(procs)


def _machine() -> dict:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem = next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                   if line.startswith("MemTotal"))
        mem_gb = f"{int(mem) / 1024 / 1024:.1f} GiB"
    except (OSError, StopIteration):
        mem_gb = "unknown"
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent, timeout=5).stdout.strip() or "unknown"
    except (OSError, subprocess.TimeoutExpired):
        commit = "unknown"

    def version(name: str) -> str:
        try:
            return pkg.version(name)
        except pkg.PackageNotFoundError:
            return "absent"

    return {"host": platform.node(), "os": platform.platform(), "cpu": cpu, "cores": os.cpu_count(),
            "memory": mem_gb, "load_avg_at_start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
            "python": platform.python_version(), "electra": f"{version('electra')} (git {commit})",
            "uvicorn": version("uvicorn"), "fastapi": version("fastapi"), "msgpack": version("msgpack")}


def _write(out_dir: Path, report: dict) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "performance.json").write_text(json.dumps(report, indent=1))
    pts, settings, machine = report["points"], report["settings"], report["machine"]
    rows = []
    for arch in ARCHS:
        for p in pts[arch]:
            c, h = p["controller"], p["heartbeat"]
            rate = f"{c['per_s']:,.0f}" if c["per_s"] >= 10 else f"{c['per_s']:.1f}"
            rows.append([arch, p["brokers"], rate, f"{c['p50_ms']:.1f}", f"{c['p99_ms']:.1f}",
                         c["failed"], f"{h['per_s']:,.0f}", f"{h['p99_ms']:.1f}", f"{p['register_s']:.1f}",
                         f"{p['load_cpu_s']:.1f} / {p['server_cpu_s']:.1f}"])
    header = ["architecture", "brokers", "controller req/s", "p50 ms", "p99 ms", "failed", "heartbeats/s",
              "heartbeat p99 ms", "register all (s)", "CPU s: load gen / servers"]
    storms = [[arch, p["storm"]["sets"], p["storm"]["unrecovered"],
               "-" if p["storm"]["recovery_s"] is None else f"{p['storm']['recovery_s']:.1f}"]
              for arch in ARCHS for p in pts[arch] if "storm" in p]
    storm_header = ["architecture", "sets whose master died", "not recovered", "recovery s (all sets)"]
    res = report["result"]
    storm = next((p["storm"] for a in ARCHS for p in pts[a] if "storm" in p), None)
    if storm is None:
        storm_text = ""
    elif storm["unrecovered"]:
        storm_text = (f" After {settings['storm_fraction']:.0%} of the masters died at once, "
                      f"{storm['sets'] - storm['unrecovered']} of {storm['sets']} affected sets had a new master "
                      f"within the {settings['storm limit s']:.0f} s limit (the RESULT line then carries the limit).")
    else:
        storm_text = (f" After {settings['storm_fraction']:.0%} of the masters died at once, every affected set "
                      f"had a new master after {res['storm_recovery_s']} s.")
    old_rate = next((p["controller"]["per_s"] for p in pts["legacy"][-1:]), 0.0)
    summary = (f"At {res['brokers']:,} brokers the new architecture served {res['new_per_s']:,} controller "
               f"requests/s against {old_rate:,.1f} for the old one ({res['new_vs_old']}x); p99 "
               f"{res['new_p99_ms']} ms against {res['old_p99_ms']} ms.{storm_text} Storm figures: "
               f"{ARCHS[0] if pts[ARCHS[0]] else ARCHS[1]} architecture.")
    kv = [[k, v] for k, v in machine.items()]
    st = [[k, v] for k, v in settings.items() if k != "notes"]
    first = (f"<section class='first-page'><h1>Electra performance report: old vs new architecture</h1>"
             f"<p>{report['generated']}</p><p>{summary}</p><h2>Machine and versions</h2>{R.table(['', ''], kv)}"
             f"<h2>Settings</h2>{R.table(['', ''], st)}<p>{settings['notes']}</p></section>")
    tput = {a: [(p["brokers"], p["controller"]["per_s"]) for p in pts[a]] for a in ARCHS}
    lat = {f"{a} {q}": [(p["brokers"], p["controller"][f"{q}_ms"]) for p in pts[a]] for a in ARCHS
           for q in ("p50", "p99")}
    cdf = {a: [(ms, q) for ms, q in pts[a][-1]["controller"]["cdf"]] for a in ARCHS if pts[a]}
    storm_rec = {a: [(0.0, 0.0)] + [(t, i + 1) for i, t in enumerate(p["storm"]["recovered_at"])]
                 for a in ARCHS for p in pts[a] if "storm" in p}
    storm_rps = {a: [(t, n) for t, n in p["storm"]["requests_per_s"]] for a in ARCHS for p in pts[a] if "storm" in p}
    charts = [R.line_chart("Controller requests per second against concurrent brokers", tput, "brokers",
                           "requests/s", logx=True),
              R.line_chart("Controller request latency p50 and p99 against brokers", lat, "brokers", "ms",
                           logx=True, logy=True),
              R.line_chart(f"Latency CDF at {pts['new'][-1]['brokers'] if pts['new'] else '?'} brokers", cdf,
                           "latency (ms)", "fraction of requests", logx=True),
              R.line_chart("Failover storm: sets with a new master committed, seconds after the kill", storm_rec,
                           "seconds after the kill", "sets recovered", step=True),
              R.line_chart("Failover storm: broker requests completed per second", storm_rps,
                           "seconds after the kill", "requests/s")]
    body = [first, "<h2>Results</h2>", R.table(header, rows), "<h2>Failover storm</h2>",
            R.table(storm_header, storms), *charts, f"<pre>{report['result_line']}</pre>"]
    (out_dir / "performance.html").write_text(R.page("Electra performance report", body))
    md = [f"# Electra performance report: old vs new architecture\n\n{report['generated']}\n\n{summary}\n",
          "## Machine and versions\n", R.markdown_table(["", ""], kv), "\n## Settings\n",
          R.markdown_table(["", ""], st), f"\n{settings['notes']}\n\n## Results\n", R.markdown_table(header, rows),
          "\n## Failover storm\n", R.markdown_table(storm_header, storms),
          f"\nPlots: performance.html. Raw data: performance.json.\n\n    {report['result_line']}\n"]
    (out_dir / "performance.md").write_text("\n".join(md))


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="electra report performance", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--brokers", type=_parse_sweep, default=_parse_sweep("10,100,1000,5000"),
                   help="concurrent brokers per point, comma-separated (default 10,100,1000,5000)")
    p.add_argument("--duration", type=float, default=10.0, help="measured seconds per point (default 10)")
    p.add_argument("--architectures", default="new,legacy", help="which to run (default new,legacy)")
    p.add_argument("--storm-fraction", type=float, default=0.2, help="masters killed at once (default 0.2)")
    p.add_argument("--storm-limit-s", type=float, default=90.0, help="give up waiting for recovery after this")
    p.add_argument("--heartbeat-timeout-ms", type=int, default=10_000,
                   help="heartbeatTimeoutMillis the brokers send (RocketMQ default 10000)")
    p.add_argument("--scan-ms", type=int, default=5000, help="the leader's inactive-master scan (RocketMQ: 5000)")
    p.add_argument("--out", default=None, help="report directory (default reports/performance-<UTC time>)")
    args = p.parse_args(argv)
    archs = [a.strip() for a in args.architectures.split(",") if a.strip()]
    if not archs or set(archs) - set(ARCHS):
        p.error(f"--architectures: choose among {', '.join(ARCHS)}")
    if not 0 < args.storm_fraction <= 1:
        p.error("--storm-fraction must be in (0, 1]")
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out_dir = Path(args.out or f"reports/performance-{stamp}")
    machine = _machine()
    print(f"report performance: {', '.join(archs)} x {args.brokers} brokers, {args.duration:.0f}s each, "
          f"storm at {args.brokers[-1]} brokers; output {out_dir}", flush=True)
    points: dict[str, list[dict]] = {a: [] for a in ARCHS}
    with tempfile.TemporaryDirectory(prefix="report-performance-") as tmp:
        for n in args.brokers:
            for arch in archs:
                storm = n == args.brokers[-1]
                pt = _run_point(arch, n, args, storm, Path(tmp))
                points[arch].append(pt)
                c = pt["controller"]
                print(f"  {arch:>6} {pt['brokers']:>5} brokers: {c['per_s']:>8,.0f} req/s  p50 {c['p50_ms']:7.1f} ms"
                      f"  p99 {c['p99_ms']:7.1f} ms  failed {c['failed']}  heartbeats {pt['heartbeat']['per_s']:,.0f}/s"
                      f"  cpu load/servers {pt['load_cpu_s']:.1f}/{pt['server_cpu_s']:.1f}s  {pt['failures'] or ''}"
                      + (f"  storm {pt['storm']['sets']} sets, recovered in {pt['storm']['recovery_s'] or 'not all'}s"
                         if storm else ""), flush=True)

    def at_largest(arch: str) -> dict | None:
        return points[arch][-1] if points[arch] else None

    new, old = at_largest("new"), at_largest("legacy")
    new_c = new["controller"] if new else {"per_s": 0.0, "p99_ms": float("nan")}
    old_c = old["controller"] if old else {"per_s": 0.0, "p99_ms": float("nan")}
    storm_of = (new or old or {}).get("storm") or {}
    recovery = storm_of.get("recovery_s")
    result = {"brokers": (new or old)["brokers"], "new_per_s": round(new_c["per_s"]),
              "old_per_s": round(old_c["per_s"]),
              "new_vs_old": round(new_c["per_s"] / old_c["per_s"], 2) if old_c["per_s"] else float("nan"),
              "new_p99_ms": round(new_c["p99_ms"], 1), "old_p99_ms": round(old_c["p99_ms"], 1),
              "storm_recovery_s": round(recovery if recovery is not None else args.storm_limit_s, 1)}
    line = result_line(**result)
    settings = {"architectures": ", ".join(archs), "sweep (brokers)": ", ".join(map(str, args.brokers)),
                "measured seconds per point": args.duration, "controllers": "3 processes, fsync on, loopback, "
                "plaintext HTTP", "replicas per broker set": 3, "heartbeat period s": 1.0,
                "heartbeatTimeoutMillis": args.heartbeat_timeout_ms, "inactive-master scan ms": args.scan_ms,
                "storm_fraction": args.storm_fraction, "storm limit s": args.storm_limit_s,
                "notes": ("Controller requests: every broker repeats GetReplicaInfo (and AlterSyncStateSet when its "
                          "set changed) back to back on its own kept-alive connection, after registering (apply id, "
                          "register, elect, sync-state set) at start; heartbeats keep their real 1 s period in both "
                          "architectures and go to the leader's liveness table (no Kafka: the comparison isolates "
                          "the request architecture). The storm runs at the largest point with the brokers back at "
                          "their real periods (replica info every 5 s). One load-generator process on the same "
                          "machine as the controllers; its CPU is in the results table. The machine may be shared: "
                          "see the load average above. etcd is not included (no launcher in this project yet).")}
    report = {"generated": f"generated {datetime.now(UTC).isoformat(timespec='seconds')} by `electra report "
                           f"performance {' '.join(argv)}`",
              "machine": machine, "settings": settings, "points": points, "result": result, "result_line": line}
    _write(out_dir, report)
    print(f"wrote {out_dir / 'performance.html'}, {out_dir / 'performance.md'}, {out_dir / 'performance.json'}",
          flush=True)
    print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
