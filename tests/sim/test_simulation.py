"""Deterministic simulation of the real Raft core under faults (CI runs 2,000+ seeds).

Each seed runs a cluster with drops, delays, reordering, duplication, partitions,
process pauses, drifting clocks, crashes that lose unsynced writes, restarts,
snapshots, compaction and InstallSnapshot; clients write and read in every mode
(log, ReadIndex, lease, follower). Invariants are checked after every event and
the client history is checked for linearizability.
"""

from __future__ import annotations

import pytest

from electra.consensus import core, simulation
from electra.consensus.simulation import SimConfig, SimulationFailure, run_seed

CHUNK = 100
SLOW_DISK = SimConfig(disk_ms=(2.0, 20.0))  # a wide fsync window makes durability bugs visible


@pytest.mark.parametrize("start", range(0, 1600, CHUNK))
def test_three_nodes_under_faults(start):
    for seed in range(start, start + CHUNK):
        run_seed(seed)


@pytest.mark.parametrize("start", range(100_000, 100_400, CHUNK))
def test_five_nodes_under_faults(start):
    for seed in range(start, start + CHUNK):
        run_seed(seed, SimConfig(nodes=5))


@pytest.mark.parametrize("start", range(200_000, 200_200, CHUNK))
def test_three_nodes_lossy_network(start):
    cfg = SimConfig(drop_rate=0.2, dup_rate=0.1, long_delay_rate=0.05)
    for seed in range(start, start + CHUNK):
        run_seed(seed, cfg)


@pytest.mark.parametrize("start", range(400_000, 400_200, CHUNK))
def test_three_nodes_slow_disk(start):
    for seed in range(start, start + CHUNK):
        run_seed(seed, SLOW_DISK)


@pytest.mark.slow
@pytest.mark.parametrize("start", range(1_000_000, 1_020_000, 1000))
def test_soak_many_seeds(start):
    for seed in range(start, start + 1000):
        run_seed(seed, SimConfig(nodes=3 + 2 * (seed % 2), duration_ms=6000))


def test_same_seed_replays_identically():
    a, b = run_seed(42), run_seed(42)
    assert a == b
    assert a.ok_ops > 50 and a.final_index > 50  # the workload really ran


def test_the_workload_exercises_every_read_mode_and_install_snapshot():
    results = [run_seed(seed) for seed in range(300_000, 300_040)]
    for mode in ("log", "readindex", "lease", "follower"):
        assert sum(r.ok_reads[mode] for r in results) > 100, mode
    assert sum(r.snapshots_installed for r in results) > 10


def _fails_somewhere(seeds: range, cfg: SimConfig | None = None) -> str:
    for seed in seeds:
        try:
            run_seed(seed, cfg)
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
    assert _fails_somewhere(range(0, 200))


def test_checker_catches_messages_sent_before_votes_are_durable(monkeypatch):
    orig = core.RaftCore.ready

    def eager(self):
        rd = orig(self)
        rd.send_now, rd.send_after_persist = rd.send_now + rd.send_after_persist, []
        return rd

    monkeypatch.setattr(core.RaftCore, "ready", eager)
    assert _fails_somewhere(range(0, 200), SLOW_DISK)


def test_checker_catches_acknowledging_uncommitted_entries(monkeypatch):
    """Apply before commit (here: treat every appended entry as committed) must be caught."""
    orig = core.RaftCore.ready

    def optimistic(self):
        self.commit = max(self.commit, self.stable)
        return orig(self)

    monkeypatch.setattr(core.RaftCore, "ready", optimistic)
    assert _fails_somewhere(range(0, 200))


def test_checker_catches_reads_answered_before_their_read_index_is_applied(monkeypatch):
    orig = simulation.Simulation.answer_reads

    def hasty(self, node):
        node.read_wait = [(0, *waiting[1:]) for waiting in node.read_wait]
        return orig(self, node)

    monkeypatch.setattr(simulation.Simulation, "answer_reads", hasty)
    assert "linearizable" in _fails_somewhere(range(0, 100))
