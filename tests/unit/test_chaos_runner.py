"""`electra chaos` interrupted (Ctrl-C cancels the run's task; SIGTERM unwinds it the same way): the run's
HTTP sessions are closed and what the finished episodes found is still reported. Fakes stand in for the
cluster and the workload: no process is started."""

from __future__ import annotations

import asyncio
from pathlib import Path

from electra.chaos import runner
from electra.chaos.checkers import Findings
from electra.chaos.history import HistoryLog
from electra.chaos.nemesis import Fault


class FakeCluster:
    def __init__(self, *args, **kwargs) -> None:
        self.endpoints = {1: "127.0.0.1:1", 2: "127.0.0.1:2", 3: "127.0.0.1:3"}
        self.ids = [1, 2, 3]
        self.mounted, self.disk_shim, self.creds = True, None, None
        self.closed = False

    def start(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


class FakeWorkload:
    made: list[FakeWorkload] = []

    def __init__(self, *args, **kwargs) -> None:
        self.stop = asyncio.Event()
        self.op_timeout_s = 0.1
        self.closed = False
        FakeWorkload.made.append(self)

    async def setup_sets(self) -> None:
        await asyncio.Event().wait()  # the episode is under way when Ctrl-C comes

    async def close(self) -> None:
        self.closed = True


def test_an_interrupted_episode_closes_its_workloads_sessions(monkeypatch, tmp_path):
    # QA: Ctrl-C in an episode left its aiohttp sessions open: a page of "Unclosed client session" ERRORs
    # after "electra chaos: interrupted".
    monkeypatch.setattr(runner, "Workload", FakeWorkload)
    FakeWorkload.made.clear()
    cfg = runner.RunConfig(out_dir=tmp_path, kinds=["kill"])

    async def main() -> None:
        task = asyncio.create_task(runner.run_episode(cfg, FakeCluster(), 0, ["kill"]))
        for _ in range(100):  # bounded: until the episode's workload exists
            if FakeWorkload.made:
                break
            await asyncio.sleep(0.01)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return
        raise AssertionError("the episode swallowed the cancel")

    asyncio.run(asyncio.wait_for(main(), 10))
    assert [w.closed for w in FakeWorkload.made] == [True]


def test_an_interrupted_run_reports_its_finished_episodes(monkeypatch, tmp_path, capsys):
    # QA: Ctrl-C (or SIGTERM) after hours of a soak gave no report.html and no RESULT line for the episodes
    # that had finished; only their histories were on disk.
    cluster = FakeCluster()
    monkeypatch.setattr(runner, "ChaosCluster", lambda *a, **k: cluster)
    monkeypatch.setattr(runner, "Workload", FakeWorkload)

    async def leader(*args) -> int:
        return 1

    third = asyncio.Event()

    async def episode(cfg, cluster, n, kinds):
        if n == 2:
            third.set()
            await asyncio.Event().wait()  # interrupted in its third episode
        f = Fault("kill", "any", 0.5, 1.5, targets=[2])
        return runner.EpisodeResult(n, [f], Findings(unavailable=[("kill", 0.25 * (n + 1))], recovery_s=0.1), 100,
                                    Path(tmp_path / f"episode-{n:04d}.jsonl"), HistoryLog(), 0.0)

    monkeypatch.setattr(runner, "_wait_leader", leader)
    monkeypatch.setattr(runner, "run_episode", episode)
    cfg = runner.RunConfig(out_dir=tmp_path, episodes=30, kinds=["kill"])

    async def main() -> None:
        task = asyncio.create_task(runner.run(cfg))
        await asyncio.wait_for(third.wait(), 5)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return
        raise AssertionError("the run swallowed the cancel")

    asyncio.run(asyncio.wait_for(main(), 10))
    out = capsys.readouterr().out
    assert cluster.closed
    assert (tmp_path / "report.html").exists()
    assert "interrupted: reporting the 2 finished episode(s)" in out
    assert "RESULT episodes=2 fault_kinds=1 faults=2 ops=200 " in out


def test_a_cluster_that_elects_no_leader_ends_the_run_with_one_line(monkeypatch, tmp_path):
    # QA: `electra chaos --fsync-delay-ms 100000` (every vote waits 100 s for its fsync) ended after 30 s with a
    # RuntimeError traceback and node 1's (empty) log tail.
    cluster = FakeCluster()
    cluster.logs = tmp_path / "logs"
    cluster.logs.mkdir()
    (cluster.logs / "node1.log").write_text("starting\nnode 1 starting: term=0\n")
    cluster.log_tail = lambda name, lines=30: "\n".join(
        (cluster.logs / f"{name}.log").read_text().splitlines()[-lines:])
    monkeypatch.setattr(runner, "ChaosCluster", lambda *a, **k: cluster)
    monkeypatch.setattr(runner, "Workload", FakeWorkload)

    async def no_leader(*args) -> None:
        return None

    monkeypatch.setattr(runner, "_wait_leader", no_leader)
    try:
        asyncio.run(runner.run(runner.RunConfig(out_dir=tmp_path, kinds=["kill"])))
    except SystemExit as exc:
        assert exc.code == (f"error: the controller group elected no leader within 30s (logs in {cluster.logs}; "
                            "node 1 last logged: node 1 starting: term=0)")
    else:
        raise AssertionError("the run went on without a leader")
    assert cluster.closed
