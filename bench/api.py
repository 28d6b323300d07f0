"""`electra bench api`: Electra's broker API against etcd's HTTP API, same machine, same load generator.

Starts three etcd members (Debian's `etcd-server`, 3.4) and three `electra node` processes on
loopback, fsync on in both, and drives each with `wrk` (C, Lua scripts; 64 connections):

* writes: etcd `POST /v3/kv/put` of 64 keys vs Electra `register` of broker 1 in 64 sets, with a
  new address every request (so every request is a log entry), at each system's leader;
* leader reads: etcd `POST /v3/kv/range` (linearizable by default) vs Electra `replica-info`
  (a ReadIndex read on the leader);
* spread reads: the same reads with the 64 connections spread over the three nodes (etcd
  followers ask the leader for a read index; Electra followers serve bounded-staleness reads).

TLS is compared fairly: etcd over plaintext against Electra `--insecure` (plaintext, no tokens)
for the RESULT line; Electra secure (HTTPS and a broker token on every request) is measured too
and printed on its own line. The Electra leader's CPU over each run gives requests per CPU second.
Each line also gives the CPU the leader and the three nodes used, and requests per CPU second:
on a shared machine throughput follows the CPU share each system gets, efficiency does not.
The machine is shared: run it a few times and read the spread.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from electra.cli_args import Parser, count_list
from electra.interrupts import die_with_parent

from . import wrk
from .common import (
    _stat_fields,
    bench_credentials,
    free_ports,
    process_tree_cpu_s,
    result_line,
    start_controller_processes,
    stop_processes,
)

CONNECTIONS = 64
SETS = 64
INSTALL_HINT = ("electra bench api needs `etcd` (Debian package etcd-server) and `wrk`: "
                "run `make test-tools` or `apt-get install -y etcd-server wrk`")

# wrk scripts: one Lua state per thread; `setup` numbers the threads so that addresses never repeat.
_COMMON = """
local threads = 0
function setup(thread) thread:set("tid", threads); threads = threads + 1 end
local n = 0
"""
ELECTRA_WRITE = _COMMON + """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
function request()
  n = n + 1
  local body = string.format('{"clusterName":"bench","brokerId":1,"brokerAddress":"10.%d.%d.%d:%d"}',
                             tid, math.floor(n / 65536) % 256, math.floor(n / 256) % 256, n % 256)
  return wrk.format(nil, "/v1/broker-sets/s" .. (n % 64) .. "/register", nil, body)
end
"""
ELECTRA_READ = _COMMON + """
function request()
  n = n + 1
  return wrk.format("GET", "/v1/broker-sets/s" .. (n % 64) .. "/replica-info")
end
"""
# etcd's JSON gateway takes base64 keys and values: 4-character alphanumeric strings are valid base64.
ETCD_WRITE = _COMMON + """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
function request()
  n = n + 1
  local body = string.format('{"key":"k%03d","value":"%02d%06d"}', n % 64, tid % 100, n % 1000000)
  return wrk.format(nil, "/v3/kv/put", nil, body)
end
"""
ETCD_READ = _COMMON + """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
function request()
  n = n + 1
  return wrk.format(nil, "/v3/kv/range", nil, string.format('{"key":"k%03d"}', n % 64))
end
"""


def _tools_missing() -> list[str]:
    return [t for t in ("etcd", "wrk") if shutil.which(t) is None]


# ------------------------------------------------------------------ wrk
def run_wrk(targets: list[str], script: str, duration: float, workdir: Path, headers: dict[str, str]) -> dict:
    """`wrk` with 64 connections in all, split over `targets` (base URLs), run at once; summed."""
    path = workdir / f"script-{abs(hash(script))}.lua"
    path.write_text(script + wrk.DONE)
    per = [CONNECTIONS // len(targets) + (1 if i < CONNECTIONS % len(targets) else 0) for i in range(len(targets))]
    procs = [subprocess.Popen(wrk.command(url, path, c, duration, headers),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for url, c in zip(targets, per, strict=True)]
    try:
        parsed = [wrk.parse(p.communicate(timeout=duration + 60)[0]) for p in procs]
    finally:  # interrupted (Ctrl-C on this process alone, SIGTERM): wrk would load the servers on to its end
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return {"rps": sum(p["rps"] for p in parsed), "p99_ms": max(p["p99_ms"] for p in parsed),
            "non_2xx": sum(p["non_2xx"] for p in parsed), "socket_errors": sum(p["socket_errors"] for p in parsed)}


# ------------------------------------------------------------------ etcd
def start_etcd(data_dir: Path) -> tuple[list[subprocess.Popen], list[str]]:
    """Three etcd members on loopback (fsync on: etcd always syncs its WAL); returns them and client URLs."""
    ports = free_ports(6)
    names = [f"e{i}" for i in range(3)]
    peer = [f"http://127.0.0.1:{ports[i]}" for i in range(3)]
    client = [f"http://127.0.0.1:{ports[3 + i]}" for i in range(3)]
    cluster = ",".join(f"{n}={p}" for n, p in zip(names, peer, strict=True))
    procs = []
    for i, name in enumerate(names):
        log = open(data_dir / f"{name}.log", "w")  # noqa: SIM115 - the process owns it until it ends
        procs.append(subprocess.Popen(die_with_parent(
            ["etcd", "--name", name, "--data-dir", str(data_dir / name), "--listen-peer-urls", peer[i],
             "--initial-advertise-peer-urls", peer[i], "--listen-client-urls", client[i],
             "--advertise-client-urls", client[i], "--initial-cluster", cluster,
             "--initial-cluster-state", "new", "--initial-cluster-token", "electra-bench", "--log-level", "warn"]),
            stdout=log, stderr=subprocess.STDOUT))
    return procs, client


def _post_json(url: str, body: dict, timeout: float = 2.0) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def etcd_leader(client_urls: list[str], timeout: float = 30.0) -> str:
    """The client URL of the member that leads (bounded wait)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for url in client_urls:
            try:
                st = _post_json(f"{url}/v3/maintenance/status", {})
            except OSError:
                continue
            if st.get("leader") and st["leader"] == st["header"]["member_id"]:
                return url
        time.sleep(0.2)
    raise RuntimeError("etcd elected no leader in time")


def seed_etcd(leader: str) -> None:
    for i in range(SETS):
        _post_json(f"{leader}/v3/kv/put", {"key": f"k{i:03d}", "value": "AAAAAAAA"})


# ------------------------------------------------------------------ Electra
async def _seed_electra(endpoints: list[str], creds) -> str:
    """Broker 1 of sets s0..s63 applied and registered; returns the leader's endpoint."""
    from electra.api.client import ControllerClient
    from electra.security.credentials import ClientCredentials

    none = ClientCredentials()
    broker = ControllerClient(endpoints, credentials=creds.credentials("broker") if creds else none)
    observer = ControllerClient(endpoints, credentials=creds.credentials("observer") if creds else none)
    try:
        leader = None
        for _ in range(300):  # bounded: 60 s (a loaded machine: nodes and their front-ends import for seconds)
            leader = await observer.find_leader()
            if leader is not None:
                break
            await asyncio.sleep(0.2)
        if leader is None:
            raise RuntimeError("the Electra nodes elected no leader in time")
        for i in range(SETS):
            r = await broker.apply_broker_id("bench", f"s{i}", 1, "10.0.0.1:10911;1")
            assert r["code"] == 0, r
            r = await broker.register("bench", f"s{i}", 1, "10.0.0.1:10911")
            assert r["code"] == 0, r
        return endpoints[leader - 1]
    finally:
        await broker.close()
        await observer.close()


def _electra_runs(tmp: Path, duration: float, secure: bool, spread: bool, work: Path, front_ends: int = 0) -> dict:
    extra = ("--front-ends", str(front_ends)) if front_ends else ()
    procs, endpoints = start_controller_processes(tmp, extra, secure=secure)
    creds = bench_credentials(tmp) if secure else None
    try:
        time.sleep(2.0)
        leader_ep = asyncio.run(_seed_electra(endpoints, creds))
        leader_pid = procs[endpoints.index(leader_ep)].pid
        pids = [p.pid for p in procs]
        scheme = "https" if secure else "http"
        headers = {"Authorization": f"Bearer {creds.token_file('broker').read_text().strip()}"} if secure else {}
        out = {}
        for key, script, targets in (("write", ELECTRA_WRITE, [leader_ep]), ("read", ELECTRA_READ, [leader_ep]),
                                     ("spread_read", ELECTRA_READ, endpoints)):
            if key == "spread_read" and not spread:
                continue
            cpu0, all0, own0 = process_tree_cpu_s(leader_pid), _cpu(pids), _own_cpu_s(leader_pid)
            res = run_wrk([f"{scheme}://{ep}" for ep in targets], script, duration, work, headers)
            res["leader_cpu_s"], res["cluster_cpu_s"] = process_tree_cpu_s(leader_pid) - cpu0, _cpu(pids) - all0
            res["leader_raft_cpu_s"] = _own_cpu_s(leader_pid) - own0  # the Raft process alone (no front-ends)
            out[key] = res
        return out
    finally:
        stop_processes(procs)


def _etcd_runs(tmp: Path, duration: float, work: Path) -> dict:
    procs, clients = start_etcd(tmp)
    try:
        leader = etcd_leader(clients)
        seed_etcd(leader)
        leader_pid = procs[clients.index(leader)].pid
        pids = [p.pid for p in procs]
        out = {}
        for key, script, targets in (("write", ETCD_WRITE, [leader]), ("read", ETCD_READ, [leader]),
                                     ("spread_read", ETCD_READ, clients)):
            cpu0, all0 = process_tree_cpu_s(leader_pid), _cpu(pids)
            res = run_wrk(targets, script, duration, work, {})
            res["leader_cpu_s"], res["cluster_cpu_s"] = process_tree_cpu_s(leader_pid) - cpu0, _cpu(pids) - all0
            out[key] = res
        return out
    finally:
        stop_processes(procs, grace_s=1.0)  # a throwaway etcd: its graceful stop waits ~7 s for peers


def _own_cpu_s(pid: int) -> float:
    """CPU seconds of one process itself (user + system), without its children."""
    f = _stat_fields(pid)
    return sum(int(x) for x in f[11:13]) / os.sysconf("SC_CLK_TCK") if f is not None else 0.0


def _cpu(pids: list[int]) -> float:
    return sum(process_tree_cpu_s(p) for p in pids)


def _line(system: str, key: str, r: dict, duration: float) -> str:
    def per(cpu_s: float) -> str:
        return f"{r['rps'] * duration / cpu_s:,.0f}" if cpu_s > 0 else "-"

    return (f"  {system:<17} {key:<11} {r['rps']:>7,.0f}/s  p99 {r['p99_ms']:6.1f} ms  "
            f"leader {r['leader_cpu_s'] / duration:4.2f} cores ({per(r['leader_cpu_s'])}/CPU-s), "
            f"3 nodes {r['cluster_cpu_s'] / duration:4.2f} cores ({per(r['cluster_cpu_s'])}/CPU-s)  "
            f"failed {r['non_2xx'] + r['socket_errors']}")


def _print_front_end_scaling(by_count: dict[int, dict], duration: float) -> None:
    """Per workload: requests/s and requests per CPU-second of the serving node's processes, per front-end count."""
    print("  front-ends: requests/s, and requests per CPU-second of the serving node's processes "
          "(Raft process + its front-ends; spread: all three nodes)", flush=True)
    for key in ("write", "read", "spread_read"):
        cells = []
        for n, runs in by_count.items():
            r = runs[key]
            cpu = r["cluster_cpu_s"] if key == "spread_read" else r["leader_cpu_s"]
            per_cpu = r["rps"] * duration / cpu if cpu > 0 else float("nan")
            cells.append(f"fe={n}: {r['rps']:,.0f}/s {per_cpu:,.0f}/CPU-s {cpu / duration:.2f} cores")
        line = f"    {key:<11} " + " | ".join(cells)
        if 1 in by_count and 2 in by_count and by_count[1][key]["rps"]:
            line += f"  scaling 1->2: {by_count[2][key]['rps'] / by_count[1][key]['rps']:.2f}x"
        if key != "spread_read":  # where a request's CPU goes at the leader: Raft process vs front-ends
            costs = []
            for n, runs in by_count.items():
                r = runs[key]
                done = r["rps"] * duration
                if n and done:
                    raft_us = r["leader_raft_cpu_s"] / done * 1e6
                    costs.append(f"fe={n}: Raft process {raft_us:.0f} us + front-ends "
                                 f"{(r['leader_cpu_s'] - r['leader_raft_cpu_s']) / done * 1e6:.0f} us per request")
                elif done:
                    costs.append(f"fe=0: {r['leader_cpu_s'] / done * 1e6:.0f} us per request")
            line += "\n" + " " * 16 + " | ".join(costs)
        print(line, flush=True)


def main(argv: list[str]) -> int:
    p = Parser(prog="electra bench api", description=__doc__,
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, minimum=1, default=10.0, help="seconds per wrk run (default 10)")
    p.add_argument("--no-tls-run", action="store_true", help="skip the extra Electra run with TLS and tokens")
    p.add_argument("--front-ends", default="0", type=count_list(0, 16, sort=False),
                   help="front-end processes per Electra node (`electra node --front-ends`); a list such as 0,1,2 "
                        "measures each, prints requests per CPU-second of a node's processes and the 1->2 scaling; "
                        "the RESULT line and the TLS run use the first (default 0)")
    args = p.parse_args(argv)
    missing = _tools_missing()
    if missing:
        print(f"missing: {', '.join(missing)}. {INSTALL_HINT}")
        return 2
    version = subprocess.run(["etcd", "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    print(f"bench api: 3 etcd members ({version}) vs 3 electra nodes, fsync on, wrk {CONNECTIONS} connections, "
          f"{args.duration:.0f}s per run; the machine is shared, so read the spread of a few runs", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-api-") as tmp:
        root = Path(tmp)
        for d in ("etcd", "electra", "electra-tls", "wrk"):
            (root / d).mkdir()
        etcd = _etcd_runs(root / "etcd", args.duration, root / "wrk")
        for key, r in etcd.items():
            print(_line("etcd", key, r, args.duration), flush=True)
        by_count = {}
        for n in args.front_ends:
            (root / f"electra-fe{n}").mkdir()
            by_count[n] = _electra_runs(root / f"electra-fe{n}", args.duration, False, True, root / "wrk", n)
            for key, r in by_count[n].items():
                print(_line(f"electra fe={n}" if len(args.front_ends) > 1 else "electra", key, r, args.duration),
                      flush=True)
        electra = by_count[args.front_ends[0]]
        if len(args.front_ends) > 1:
            _print_front_end_scaling(by_count, args.duration)
        if not args.no_tls_run:
            tls = _electra_runs(root / "electra-tls", args.duration, True, False, root / "wrk", args.front_ends[0])
            for key, r in tls.items():
                print(_line("electra TLS+token", key, r, args.duration), flush=True)
            print(f"  electra with TLS and tokens: write_per_s={tls['write']['rps']:.0f} "
                  f"read_per_s={tls['read']['rps']:.0f} write_p99_ms={tls['write']['p99_ms']:.1f}", flush=True)
    bad = sum(r["non_2xx"] + r["socket_errors"] for r in (*etcd.values(), *electra.values()))
    if bad:
        print(f"  WARNING: {bad} requests failed (non-2xx or socket errors); the figures count only answers")

    def ratio(key: str) -> float:
        return round(electra[key]["rps"] / etcd[key]["rps"], 2) if etcd[key]["rps"] else float("nan")

    print(result_line(write_per_s=round(electra["write"]["rps"]), etcd_write_per_s=round(etcd["write"]["rps"]),
                      write_ratio=ratio("write"), read_per_s=round(electra["read"]["rps"]),
                      etcd_read_per_s=round(etcd["read"]["rps"]), read_ratio=ratio("read"),
                      spread_read_ratio=ratio("spread_read"), write_p99_ms=round(electra["write"]["p99_ms"], 1),
                      etcd_write_p99_ms=round(etcd["write"]["p99_ms"], 1)))
    return 0
