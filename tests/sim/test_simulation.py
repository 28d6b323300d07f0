"""Deterministic simulation of the node runtime that ships (CI runs 10,000 seeds).

Each seed runs `RaftNode`s (the driver `electra node` runs) on a virtual-time loop
over a simulated disk, network and clocks, with fault rates drawn per seed: drops,
delays, duplicates, partitions, corrupted snapshot chunks, pauses, clock drift and
jumps, process kills and power losses (unsynced writes lost or torn), fsync
failures, ENOSPC and bit rot; clients run the KV or the controller workload in
every read mode. Replication safety, controller invariants and linearizability
are checked; after the faults heal the group must converge. Every deliberate bug
in consensus/mutations.py must make some seed fail.
"""

from __future__ import annotations

import random

import pytest

from electra.consensus import core, mutations, node
from electra.consensus.simulation import (
    FAULTS,
    MUTATION_SEEDS,
    SimConfig,
    SimulationFailure,
    ci_config,
    hunt_mutation,
    run_seed,
)

CHUNK = 500
# 10,000 seeds: 5,000 KV on 3 nodes, 1,000 KV on 5 nodes, 4,000 controller on 3 nodes, each with
# a 400 ms safety phase (ci_config's 500 ms put the sim share over 4 min of CI; the swarm
# coverage test below keeps 500 ms).
DURATION_MS = 400
KV_3 = range(0, 5000, CHUNK)
KV_5 = range(100_000, 101_000, CHUNK)
CONTROLLER_3 = range(200_000, 204_000, CHUNK)


@pytest.mark.parametrize("start", KV_3)
def test_kv_three_nodes(start):
    cfg = ci_config("kv", duration_ms=DURATION_MS)
    for seed in range(start, start + CHUNK):
        run_seed(seed, cfg)


@pytest.mark.parametrize("start", KV_5)
def test_kv_five_nodes(start):
    cfg = ci_config("kv", nodes=5, duration_ms=DURATION_MS)
    for seed in range(start, start + CHUNK):
        run_seed(seed, cfg)


@pytest.mark.parametrize("start", CONTROLLER_3)
def test_controller_three_nodes(start):
    cfg = ci_config("controller", duration_ms=DURATION_MS)
    for seed in range(start, start + CHUNK):
        run_seed(seed, cfg)


@pytest.mark.slow
@pytest.mark.parametrize("start", range(1_000_000, 1_040_000, 2000))
def test_soak_many_seeds(start):
    for seed in range(start, start + 2000):
        workload = "controller" if seed % 2 else "kv"
        run_seed(seed, ci_config(workload, nodes=3 + 2 * (seed % 4 == 3), duration_ms=2000))


@pytest.mark.parametrize("workload", ["kv", "controller"])
def test_same_seed_replays_identically(workload):
    cfg = ci_config(workload, duration_ms=1500)
    first = [run_seed(seed, cfg) for seed in range(40, 45)]
    assert first == [run_seed(seed, cfg) for seed in range(40, 45)]
    assert sum(r.ok_ops for r in first) > 80 and sum(r.final_index for r in first) > 60  # the workload really ran


def test_the_swarm_exercises_every_fault_read_mode_and_recovery_path():
    results = {w: [run_seed(seed, ci_config(w)) for seed in range(300_000, 300_150)] for w in ("kv", "controller")}
    for workload, runs in results.items():
        for mode in ("log", "linearizable", "lease", "follower"):
            assert sum(r.ok_reads.get(mode, 0) for r in runs) > 50, (workload, mode)
        assert sum(r.snapshots_installed for r in runs) > 10, workload
    every = results["kv"] + results["controller"]
    for fault in every[0].faults:
        assert sum(r.faults[fault] for r in every) > 0, fault
    for what in ("torn_tails", "fsync_failures", "enospc", "refused_starts", "disk_failure_stops"):
        assert sum(r.disk[what] for r in every) > 0, what


@pytest.mark.parametrize("name", sorted(mutations.KNOWN))
def test_mutations_caught(name):
    """A checker that never fails proves nothing: each deliberate bug fails some seed."""
    failure = hunt_mutation(name, max_seeds=MUTATION_SEEDS)
    assert failure is not None, f"{name} was not caught in {MUTATION_SEEDS} seeds"


LEASE_FOCUS = {"duration_ms": 2000, "fault_kinds": ("isolate_leader", "heal", "clock_rate"),
               "read_ratio": (0.95, 0.95)}  # readers keep reading at a cut-off leader


def test_lease_violation_seen_when_clocks_drift_beyond_the_assumption():
    """Leases are safe only within max_clock_drift (0.1): clocks drifting by 0.8 break them, and it shows.

    About one seed in a hundred shows it (seeds 35, 113 and 288 of the first 300 before follower reads that a new
    leader had asked of its predecessor were served by it instead of failing; 391, 393 and 445 since: a change of
    schedule moves which seeds do). The loop stops at the first, and 1,000 seeds leave missing it unlikely."""
    for seed in range(0, 1000):
        try:
            run_seed(seed, ci_config("kv", clock_drift=0.8, **LEASE_FOCUS))
        except SimulationFailure as exc:
            assert "lease safety" in exc.reason or "linearizable" in exc.reason, exc.reason
            return
    pytest.fail("clocks drifting far beyond max_clock_drift produced no lease violation in 1,000 seeds")


def test_leases_hold_when_clocks_drift_within_the_assumption():
    """The control for the test above: the same focused faults, drift drawn below max_clock_drift."""
    for seed in range(0, 200):
        run_seed(seed, ci_config("kv", **LEASE_FOCUS))


def test_a_snapshot_transfer_ends_with_its_leaders_term():
    """Regression: a sender of a lost term kept its follower waiting (resend timeouts of 1 s) after its
    leader won again; these seeds then did not converge (checked by running the pre-fix sender)."""
    for seed in (129, 266):
        run_seed(seed, ci_config("controller", duration_ms=1200))


def _fails_somewhere(seeds: range, workload: str = "kv") -> str:
    for seed in seeds:
        try:
            run_seed(seed, ci_config(workload, duration_ms=1000))
        except SimulationFailure as exc:
            return exc.reason
    return ""


def test_checker_catches_votes_granted_to_out_of_date_logs(monkeypatch):
    """The simulation must be able to fail: break the election restriction and it does."""
    orig = core.RaftCore._handle_vote_request

    def careless(self, m):
        m.last_term = 1 << 30  # every candidate looks up to date
        return orig(self, m)

    monkeypatch.setattr(core.RaftCore, "_handle_vote_request", careless)
    assert _fails_somewhere(range(0, 300))


def test_checker_catches_acknowledging_uncommitted_entries(monkeypatch):
    """Apply before commit (here: treat every appended entry as committed) must be caught."""
    orig = core.RaftCore.ready

    def optimistic(self):
        self.commit = max(self.commit, self.stable)
        return orig(self)

    monkeypatch.setattr(core.RaftCore, "ready", optimistic)
    assert _fails_somewhere(range(0, 300))


def test_checker_catches_reads_answered_before_their_read_index_is_applied(monkeypatch):
    """A bug in the driver (not the core) is caught too: answer a read before its index is applied."""

    def hasty(self, index, fut, deadline, fn):
        node._resolve(fut, fn, self.sm)  # at once, whatever is applied

    monkeypatch.setattr(node.RaftNode, "_park", hasty)
    assert "linearizable" in _fails_somewhere(range(0, 300))


def test_checker_catches_a_lost_snapshot_install_in_the_driver(monkeypatch):
    """The driver installs a received snapshot without restoring the state machine: replicas diverge."""
    orig = node.RaftNode._on_snapshot_chunk

    def forgetful(self, m):
        restore = self.sm.restore
        self.sm.restore = lambda inp: None
        try:
            return orig(self, m)
        finally:
            self.sm.restore = restore

    monkeypatch.setattr(node.RaftNode, "_on_snapshot_chunk", forgetful)
    assert _fails_somewhere(range(0, 300), "controller")


def test_controller_workload_sends_distinct_commands_the_service_would_accept():
    """Acknowledged commands are found in the final log by their bytes: the workload never sends
    the same bytes twice (here many ops in one millisecond), and every command decodes strictly."""
    from electra.consensus.simcontroller import ControllerWorkload
    from electra.state import commands

    workload, rng = ControllerWorkload(), random.Random(7)
    sent = [op.command for op in (workload.next_op(rng, i, 1_000) for i in range(400)) if op.command is not None]
    assert len(sent) > 100 and len(set(sent)) == len(sent)
    for cmd in sent:
        commands.decode(cmd)  # no field the service's commands do not have


@pytest.mark.parametrize("workload", ["kv", "controller"])
def test_wiped_nodes_rejoin_without_losing_acknowledged_writes(workload):
    """The operator's recovery: a stopped node's disk (or one that refused to start on bit rot) is emptied and it
    starts with --rejoin, while the others keep a majority. Every seed stays linearizable and converges."""
    cfg = SimConfig(workload=workload, duration_ms=1000, trace=False, fault_kinds=FAULTS + ("wipe",))
    wipes = 0
    for seed in range(500_000, 500_150):
        wipes += run_seed(seed, cfg).faults["wipe"]
    assert wipes > 20


@pytest.mark.parametrize("workload", ["kv", "controller"])
def test_a_group_of_one_runs_every_fault_it_can_take(workload):
    # `electra sim --nodes 1` reported seed 2 as a failure of the group: the nemesis drew a partition and
    # asked for a cut of one node into two sides (randrange(1, 1)); a group of one has no partition.
    cfg = ci_config(workload, nodes=1)
    for seed in range(12):
        run_seed(seed, cfg)
