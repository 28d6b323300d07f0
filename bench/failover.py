"""`electra bench failover`: master failover through the whole heartbeat pipeline, crash and hang.

For each G in `--groups` (a comma list, smallest first), one fresh local stack
(embedded Kafka, 3 controller processes, an ingest process per node, the Spark job
in local mode) and G simulated broker sets x 3 replicas heartbeating every second
over their session connections. Once every set has a master and a full sync-state
set, heartbeats and the job's CPU are measured for `--measure` seconds, then:

* crash: `--crash` masters are killed (their session connections reset, as when a
  process dies), one every `--every` seconds; failover time = new master committed
  (replica info) minus the kill. The leader's connection-loss lane elects within a Kafka
  round trip (api/connection_loss.py); the job's proposal, a batch later, is the fallback.
* hang: `--hang` masters hang (connection kept, no heartbeats), one every `--every`
  seconds; failover time = new master committed minus the master's last accepted
  heartbeat. Its floor is the heartbeat timeout (`--timeout-ms`).

false_failovers counts the other sets whose master epoch moved during the run (as the
brokers learned it). job_cpu_us_per_hb is the Spark job's CPU (driver, JVM and Python
workers: its whole process tree, from /proc) per heartbeat accepted by ingest in the
measuring window. A size is sustained when at least 95% of the offered heartbeats were
accepted, enough sets settled (a master with a sync-state set of 3) to crash and hang as many
masters as asked (every set, below `--crash` + `--hang` sets), and every crashed and hung master
was replaced. crash_failovers and hang_failovers count the failovers measured.

The last line describes the largest sustained size (or, when none was, the size that ran, with
`sustained=0`):
`RESULT groups=<n> timeout_s=<x> crash_failover_p50_s=<x> crash_failover_p99_s=<x> hang_failover_p50_s=<x>
hang_failover_p99_s=<x> false_failovers=<n> job_cpu_us_per_hb=<x> batch_ms_p50=<n> sustained=<0|1>
crash_failovers=<n> hang_failovers=<n> crash_by_lane=<n> hang_by_lane=<n>` (one line; crash_by_lane and
hang_by_lane: the failovers of each kind the leader's lane elected, from `disconnected` and `silent` records).
With fewer settled sets than `--crash` + `--hang`, the settled ones are shared between the two modes.
Everything (load generator included) shares this machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import urllib.request
from datetime import datetime
from pathlib import Path

import uvloop  # the simulated fleet runs in this process: uvloop's TLS and sockets cost less per heartbeat

from electra.cli_args import Parser, count_list, make_dir
from electra.local_ports import free_ports

from .common import percentile, process_tree_cpu_s, result_line


def _ingest_accepted(endpoints: list[str], creds) -> int:
    total = 0
    for ep in endpoints:
        try:
            req = urllib.request.Request(f"{creds.scheme}://{ep}/metrics", headers=creds.headers())
            text = urllib.request.urlopen(req, timeout=2, context=creds.ssl_context()).read().decode()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith('electra_ingest_heartbeats_total{result="accepted"}'):
                total += int(float(line.split()[-1]))
    return total


async def _run_size(groups: int, args, tmp: Path) -> dict:
    from electra.api.client import ControllerClient
    from electra.broker_simulator import BrokerFleet
    from electra.local_stack import LocalStack, StackConfig
    from electra.replica_info_reader import ReplicaInfoReader

    ports = free_ports(9)
    stack = LocalStack(StackConfig(data_dir=tmp, trigger_ms=args.trigger_ms, log_level="WARNING",
                                   ingest_workers=args.ingest_workers,
                                   job_args=["--log-level", "INFO", *args.job_arg]))
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
    reader = ReplicaInfoReader(endpoints, credentials=observer, connections_per_node=16)
    fleet = BrokerFleet(endpoints, groups, 3, heartbeat_s=1.0, poll_s=5.0, timeout_ms=args.timeout_ms,
                        credentials=stack.creds.credentials("broker"),
                        ingest_endpoints=ingest)
    try:
        await fleet.start()
        print(f"  G={groups}: {groups} sets registered in {time.monotonic() - t0:.0f}s; waiting for the job and "
              "full sync-state sets", flush=True)
        await _first_batch(stack, args.job_start)
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
        parts = _components(stack, await client.find_leader())
        a0, m0 = _ingest_accepted(ingest, observer), time.monotonic()
        cpu0, polls0, load0 = _cpu_of(parts), fleet.stats["replica_info_polls"], _loadavg()
        await asyncio.sleep(args.measure)
        accepted, cpu = _ingest_accepted(ingest, observer) - a0, _cpu_of(parts)
        if stack.procs["streaming"].poll() is not None:
            print(f"  G={groups}: the streaming job exited ({stack.procs['streaming'].returncode}):\n"
                  f"{stack.log_tail('streaming', 40)}", flush=True)
        cpu = {k: cpu[k] - cpu0[k] for k in cpu}
        window = time.monotonic() - m0
        polls = fleet.stats["replica_info_polls"] - polls0
        job_cpu = cpu["job"]
        hb_rate = accepted / window
        out["hb_per_s"] = hb_rate
        out["offered_hb_per_s"] = 3 * groups
        print(f"  G={groups}: {hb_rate:,.0f} heartbeats/s accepted of {3 * groups:,} offered, {polls / window:,.0f} "
              f"replica-info polls/s; load average {load0} -> {_loadavg()}", flush=True)
        out["job_cpu_us_per_hb"] = round(job_cpu / max(1.0, accepted) * 1e6, 1)
        print(f"  G={groups}: Spark job CPU {job_cpu:.1f}s for {accepted:,.0f} heartbeats: "
              f"{out['job_cpu_us_per_hb']} us per heartbeat", flush=True)
        print(f"  G={groups}: CPU (cores) " + ", ".join(f"{k} {v / window:.2f}" for k, v in cpu.items())
              + f"; ingest {cpu['ingest'] / max(1.0, accepted) * 1e6:.0f} us/heartbeat, bench (fleet) "
              f"{cpu['bench'] / max(1.0, accepted + polls) * 1e6:.0f} us/request, leader "
              f"{cpu['leader'] / max(1.0, polls) * 1e6:.0f} us/replica-info poll (all its work / polls)", flush=True)
        epochs0 = {n: max(b.master_epoch for b in fleet.by_set[n]) for n in names}
        eligible = [n for n in names if fleet.master_of(n) is not None
                    and len(fleet.master_of(n).sync_state_set) == 3]
        out["settled"] = len(eligible)
        crash, hang = _victims(eligible, args.crash, args.hang)
        epochs_at_kill = {n: fleet.master_of(n).master_epoch for n in crash}
        crash_spans: dict[str, tuple[float, float]] = {}
        for mode, victims in (("crash", crash), ("hang", hang)):
            by_lane, _ = await _lane(client, endpoints)
            spans = await _failovers(fleet, reader, mode, victims, args)
            elected, out[f"{mode}_lane_timing"] = await _lane(client, endpoints)
            out[f"{mode}_by_lane"] = elected - by_lane  # (counted per mode: the lane elects for both)
            times = sorted(t1 - t0 for t0, t1 in spans.values())
            if mode == "crash":
                crash_spans = spans
            out[f"{mode}_n"], out[f"{mode}_replaced"] = len(victims), len(times)
            out[f"{mode}_p50_s"] = percentile(times, 0.5)
            out[f"{mode}_p99_s"] = percentile(times, 0.99)
            print(f"  G={groups}: {mode}: {len(times)}/{len(victims)} masters replaced; failover p50 "
                  f"{out[f'{mode}_p50_s']:.2f}s p99 {out[f'{mode}_p99_s']:.2f}s max "
                  f"{times[-1] if times else float('nan'):.2f}s (timeout {args.timeout_ms / 1000:.1f}s)", flush=True)
        await asyncio.sleep(fleet.poll_s + 2)  # brokers learn every epoch by polling replica info
        # (and the job has logged the batches that proposed: their lines come after the commit)
        for mode, record in (("crash", "disconnected"), ("hang", "silent")):
            print(f"  G={groups}: {mode}: {out[f'{mode}_by_lane']} of {out[f'{mode}_replaced']} new masters elected "
                  f"by the leader's lane from {record} records (api/connection_loss.py), the rest by the streaming job",
                  flush=True)
            if t := out[f"{mode}_lane_timing"]:  # the leader's last elections, up to this mode's (both, for hang)
                print(f"  G={groups}: the lane's elections at the leader up to the {mode} failovers (p50 / p99 ms): "
                      f"the record's way from the ingest worker {t['arrival_ms_p50']:g} / {t['arrival_ms_p99']:g}, its "
                      f"proposal to the answer {t['elect_ms_p50']:g} / {t['elect_ms_p99']:g} (over {t['elections']}); "
                      f"its records so far: {t['outcomes']}", flush=True)
        hops = out["crash_hops"] = _crash_hops(stack.logs / "streaming.log", crash_spans, epochs_at_kill)
        if hops.get("batch_ms"):
            print(f"  G={groups}: crash hops of the job's elections over {len(hops['batch_ms'])} failovers "
                  "(p50 / p99 s): " + ", ".join(
                      f"{k} {percentile(v, 0.5):.2f} / {percentile(v, 0.99):.2f}" for k, v in hops.items()), flush=True)
        touched = set(crash) | set(hang)
        moved = [n for n in names if n not in touched
                 and max(b.master_epoch for b in fleet.by_set[n]) != epochs0[n]]
        out["false_failovers"] = len(moved)
        if moved:
            print(f"  G={groups}: FALSE failovers: {moved[:10]}", flush=True)
        out["batch_ms"] = _batch_ms(stack.logs / "streaming.log")
        phases = out["phase_ms_p50"] = _phase_medians(stack.logs / "streaming.log")
        print(f"  G={groups}: batch phases p50 (ms): " + ", ".join(f"{k} {v:g}" for k, v in phases.items()), flush=True)
        out["sustained"], why = _verdict(out, groups, args.crash + args.hang)
        if why:
            print(f"  G={groups}: not sustained: {why}", flush=True)
        return out
    finally:
        try:
            async with asyncio.timeout(60):
                await fleet.stop()
                reader.close()
                await client.close()
        finally:
            stack.stop_all()


async def _first_batch(stack, limit_s: float) -> None:
    """Wait (without blocking the fleet's loop) until the Spark job logged its first micro-batch: before
    it, the controllers have no liveness and no set can settle (its start-up took 1-5 min on the loaded
    2-core machine, which a settle clock started at registration spent for nothing). A job that exited
    is an error, with its log's tail."""
    log, proc, end = stack.logs / "streaming.log", stack.procs["streaming"], time.monotonic() + limit_s
    while time.monotonic() < end:
        try:
            if " batch=" in log.read_text(errors="replace"):
                return
        except OSError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"the streaming job exited ({proc.returncode}):\n{stack.log_tail('streaming', 40)}")
        await asyncio.sleep(1.0)
    print(f"  the streaming job logged no batch within {limit_s:.0f}s; settling anyway", flush=True)


def _components(stack, leader_id: int | None) -> dict[str, list[int]]:
    """The processes whose CPU the bench reports, by role: pids of process trees."""
    nodes = {i: stack.procs[f"node{i}"].pid for i in stack.endpoints}
    parts = {"leader": [nodes[leader_id]] if leader_id in nodes else [],
             "followers": [pid for i, pid in nodes.items() if i != leader_id],
             "ingest": [stack.procs[f"ingest{i}"].pid for i in stack.ingest_endpoints],
             "job": [stack.procs["streaming"].pid]}
    if stack.kafka is not None and stack.kafka.proc is not None:
        parts["kafka"] = [stack.kafka.proc.pid]
    return parts


def _cpu_of(parts: dict[str, list[int]]) -> dict[str, float]:
    """CPU seconds so far of each role's process trees (from /proc), and of this process alone as `bench`
    (the simulated fleet; its tree would hold the whole stack, whose processes it started)."""
    return {**{k: sum(process_tree_cpu_s(pid) for pid in pids) for k, pids in parts.items()},
            "bench": time.process_time()}


def _loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def _verdict(out: dict, groups: int, asked: int) -> tuple[bool, str]:
    """Whether a size was sustained, and if not, why: the heartbeats kept up, enough sets settled to
    measure as many failovers as asked (a size whose sets cannot keep full sync-state sets is not
    one the stack holds, and a p99 of one failover says little), and every master was replaced."""
    if out["hb_per_s"] < 0.95 * out["offered_hb_per_s"]:
        return False, f"{out['hb_per_s']:,.0f} of {out['offered_hb_per_s']:,} heartbeats/s accepted (< 95%)"
    if out["settled"] < min(asked, groups):
        return False, (f"only {out['settled']} sets settled with a sync-state set of 3, {min(asked, groups)} "
                       "needed for the failovers asked")
    if out["crash_replaced"] < out["crash_n"] or out["hang_replaced"] < out["hang_n"]:
        return False, (f"{out['crash_replaced']}/{out['crash_n']} crashed and {out['hang_replaced']}/"
                       f"{out['hang_n']} hung masters replaced")
    return True, ""


def _victims(eligible: list[str], crash: int, hang: int) -> tuple[list[str], list[str]]:
    """The sets whose masters crash and hang: as asked, or, with fewer eligible sets, shared in proportion
    (a short supply must not leave one mode unmeasured: `hang_failover_*` came out nan at 9 eligible sets)."""
    if len(eligible) < crash + hang:
        crash = round(len(eligible) * crash / max(1, crash + hang))
        hang = len(eligible) - crash
    return eligible[:crash], eligible[crash:crash + hang]


async def _failovers(fleet, reader, mode: str, victims: list[str], args) -> dict[str, tuple[float, float]]:
    """Crash or hang the masters of `victims`; for each one replaced: (the kill (crash) or the master's last
    accepted heartbeat (hang), the moment replica info showed another master at a higher epoch), wall clock.

    Replica info is polled from the first kill on, all pending sets at once: polling only after the
    last kill, or one set after another, would add that wait to the measured times. The polls (20 sets
    every 50 ms) go over the fleet's kind of kept-alive connections to every node (a follower read is as
    fresh as the leader's), not through aiohttp to the leader, which they would load during the run.
    """
    started: dict[str, tuple[int, int, float]] = {}
    done: dict[str, float] = {}

    async def check(name: str, old: int, epoch: int, t0: float) -> None:
        try:
            h = (await reader.replica_info(name)).get("header") or {}
        except ConnectionError:
            return
        if (h.get("masterEpoch") or 0) > epoch and h.get("masterBrokerId") not in (None, old):
            done[name] = time.time()

    async def poll() -> None:
        deadline = time.monotonic() + len(victims) * args.every + args.timeout_ms / 1000 * 3 + 60
        while (len(started) < len(victims) or len(done) < len(started)) and time.monotonic() < deadline:
            await asyncio.gather(*(check(n, *v) for n, v in list(started.items()) if n not in done))
            await asyncio.sleep(0.05)

    poller = asyncio.create_task(poll())
    for name in victims:
        m = fleet.master_of(name)
        if m is None:  # its master changed meanwhile: not a victim
            victims = [v for v in victims if v != name]
            continue
        if mode == "crash":
            fleet.kill(name, m.broker_id)
            started[name] = (m.broker_id, m.master_epoch, time.time())
        else:
            fleet.hang(name, m.broker_id)
            started[name] = (m.broker_id, m.master_epoch, m.last_heartbeat_at)
        await asyncio.sleep(args.every)
    await poller
    return {n: (started[n][2], t) for n, t in done.items()}


async def _lane(client, endpoints: list[str]) -> tuple[int, dict]:
    """The connection-loss lane's elections so far over every node, and the timings of the node that made the
    most (the leader), with that node's counts of what became of the records it took (`outcomes`). A node
    that does not answer (restarting) is left out."""
    total, timing = 0, {}
    for ep in endpoints:
        try:
            pipe = (await client.metadata(ep))["pipeline"]
        except Exception:  # noqa: BLE001 - a restarting node
            continue
        total += pipe["connection_loss"]["elected"]
        t = pipe.get("connection_loss_timing") or {}
        if t.get("elections", 0) > timing.get("elections", 0):
            timing = {**t, "outcomes": {k: v for k, v in pipe["connection_loss"].items() if v}}
    return total, timing


def _log_time(line: str) -> float | None:
    """The wall-clock instant of a job log line (`2026-11-23 15:00:00,123 INFO ...`, local time)."""
    try:
        return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    except ValueError:
        return None


def _crash_hops(log: Path, spans: dict[str, tuple[float, float]], epochs: dict[str, int]) -> dict[str, list[float]]:
    """Where each crash failover's time went, from the job's log (proposal and batch lines) and the bench's clocks.

    * `to_batch`: the kill → the start of the micro-batch that proposed (the disconnect record's way to
      Kafka, then the wait for the next batch to be planned);
    * `batch_to_judged`: that batch's start → its judging instant (`proposedAtMs`: the data horizon, the
      newest ingest stamp the batch holds, so it may come slightly before the batch's start);
    * `judged_to_answered`: → the job had the leader's answer (the proposal's HTTP request, the Raft
      commit and apply; when the operator did not send it itself, also the rest of the batch up to
      `foreachBatch`);
    * `answered_to_seen`: → the bench's 50 ms replica-info poll saw the new master (negative: it saw the
      commit before the job's answer arrived);
    * `batch_ms`: the whole batch (its end is after the answer: liveness records and the progress event).
    """
    lines = log.read_text(errors="replace").splitlines()
    hops: dict[str, list[float]] = {k: [] for k in ("to_batch", "batch_to_judged", "judged_to_answered",
                                                     "answered_to_seen", "batch_ms")}
    for name, (t_kill, t_seen) in spans.items():
        key = f" proposal {name} expectedMasterEpoch={epochs.get(name)} "
        for i, line in enumerate(lines):
            t_ans = _log_time(line)
            # the job's own elections (code 0): a proposal fenced by the lane's election elected nothing
            if key not in line or " code 0," not in line or t_ans is None or t_ans < t_kill:
                continue
            try:
                detect = float(line.split(" detect_ms=")[1].split()[0])
                sent = float(line.split(" sent_ms=")[1].split()[0])
            except (IndexError, ValueError):
                break
            if " answered_at_ms=" in line:  # the operator's own send is answered before the sink logs it
                t_ans = float(line.split(" answered_at_ms=")[1].split()[0]) / 1000
            judged = t_ans - (sent - detect) / 1000
            batch = next((x for x in lines[i + 1:] if " batch_ms=" in x), None)
            t_end = _log_time(batch) if batch else None
            if t_end is None:
                break
            batch_ms = float(batch.split(" batch_ms=")[1].split()[0])
            start = t_end - batch_ms / 1000
            for k, v in (("to_batch", start - t_kill), ("batch_to_judged", judged - start),
                         ("judged_to_answered", t_ans - judged), ("answered_to_seen", t_seen - t_ans),
                         ("batch_ms", batch_ms / 1000)):
                hops[k].append(v)
            break
    return {k: sorted(v) for k, v in hops.items()}


def _phase_medians(log: Path) -> dict[str, float]:
    """Median of each phase of the job's batches (after the first three), from its per-batch log lines."""
    from .stream import phase_medians

    return phase_medians([x for x in log.read_text(errors="replace").splitlines() if " batch_ms=" in x][3:])


def _batch_ms(log: Path) -> float:
    """Median Spark batch duration from the job's per-batch log lines (after the first three)."""
    vals = []
    for line in log.read_text(errors="replace").splitlines():
        if " batch_ms=" in line:
            vals.append(float(line.split(" batch_ms=")[1].split()[0]))
    vals = sorted(vals[3:])
    return percentile(vals, 0.5) if vals else float("nan")


def main(argv: list[str]) -> int:
    p = Parser(prog="electra bench failover", description=__doc__,
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--groups", type=count_list(1, 64_000), default="100,300,1000",
                   help="broker set counts to try, smallest first")
    p.add_argument("--crash", type=int, default=20, help="masters crashed per size (session reset)")
    p.add_argument("--hang", type=int, default=20, help="masters hung per size (no heartbeats, connection kept)")
    p.add_argument("--every", type=float, default=0.5, help="seconds between two crashes or hangs")
    p.add_argument("--timeout-ms", type=int, minimum=1, default=3000, help="the brokers' heartbeatTimeoutMillis")
    p.add_argument("--trigger-ms", type=int, default=1000, help="the Spark job's trigger interval")
    p.add_argument("--ingest-workers", type=int, minimum=1, default=1, help="ingest worker processes per node")
    p.add_argument("--measure", type=float, minimum=1, default=15.0, help="seconds of heartbeat counting")
    p.add_argument("--settle", type=float, minimum=1, default=180.0,
                   help="max seconds to wait for full sync-state sets (from the job's first batch on)")
    p.add_argument("--job-start", type=float, minimum=1, default=300.0,
                   help="max seconds to wait for the Spark job's first batch after the fleet registered")
    p.add_argument("--job-arg", action="append", default=[],
                   help="an extra argument for the streaming job (repeat; e.g. --job-arg=--proposals-at-batch-end)")
    p.add_argument("--out", default=None, help="keep each size's logs under this directory (default: a temp dir)")
    args = p.parse_args(argv)
    from electra.streaming.job import check_extra_args

    check_extra_args(args.job_arg)  # the job's own parser: a bad --job-arg is refused before the stack starts
    if args.out:
        make_dir(args.out, "--out")
    sizes = args.groups
    print(f"bench failover: sizes {sizes}, {args.crash} crashed and {args.hang} hung masters per size, heartbeat "
          f"timeout {args.timeout_ms} ms, trigger {args.trigger_ms} ms", flush=True)
    results = []
    for g in sizes:
        if args.out:
            r = uvloop.run(_run_size(g, args, Path(args.out) / f"groups-{g}"))
        else:
            with tempfile.TemporaryDirectory(prefix=f"bench-failover-{g}-") as tmp:
                r = uvloop.run(_run_size(g, args, Path(tmp)))
        results.append(r)
        print(f"  G={g}: {'sustained' if r['sustained'] else 'NOT sustained'}; median Spark batch "
              f"{r['batch_ms']:.0f} ms", flush=True)
        if not r["sustained"]:
            break
    print(f"{'groups':>7} {'offered/s':>10} {'accepted/s':>10} {'crash':>9} {'p50_s':>6} {'p99_s':>6} {'hang':>9} "
          f"{'p50_s':>6} {'p99_s':>6} {'false':>5} {'us/hb':>7} {'batch_ms':>8}")
    for r in results:
        print(f"{r['groups']:>7} {r['offered_hb_per_s']:>10,} {r['hb_per_s']:>10,.0f} "
              f"{r['crash_replaced']:>4}/{r['crash_n']:<4} {r['crash_p50_s']:>6.2f} {r['crash_p99_s']:>6.2f} "
              f"{r['hang_replaced']:>4}/{r['hang_n']:<4} {r['hang_p50_s']:>6.2f} {r['hang_p99_s']:>6.2f} "
              f"{r['false_failovers']:>5} {r['job_cpu_us_per_hb']:>7.0f} {r['batch_ms']:>8.0f}")
    ok = [r for r in results if r["sustained"]]
    best = ok[-1] if ok else results[-1]
    if not ok:
        print(f"NOT sustained at any size: the RESULT line describes G={best['groups']} "
              f"({best.get('settled', 0)} sets settled, {best['hb_per_s']:,.0f} of {best['offered_hb_per_s']:,} "
              "heartbeats/s accepted)", flush=True)
    print(result_line(groups=best["groups"], timeout_s=args.timeout_ms / 1000,
                      crash_failover_p50_s=round(best["crash_p50_s"], 2),
                      crash_failover_p99_s=round(best["crash_p99_s"], 2),
                      hang_failover_p50_s=round(best["hang_p50_s"], 2),
                      hang_failover_p99_s=round(best["hang_p99_s"], 2),
                      false_failovers=best["false_failovers"], job_cpu_us_per_hb=best["job_cpu_us_per_hb"],
                      batch_ms_p50=round(best["batch_ms"]) if best["batch_ms"] == best["batch_ms"] else -1,
                      sustained=int(best["sustained"]), crash_failovers=best["crash_replaced"],
                      hang_failovers=best["hang_replaced"], crash_by_lane=best.get("crash_by_lane", 0),
                      hang_by_lane=best.get("hang_by_lane", 0)))
    return 0
