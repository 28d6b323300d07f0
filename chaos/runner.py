"""`electra chaos`: episodes of workload + nemesis on one real controller group, checked and reported.

One cluster serves every episode of a run; each episode uses fresh broker sets
(keys the checkers treat independently), heals all faults at its end, waits for
every node to catch up and only then hands over to the next. A violation makes the
run exit non-zero and prints the command that replays the failing episode.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from electra.bench.common import percentile, result_line
from electra.consensus import mutations
from electra.security.credentials import ClientCredentials

from . import report
from .checkers import RECOVERY_BOUND_S, Findings, check_episode
from .cluster import ChaosCluster
from .history import HistoryLog
from .nemesis import Fault, Nemesis, parse_kind, schedule, supported
from .workload import Workload

LEADER_WAIT_S = 30.0  # for the started cluster's first leader
FINAL_READ_S = 20.0  # to read every set's final state from a leader after the episode
LONG_FAULT_S = (1.0, 6.0)  # --long: how long each fault lasts (seconds, drawn per fault)


@dataclass
class RunConfig:
    out_dir: Path
    episodes: int = 30
    seed: int = 1
    first_episode: int = 0
    nodes: int = 3
    kinds: list[str] = field(default_factory=lambda: ["kill", "pause", "partition", "delay", "loss", "clock",
                                                       "clock-rate", "disk-full", "torn-tail", "slow-disk",
                                                       "power-loss"])
    mixed: bool = False
    sets: int = 3
    procs_per_set: int = 2
    fault_s: tuple[float, float] = (1.0, 2.5)
    tick_ms: int = 100
    secure: bool = True
    stop_on_failure: bool = False
    recovery_bound_s: float = RECOVERY_BOUND_S
    fsync_delay_ms: int = 0  # every fsync of every node waits this long, all run (a slow disk everywhere)
    election_jitter_ticks: int | None = None  # the nodes' election timeout spread (None: their default)
    time_budget_s: float | None = None  # no new episode starts after this long (a soak cut to the time there is)


@dataclass
class EpisodeResult:
    number: int
    faults: list[Fault]
    findings: Findings
    ops: int
    history: Path
    log: HistoryLog
    heal_at: float


def _credentials(cluster: ChaosCluster, role: str) -> ClientCredentials:
    if cluster.creds is None:
        return ClientCredentials.from_files(None, None)
    return cluster.creds.credentials(role)


async def _leader(wl: Workload, cluster: ChaosCluster) -> int | None:
    """The node leading the newest term: a cut-off leader of an older term may still claim to lead,
    and a fault aimed at "the leader" must hit the one the others follow."""
    ids = [i for i in cluster.endpoints if cluster.alive(i) and i not in cluster.paused]
    claims = await asyncio.gather(*(wl.leader_term(cluster.endpoints[i]) for i in ids))
    leaders = [(term, i) for i, (leads, term) in zip(ids, claims, strict=True) if leads]
    return max(leaders)[1] if leaders else None


async def _wait_leader(wl: Workload, cluster: ChaosCluster, timeout: float) -> int | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (lead := await _leader(wl, cluster)) is not None:
            return lead
        await asyncio.sleep(0.1)
    return None


async def _just_after_an_acknowledged_change(log: HistoryLog, timeout: float) -> None:
    """Return as soon as a write that changed a set is acknowledged (bounded): the worst moment for a
    power cut, when that write may still sit only in page caches if anything acknowledged it early."""
    seen = len(log.records)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for r in log.records[seen:]:
            if r["type"] == "ok" and (r.get("out") or {}).get("code") == 0 and r.get("changed"):
                return
        seen = len(log.records)
        await asyncio.sleep(0.005)


async def _wait_caught_up(wl: Workload, cluster: ChaosCluster, timeout: float) -> bool:
    """Every node has applied what the leader committed (so a torn or lagging node is whole again)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        mds = []
        for ep in cluster.endpoints.values():
            with contextlib.suppress(Exception):
                mds.append(await wl.meta.metadata(ep))
        lead = [m for m in mds if m.get("is_leader")]
        if len(mds) == len(cluster.ids) and lead and all(
                m["applied_index"] >= lead[0]["commit_index"] for m in mds):
            return True
        await asyncio.sleep(0.1)
    return False


async def _final_state(wl: Workload, cluster: ChaosCluster, sets: list[str], proc: int
                       ) -> dict[str, dict[str, Any] | None]:
    """Each set as the leader has it at the end: leader-checked replica info (recorded, so linearizability
    covers it) plus the broker ids from the leader's sync-state data."""
    final: dict[str, dict[str, Any] | None] = {}
    deadline = time.monotonic() + FINAL_READ_S
    for s in sets:
        while time.monotonic() < deadline:
            lead = await _leader(wl, cluster)
            if lead is None:
                await asyncio.sleep(0.1)
                continue
            wl.broker.preferred = cluster.endpoints[lead]
            before = len(wl.log.records)
            await wl.run_op(proc, s, "replica_info", {})
            rec = wl.log.records[-1]
            if rec["type"] != "ok" or not rec.get("leader_read") or len(wl.log.records) == before:
                continue
            out = rec["out"]
            if out["code"] != 0:
                final[s] = None
                break
            # Sync-state data is the answering node's local view: ask the leader, and use the answer
            # only if that node still led the same term afterwards (it had applied every acked write).
            ep = cluster.endpoints[lead]
            _, term = await wl.leader_term(ep)
            wl.admin.preferred = ep
            try:
                node, _, body = await wl.admin.attempt("POST", "/v1/admin/sync-state-data", {"brokerNames": [s]})
            except Exception:
                continue
            if node != ep or await wl.leader_term(ep) != (True, term):
                continue
            table = (body.get("body") or {}).get("replicasInfoTable", {}).get(s, {})
            brokers = {r["brokerId"] for part in ("inSyncReplicas", "notInSyncReplicas") for r in table.get(part, [])}
            final[s] = {"brokers": brokers, "mepoch": out.get("mepoch", 0), "sse": out.get("sse", 0)}
            break
    return final


async def stop_workload(wl, clients, tasks, log) -> None:
    """Stop the client workload: operations in flight complete (or time out as unknown) before the
    history closes; the other workload tasks are cancelled and their failures recorded."""
    wl.stop.set()
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(wl.op_timeout_s + 3):
            await asyncio.gather(*clients, return_exceptions=True)
    for t in tasks:
        t.cancel()
    for res in await asyncio.gather(*tasks, return_exceptions=True):
        if isinstance(res, Exception):
            log.add("error", where="workload task", error=f"{type(res).__name__}: {res}")


async def run_episode(cfg: RunConfig, cluster: ChaosCluster, n: int, kinds: list[str]) -> EpisodeResult:
    log = HistoryLog()
    sets = [f"e{n}-s{k}" for k in range(cfg.sets)]
    creds = {r: _credentials(cluster, r) for r in ("broker", "admin")}
    # A slow disk everywhere makes every write slower: give requests room for a few fsyncs.
    wl = Workload(list(cluster.endpoints.values()), creds, log, sets, seed=hash((cfg.seed, n)) & 0xFFFFFFFF,
                  procs_per_set=cfg.procs_per_set, op_timeout_s=2.0 + 3 * cfg.fsync_delay_ms / 1000)
    nemesis = Nemesis(cluster)
    faults = schedule(cfg.seed, n, kinds, cfg.nodes, cfg.mixed, cfg.fault_s)
    tasks: list[asyncio.Task] = []
    clients: list[asyncio.Task] = []
    heal_at = 0.0
    recovery: float | None = None
    try:  # the workload's HTTP sessions are closed however the episode ends (Ctrl-C and SIGTERM included)
        try:
            await wl.setup_sets()
            background = [asyncio.create_task(wl.observer_loop()), asyncio.create_task(wl.heartbeat_loop())]
            background += [asyncio.create_task(wl.watch_loop(s)) for s in sets]
            clients = [asyncio.create_task(wl.client_loop(s)) for s in sets for _ in range(cfg.procs_per_set)]
            clients += [asyncio.create_task(wl.pinned_reader_loop(s)) for s in sets]
            tasks = background + clients
            t0 = log.now()
            heal_due = 0.0
            for f in sorted(faults, key=lambda f: f.start):
                await asyncio.sleep(max(0.0, t0 + f.start - log.now()))
                if f.kind == "power-loss":
                    await _just_after_an_acknowledged_change(log, timeout=8.0)
                leader = await _leader(wl, cluster)
                wl.pinned = cluster.endpoints[leader] if leader is not None else None
                rec = log.add("fault-start", fault=f.kind, kind=f.kind, mode=f.mode, leader=leader)
                await asyncio.to_thread(nemesis.start, f, leader)
                rec.update(fault=f.label(), target=f.targets, detail=f.detail, injected=log.now())
                heal_due = max(heal_due, rec["mono"] + (f.end - f.start))  # each fault lasts its full duration
            await asyncio.sleep(max(0.0, heal_due - log.now()))
            exit_codes = {i: cluster.exit_code(i) for i in cluster.ids if cluster.exit_code(i) is not None}
            restarted = await asyncio.to_thread(nemesis.heal, faults)
            heal_at = log.now()
            for f in faults:
                log.add("fault-end", fault=f.label(), kind=f.kind, target=f.targets, detail=f.detail,
                        restarted=restarted, exit_codes=exit_codes)
            # Recovery: the first write invoked after healing that is acknowledged.
            deadline = time.monotonic() + cfg.recovery_bound_s + 2
            while recovery is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
                acked = [r for r in log.records if r["type"] == "ok"]
                ops = {r["id"]: r for r in log.records if r["type"] == "invoke" and r["mono"] >= heal_at
                       and r["op"] in ("apply_broker_id", "register", "elect", "alter_sss")}
                done = [r["mono"] for r in acked if r["id"] in ops]
                if done:
                    recovery = min(done) - heal_at
            await asyncio.sleep(0.5)
        finally:
            await stop_workload(wl, clients, tasks, log)
        final = await _final_state(wl, cluster, sets, proc=10**6 + n)
        if not await _wait_caught_up(wl, cluster, 60.0):
            # The next episode could then hit the only up-to-date node and look like a lost write.
            print(f"warning: after episode {n} not every node caught up with the leader within 60s", flush=True)
    finally:
        await wl.close()
    findings = await asyncio.to_thread(check_episode, log, final, recovery, recovery_bound_s=cfg.recovery_bound_s)
    path = cfg.out_dir / f"episode-{n:04d}.jsonl"
    log.write(path)
    ops = sum(1 for r in log.records if r["type"] == "invoke")
    return EpisodeResult(n, faults, findings, ops, path, log, heal_at)


def no_leader(cluster: ChaosCluster) -> SystemExit:
    """The run cannot start (nodes that cannot start or elect: a starved machine, a --fsync-delay-ms longer than
    an election, ...): one line, exit 1, the last words of node 1's log and where the logs are; no traceback."""
    last = cluster.log_tail("node1", lines=1).strip()
    return SystemExit(f"error: the controller group elected no leader within {LEADER_WAIT_S:.0f}s "
                      f"(logs in {cluster.logs}{'; node 1 last logged: ' + last[:300] if last else ''})")


def summary_line(cfg: RunConfig, r: EpisodeResult) -> str:
    f = r.findings
    unav = max((s for _, s in f.unavailable), default=0.0)
    verdict = "ok" if f.ok else "FAIL " + "; ".join(f"{v.checker}: {v.detail}" for v in f.verdicts if not v.ok)
    rec = f"{f.recovery_s:.2f}s" if f.recovery_s is not None else "none"
    return (f"episode {r.number} seed={cfg.seed} faults={'+'.join(x.label() for x in r.faults)} ops={r.ops} "
            f"lin={f.count('linearizability')} invariants={f.invariant_violations} lost_acked={f.lost_acked} "
            f"unavailable={unav:.2f}s recovery={rec} {verdict}")


def replay_command(cfg: RunConfig, n: int) -> str:
    muts = ",".join(sorted(mutations.active()))
    return (f"{'ELECTRA_TEST_MUTATION=' + muts + ' ' if muts else ''}electra chaos --seed {cfg.seed} --episode {n} "
            f"--nodes {cfg.nodes} --faults {','.join(cfg.kinds)}"
            f"{' --long' if cfg.fault_s == LONG_FAULT_S else ' --mixed' if cfg.mixed else ''}"
            f"{f' --sets {cfg.sets}' if cfg.sets != RunConfig.sets else ''}"
            f"{f' --tick-ms {cfg.tick_ms}' if cfg.tick_ms != RunConfig.tick_ms else ''}"
            f"{f' --recovery-bound-s {cfg.recovery_bound_s:g}' if cfg.recovery_bound_s != RECOVERY_BOUND_S else ''}"
            f"{f' --fsync-delay-ms {cfg.fsync_delay_ms}' if cfg.fsync_delay_ms else ''}"
            f"{f' --election-jitter-ticks {cfg.election_jitter_ticks}' if cfg.election_jitter_ticks else ''}"
            f"{' --insecure' if not cfg.secure else ''}")


async def run(cfg: RunConfig) -> tuple[int, str]:
    """Run the episodes; returns (exit code, RESULT line)."""
    kinds, skipped = supported(cfg.kinds, cfg.nodes)
    for k, why in skipped.items():
        print(f"skipped fault kind {k}: {why}", flush=True)
    if not kinds:
        raise SystemExit("no fault kind can be injected here")
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    base = {parse_kind(e)[0] for e in kinds}
    cluster = ChaosCluster(cfg.out_dir / "cluster", nodes=cfg.nodes, seed=cfg.seed, tick_ms=cfg.tick_ms,
                           secure=cfg.secure, tmpfs="disk-full" in base, faketime="clock" in base,
                           disk_shim=bool(base & {"slow-disk", "power-loss"}) or cfg.fsync_delay_ms > 0,
                           fsync_delay_ms=cfg.fsync_delay_ms, election_jitter_ticks=cfg.election_jitter_ticks,
                           clock_rate="clock-rate" in base)
    for kind, failed in (("disk-full", not cluster.mounted), ("slow-disk", cluster.disk_shim is None),
                         ("power-loss", cluster.disk_shim is None)):
        if kind in base and failed:
            why = "mounting a tmpfs failed" if kind == "disk-full" else "building the disk shim failed"
            kinds = [e for e in kinds if parse_kind(e)[0] != kind]
            skipped[kind] = why
            print(f"skipped fault kind {kind}: {why}", flush=True)
    results: list[EpisodeResult] = []
    if mutations.active():
        print(mutations.banner(), flush=True)
    interrupted = False
    try:
        cluster.start()
        probe = Workload(list(cluster.endpoints.values()), {r: _credentials(cluster, r) for r in ("broker", "admin")},
                         HistoryLog(), [], 0)
        try:
            if await _wait_leader(probe, cluster, LEADER_WAIT_S) is None:
                raise no_leader(cluster)
        finally:
            await probe.close()
        started = time.monotonic()
        for n in range(cfg.first_episode, cfg.first_episode + cfg.episodes):
            if cfg.time_budget_s is not None and time.monotonic() - started > cfg.time_budget_s:
                print(f"time budget of {cfg.time_budget_s:.0f}s spent: stopping after {len(results)} episodes",
                      flush=True)
                break
            r = await run_episode(cfg, cluster, n, kinds)
            results.append(r)
            print(summary_line(cfg, r), flush=True)
            if not r.findings.ok:
                print(f"  history: {r.history}\n  replay: {replay_command(cfg, n)}", flush=True)
                if cfg.stop_on_failure:
                    break
    except (asyncio.CancelledError, KeyboardInterrupt):  # Ctrl-C cancels this task; SIGTERM raises (interrupts.py)
        interrupted = True
        raise
    finally:
        cluster.close()
        if interrupted:  # what the finished episodes found is reported all the same (exit 130 says it stopped short)
            print(f"interrupted: reporting the {len(results)} finished episode(s)", flush=True)
            print(report_run(cfg, results, skipped)[1], flush=True)
    return report_run(cfg, results, skipped)


def report_run(cfg: RunConfig, results: list[EpisodeResult], skipped: dict[str, str]) -> tuple[int, str]:
    """Write report.html and print the unavailability per kind; returns (exit code, RESULT line)."""
    html = cfg.out_dir / "report.html"
    html.write_text(report.render(cfg, results, skipped))
    print(f"report: {html}", flush=True)
    unav = sorted(s for r in results for _, s in r.findings.unavailable)
    rec = sorted(r.findings.recovery_s for r in results if r.findings.recovery_s is not None)
    per_kind: dict[str, list[float]] = {}
    for r in results:
        for k, s in r.findings.unavailable:
            per_kind.setdefault(k, []).append(s)
    for k, v in sorted(per_kind.items()):
        v.sort()
        print(f"unavailable {k}: p50={percentile(v, 0.5):.2f}s p99={percentile(v, 0.99):.2f}s max={v[-1]:.2f}s "
              f"(n={len(v)})", flush=True)
    line = result_line(
        episodes=len(results), fault_kinds=len({f.kind for r in results for f in r.faults}),
        faults=sum(len(r.faults) for r in results), ops=sum(r.ops for r in results),
        lin_violations=sum(r.findings.count("linearizability") for r in results),
        invariant_violations=sum(r.findings.invariant_violations for r in results),
        lost_acked=sum(r.findings.lost_acked for r in results),
        unavailable_p99_s=percentile(unav, 0.99) if unav else 0.0,
        recovery_p99_s=percentile(rec, 0.99) if rec else 0.0)
    failed = any(not r.findings.ok for r in results)
    return (1 if failed else 0), line
