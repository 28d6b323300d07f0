"""The checkers: what must hold in every episode's history, whatever the faults.

- linearizability of the controller operations per broker set, against the state
  machine as the model (chaos/controller_model.py); reads count only when the node
  that served them led the same term before and after (a follower read is allowed
  to be stale by design);
- at most one master per (broker set, master epoch), over everything any client or
  watcher saw, follower reads included;
- at most one Raft leader per term, over the observer's metadata polls;
- epochs never go backwards for one observer (a client's writes and leader reads in
  order, one watch connection's events);
- every acknowledged write is in the final state (`lost_acked`);
- recovery: once faults heal the group accepts a write again within a stated bound.

Unavailability windows (per fault: from its start to the first acknowledged write
invoked after it) are measurements, reported per fault kind, not verdicts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from electra.consensus import linearizability
from electra.consensus.linearizability import Op
from electra.state.codes import Code

from . import controller_model
from .history import HistoryLog, operations

# Liveness needs CPU: on a 2-core machine shared with a dozen busy processes a restarted node takes
# seconds to import and elect. The bound is a stated parameter (`electra chaos --recovery-bound-s`).
RECOVERY_BOUND_S = 30.0


@dataclass
class Verdict:
    checker: str
    ok: bool
    violations: int = 0
    detail: str = ""


@dataclass
class Findings:
    verdicts: list[Verdict] = field(default_factory=list)
    lost_acked: int = 0
    unavailable: list[tuple[str, float]] = field(default_factory=list)  # (fault kind, seconds)
    recovery_s: float | None = None

    @property
    def ok(self) -> bool:
        return all(v.ok for v in self.verdicts)

    def count(self, checker: str) -> int:
        return sum(v.violations for v in self.verdicts if v.checker == checker)

    @property
    def invariant_violations(self) -> int:
        """Violations of every checker but linearizability and lost writes (each counted on its own)."""
        return sum(v.violations for v in self.verdicts
                   if v.checker not in ("linearizability", "acknowledged-writes-kept"))


def _model_ops(ops: list[dict[str, Any]]) -> list[Op]:
    out = []
    for o in ops:
        if o["status"] == "fail" or o["op"] not in controller_model.WRITES + controller_model.READS:
            continue
        if o["op"] in controller_model.READS and not (o["status"] == "ok" and o.get("leader_read")):
            continue
        ret = o["ret"] if o["status"] == "ok" else math.inf
        out.append(Op(o["proc"], o["set"], o["op"], o["args"], o["call"], ret, o.get("out"), o["status"], o["id"]))
    return out


def check_linearizable(ops: list[dict[str, Any]], timeout_s: float = 20.0) -> Verdict:
    model_ops = _model_ops(ops)
    res = linearizability.check(model_ops, initial=controller_model.INITIAL, timeout_s=timeout_s,
                                model=controller_model.MODEL)
    if res.ok:
        return Verdict("linearizability", True, 0, f"{len(model_ops)} ops over {len({o.key for o in model_ops})} sets")
    # A search that ran out of time proves nothing: not a violation, but not a pass either.
    what = "could not be decided in time" if res.timed_out else "not linearizable"
    return Verdict("linearizability", False, 0 if res.timed_out else 1,
                   f"set {res.key}: {what}: {res.explanation}")


def _observations(log: HistoryLog, ops: list[dict[str, Any]]) -> list[tuple[str, int, int, str]]:
    """(set, master epoch, master, who) for every master any client or watcher was told of."""
    seen = []
    for o in ops:
        out = o.get("out") or {}
        told = out.get("code") in (Code.SUCCESS, Code.CONTROLLER_MASTER_STILL_EXIST)
        if o["status"] == "ok" and told and out.get("master") is not None and out.get("mepoch") is not None:
            seen.append((o["set"], out["mepoch"], out["master"], f"op {o['id']} {o['op']} via {o.get('node')}"))
    for w in log.of_type("watch"):
        ev = w["event"]
        if ev.get("type") == "ElectMaster" and ev.get("newMasterElected"):
            seen.append((w["set"], ev["masterEpoch"], ev["newMasterBrokerId"], f"watch {w['conn']}"))
    return seen


def check_one_master_per_epoch(log: HistoryLog, ops: list[dict[str, Any]]) -> Verdict:
    masters: dict[tuple[str, int], dict[int, str]] = {}
    for s, epoch, master, who in _observations(log, ops):
        masters.setdefault((s, epoch), {}).setdefault(master, who)
    bad = {k: v for k, v in masters.items() if len(v) > 1}
    if not bad:
        return Verdict("one-master-per-epoch", True, 0, f"{len(masters)} (set, epoch) pairs")
    (s, e), who = next(iter(sorted(bad.items())))
    return Verdict("one-master-per-epoch", False, len(bad), f"set {s} epoch {e}: masters {who}")


def check_one_leader_per_term(log: HistoryLog) -> Verdict:
    leaders: dict[int, set[str]] = {}
    for r in log.of_type("leader"):
        leaders.setdefault(r["term"], set()).add(r["node"])
    bad = {t: n for t, n in leaders.items() if len(n) > 1}
    if not bad:
        return Verdict("one-leader-per-term", True, 0, f"{len(leaders)} terms")
    t = min(bad)
    return Verdict("one-leader-per-term", False, len(bad), f"term {t}: leaders {sorted(bad[t])}")


def check_monotonic_epochs(log: HistoryLog, ops: list[dict[str, Any]]) -> Verdict:
    bad: list[str] = []
    last: dict[tuple[str, str], int] = {}
    for o in sorted((o for o in ops if o["status"] == "ok"), key=lambda o: o["ret"]):
        out = o.get("out") or {}
        if out.get("mepoch") is None or (o["op"] in controller_model.READS and not o.get("leader_read")):
            continue
        key = (f"proc {o['proc']}", o["set"])
        if out["mepoch"] < last.get(key, -1):
            bad.append(f"{key[0]} on {o['set']}: epoch {out['mepoch']} after {last[key]} (op {o['id']})")
        last[key] = max(out["mepoch"], last.get(key, -1))
    for w in log.of_type("watch"):
        ev = w["event"]
        for field_ in ("masterEpoch", "syncStateSetEpoch"):
            if ev.get(field_) is None:
                continue
            key = (f"watch {w['conn']} {field_}", w["set"])
            if ev[field_] < last.get(key, -1):
                bad.append(f"{key[0]}: {ev[field_]} after {last[key]}")
            last[key] = max(ev[field_], last.get(key, -1))
    if not bad:
        return Verdict("monotonic-epochs", True, 0, f"{len(last)} observers")
    return Verdict("monotonic-epochs", False, len(bad), bad[0])


def check_watchers_miss_nothing(log: HistoryLog) -> Verdict:
    """Each set's watcher, over all its connections (it resumes with `Last-Event-ID` on whatever node it
    reconnects to), received every role change once and in order: event ids rise, and the sync-state-set
    epoch, which every successful election and sync-state-set change moves by one, never skips one. A
    `resync` event (the node no longer held the missed events, or a leader did not know the watcher's
    index) starts the count again from the set as it is."""
    bad: list[str] = []
    last: dict[str, tuple[int, int | None, str]] = {}  # set -> (id, syncStateSetEpoch, conn) of the last event
    events = 0
    for w in log.of_type("watch"):
        ident, ev = w.get("id"), w["event"]
        if ident is None:  # a record of the history before watchers resumed
            continue
        events += 1
        ident, epoch = int(ident), ev.get("syncStateSetEpoch")
        prev = last.get(w["set"])
        if prev is not None and ident <= prev[0] and w.get("kind") != "resync":
            bad.append(f"watcher of {w['set']}: event {ident} on {w['conn']} after {prev[0]} on {prev[2]}")
        elif prev is not None and w.get("kind") != "resync" and prev[1] is not None and epoch is not None \
                and epoch - prev[1] not in (0, 1):
            bad.append(f"watcher of {w['set']}: sync-state-set epoch {prev[1]} (event {prev[0]}, {prev[2]}) then "
                       f"{epoch} (event {ident}, {w['conn']}): a role change was missed")
        last[w["set"]] = (ident, epoch, w["conn"])
    if not bad:
        return Verdict("watchers-miss-nothing", True, 0, f"{events} events to {len(last)} resuming watchers")
    return Verdict("watchers-miss-nothing", False, len(bad), bad[0])


def lost_acknowledged(ops: list[dict[str, Any]], final: dict[str, dict[str, Any] | None]) -> tuple[int, str]:
    """Acknowledged writes missing from the final state of their set: broker ids, epochs reached."""
    lost, example = 0, ""
    for o in ops:
        out = o.get("out") or {}
        if o["status"] != "ok" or out.get("code") != Code.SUCCESS or o["set"] not in final:
            continue
        f = final[o["set"]]
        missing = None
        if o["op"] == "apply_broker_id" and (f is None or o["args"]["bid"] not in f["brokers"]):
            missing = f"broker id {o['args']['bid']}"
        elif o["op"] == "elect" and (f is None or f["mepoch"] < out.get("mepoch", 0)):
            missing = f"master epoch {out.get('mepoch')}"
        elif o["op"] == "alter_sss" and (f is None or f["sse"] < out.get("sse", 0)):
            missing = f"sync-state-set epoch {out.get('sse')}"
        if missing:
            lost += 1
            example = example or f"set {o['set']}: acknowledged {missing} (op {o['id']}) is not in the final state"
    return lost, example


def unavailability(log: HistoryLog, ops: list[dict[str, Any]]) -> list[tuple[str, float]]:
    """Per fault: seconds from its start (once injected) to the first acknowledged write invoked after it,
    labelled by kind and, where it says whom the fault hit (`kill(leader)`, `partition(isolate-leader)`), its mode."""
    writes = sorted((o for o in ops if o["status"] == "ok" and o["op"] in controller_model.WRITES),
                    key=lambda o: o["call"])
    out = []
    for f in log.of_type("fault-start"):
        # From when the fault is in force (the nemesis's `injected` stamp): a write invoked while the
        # injection was still under way could be answered by a node it was about to cut off.
        t0 = f.get("injected", f["mono"])
        # The earliest acknowledgement among them (not the one invoked first: that one may have spent
        # seconds in its client's retries while later ones already went through).
        first = min((o["ret"] for o in writes if o["call"] >= t0), default=None)
        if first is not None:
            what = f["kind"] if f.get("mode", "node") in ("node", "any") else f"{f['kind']}({f['mode']})"
            out.append((what, first - t0))
    return out


def check_episode(log: HistoryLog, final: dict[str, dict[str, Any] | None], recovery_s: float | None,
                  lin_timeout_s: float = 20.0, recovery_bound_s: float = RECOVERY_BOUND_S) -> Findings:
    ops = operations(log)
    fnd = Findings(recovery_s=recovery_s)
    fnd.verdicts.append(check_linearizable(ops, lin_timeout_s))
    fnd.verdicts.append(check_one_master_per_epoch(log, ops))
    fnd.verdicts.append(check_one_leader_per_term(log))
    fnd.verdicts.append(check_monotonic_epochs(log, ops))
    fnd.verdicts.append(check_watchers_miss_nothing(log))
    fnd.lost_acked, example = lost_acknowledged(ops, final)
    unread = sorted({o["set"] for o in ops} - final.keys())
    if unread:  # a set whose final state could not be read proves nothing about its writes
        example = example or f"the final state of {', '.join(unread)} could not be read from a leader"
    fnd.verdicts.append(Verdict("acknowledged-writes-kept", fnd.lost_acked == 0 and not unread, fnd.lost_acked,
                                example or f"{len(final)} sets read at the end"))
    recovered = recovery_s is not None and recovery_s <= recovery_bound_s
    fnd.verdicts.append(Verdict("recovery", recovered, 0 if recovered else 1,
                                f"write accepted {recovery_s:.2f}s after healing" if recovery_s is not None
                                else f"no write accepted within {recovery_bound_s:.0f}s after healing"))
    errors = [r for r in log.of_type("error")]
    if errors:  # the harness itself broke: the episode proves nothing, so it cannot pass
        fnd.verdicts.append(Verdict("harness", False, 0, f"{len(errors)} errors, first: {errors[0]['error']}"))
    fnd.unavailable = unavailability(log, ops)
    return fnd


# ---------------------------------------------------------------------- the pipeline (`electra chaos --pipeline`)
# History records of a pipeline run (chaos/pipeline.py), besides the controller operations:
# - `role`: a simulated broker's view changed (`set`, `broker`, `role`, `master`, `mepoch`, `alive`, `hung`),
#   from its replica-info polls; `watch` records on the fleet's sets come from the SSE stream;
# - `fleet-baseline`: every fleet set's master and master epoch (replica info) when the episode starts;
# - `fault-start` of a broker fault names its victim: `set`, `broker` (the master) and its `mepoch`.
BROKER_FAULTS = ("broker-kill", "broker-hang")
# Failover is a liveness property of the whole pipeline: a crash is about two Spark micro-batches, a hang
# the heartbeat timeout plus those (docs/failover-signal.md: 5-10 s batches on this loaded machine).
FAILOVER_BOUND_S = 60.0


def _master_views(log: HistoryLog) -> list[tuple[str, int, int, str, float]]:
    """(set, master epoch, master, who, mono) for every master a simulated broker or a fleet watcher was told of
    (the fleet's sets are those with `role` records; the controller workload's are checked by
    check_one_master_per_epoch)."""
    seen = []
    fleet = {r["set"] for r in log.of_type("role")}
    for r in log.of_type("role"):
        if r.get("master") is not None and r.get("mepoch") is not None:
            seen.append((r["set"], r["mepoch"], r["master"], f"broker {r['broker']}", r["mono"]))
    for w in log.of_type("watch"):
        ev = w["event"]
        if w["set"] in fleet and ev.get("type") == "ElectMaster" and ev.get("newMasterElected"):
            seen.append((w["set"], ev["masterEpoch"], ev["newMasterBrokerId"], f"watch {w['conn']}", w["mono"]))
    return seen


def check_one_acting_master(log: HistoryLog) -> Verdict:
    """Never two simulated brokers of a set acting as master under one master epoch, and every broker and
    watcher of a set agreeing on who the master of each epoch is (a broker acting as master is one told
    it is the master: two acting under one epoch are two masters told for it)."""
    acting: dict[tuple[str, int], set[int]] = {}
    told: dict[tuple[str, int], dict[int, str]] = {}
    for r in log.of_type("role"):
        if r.get("role") == "master":
            acting.setdefault((r["set"], r["mepoch"]), set()).add(r["broker"])
    for s, epoch, master, who, _ in _master_views(log):
        told.setdefault((s, epoch), {}).setdefault(master, who)
    bad = sorted(k for k, v in told.items() if len(v) > 1)
    if not bad:
        return Verdict("one-acting-master-per-epoch", True, 0, f"{len(told)} (set, epoch) pairs seen by brokers")
    s, e = bad[0]
    return Verdict("one-acting-master-per-epoch", False, len(bad),
                   f"set {s} epoch {e}: acting as master {sorted(acting.get((s, e), ()))}, "
                   f"told {told.get((s, e), {})}")


def failover_seen(log: HistoryLog, s: str, old_master: int, epoch: int, since: float) -> float | None:
    """When (mono) a broker or watcher of `s` first learned of a master other than `old_master` above `epoch`."""
    return min((mono for set_, e, m, _, mono in _master_views(log)
                if set_ == s and e > epoch and m != old_master and mono >= since), default=None)


def check_broker_failover(log: HistoryLog, bound_s: float = FAILOVER_BOUND_S
                          ) -> tuple[Verdict, list[tuple[str, float]]]:
    """Every killed or hung master replaced within `bound_s` of its fault (OpenChaos's recovery checker);
    returns the verdict and (fault kind, seconds to the replacement) per broker fault."""
    times, late = [], []
    for f in log.of_type("fault-start"):
        if f["kind"] not in BROKER_FAULTS or f.get("set") is None:
            continue  # no eligible victim: nothing was injected
        at = failover_seen(log, f["set"], f["broker"], f["mepoch"], f["mono"])
        if at is None or at - f["mono"] > bound_s:
            late.append(f"{f['kind']} of {f['set']} master {f['broker']} (epoch {f['mepoch']}): "
                        + ("not replaced" if at is None else f"replaced after {at - f['mono']:.1f}s")
                        + f", bound {bound_s:.0f}s")
        if at is not None:
            times.append((f["kind"], at - f["mono"]))
    if late:
        return Verdict("broker-failover", False, len(late), late[0]), times
    took = ", ".join(f"{k} {t:.1f}s" for k, t in times)
    return Verdict("broker-failover", True, 0, f"{len(times)} masters replaced within {bound_s:.0f}s"
                   + (f" ({took})" if took else "")), times


def check_no_false_failover(log: HistoryLog) -> tuple[Verdict, int]:
    """No master failed over in a set no broker fault hit: ingest, Kafka and Spark restarts and controller
    faults must not fail a healthy master over (an ingest restart cuts sessions without a `disconnected`
    record). Returns the verdict and the number of sets failed over falsely."""
    base = next(log.of_type("fleet-baseline"), None)
    if base is None:
        return Verdict("no-false-failover", True, 0, "no fleet in this history"), 0
    victims = {f["set"] for f in log.of_type("fault-start") if f["kind"] in BROKER_FAULTS and f.get("set")}
    moved: dict[str, str] = {}
    for s, epoch, master, who, _ in _master_views(log):
        start = base["sets"].get(s)
        if start is not None and s not in victims and epoch > start["mepoch"] and s not in moved:
            moved[s] = f"set {s}: master {start['master']} (epoch {start['mepoch']}) -> {master} (epoch {epoch}), " \
                       f"seen by {who}"
    if not moved:
        return Verdict("no-false-failover", True, 0, f"{len(base['sets']) - len(victims)} healthy sets kept their "
                                                     "masters"), 0
    return Verdict("no-false-failover", False, len(moved), next(iter(moved.values()))), len(moved)
