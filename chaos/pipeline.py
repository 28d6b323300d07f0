"""`electra chaos --pipeline`: faults on the heartbeat pipeline, with simulated brokers' roles checked.

One run starts one pipeline (Spark takes 60-90 s to start on the shared machine, so it is
paid once): the controller group of `electra chaos` (`ChaosCluster`, with its peer-link
proxies), tansu, an ingest worker per node, the Spark job, and a fleet of simulated broker
sets (`BrokerFleet`, each broker holding a session connection to an ingest worker, as
`bench failover` and `electra up --demo` run it). Then episodes follow one another, each
with one fault from the seeded schedule (chaos/nemesis.py's rng, kinds in turn):

| kind | injected | healed |
| --- | --- | --- |
| `kafka-restart` | tansu stopped (it keeps nothing: it comes back empty) | started again, topics created |
| `spark-kill` | the job's process group SIGKILLed (driver and JVM) | started again from its checkpoint |
| `ingest-kill` | one node's ingest worker SIGKILLed (no `disconnected` record can be produced) | started again |
| `broker-kill` | a set's master crashes: its session is reset, all its traffic stops | revived once replaced |
| `broker-hang` | a set's master hangs: connection kept, no heartbeats, no requests | revived once replaced |
| node kinds | `kill`, `pause`, `partition`, `delay`, `loss` from chaos/nemesis.py | as there |

A broker fault lasts until its master is replaced (or the failover bound passes): reviving
the broker earlier would let its heartbeats cancel the failover. After a Spark kill or a Kafka
restart the episode waits for the job's next micro-batch (bounded), and every episode ends with
a settling time (the heartbeat timeout plus a few seconds) for a false failover to show before
the next fault. Throughout, the controller workload of `electra chaos` runs on its own sets,
and every simulated broker's view (role, master, master epoch) and a watch stream per fleet
set are recorded; chaos/checkers.py checks both.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from electra.bench.common import percentile, result_line
from electra.broker_simulator import BrokerFleet
from electra.consensus import mutations
from electra.local_ports import free_ports

from . import report
from .checkers import (
    BROKER_FAULTS,
    FAILOVER_BOUND_S,
    check_broker_failover,
    check_episode,
    check_no_false_failover,
    check_one_acting_master,
    failover_seen,
)
from .cluster import ChaosCluster
from .history import HistoryLog
from .nemesis import KINDS, Fault, Nemesis, parse_kind, schedule
from .runner import (
    LEADER_WAIT_S,
    EpisodeResult,
    RunConfig,
    _credentials,
    _final_state,
    _leader,
    _wait_caught_up,
    _wait_leader,
    no_leader,
    stop_workload,
    summary_line,
)
from .workload import Workload

PIPELINE_KINDS = ("kafka-restart", "spark-kill", "ingest-kill", "broker-kill", "broker-hang")
NODE_KINDS = ("kill", "pause", "partition", "delay", "loss")  # need nothing but the processes and proxies
DEFAULT_FAULTS = "broker-kill,broker-hang,ingest-kill,kafka-restart,spark-kill,kill:leader,partition:isolate-leader"
JOB_READY_S = 300.0  # Spark's start-up and first batch: 60-90 s here under load, minutes at worst
# The job's first micro-batches are slow (the first took 94 s and the next three 8-10 s in a measured run,
# against 3-5 s later): episodes start after these, so failover times are the steady state's.
WARM_UP_BATCHES = 4
ROLE_POLL_S = 0.05  # how often the brokers' views are sampled (they change at most once a poll, 1 s)


@dataclass
class PipelineConfig(RunConfig):
    broker_sets: int = 4
    # The simulated brokers' heartbeatTimeoutMillis (RocketMQ's default). At 3 s the liveness the
    # controllers see is older than the timeout whenever a batch takes 4 s (this machine under load), so
    # masters cannot keep replicas in their sync-state sets (docs/failover-signal.md, round 2).
    broker_timeout_ms: int = 10_000
    failover_bound_s: float = FAILOVER_BOUND_S
    trigger_ms: int = 500
    settle_s: float = 3.0  # after each episode, beyond the heartbeat timeout: time for a false failover to show
    kinds: list[str] = field(default_factory=lambda: DEFAULT_FAULTS.split(","))
    sets: int = 2
    procs_per_set: int = 1


@dataclass
class PipelineEpisode(EpisodeResult):
    failovers: list[tuple[str, float]] = field(default_factory=list)  # (broker fault kind, seconds)
    false_failovers: int = 0


def parse_entry(entry: str) -> tuple[str, str | None]:
    kind, _, mode = entry.partition(":")
    if kind in PIPELINE_KINDS:
        if mode:
            raise ValueError(f"pipeline fault {kind!r} takes no mode")
        return kind, None
    if kind not in KINDS:  # name the pipeline's own kinds too
        raise ValueError(f"unknown fault kind {kind!r}; known with --pipeline: {', '.join(PIPELINE_KINDS)}, "
                         f"and the node kinds {', '.join(NODE_KINDS)}")
    return parse_kind(entry)


def supported(kinds: list[str]) -> tuple[list[str], dict[str, str]]:
    """The entries a pipeline run can inject: pipeline kinds and the node kinds that need no extra setup."""
    skipped = {}
    for e in kinds:
        k, _ = parse_entry(e)
        if k not in PIPELINE_KINDS and k not in NODE_KINDS:
            skipped[k] = f"not with --pipeline (only {', '.join(NODE_KINDS)} of the node-level kinds)"
    return [e for e in kinds if parse_entry(e)[0] not in skipped], skipped


def pipeline_schedule(seed: int, episode: int, kinds: list[str], nodes: int, mixed: bool = False,
                      duration: tuple[float, float] = (1.0, 2.5)) -> list[Fault]:
    """Episode `episode`'s faults: the kinds in turn, node kinds scheduled by the node nemesis itself. With
    `mixed`, a broker fault gets a node fault of the list on top half of the time (a failover during a
    leader election or a partition)."""
    entry = kinds[episode % len(kinds)]
    kind, _ = parse_entry(entry)
    if kind not in PIPELINE_KINDS:
        return schedule(seed, episode, [entry], nodes, False, duration)
    rng = random.Random(f"{seed}/{episode}")
    start = rng.uniform(0.3, 1.0)
    mode = {"kafka-restart": "kafka", "spark-kill": "job", "ingest-kill": "any"}.get(kind, "master")
    faults = [Fault(kind, mode, start, start + rng.uniform(*duration), seed=rng.randrange(1 << 30))]
    node_entries = [e for e in kinds if parse_entry(e)[0] not in PIPELINE_KINDS]
    if mixed and kind in BROKER_FAULTS and node_entries and rng.random() < 0.5:
        faults += schedule(seed, episode, [rng.choice(node_entries)], nodes, False, duration)
    return faults


class PipelineCluster(ChaosCluster):
    """The controller group of `electra chaos` plus tansu, one ingest worker per node and the Spark job."""

    def __init__(self, data_dir: Path, *, nodes: int, seed: int, tick_ms: int, secure: bool, trigger_ms: int) -> None:
        super().__init__(data_dir, nodes=nodes, seed=seed, tick_ms=tick_ms, secure=secure)
        self.ingest_endpoints = {i: f"127.0.0.1:{p}" for i, p in zip(self.ids, free_ports(nodes), strict=True)}
        self.cfg.trigger_ms = trigger_ms
        self.cfg.ingest_workers = 1

    def start(self) -> None:
        self.start_kafka()
        super().start()
        for i in self.ids:
            self.start_ingest(i)
        self.start_job()

    def kill_process(self, name: str) -> None:
        """SIGKILL a process and everything it started (the job's JVM, an ingest worker's children)."""
        p = self.procs.get(name)
        if p is None or p.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=10)

    def job_batches(self) -> int:
        """Micro-batches the job has logged so far (its log survives its restarts)."""
        try:
            return (self.logs / "streaming.log").read_text(errors="replace").count(" batch_ms=")
        except OSError:
            return 0


class PipelineNemesis:
    """Injects and heals pipeline faults; node-level faults go to the node nemesis."""

    def __init__(self, cluster: PipelineCluster, fleet: BrokerFleet) -> None:
        self.cluster, self.fleet, self.nodes = cluster, fleet, Nemesis(cluster)

    def victim(self, rng: random.Random) -> str | None:
        """A set whose every broker is up, with a master and a replica in sync (a failover has a candidate)."""
        ok = [s for s, bs in sorted(self.fleet.by_set.items())
              if (m := self.fleet.master_of(s)) is not None and len(m.sync_state_set) >= 2
              and all(b.alive and not b.hung for b in bs)]
        return rng.choice(ok) if ok else None

    async def start(self, f: Fault, leader: int | None, rec: dict) -> None:
        c, rng = self.cluster, random.Random(f.seed)
        if f.kind in BROKER_FAULTS:
            s = self.victim(rng)
            if s is None:
                f.detail = "no set with every broker up and a replica in sync: not injected"
                return
            m = self.fleet.master_of(s)
            assert m is not None and m.broker_id is not None
            rec.update(set=s, broker=m.broker_id, mepoch=m.master_epoch)
            (self.fleet.kill if f.kind == "broker-kill" else self.fleet.hang)(s, m.broker_id)
            f.detail = f"{s} master {m.broker_id} epoch {m.master_epoch}"  # targets name nodes: left empty
            f.undo = (s, m.broker_id)
        elif f.kind == "kafka-restart":
            assert c.kafka is not None
            await asyncio.to_thread(c.kafka.stop)
            f.detail = "tansu stopped"
        elif f.kind == "spark-kill":
            await asyncio.to_thread(c.kill_process, "streaming")
            f.detail = "job SIGKILLed"
        elif f.kind == "ingest-kill":
            f.targets = [rng.choice(c.ids)]
            await asyncio.to_thread(c.kill_process, f"ingest{f.targets[0]}")
            f.detail = "ingest worker SIGKILLed"
        else:
            await asyncio.to_thread(self.nodes.start, f, leader)

    async def heal(self, f: Fault) -> list[int]:
        c = self.cluster
        if f.kind in BROKER_FAULTS and f.undo is not None:
            self.fleet.revive(*f.undo)
        elif f.kind == "kafka-restart":
            await asyncio.to_thread(c.restart_kafka)
        elif f.kind == "spark-kill":
            c.start_job()
        elif f.kind == "ingest-kill":
            c.start_ingest(f.targets[0])
        elif f.kind not in PIPELINE_KINDS:
            return await asyncio.to_thread(self.nodes.heal, [f])
        return []


async def record_roles(fleet: BrokerFleet, log: HistoryLog, stop: asyncio.Event) -> None:
    """A `role` record whenever a simulated broker's view changes (the first pass records every broker)."""
    last: dict[tuple[str, int | None], tuple] = {}
    while True:
        for b in fleet.brokers:
            view = (b.role, b.master_id, b.master_epoch, b.alive, b.hung)
            if b.broker_id is not None and last.get((b.name, b.broker_id)) != view:
                last[(b.name, b.broker_id)] = view
                log.add("role", set=b.name, broker=b.broker_id, role=b.role, master=b.master_id,
                        mepoch=b.master_epoch, alive=b.alive, hung=b.hung)
        if stop.is_set():
            return
        await asyncio.sleep(ROLE_POLL_S)


async def _baseline(fleet: BrokerFleet, log: HistoryLog) -> None:
    """Every fleet set's master and epoch as the controller has them (the brokers' views may lag a poll)."""
    sets = {}
    for s, bs in sorted(fleet.by_set.items()):
        newest = max(bs, key=lambda b: b.master_epoch)
        sets[s] = {"master": newest.master_id, "mepoch": newest.master_epoch}
        with contextlib.suppress(Exception):  # no answer: the brokers' newest view stands in
            h = (await fleet.client.replica_info(s)).get("header") or {}
            if (h.get("masterEpoch") or 0) >= newest.master_epoch:
                sets[s] = {"master": h.get("masterBrokerId"), "mepoch": h.get("masterEpoch") or 0}
    log.add("fleet-baseline", sets=sets)


async def _wait_job_batch(cluster: PipelineCluster, after: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cluster.job_batches() > after:
            return True
        await asyncio.sleep(0.5)
    return False


async def run_episode(cfg: PipelineConfig, cluster: PipelineCluster, fleet: BrokerFleet, n: int,
                      kinds: list[str]) -> PipelineEpisode:
    log = HistoryLog()
    sets = [f"e{n}-s{k}" for k in range(cfg.sets)]
    creds = {r: _credentials(cluster, r) for r in ("broker", "admin")}
    endpoints = list(cluster.endpoints.values())
    wl = Workload(endpoints, creds, log, sets, seed=hash((cfg.seed, n)) & 0xFFFFFFFF,
                  procs_per_set=cfg.procs_per_set)
    watchers = Workload(endpoints, creds, log, sorted(fleet.by_set), seed=hash((cfg.seed, n, "fleet")) & 0xFFFFFFFF)
    nemesis = PipelineNemesis(cluster, fleet)
    faults = pipeline_schedule(cfg.seed, n, kinds, cfg.nodes, cfg.mixed, cfg.fault_s)
    clients: list[asyncio.Task] = []
    tasks: list[asyncio.Task] = []
    heal_at, recovery = 0.0, None
    try:
        await _baseline(fleet, log)
        tasks = [asyncio.create_task(record_roles(fleet, log, watchers.stop))]
        tasks += [asyncio.create_task(watchers.watch_loop(s)) for s in watchers.sets]
        await wl.setup_sets()
        tasks += [asyncio.create_task(wl.observer_loop()), asyncio.create_task(wl.heartbeat_loop())]
        tasks += [asyncio.create_task(wl.watch_loop(s)) for s in sets]
        clients = [asyncio.create_task(wl.client_loop(s)) for s in sets for _ in range(cfg.procs_per_set)]
        t0 = log.now()
        heal_due, started = 0.0, []
        for f in sorted(faults, key=lambda f: f.start):
            await asyncio.sleep(max(0.0, t0 + f.start - log.now()))
            leader = await _leader(wl, cluster)
            rec = log.add("fault-start", fault=f.kind, kind=f.kind, mode=f.mode, leader=leader)
            await nemesis.start(f, leader, rec)
            rec.update(fault=f.label(), target=f.targets, detail=f.detail, injected=log.now())
            heal_due = max(heal_due, rec["mono"] + (f.end - f.start))
            started.append(rec)
        await asyncio.sleep(max(0.0, heal_due - log.now()))
        for rec in started:
            if "set" in rec:  # a broker fault holds until its master is replaced (or the bound passes)
                deadline = rec["mono"] + cfg.failover_bound_s
                while log.now() < deadline and failover_seen(log, rec["set"], rec["broker"], rec["mepoch"],
                                                             rec["mono"]) is None:
                    await asyncio.sleep(0.1)
        batches = cluster.job_batches()
        restarted = []
        for f in faults:
            restarted += await nemesis.heal(f)
        heal_at = log.now()
        for f in faults:
            log.add("fault-end", fault=f.label(), kind=f.kind, target=f.targets, detail=f.detail,
                    restarted=restarted)
        if {f.kind for f in faults} & {"spark-kill", "kafka-restart"}:
            if await _wait_job_batch(cluster, batches, JOB_READY_S):
                log.add("job-ready", after=log.now() - heal_at)  # its first micro-batch since healing
            else:
                log.add("error", where="pipeline", error=f"the Spark job logged no batch within {JOB_READY_S:.0f}s "
                                                         "of healing")
        deadline = time.monotonic() + cfg.recovery_bound_s + 2
        while recovery is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            ops = {r["id"] for r in log.records if r["type"] == "invoke" and r["mono"] >= heal_at
                   and r["op"] in ("apply_broker_id", "register", "elect", "alter_sss")}
            done = [r["mono"] for r in log.records if r["type"] == "ok" and r["id"] in ops]
            if done:
                recovery = min(done) - heal_at
        # Time for a false failover to show: the heartbeat timeout and a few batches.
        await asyncio.sleep(cfg.broker_timeout_ms / 1000 + cfg.settle_s)
    finally:
        watchers.stop.set()
        await stop_workload(wl, clients, tasks, log)
        await watchers.close()
    try:
        final = await _final_state(wl, cluster, sets, proc=10**6 + n)
        if not await _wait_caught_up(wl, cluster, 60.0):
            print(f"warning: after episode {n} not every node caught up with the leader within 60s", flush=True)
    finally:
        await wl.close()
    findings = await asyncio.to_thread(check_episode, log, final, recovery, recovery_bound_s=cfg.recovery_bound_s)
    findings.verdicts.append(check_one_acting_master(log))
    failover, times = check_broker_failover(log, cfg.failover_bound_s)
    false, n_false = check_no_false_failover(log)
    findings.verdicts += [failover, false]
    path = cfg.out_dir / f"episode-{n:04d}.jsonl"
    log.write(path)
    ops = sum(1 for r in log.records if r["type"] == "invoke")
    return PipelineEpisode(n, faults, findings, ops, path, log, heal_at, failovers=times, false_failovers=n_false)


def replay_command(cfg: PipelineConfig, n: int) -> str:
    muts = ",".join(sorted(mutations.active()))
    d = PipelineConfig  # its defaults: an option equal to one is left out
    return (f"{'ELECTRA_TEST_MUTATION=' + muts + ' ' if muts else ''}electra chaos --pipeline --seed {cfg.seed} "
            f"--episode {n} --faults {','.join(cfg.kinds)} --broker-sets {cfg.broker_sets}"
            f"{' --mixed' if cfg.mixed else ''}"
            f"{f' --nodes {cfg.nodes}' if cfg.nodes != d.nodes else ''}"
            f"{f' --tick-ms {cfg.tick_ms}' if cfg.tick_ms != d.tick_ms else ''}"
            f"{f' --broker-timeout-ms {cfg.broker_timeout_ms}' if cfg.broker_timeout_ms != d.broker_timeout_ms else ''}"
            f"{' --insecure' if not cfg.secure else ''}")


async def _settled(fleet: BrokerFleet, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all((m := fleet.master_of(s)) is not None and len(m.sync_state_set) >= 2 for s in fleet.by_set):
            return True
        await asyncio.sleep(0.5)
    return False


async def run(cfg: PipelineConfig) -> tuple[int, str]:
    """Start the pipeline, run the episodes in sequence on it; returns (exit code, RESULT line)."""
    kinds, skipped = supported(cfg.kinds)
    for k, why in skipped.items():
        print(f"skipped fault kind {k}: {why}", flush=True)
    if not kinds:
        raise SystemExit("no fault kind can be injected here")
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    cluster = PipelineCluster(cfg.out_dir / "cluster", nodes=cfg.nodes, seed=cfg.seed, tick_ms=cfg.tick_ms,
                              secure=cfg.secure, trigger_ms=cfg.trigger_ms)
    if mutations.active():
        print(mutations.banner(), flush=True)
    results: list[PipelineEpisode] = []
    fleet: BrokerFleet | None = None
    t0 = time.monotonic()
    try:
        await asyncio.to_thread(cluster.start)
        probe = Workload(list(cluster.endpoints.values()), {r: _credentials(cluster, r) for r in ("broker", "admin")},
                         HistoryLog(), [], 0)
        try:
            if await _wait_leader(probe, cluster, LEADER_WAIT_S) is None:
                raise no_leader(cluster)
        finally:
            await probe.close()
        fleet = BrokerFleet(list(cluster.endpoints.values()), cfg.broker_sets, 3, cluster="pipe", heartbeat_s=1.0,
                            poll_s=1.0, timeout_ms=cfg.broker_timeout_ms, seed=cfg.seed,
                            ingest_endpoints=list(cluster.ingest_endpoints.values()),
                            credentials=_credentials(cluster, "broker"))
        await fleet.start()
        if not await _wait_job_batch(cluster, WARM_UP_BATCHES - 1, JOB_READY_S):
            raise RuntimeError(f"the Spark job logged no {WARM_UP_BATCHES} batches within {JOB_READY_S:.0f}s:\n"
                               + cluster.log_tail("streaming"))
        if not await _settled(fleet, 120.0):
            raise RuntimeError("the simulated broker sets did not all reach a master with a replica in sync "
                               "within 120s")
        print(f"pipeline up in {time.monotonic() - t0:.0f}s: {cfg.nodes} controllers, tansu, {cfg.nodes} ingest "
              f"workers, the Spark job, {cfg.broker_sets} broker sets x 3", flush=True)
        started = time.monotonic()
        for n in range(cfg.first_episode, cfg.first_episode + cfg.episodes):
            if cfg.time_budget_s is not None and time.monotonic() - started > cfg.time_budget_s:
                print(f"time budget of {cfg.time_budget_s:.0f}s spent: stopping after {len(results)} episodes",
                      flush=True)
                break
            r = await run_episode(cfg, cluster, fleet, n, kinds)
            results.append(r)
            fo = ",".join(f"{s:.2f}s" for _, s in r.failovers) or "-"
            print(f"{summary_line(cfg, r)} failover={fo} false_failovers={r.false_failovers}", flush=True)
            if not r.findings.ok:
                print(f"  history: {r.history}\n  replay: {replay_command(cfg, n)}", flush=True)
                if cfg.stop_on_failure:
                    break
    finally:
        try:
            if fleet is not None:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(30):
                        await fleet.stop()
        finally:
            await asyncio.to_thread(cluster.close)
    return _report(cfg, results, skipped)


def _report(cfg: PipelineConfig, results: list[PipelineEpisode], skipped: dict[str, str]) -> tuple[int, str]:
    html = cfg.out_dir / "report.html"
    html.write_text(report.render(cfg, results, skipped))
    print(f"report: {html}", flush=True)
    per_kind: dict[str, list[float]] = {}
    for r in results:
        for k, s in r.findings.unavailable:
            per_kind.setdefault(k, []).append(s)
    for k, v in sorted(per_kind.items()):
        v.sort()
        print(f"unavailable {k}: p50={percentile(v, 0.5):.2f}s p99={percentile(v, 0.99):.2f}s max={v[-1]:.2f}s "
              f"(n={len(v)})", flush=True)
    per_fault: dict[str, list[float]] = {}
    for r in results:
        for k, s in r.failovers:
            per_fault.setdefault(k, []).append(s)
    for k, v in sorted(per_fault.items()):
        v.sort()
        print(f"failover {k}: p50={percentile(v, 0.5):.2f}s p99={percentile(v, 0.99):.2f}s max={v[-1]:.2f}s "
              f"(n={len(v)}, bound {cfg.failover_bound_s:.0f}s)", flush=True)
    unav = sorted(s for r in results for _, s in r.findings.unavailable)
    rec = sorted(r.findings.recovery_s for r in results if r.findings.recovery_s is not None)
    fo = sorted(s for r in results for _, s in r.failovers)
    line = result_line(
        episodes=len(results), fault_kinds=len({f.kind for r in results for f in r.faults}),
        faults=sum(len(r.faults) for r in results), ops=sum(r.ops for r in results),
        lin_violations=sum(r.findings.count("linearizability") for r in results),
        invariant_violations=sum(r.findings.invariant_violations for r in results),
        lost_acked=sum(r.findings.lost_acked for r in results),
        unavailable_p99_s=percentile(unav, 0.99) if unav else 0.0,
        recovery_p99_s=percentile(rec, 0.99) if rec else 0.0,
        broker_failover_p99_s=percentile(fo, 0.99) if fo else 0.0,
        false_failovers=sum(r.false_failovers for r in results))
    failed = any(not r.findings.ok for r in results) or not results
    return (1 if failed else 0), line
