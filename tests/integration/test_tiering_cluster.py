"""Three in-process controller nodes (real Raft over loopback TCP, real HTTP) uploading to real Delta tables:
leader killed mid-upload, deposed leader fenced, restart with a journal gap, bootstrap of one node and of a
whole cluster, time travel over HTTP checked against the replayed Raft log."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import threading
import time

import httpx
import pytest

from electra.api.server import start_controller_node
from electra.consensus.core import RaftConfig
from electra.consensus.errors import NotLeader, ProposalTimeout, RaftError
from electra.consensus.node import NodeConfig
from electra.local_ports import free_ports
from electra.state.journal import JournalEntry, entry_for
from electra.state.machine import ControllerStateMachine
from electra.tiering.reader import TierReader
from electra.tiering.schema import GAP, event_rows
from electra.tiering.store import Fenced, TierStore
from electra.tiering.uploader import TierConfig

pytestmark = pytest.mark.integration


class Cluster:
    def __init__(self, tmp_path, uri: str, node_kw: dict | None = None, tier_kw: dict | None = None) -> None:
        self.tmp, self.uri = tmp_path, uri
        self.node_kw, self.tier_kw = node_kw or {}, tier_kw or {}
        ports = free_ports(6)
        self.peers = {i + 1: ("127.0.0.1", ports[i]) for i in range(3)}
        self.http = {i + 1: f"127.0.0.1:{ports[3 + i]}" for i in range(3)}
        self.nodes: dict = {}

    async def start(self, i: int, bootstrap: bool = False) -> None:
        cfg = NodeConfig(node_id=i, peers=self.peers, data_dir=self.tmp / f"n{i}", tick_s=0.05, fsync=False,
                         raft=RaftConfig(election_ticks=10, heartbeat_ticks=1), **self.node_kw)
        host, port = self.http[i].split(":")
        self.nodes[i] = await start_controller_node(
            cfg, host, int(port), self.http, scan_interval_s=3600,
            tier=TierConfig(self.uri, interval_s=0.05, **self.tier_kw), bootstrap_from_tier=bootstrap)

    async def start_all(self, bootstrap: bool = False) -> None:
        for i in self.peers:
            await self.start(i, bootstrap)

    async def stop(self, i: int) -> None:
        await self.nodes.pop(i).stop()

    async def stop_all(self) -> None:
        for i in list(self.nodes):
            await self.stop(i)

    async def leader(self, timeout: float = 10.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for n in self.nodes.values():
                if n.node._running and n.node.is_leader and n.node.core.committed_in_term():
                    return n
            await asyncio.sleep(0.02)
        raise AssertionError("no leader")

    async def drive(self, n: int, start: int = 0) -> None:
        """Writes that produce every event type, through whoever is leader (retrying across changes)."""
        k = start
        while k < start + n:
            ld = await self.leader()
            svc = ld.service.requests
            name = f"bs{k % 4}"
            try:
                bs = ld.service.sm.sets.get(name)
                step = k // 4 % 5
                if bs is None or step in (0, 1):
                    nxt = bs.next_broker_id if bs else 1
                    await svc.apply_broker_id("c", name, nxt, f"10.0.{k % 4}.{nxt}:1;{nxt}")
                elif step == 2:
                    bid = min(bs.brokers)
                    await svc.register_broker("c", name, bid, f"10.1.{k % 7}.{bid}:1")
                    if bs.master_epoch == 0:
                        await svc.elect_master("c", name, bid)
                elif step == 3 and bs.master_id is not None:
                    for b in bs.brokers:
                        svc.heartbeat("c", name, b, bs.brokers[b][0])
                    await svc.alter_sync_state_set(name, bs.master_id, bs.master_epoch, sorted(bs.brokers),
                                                   bs.sync_state_set_epoch)
                else:
                    victims = [b for b in sorted(bs.brokers) if b != bs.master_id][:1]
                    await svc.clean_broker_data("c", name, victims or None, True)
            except RaftError:
                await asyncio.sleep(0.05)
                continue
            k += 1

    async def uploaded(self, timeout: float = 15.0):
        """Wait until the leader's uploader has everything it applied; return the leader."""
        deadline = time.monotonic() + timeout
        while True:
            ld = await self.leader()
            if ld.tier.active_term and ld.tier.uploaded >= ld.node.applied:
                return ld
            assert time.monotonic() < deadline, f"upload stuck at {ld.tier.uploaded} < {ld.node.applied}"
            await asyncio.sleep(0.05)


def _log_events(core, first: int = 1, sets: dict | None = None) -> tuple[list[JournalEntry], dict[int, int]]:
    """Replay the Raft log entries first.. in a scratch state machine: the events it must produce."""
    sm = ControllerStateMachine()
    sm.sets = sets or {}
    out, ts = [], {}

    def on_event(index, ev):
        out.append(entry_for(sm, index, core.term_at(index), ev))

    sm.on_event(on_event)
    for i in range(first, core.last_index() + 1):
        if i > core.commit:
            break
        data = core.log_data[i - core.offset - 1]
        if data:
            sm.apply(i, data)
            ts[i] = sm.apply_time_ms
    return out, ts


def _key(r: dict) -> tuple:
    return r["index"], r["seq"], r["term"], r["ts_ms"], r["type"], r["cluster"], r["broker_set"], r["payload"], \
        r["state"]


def _table_rows(uri: str, gaps: bool = False) -> list[tuple]:
    rows = TierStore(uri).read("events").to_pylist()
    return sorted(_key(r) for r in rows if gaps or r["type"] != GAP)


def _assert_table_matches_log(uri: str, expected: list[JournalEntry]) -> None:
    got = _table_rows(uri)
    want = sorted(_key(r) for r in event_rows(expected, 0))
    assert len({(r[0], r[1]) for r in got}) == len(got), "duplicate events in the table"
    assert got == want


def _wire(sets: dict) -> dict:
    return {n: bs.to_wire() for n, bs in sets.items()}


def test_leader_killed_mid_upload_then_fenced_zombie_then_bootstrap_and_time_travel(tmp_path):
    uri = str(tmp_path / "tier")

    async def main():
        c = Cluster(tmp_path, uri)
        await c.start_all()
        try:
            await c.drive(60)
            old = await c.uploaded()
            old_id, old_term = old.node.cfg.node_id, old.node.core.term
            entered, release, outcome = threading.Event(), threading.Event(), {}

            def hold():  # runs on the uploader's thread after its fence check, before the commit
                entered.set()
                release.wait(20)

            real_commit = old.tier.store.commit

            def recording_commit(*args, **kw):
                try:
                    return real_commit(*args, **kw)
                except Exception as exc:
                    outcome["error"] = exc
                    raise

            old.tier.before_commit = hold
            old.tier.store.commit = recording_commit
            await c.drive(12, start=60)
            assert await asyncio.to_thread(entered.wait, 10), "the upload never started"
            # Kill the leader mid-upload: its task and Raft stop, its commit is still in flight.
            zombie_exec = old.tier._exec
            old.tier._task.cancel()
            old.server.should_exit = True
            await old.node.stop()
            c.nodes.pop(old_id)
            new = await c.leader()
            deadline = time.monotonic() + 10
            while new.tier.active_term != new.node.core.term:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.02)
            before = TierStore(uri).progress()
            assert before.term == new.node.core.term > old_term
            release.set()  # the deposed leader's commit now runs, and must be refused
            await asyncio.to_thread(zombie_exec.shutdown, True)
            assert isinstance(outcome.get("error"), Fenced), outcome
            after_zombie = TierStore(uri).progress()
            assert after_zombie.term == before.term  # only the new leader commits (it keeps uploading)
            rows = TierStore(uri).read("events").to_pylist()
            assert all(r["index"] <= before.upto for r in rows if r["uploader_term"] == old_term)

            await c.drive(40, start=72)
            ld = await c.uploaded()
            expected, ts = _log_events(ld.node.core)
            _assert_table_matches_log(uri, expected)  # no gap, no duplicate
            assert ld.tier.metrics["gaps"] == 0

            # The killed node lost its disk: it starts from the tier and catches up through Raft.
            shutil.rmtree(tmp_path / f"n{old_id}")
            await c.start(old_id, bootstrap=True)
            fresh = c.nodes[old_id]
            assert fresh.node.status()["snapshot_index"] > 0
            await c.drive(8, start=112)
            ld = await c.uploaded()
            deadline = time.monotonic() + 10
            while fresh.node.applied < ld.node.applied:
                assert time.monotonic() < deadline, "bootstrapped node did not catch up"
                await asyncio.sleep(0.05)
            assert _wire(fresh.service.sm.sets) == _wire(ld.service.sm.sets)

            # Time travel over HTTP, against the replayed log.
            expected, ts = _log_events(ld.node.core)
            _assert_table_matches_log(uri, expected)
            idx = sorted(ts)
            sm = ControllerStateMachine()
            async with httpx.AsyncClient() as http:
                for cut in (idx[len(idx) // 5], idx[len(idx) // 2], idx[-1]):
                    sm.sets = {}
                    for i in idx:
                        if ts[i] > ts[cut]:
                            break
                        sm.apply(i, ld.node.core.log_data[i - ld.node.core.offset - 1])
                    r = await http.get(f"http://{c.http[fresh.node.cfg.node_id]}/v1/admin/history",
                                       params={"at": ts[cut], "from": ts[idx[0]], "to": ts[cut]})
                    assert r.status_code == 200, r.text
                    body = r.json()
                    assert body["state"]["brokerSets"] == [bs.view().to_public() for _, bs in sorted(sm.sets.items())]
                    assert [e["index"] for e in body["events"]["events"]] == \
                        [e.index for e in expected if ts[idx[0]] <= e.ts <= ts[cut]]
                bad = await http.get(f"http://{c.http[fresh.node.cfg.node_id]}/v1/admin/history", params={"at": "x"})
                assert bad.status_code == 422 and bad.json()["code"] == 2005 and "query.at" in bad.json()["remark"]
                assert bad.json()["errors"][0]["field"] == "query.at"
                bad = await http.get(f"http://{c.http[fresh.node.cfg.node_id]}/v1/admin/history",
                                     params={"at": "now", "from": "<b>forged</b>"})
                assert bad.status_code == 422 and "forged" not in bad.text and "query.from" in bad.text
                bad = await http.get(f"http://{c.http[fresh.node.cfg.node_id]}/v1/admin/history",
                                     params={"at": "now", "from": 1795795201000, "to": 1795795200000})  # reversed
                assert bad.status_code == 422 and "query.from" in bad.text and "after `to`" in bad.text
                for limit in (0, -1, 100_001, "x"):
                    bad = await http.get(f"http://{c.http[fresh.node.cfg.node_id]}/v1/admin/history",
                                         params={"at": "now", "from": 0, "limit": limit})
                    assert bad.status_code == 422 and "query.limit" in bad.text, bad.text
                r = await http.get(f"http://{c.http[fresh.node.cfg.node_id]}/v1/admin/history",
                                   params={"at": "now", "from": 0, "limit": 2})
                assert len(r.json()["events"]["events"]) == 2 and r.json()["events"]["truncated"], r.text
                first, cursor = r.json()["events"]["events"], r.json()["events"]["next_after"]
                r = await http.get(f"http://{c.http[fresh.node.cfg.node_id]}/v1/admin/history",
                                   params={"at": "now", "from": 0, "limit": 2, "after": cursor})
                nxt = r.json()["events"]["events"]
                assert r.status_code == 200 and nxt and (nxt[0]["index"], nxt[0]["seq"]) > \
                    (first[-1]["index"], first[-1]["seq"]), r.text
                for params, field in (({"at": "2999-01-01"}, "query.at"), ({"at": "now", "limit": 5}, "query.limit")):
                    bad = await http.get(f"http://{c.http[fresh.node.cfg.node_id]}/v1/admin/history", params=params)
                    assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == field, bad.text
                for after, params in (("x:1", {"from": 0}), ("5", {})):
                    bad = await http.get(f"http://{c.http[fresh.node.cfg.node_id]}/v1/admin/history",
                                         params={"at": "now", "after": after, **params})
                    assert bad.status_code == 422 and "query.after" in bad.text and "x:1" not in bad.text, bad.text
                metrics = (await http.get(f"http://{c.http[ld.node.cfg.node_id]}/metrics")).text
                assert "electra_tier_upload_lag_entries" in metrics and 'electra_tier_total{what="fenced"}' in metrics
        finally:
            await c.stop_all()

    asyncio.run(asyncio.wait_for(main(), 90))


@pytest.mark.parametrize("slack", [1000, 0], ids=["log-retained-rebuild", "log-compacted-gap-marker"])
def test_restarted_leader_bridges_journal_gap(tmp_path, slack):
    """A restarted node's journal starts at its snapshot; as leader it must still upload (uploaded, snapshot]."""
    uri = str(tmp_path / "tier")

    async def main():
        c = Cluster(tmp_path, uri, node_kw={"snapshot_entries": 20, "compaction_slack": slack})
        await c.start_all()
        try:
            await c.drive(12)
            ld = await c.uploaded()
            mark = ld.tier.uploaded

            def paused():
                raise RuntimeError("tier unavailable")

            for n in c.nodes.values():
                n.tier.before_commit = paused
            await c.drive(50, start=12)
            ld = await c.leader()
            lid = ld.node.cfg.node_id

            async def no_hand_over() -> None:  # the leader goes as a crashed one does: leadership is elected again
                return None

            ld.node.hand_over_leadership = no_hand_over
            await c.stop(lid)
            await c.start(lid)  # restores its newest snapshot: the journal starts there
            restarted = c.nodes[lid]
            assert restarted.service.journal.floor > mark
            # Uploads resume on the restarted node only: the interim leader must not upload the gap before the
            # restarted node leads again (under load it did, and left it nothing to rebuild).
            restarted.tier.before_commit = None
            for _ in range(4):  # bounded: a transfer gives up after an election timeout (0.5 s here) while the
                cur = await c.leader()  # restarted node still installs a snapshot; ask again until it leads
                if cur is restarted:
                    break
                with contextlib.suppress(ProposalTimeout, NotLeader):
                    await cur.node.transfer_leadership(lid, timeout=3.0)
            assert (await c.leader()) is restarted
            for n in c.nodes.values():
                n.tier.before_commit = None
            await c.drive(10, start=62)
            ld = await c.uploaded()
            assert ld is restarted
            m = ld.tier.metrics
            full = TierReader(uri).state_at_index(None)
            assert _wire(full.sets) == _wire(ld.service.sm.sets)  # bootstrap-exact either way
            if slack:
                assert m["rebuilt_events"] > 0 and m["gaps"] == 0
                expected, _ = _log_events(ld.node.core)
                _assert_table_matches_log(uri, expected)
            else:
                assert m["gaps"] == 1 and m["gap_entries"] > 0
                gaps = [r for r in _table_rows(uri, gaps=True) if r[4] == GAP]
                assert len(gaps) == 1
                assert full.complete and full.snapshot_index >= gaps[0][0]
        finally:
            await c.stop_all()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_whole_cluster_bootstraps_from_tier_after_losing_its_disks(tmp_path):
    uri = str(tmp_path / "tier")

    async def main():
        c = Cluster(tmp_path, uri, tier_kw={"snapshot_every_entries": 25})
        await c.start_all()
        try:
            await c.drive(50)
            ld = await c.uploaded()
            state, applied = _wire(ld.service.sm.sets), ld.node.applied
            deadline = time.monotonic() + 15  # the snapshot upload runs beside the events upload
            while TierStore(uri).progress("snapshots").upto == 0 and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            assert TierStore(uri).progress("snapshots").upto > 0
            before = _table_rows(uri)
            await c.stop_all()
            for i in c.peers:
                shutil.rmtree(tmp_path / f"n{i}")
            await c.start_all(bootstrap=True)
            ld = await c.leader()
            # (>=: the stops hand leadership over, and a new leader's no-op may have been uploaded before the last stop)
            assert _wire(ld.service.sm.sets) == state and ld.node.core.offset >= applied
            boot = ld.node.core.offset  # every node started from the tier's state at this index
            await c.drive(20, start=50)
            ld = await c.uploaded()
            after = _table_rows(uri)
            assert after[:len(before)] == before
            base = TierReader(uri).state_at_index(boot)
            expected, _ = _log_events(ld.node.core, boot + 1, base.sets)
            assert after[len(before):] == sorted(_key(r) for r in event_rows(expected, 0))
            assert expected and ld.tier.metrics["gaps"] == 0
            # Scheduled maintenance: nothing is older than the retention period; compaction merges files.
            files = len(TierReader(uri).files("events"))
            res = await ld.tier.maintain()
            assert res["deleted_events"] == 0 and res["events_files_compacted"] > 0
            assert len(TierReader(uri).files("events")) < files and _table_rows(uri) == after
        finally:
            await c.stop_all()

    asyncio.run(asyncio.wait_for(main(), 60))
