"""Every notebook in notebooks/ executed top to bottom (nbclient, a real kernel) against real data: a 3-node
in-process controller group (real Raft, real HTTP) whose leader uploads to a real Delta tier while broker sets
register and fail over, and a results file written by a short real `electra bench raft`. A failing cell fails
the test; the printed summaries are checked against what the test drove."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import nbformat
import pytest
from inprocess_cluster import start_cluster, wait_leader
from nbclient import NotebookClient

from electra.state.commands import CONTROLLER_TRIGGER
from electra.tiering.uploader import TierConfig

pytestmark = pytest.mark.integration

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
SETS = [f"nb-set-{i}" for i in range(5)]
LONG = 600_000  # heartbeat timeout of a replica that stays alive (ms)


class Fleet:
    """The cluster on its own event loop thread, so the notebooks' HTTP calls are served while they run."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.tier = str(tmp_path / "tier")
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="notebook-fleet", daemon=True)
        self.thread.start()
        self.nodes: dict = {}
        self.http: dict = {}
        self.failovers = 0
        self.masterless = 0

    def run(self, coro, timeout: float = 120):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def start(self) -> None:
        # A 2 s election timeout (40 ticks): the three nodes, their Delta tier (a commit every 50 ms) and the
        # test process's own garbage collections share one event loop, and a leader change mid-drive is
        # not what these notebooks are about (it cost the fixture its setup once in a full run on a slow disk:
        # QuorumLost on a sync-state write).
        self.nodes, self.http = await start_cluster(self.tmp, election_ticks=40, scan_interval_s=0,
                                                    tier=TierConfig(self.tier, interval_s=0.05))

    async def leader(self):
        return self.nodes[await wait_leader(self.nodes)]

    async def drive(self) -> None:
        """Register 3 replicas per set, elect, then fail masters over (set i loses its master i+1 times);
        in the last set every replica dies once, so an election finds no master before one comes back."""
        svc = (await self.leader()).service.requests
        for name in SETS:
            for b in (1, 2, 3):
                await svc.apply_broker_id("c1", name, b, f"10.0.0.{b}:10911;{b}")
                await svc.register_broker("c1", name, b, f"10.0.0.{b}:10911")
                svc.heartbeat("c1", name, b, f"10.0.0.{b}:10911", timeout_ms=LONG)
            assert (await svc.elect_master("c1", name, 1))["code"] == 0
            await self.resync(svc, name)
        for i, name in enumerate(SETS):
            for _ in range(i + 1):
                await asyncio.sleep(0.05 * (i + 1))  # masters hold their sets for different times
                bs = svc.sm.sets[name]
                self.kill(svc, name, [bs.master_id])
                res = await svc.elect_master("c1", name, CONTROLLER_TRIGGER)
                assert res["code"] == 0, res
                self.failovers += 1
                await self.resync(svc, name)
        name = SETS[-1]
        self.kill(svc, name, [1, 2, 3])
        res = await svc.elect_master("c1", name, CONTROLLER_TRIGGER)
        assert svc.sm.sets[name].master_id is None, res
        await asyncio.sleep(0.2)
        old = svc.sm.sets[name].sync_state_set
        for b in old:
            svc.heartbeat("c1", name, b, f"10.0.0.{b}:10911", timeout_ms=LONG)
        assert (await svc.elect_master("c1", name, CONTROLLER_TRIGGER))["code"] == 0
        self.masterless += 1
        await self.uploaded()

    @staticmethod
    def kill(svc, name: str, ids: list[int]) -> None:
        """Replicas `ids` stop: their last heartbeat expires (1 ms timeout); the others stay alive."""
        for b in (1, 2, 3):
            svc.heartbeat("c1", name, b, f"10.0.0.{b}:10911", timeout_ms=1 if b in ids else LONG)
        time.sleep(0.01)

    @staticmethod
    async def resync(svc, name: str) -> None:
        """The new master takes every replica back into its sync-state set; the dead one revives."""
        bs = svc.sm.sets[name]
        for b in (1, 2, 3):
            svc.heartbeat("c1", name, b, f"10.0.0.{b}:10911", timeout_ms=LONG)
        res = await svc.alter_sync_state_set(name, bs.master_id, bs.master_epoch, [1, 2, 3], bs.sync_state_set_epoch)
        assert res["code"] == 0, res

    async def uploaded(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            ld = await self.leader()
            if ld.tier.active_term and ld.tier.uploaded >= ld.node.applied:
                return
            assert time.monotonic() < deadline, f"upload stuck at {ld.tier.uploaded} < {ld.node.applied}"
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        for n in self.nodes.values():
            await n.stop()

    def close(self) -> None:
        try:
            self.run(self.stop(), timeout=60)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    f = Fleet(tmp_path_factory.mktemp("fleet"))
    try:
        f.run(f.start())
        f.run(f.drive())
        yield f
    finally:
        f.close()


@pytest.fixture(scope="module")
def bench_results(tmp_path_factory) -> Path:
    """A results file with one short real `electra bench raft` run appended by the bench itself."""
    path = tmp_path_factory.mktemp("bench") / "results.txt"
    path.write_text((NOTEBOOKS / "data" / "bench-results.txt").read_text())
    cmd = [sys.executable, "-m", "electra.cli", "bench", "raft", "--clients", "20", "--duration", "2",
           "--warmup", "0.5", "--settle", "3", "--skip-pysyncobj", "--unsafe-no-fsync"]
    out = subprocess.run(cmd, env={**os.environ, "ELECTRA_BENCH_RESULTS": str(path)}, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert re.search(r"^\S+Z raft RESULT commits_per_s=\d+", path.read_text().splitlines()[-1])
    return path


def execute(name: str, env: dict[str, str], monkeypatch) -> str:
    """Run the notebook in a fresh kernel (cwd notebooks/); return all text it printed or displayed."""
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("MPLBACKEND", "agg")
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    text = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            text.append(out.get("text", "") or out.get("data", {}).get("text/plain", ""))
    return "\n".join(text)


def test_notebooks_in_the_folder_are_the_tested_ones():
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == [
        "capacity.ipynb", "failover_analysis.ipynb", "fleet_health.ipynb", "time_travel.ipynb"]
    assert not list(NOTEBOOKS.glob("*.py")), "notebooks are .ipynb files (executed here)"


def test_fleet_health(fleet, monkeypatch):
    endpoints = ",".join(fleet.http.values())
    out = execute("fleet_health.ipynb", {"ELECTRA_ENDPOINTS": endpoints, "ELECTRA_TIER_URI": fleet.tier}, monkeypatch)
    assert "controllers reachable: 3/3; leaders: [" in out and "quorum: yes" in out
    assert f"tier: {len(SETS)} broker sets" in out
    # Every replica heartbeated with a 10-minute timeout after the last election: all masters alive.
    assert f"broker sets: {len(SETS)}; without master: 0; master not alive: 0" in out


def test_fleet_health_with_a_node_down(fleet, monkeypatch):
    """An unreachable endpoint is reported, not a failed cell."""
    endpoints = ",".join([*fleet.http.values(), "127.0.0.1:9"])
    out = execute("fleet_health.ipynb", {"ELECTRA_ENDPOINTS": endpoints, "ELECTRA_TIER_URI": fleet.tier}, monkeypatch)
    assert "controllers reachable: 3/4" in out and "Connection refused" in out, out[:3000]


def test_failover_analysis(fleet, monkeypatch):
    out = execute("failover_analysis.ipynb", {"ELECTRA_TIER_URI": fleet.tier}, monkeypatch)
    m = re.search(r"elections: (\d+) \((\d+) found no master\); failovers: (\d+) in (\d+) broker sets", out)
    assert m, out[-3000:]
    elections, empty, failovers, sets = map(int, m.groups())
    assert elections == len(SETS) + fleet.failovers + 2 and empty == fleet.masterless
    # the all-dead set's master comes back as the same broker or another one: at most one more failover
    assert fleet.failovers <= failovers <= fleet.failovers + 1 and sets == len(SETS)
    assert "busiest minute:" in out


def test_time_travel(fleet, monkeypatch):
    from electra.tiering.reader import TierReader

    events = TierReader(fleet.tier).to_pandas("events")
    first = events[events["type"] == "ElectMaster"].sort_values("index")
    # Right after the first election of the first set: one master, at epoch 1, and later changes since.
    at = int(first.iloc[0]["ts_ms"])
    out = execute("time_travel.ipynb", {"ELECTRA_TIER_URI": fleet.tier, "ELECTRA_AT": str(at),
                                        "ELECTRA_USE_SPARK": "auto"}, monkeypatch)
    m = re.search(r"as of (\S+): Raft index (\d+), (\d+) broker sets", out)
    assert m, out[-3000:]
    state = TierReader(fleet.tier).state_at(at)
    assert int(m.group(2)) == state["index"] and int(m.group(3)) == len(state["brokerSets"])
    changed = int(re.search(r"(\d+) broker sets changed", out).group(1))
    assert changed >= 1
    assert "no Spark session (use_spark=auto); skipped" in out
    # default instant: halfway through the events
    out = execute("time_travel.ipynb", {"ELECTRA_TIER_URI": fleet.tier, "ELECTRA_AT": ""}, monkeypatch)
    assert re.search(r"as of \S+: Raft index \d+, \d+ broker sets, complete: True", out)


def test_capacity(bench_results, monkeypatch):
    out = execute("capacity.ipynb", {"ELECTRA_BENCH_RESULTS": str(bench_results), "ELECTRA_BROKERS": "3000"},
                  monkeypatch)
    runs = [line for line in bench_results.read_text().splitlines() if not line.startswith("#")]
    # the committed history (5 benchmarks) plus the raft run the fixture appended
    assert f"{len(runs)} runs of 5 benchmarks" in out and len(runs) == 8
    assert "fleet: 3000 brokers" in out and "ingest cores" in out


def test_capacity_default_results_file(monkeypatch):
    monkeypatch.delenv("ELECTRA_BENCH_RESULTS", raising=False)
    out = execute("capacity.ipynb", {}, monkeypatch)
    assert "7 runs of 5 benchmarks in data/bench-results.txt" in out


def test_fleet_health_on_a_secure_cluster(fleet, tmp_path, monkeypatch):
    """QA: the notebook spoke plain HTTP without a token, and reported a secure (default) cluster as down."""
    from electra.bench.common import bench_credentials, start_controller_processes, stop_processes

    procs, endpoints = start_controller_processes(tmp_path)
    try:
        creds = bench_credentials(tmp_path)
        env = {"ELECTRA_ENDPOINTS": ",".join(endpoints), "ELECTRA_TIER_URI": fleet.tier, **creds.env("observer")}
        out = ""
        for _ in range(20):  # bounded: until the three processes answer and have a leader (about 10 s here)
            out = execute("fleet_health.ipynb", env, monkeypatch)
            if "controllers reachable: 3/3" in out and "quorum: yes" in out:
                break
            time.sleep(1)
        assert "controllers reachable: 3/3" in out and "quorum: yes" in out, out[:3000]
    finally:
        stop_processes(procs)


@pytest.mark.parametrize(("name", "env", "message"), [
    ("fleet_health.ipynb", {"ELECTRA_ENDPOINTS": ","}, "parameter endpoints (ELECTRA_ENDPOINTS): expected"),
    ("time_travel.ipynb", {"ELECTRA_WINDOW_MIN": "-5"}, "parameter window_min (ELECTRA_WINDOW_MIN): expected a "
                                                        "number >= 0, got '-5'"),
    ("failover_analysis.ipynb", {"ELECTRA_SINCE": "yesterday"}, "parameter since (ELECTRA_SINCE): expected an instant"),
    ("capacity.ipynb", {"ELECTRA_BROKERS": "lots"}, "parameter brokers (ELECTRA_BROKERS): expected a whole number"),
])
def test_a_bad_parameter_stops_the_first_cell_naming_it(name, env, message, monkeypatch):
    from nbclient.exceptions import CellExecutionError

    with pytest.raises(CellExecutionError) as err:
        execute(name, env, monkeypatch)
    assert "ParameterError" in str(err.value) and message in str(err.value), str(err.value)[-2000:]
