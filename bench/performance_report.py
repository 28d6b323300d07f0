"""`electra report performance`: the old (RocketMQ 5) and the new architecture, side by side, and etcd.

For each architecture (`electra node --architecture legacy|new`, docs/architectures.md) and each
broker count of the sweep, three fresh controller processes (fsync on, plaintext loopback HTTP:
TLS would cost both the same) serve one load-generator process (bench/broker_load.py). The
brokers register, then two phases of `--duration` seconds run:

* real mix (open loop): every broker at its real periods (heartbeats every second to every
  controller, GetReplicaInfo every 5 s, AlterSyncStateSet when its set changed); latency from
  each request's intended send time. RESULT's new_p99_ms and old_p99_ms come from here;
* capacity (closed loop): the real mix goes on, plus 64 connections from `wrk` (C: it costs a
  fraction of what the servers do, where a Python closed loop costs about as much) repeating
  GetReplicaInfo over all sets back to back. RESULT's new_per_s, old_per_s and new_vs_old come
  from here.

At the RESULT point (the largest broker count every architecture ran; the legacy one stops at
`--legacy-max-brokers`) a failover storm follows: 20% of the masters die at once and the report
times how long until every affected set has a new master committed (storm_recovery_s, new
architecture; nan, with the reason on stderr, when some set had none within --storm-limit-s or no
storm ran). etcd (when installed) runs the one request with a KV equivalent, GetReplicaInfo as
a linearizable `kv/range`, at the same rates with the same generator.

Writes `performance.html` (self-contained: inline SVG, no script, no network), `performance.md`
and `performance.json` into `--out`, and ends with one line
`RESULT brokers=<n> new_per_s=<n> old_per_s=<n> new_vs_old=<x> new_p99_ms=<x> old_p99_ms=<x> storm_recovery_s=<x>`.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import math
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from importlib import metadata as pkg
from pathlib import Path

import uvloop  # the generator's sockets, timers and callbacks in C: it must cost less than the servers

from electra.cli import freeze_startup_heap
from electra.cli_args import Parser, count_list

from . import report_html as R
from . import wrk
from .broker_load import (
    CONTROLLER_KINDS,
    REPLICA_INFO_PERIOD_S,
    BrokerLoad,
    HttpConn,
    Samples,
    get,
    open_loop,
    post,
    saturate,
    set_sizes,
)
from .common import (
    percentile,
    process_tree_cpu_s,
    process_tree_runqueue_wait_s,
    result_line,
    start_controller_processes,
    stop_processes,
)

ARCHS = ("new", "legacy")


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


class _Cpu:
    """CPU seconds of this process (the load generator) and of the servers' process trees over one phase,
    and how long each side waited for a core (run-queue wait: the other tenants of a shared machine)."""

    def __init__(self, server_pids: list[int]) -> None:
        self.pids = server_pids
        self.t0, self.gen0, self.srv0 = time.monotonic(), time.process_time(), self._servers()
        self.gen_wait0, self.srv_wait0 = self._generator_waiting(), self._servers_waiting()

    def _servers(self) -> float:
        return sum(process_tree_cpu_s(p) for p in self.pids)

    @staticmethod
    def _generator_waiting() -> float:
        return process_tree_runqueue_wait_s(os.getpid(), descendants=False)  # the servers are its children

    def _servers_waiting(self) -> float:
        return sum(process_tree_runqueue_wait_s(p) for p in self.pids)

    def done(self, closed_loop: dict | None = None) -> dict:
        """The phase's figures; `closed_loop`: a wrk run of the phase, whose CPU and run-queue wait count as
        the load generator's too."""
        wall = time.monotonic() - self.t0
        gen, srv = time.process_time() - self.gen0, self._servers() - self.srv0
        gen_wait = self._generator_waiting() - self.gen_wait0
        srv_wait = self._servers_waiting() - self.srv_wait0
        if closed_loop is not None:
            gen, gen_wait = gen + closed_loop["cpu_s"], gen_wait + closed_loop["wait_s"]
        return {"load_cpu_s": gen, "server_cpu_s": srv, "load_cores": gen / wall, "server_cores": srv / wall,
                "load_wait_cores": gen_wait / wall, "server_wait_cores": srv_wait / wall}


def _capacity(mix: Samples, kinds: tuple[str, ...], closed: dict, cpu: _Cpu, seconds: float) -> dict:
    """The capacity phase: the closed loop's answers (wrk) plus the real mix's `kinds` meanwhile. Latency
    (p50, p99, CDF) is the closed loop's: nearly all of the phase's requests."""
    m = _stats(mix, kinds, seconds)
    failures = dict(mix.failure_statuses)
    for what in ("non_2xx", "socket_errors"):
        if closed[what]:
            failures[f"closed loop {what}"] = closed[what]
    return {"count": closed["requests"] + m["count"], "per_s": closed["rps"] + m["per_s"],
            "p50_ms": closed["p50_ms"], "p99_ms": closed["p99_ms"],
            "failed": closed["non_2xx"] + closed["socket_errors"] + m["failed"], "cdf": closed["cdf"],
            "saturating": {"count": closed["requests"], "per_s": closed["rps"], "p50_ms": closed["p50_ms"],
                           "p99_ms": closed["p99_ms"], "load_cpu_s": closed["cpu_s"]},
            "failures": failures} | cpu.done(closed)


def _mix_stats(s: Samples, seconds: float) -> dict:
    lag = sorted(s.send_lag)
    return {"controller": _stats(s, CONTROLLER_KINDS, seconds), "heartbeat": _stats(s, ("heartbeat",), seconds),
            "send_lag_p99_ms": 1000 * percentile(lag, 0.99), "failures": dict(s.failure_statuses)}


async def _drive(endpoints: list[str], brokers: int, args, storm: bool, server_pids: list[int], work: Path) -> dict:
    leader = await _find_leader(endpoints)
    load = BrokerLoad(leader, brokers, endpoints=endpoints, heartbeat_timeout_ms=args.heartbeat_timeout_ms,
                      heartbeats_to=args.heartbeats_to)
    load.follow_leader()
    load.start_heartbeats()
    register_s = await load.register_all()
    freeze_startup_heap()  # the generator's own collector pauses must not count as the controllers' latency
    print(f"    {len(load.brokers):,} brokers registered in {register_s:.1f} s; real mix, then capacity, "
          f"{args.duration:.0f} s each" + (", then the storm" if storm else ""), flush=True)
    load.start_brokers()
    await asyncio.sleep(min(REPLICA_INFO_PERIOD_S, args.duration))  # (most) brokers' schedules have started
    # real mix: the brokers at their real periods, open loop
    load.samples, cpu = Samples(time.monotonic()), _Cpu(server_pids)
    await asyncio.sleep(args.duration)
    out = {"brokers": len(load.brokers), "sets": len(load.sets), "register_s": register_s,
           "mix": _mix_stats(load.samples, args.duration) | cpu.done()}
    # capacity: the real mix goes on, plus a saturating closed loop of GetReplicaInfo (wrk) at the leader
    script = wrk.rotating_script([("GET", f"/v1/broker-sets/{name}/replica-info", None) for name in load.sets])
    load.samples, cpu = Samples(time.monotonic()), _Cpu(server_pids)
    closed = await wrk.run_async(f"http://{load.leader}", script, args.capacity_connections, args.duration, work)
    out["capacity"] = _capacity(load.samples, CONTROLLER_KINDS, closed, cpu, args.duration)
    out["leader_changes"] = load.leader_changes
    if storm:
        await asyncio.sleep(2.0)
        load.samples = Samples(time.monotonic())
        paused = None
        if args.storm_pause_leader_s > 0:  # a controller leader change in the middle of the storm
            paused = server_pids[endpoints.index(load.leader)]
            os.kill(paused, signal.SIGSTOP)
            asyncio.get_running_loop().call_later(args.storm_pause_leader_s, os.kill, paused, signal.SIGCONT)
        try:
            result = await load.storm(args.storm_fraction, args.storm_limit_s)
        finally:
            if paused is not None:
                os.kill(paused, signal.SIGCONT)
        s = load.samples
        timeline: dict[float, int] = {}
        for kind in ("heartbeat", *CONTROLLER_KINDS):
            for t, _ in s.done.get(kind, ()):
                b = int((t - result["t_kill"]) * 2) / 2
                timeline[b] = timeline.get(b, 0) + 1
        rec = sorted(result["recovered"].values())
        out["storm"] = {"sets": result["sets"], "unrecovered": len(result["unrecovered"]),
                        "recovery_s": round(max(rec), 2) if rec and not result["unrecovered"] else None,
                        "recovered_at": rec, "requests_per_s": sorted((t, 2 * n) for t, n in timeline.items()),
                        "unrecovered_state": result["unrecovered_state"], "failures": dict(s.failure_statuses),
                        "leader_changes": load.leader_changes - out["leader_changes"]}
    await load.stop()
    return out


def _run_point(arch: str, brokers: int, args, storm: bool, tmp: Path) -> dict:
    extra = ("--architecture", arch, "--inactive-master-scan-ms", str(args.scan_ms))
    procs, endpoints = start_controller_processes(tmp / f"{arch}-{brokers}", extra, secure=False)
    try:
        return uvloop.run(_drive(endpoints, brokers, args, storm, [p.pid for p in procs], tmp / "wrk"))
    finally:
        stop_processes(procs)


def _run_etcd_point(brokers: int, args, tmp: Path) -> dict:
    """etcd beside them, for the one request with a KV equivalent: GetReplicaInfo ~ a linearizable
    `kv/range` of the set's key (RocketMQ's other requests are conditional updates of several fields,
    heartbeats are not replicated at all). Same generator, same rates: the brokers' reads at their real
    period (open loop), then the same saturating closed loop."""
    from .api import etcd_leader, start_etcd

    d = tmp / f"etcd-{brokers}"
    d.mkdir(parents=True)
    procs, clients = start_etcd(d)
    try:
        leader = etcd_leader(clients).removeprefix("http://")
        sizes = set_sizes(brokers)
        sets = len(sizes)

        def kv(op: str, body: dict) -> bytes:
            return post(leader, f"/v3/kv/{op}", body)

        key = [base64.b64encode(f"perf-{g}".encode()).decode() for g in range(sets)]
        reads = [kv("range", {"key": key[g]}) for g in range(sets)]

        async def drive() -> dict:
            stop = asyncio.Event()
            seed = Samples(time.monotonic())
            await saturate(lambda: leader, [kv("put", {"key": k, "value": "AAAAAAAA"}) for k in key],
                           min(64, sets), _Once(sets, seed), lambda: seed, "put")
            pids = [p.pid for p in procs]
            freeze_startup_heap()
            rng = random.Random(0)
            mix, cpu = Samples(time.monotonic()), _Cpu(pids)
            phase = [mix]  # where the brokers' reads go: the real mix's samples, then the capacity phase's
            per_broker = [reads[g] for g, size in enumerate(sizes) for _ in range(size)]  # its set's key
            t = asyncio.create_task(open_loop(leader, per_broker, REPLICA_INFO_PERIOD_S, stop, lambda: phase[0],
                                              "range", rng))
            await asyncio.sleep(args.duration)
            out = {"mix": {"controller": _stats(mix, ("range",), args.duration),
                           "send_lag_p99_ms": 1000 * percentile(sorted(mix.send_lag), 0.99),
                           "failures": dict(mix.failure_statuses)} | cpu.done()}
            cap, cpu = Samples(time.monotonic()), _Cpu(pids)
            phase[0] = cap
            script = wrk.rotating_script([("POST", "/v3/kv/range", json.dumps({"key": k})) for k in key])
            closed = await wrk.run_async(f"http://{leader}", script, args.capacity_connections, args.duration,
                                         tmp / "wrk")
            stop.set()
            await t
            out["capacity"] = _capacity(cap, ("range",), closed, cpu, args.duration)
            return out

        return {"brokers": sum(sizes), "sets": sets} | uvloop.run(drive())
    finally:
        stop_processes(procs, grace_s=1.0)  # a throwaway etcd: its graceful stop waits ~7 s for peers


class _Once(asyncio.Event):
    """A stop event that sets itself once `n` answers are in `samples` (seeding: every key put once)."""

    def __init__(self, n: int, samples: Samples) -> None:
        super().__init__()
        self.n, self.samples = n, samples

    def is_set(self) -> bool:
        return sum(len(v) for v in self.samples.done.values()) >= self.n


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


WAIT_HEADER = "run-queue wait, cores: load gen / servers"


def _waits(phase: dict) -> str:
    """Run-queue wait of both sides (absent from reports written before it was measured)."""
    if "server_wait_cores" not in phase:
        return "-"
    return f"{phase['load_wait_cores']:.2f} / {phase['server_wait_cores']:.2f}"


def _fmt_rate(x: float) -> str:
    return f"{x:,.0f}" if x >= 10 else f"{x:.1f}"


def _write(out_dir: Path, report: dict) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "performance.json").write_text(json.dumps(report, indent=1))
    pts, settings, machine = report["points"], report["settings"], report["machine"]
    systems = [a for a in (*ARCHS, "etcd") if pts.get(a)]
    mix_rows, cap_rows = [], []
    for arch in systems:
        for p in pts[arch]:
            m, c = p["mix"], p["capacity"]
            hb = m.get("heartbeat")
            mc = m["controller"]
            mix_rows.append([arch, p["brokers"], _fmt_rate(mc["per_s"]), f"{mc['p50_ms']:.1f}",
                             f"{mc['p99_ms']:.1f}", mc["failed"],
                             _fmt_rate(hb["per_s"]) if hb else "-", f"{hb['p99_ms']:.1f}" if hb else "-",
                             f"{m['send_lag_p99_ms']:.1f}", f"{p['register_s']:.1f}" if "register_s" in p else "-",
                             f"{m['load_cores']:.2f} / {m['server_cores']:.2f}", _waits(m)])
            cap_rows.append([arch, p["brokers"], _fmt_rate(c["per_s"]), f"{c['p50_ms']:.1f}", f"{c['p99_ms']:.1f}",
                             c["failed"], f"{c['load_cores']:.2f} / {c['server_cores']:.2f}", _waits(c),
                             f"{c['per_s'] * report['settings']['measured seconds per phase'] / c['server_cpu_s']:,.0f}"
                             if c["server_cpu_s"] > 0 else "-"])
    mix_header = ["system", "brokers", "controller req/s", "p50 ms", "p99 ms", "failed", "heartbeats/s",
                  "heartbeat p99 ms", "send lag p99 ms", "register all (s)", "cores: load gen / servers", WAIT_HEADER]
    cap_header = ["system", "brokers", "controller req/s", "p50 ms", "p99 ms", "failed",
                  "cores: load gen / servers", WAIT_HEADER, "req per server CPU-s"]
    storms = [[arch, p["brokers"], p["storm"]["sets"], p["storm"]["unrecovered"],
               "-" if p["storm"]["recovery_s"] is None else f"{p['storm']['recovery_s']:.1f}",
               p["storm"]["leader_changes"]]
              for arch in ARCHS for p in pts[arch] if "storm" in p]
    storm_header = ["architecture", "brokers", "sets whose master died", "not recovered", "recovery s (all sets)",
                    "controller leader changes"]
    res = report["result"]
    storm = next((p["storm"] for a in ARCHS for p in pts[a] if "storm" in p and p["brokers"] == res["brokers"]), None)
    if storm is None:
        storm_text = ""
    elif storm["unrecovered"]:
        storm_text = (f" After {settings['storm_fraction']:.0%} of the masters died at once, "
                      f"{storm['sets'] - storm['unrecovered']} of {storm['sets']} affected sets had a new master "
                      f"within the {settings['storm limit s']:.0f} s limit (the RESULT line's storm_recovery_s is "
                      "then nan: no recovery time).")
    else:
        storm_text = (f" After {settings['storm_fraction']:.0%} of the masters died at once, every affected set "
                      f"had a new master after {res['storm_recovery_s']} s.")
    at = {a: next((p for p in pts[a] if p["brokers"] == res["brokers"]), None) for a in systems}
    old_rate = at["legacy"]["capacity"]["per_s"] if at.get("legacy") else 0.0
    summary = (f"At {res['brokers']:,} brokers the new architecture served {res['new_per_s']:,} controller "
               f"requests/s at saturation against {_fmt_rate(old_rate)} for the old one ({res['new_vs_old']}x); "
               f"at the brokers' real request mix its p99 was {res['new_p99_ms']} ms against {res['old_p99_ms']} ms."
               f"{storm_text} Storm figures: new architecture.")
    kv = [[k, v] for k, v in machine.items()]
    st = [[k, v] for k, v in settings.items() if k != "notes"]
    first = (f"<section class='first-page'><h1>Electra performance report: old vs new architecture</h1>"
             f"<p>{report['generated']}</p><p>{summary}</p><h2>Machine and versions</h2>{R.table(['', ''], kv)}"
             f"<h2>Settings</h2>{R.table(['', ''], st)}<p>{settings['notes']}</p></section>")
    tput = {a: [(p["brokers"], p["capacity"]["per_s"]) for p in pts[a]] for a in systems}
    lat = {f"{a} {q}": [(p["brokers"], p["mix"]["controller"][f"{q}_ms"]) for p in pts[a]] for a in systems
           for q in ("p50", "p99")}
    cdf = {a: list(at[a]["mix"]["controller"]["cdf"]) for a in systems if at.get(a)}
    storm_rec = {a: [(0.0, 0.0)] + [(t, i + 1) for i, t in enumerate(p["storm"]["recovered_at"])]
                 for a in ARCHS for p in pts[a] if "storm" in p}
    storm_rps = {a: [(t, n) for t, n in p["storm"]["requests_per_s"]] for a in ARCHS for p in pts[a] if "storm" in p}
    charts = [R.line_chart("Capacity: controller requests per second at saturation against brokers", tput,
                           "brokers", "requests/s", logx=True),
              R.line_chart("Real request mix: controller request latency p50 and p99 against brokers", lat,
                           "brokers", "ms", logx=True, logy=True),
              R.line_chart(f"Real request mix: latency CDF at {res['brokers']:,} brokers", cdf,
                           "latency (ms)", "fraction of requests", logx=True),
              R.line_chart("Failover storm: sets with a new master committed, seconds after the kill", storm_rec,
                           "seconds after the kill", "sets recovered", step=True),
              R.line_chart("Failover storm: broker requests completed per second", storm_rps,
                           "seconds after the kill", "requests/s")]
    skipped = "".join(f"<p>{t}</p>" for t in report["skipped"])
    body = [first, "<h2>Real request mix (open loop): latency</h2>", R.table(mix_header, mix_rows),
            "<h2>Capacity (saturating closed loop): throughput</h2>", R.table(cap_header, cap_rows), skipped,
            "<h2>Failover storm</h2>", R.table(storm_header, storms), *charts, f"<pre>{report['result_line']}</pre>"]
    (out_dir / "performance.html").write_text(R.page("Electra performance report", body))
    md = [f"# Electra performance report: old vs new architecture\n\n{report['generated']}\n\n{summary}\n",
          "## Machine and versions\n", R.markdown_table(["", ""], kv), "\n## Settings\n",
          R.markdown_table(["", ""], st), f"\n{settings['notes']}\n\n## Real request mix (open loop): latency\n",
          R.markdown_table(mix_header, mix_rows), "\n## Capacity (saturating closed loop): throughput\n",
          R.markdown_table(cap_header, cap_rows), *(f"\n{t}" for t in report["skipped"]),
          "\n## Failover storm\n", R.markdown_table(storm_header, storms),
          f"\nPlots: performance.html. Raw data: performance.json.\n\n    {report['result_line']}\n"]
    (out_dir / "performance.md").write_text("\n".join(md))


def _keep(out_dir: Path, points: dict) -> None:
    """Every point's raw data as soon as it ran (points.partial.json): a sweep stopped by its time limit
    keeps what it measured. The finished report (performance.json) replaces it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "points.partial.json").write_text(json.dumps(points, indent=1))


def _point_line(system: str, pt: dict) -> str:
    m, c = pt["mix"], pt["capacity"]
    line = (f"  {system:>6} {pt['brokers']:>5} brokers: mix {m['controller']['per_s']:,.0f} req/s p99 "
            f"{m['controller']['p99_ms']:.1f} ms (send lag p99 {m['send_lag_p99_ms']:.0f} ms, load gen "
            f"{m['load_cores']:.2f} cores); capacity {c['per_s']:,.0f} req/s p99 {c['p99_ms']:.1f} ms "
            f"(load gen {c['load_cores']:.2f} cores, servers {c['server_cores']:.2f}; run-queue wait "
            f"{c['load_wait_cores']:.2f} / {c['server_wait_cores']:.2f})")
    if "heartbeat" in m:
        line += f"; heartbeats {m['heartbeat']['per_s']:,.0f}/s p99 {m['heartbeat']['p99_ms']:.1f} ms"
    failures = {**m["failures"], **{f"capacity {k}": v for k, v in c["failures"].items()}}
    if failures:
        line += f"  failures {failures}"
    if "storm" in pt:
        st = pt["storm"]
        recovered = f"recovered in {st['recovery_s']} s" if st["recovery_s"] is not None else "not all recovered"
        line += (f"\n         storm {st['sets']} sets, {recovered}, "
                 f"{st['leader_changes']} leader changes" + (f", unrecovered {st['unrecovered_state']}"
                                                             if st["unrecovered"] else ""))
    return line


def main(argv: list[str]) -> int:
    p = Parser(prog="electra report performance", description=__doc__,
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--brokers", type=count_list(3, 200_000), default="10,100,1000,5000",
                   help="concurrent brokers per point, comma-separated, each at least 3 (one set; "
                        "default 10,100,1000,5000)")
    p.add_argument("--duration", type=float, minimum=1, default=10.0,
                   help="measured seconds of each phase (real mix, capacity) per point (default 10)")
    p.add_argument("--architectures", default="new,legacy", help="which to run (default new,legacy)")
    p.add_argument("--legacy-max-brokers", type=int, minimum=3, default=1000,
                   help="run the legacy architecture only up to this many brokers (default 1000: it registers "
                        "one broker request at a time; at least 3, the smallest point; leave legacy out of "
                        "--architectures not to run it)")
    p.add_argument("--etcd", choices=("auto", "on", "off"), default="auto",
                   help="etcd beside them for GetReplicaInfo ~ kv/range (auto: when `etcd` is installed)")
    p.add_argument("--capacity-connections", type=int, minimum=1, default=64,
                   help="wrk connections of the capacity phase's closed loop (default 64, as bench api's)")
    p.add_argument("--storm-fraction", type=float, default=0.2, help="masters killed at once (default 0.2)")
    p.add_argument("--storm-limit-s", type=float, minimum=1, default=90.0,
                   help="give up waiting for recovery after this")
    p.add_argument("--heartbeat-timeout-ms", type=int, minimum=1, default=10_000,
                   help="heartbeatTimeoutMillis the brokers send (RocketMQ default 10000)")
    p.add_argument("--scan-ms", type=int, minimum=1, default=5000,
                   help="the leader's inactive-master scan period (RocketMQ: 5000; the new architecture also "
                        "scans at a master's timeout)")
    p.add_argument("--heartbeats-to", choices=("all", "leader"), default="all",
                   help="brokers heartbeat every controller, as RocketMQ's do (default), or only the leader")
    p.add_argument("--storm-pause-leader-s", type=float, default=0.0,
                   help="SIGSTOP the controller leader this long when the masters die (a leader change mid-storm)")
    p.add_argument("--out", default=None, help="report directory (default reports/performance-<UTC time>)")
    args = p.parse_args(argv)
    archs = [a.strip() for a in args.architectures.split(",") if a.strip()]
    if not archs or set(archs) - set(ARCHS):
        p.error(f"--architectures: choose among {', '.join(ARCHS)}")
    if not 0 < args.storm_fraction <= 1:
        p.error("--storm-fraction must be in (0, 1]")

    def runs(arch: str, n: int) -> bool:
        return arch in archs and (arch != "legacy" or n <= args.legacy_max_brokers)

    if not any(runs(a, n) for a in archs for n in args.brokers):  # it wrote a report of nothing, exit 0
        p.error(f"--architectures {args.architectures} with --legacy-max-brokers {args.legacy_max_brokers}: no point "
                f"of --brokers {','.join(map(str, args.brokers))} would run")
    if not wrk.available():  # the capacity phase's closed loop
        print(f"electra report performance: {wrk.INSTALL_HINT}", file=sys.stderr)
        return 2
    with_etcd = args.etcd == "on" or (args.etcd == "auto" and shutil.which("etcd") is not None)
    if args.etcd == "on" and shutil.which("etcd") is None:
        p.error("--etcd on: no `etcd` on PATH (Debian package etcd-server; `make test-tools` installs it)")
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out_dir = Path(args.out or f"reports/performance-{stamp}")
    try:  # before minutes of measuring: the report must have somewhere to go
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / ".writable"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        p.error(f"--out {out_dir}: cannot write the report there ({exc.strerror or exc})")
    machine = _machine()

    both = [n for n in args.brokers if all(runs(a, n) for a in archs)]
    result_at = both[-1] if both else args.brokers[-1]  # the RESULT line's point: every architecture ran there
    print(f"report performance: {', '.join(archs)}{' and etcd' if with_etcd else ''} x {args.brokers} brokers, "
          f"{args.duration:.0f}s per phase, RESULT and storm at {result_at} brokers; output {out_dir}", flush=True)
    points: dict[str, list[dict]] = {a: [] for a in (*ARCHS, "etcd")}
    skipped: list[str] = []
    with tempfile.TemporaryDirectory(prefix="report-performance-") as tmp:
        for n in args.brokers:
            for arch in archs:
                if not runs(arch, n):
                    last = points[arch][-1] if points[arch] else None
                    why = (f"; registering {last['brokers']:,} brokers took it {last['register_s']:.0f} s, one "
                           f"request at a time, so {n:,} would take about "
                           f"{last['register_s'] * n / last['brokers']:.0f} s" if last else "")
                    skipped.append(f"{arch} at {n:,} brokers: not run (--legacy-max-brokers "
                                   f"{args.legacy_max_brokers}{why}).")
                    print("  " + skipped[-1], flush=True)
                    continue
                pt = _run_point(arch, n, args, n == result_at, Path(tmp))
                points[arch].append(pt)
                _keep(out_dir, points)
                print(_point_line(arch, pt), flush=True)
            if with_etcd:
                pt = _run_etcd_point(n, args, Path(tmp))
                points["etcd"].append(pt)
                _keep(out_dir, points)
                print(_point_line("etcd", pt), flush=True)

    def at(arch: str) -> dict | None:
        return next((q for q in points[arch] if q["brokers"] == result_at), None)

    new, old = at("new"), at("legacy")
    result, unmeasured_storm = _result(new, old, result_at, args.storm_limit_s)
    line = result_line(**result)
    settings = {"architectures": ", ".join(archs) + (", etcd (reads only)" if with_etcd else ""),
                "sweep (brokers)": ", ".join(map(str, args.brokers)),
                "measured seconds per phase": args.duration, "controllers": "3 processes, fsync on, loopback, "
                "plaintext HTTP", "replicas per broker set": 3, "heartbeat period s": 1.0,
                "replica info period s": REPLICA_INFO_PERIOD_S, "capacity connections": args.capacity_connections,
                "heartbeatTimeoutMillis": args.heartbeat_timeout_ms,
                "inactive-master scan ms (new: also at each master's timeout)": args.scan_ms,
                "storm_fraction": args.storm_fraction, "storm limit s": args.storm_limit_s,
                "notes": NOTES}
    report = {"generated": f"generated {datetime.now(UTC).isoformat(timespec='seconds')} by `electra report "
                           f"performance {' '.join(argv)}`",
              "machine": machine, "settings": settings, "points": points, "result": result, "result_line": line,
              "skipped": skipped}
    _write(out_dir, report)
    (out_dir / "points.partial.json").unlink(missing_ok=True)
    print(f"wrote {out_dir / 'performance.html'}, {out_dir / 'performance.md'}, {out_dir / 'performance.json'}",
          flush=True)
    unmeasured = [k for k in ("new_p99_ms", "old_p99_ms") if math.isnan(result[k]) and
                  (new if k == "new_p99_ms" else old) is not None]
    if unmeasured:  # no controller request in the real mix: too short a run for its 5 s polls
        print(f"error: {' and '.join(unmeasured)}: no controller request was measured in the real request mix at "
              f"{result['brokers']} brokers within --duration {args.duration:g} s (each broker asks every "
              f"{REPLICA_INFO_PERIOD_S:g} s): run longer", file=sys.stderr)
    if new is None and old is None:  # refused up front; kept for a point that ran nothing
        print(f"error: no architecture was measured at {result_at} brokers: nothing to compare", file=sys.stderr)
    if unmeasured_storm:
        print(f"storm_recovery_s: {unmeasured_storm}", file=sys.stderr)
    print(line, flush=True)
    return 1 if unmeasured or (new is None and old is None) else 0


def _result(new: dict | None, old: dict | None, brokers: int, storm_limit_s: float) -> tuple[dict, str | None]:
    """The RESULT line's values from the points of each architecture at `brokers` (None: not run there), and why
    storm_recovery_s is nan (None when it was measured). A storm that did not recover within `storm_limit_s`, or
    did not run, has no recovery time: the limit stood in for it and read as a measurement (`storm_recovery_s=90`
    from a run that measured nothing)."""
    nan = float("nan")
    new_cap = new["capacity"]["per_s"] if new else 0.0
    old_cap = old["capacity"]["per_s"] if old else 0.0
    storm = (new or old or {}).get("storm")
    why = None
    if storm is None:
        why = f"no failover storm ran at {brokers} brokers"
    elif storm["recovery_s"] is None:
        why = (f"{storm['unrecovered']} of {storm['sets']} sets whose master died had no new master within "
               f"--storm-limit-s {storm_limit_s:g} s")
    result = {"brokers": (new or old or {}).get("brokers", brokers), "new_per_s": round(new_cap),
              "old_per_s": round(old_cap), "new_vs_old": round(new_cap / old_cap, 2) if old_cap else nan,
              "new_p99_ms": round(new["mix"]["controller"]["p99_ms"], 1) if new else nan,
              "old_p99_ms": round(old["mix"]["controller"]["p99_ms"], 1) if old else nan,
              "storm_recovery_s": nan if why else round(storm["recovery_s"], 1)}
    return result, why


NOTES = ("Each point starts three fresh controller processes; the brokers register (apply id, heartbeat, "
         "register, the first asks for the election, the master grows its sync-state set), then two phases "
         "of the measured length run. Real mix (open loop): every broker heartbeats every controller once a "
         "second (as RocketMQ brokers do; no Kafka: the comparison isolates the request architecture), asks "
         "for its replica info every 5 s, and the master alters its sync-state set when its set changed; "
         "latency runs from each request's intended send time, so a slow answer that delays a broker's next "
         "request counts (send lag: how late the generator itself sent). Capacity: the real mix goes on and "
         "64 more kept-alive connections from wrk (a C load generator, at the leader) repeat GetReplicaInfo "
         "back to back over all sets; the phase's p50, p99 and CDF are wrk's. RESULT: new_per_s, "
         "old_per_s and new_vs_old are the capacity phase's controller requests per second; new_p99_ms and "
         "old_p99_ms are the controller requests' p99 (replica info, sync-state set, elections) in the real "
         "mix; storm_recovery_s is the new architecture's time until every set whose master died has a new "
         "master (nan when one had none within the storm limit). One load-generator process (asyncio protocols, "
         "pre-encoded requests) for the real mix "
         "and wrk for the closed loop, on the same machine; their CPU is in the tables, and so is the "
         "run-queue wait of both sides (/proc schedstat: time runnable "
         "but waiting for a core, i.e. taken by the machine's other tenants): a capacity figure with servers "
         "waiting for cores is the machine's, not the architecture's. etcd: a linearizable kv/range per "
         "broker's set key stands for GetReplicaInfo (same rates, same generators); RocketMQ's other requests "
         "have no KV equivalent (conditional updates of several fields; heartbeats are not replicated). "
         "The machine may be shared: see the load average.")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
