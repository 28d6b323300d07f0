"""Three `electra node --tier-uri` processes: SIGKILL the leader under writes; the events table then equals
the events of the surviving Raft log (read from disk), with no gap and no duplicate."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time

import aiohttp
import pytest

from electra.api.client import ControllerClient
from electra.bench.common import stop_processes
from electra.consensus.storage import LogStorage
from electra.local_ports import free_ports
from electra.state.journal import JournalEntry, entry_for
from electra.state.machine import ControllerStateMachine
from electra.tiering.schema import GAP, event_rows
from electra.tiering.store import TierStore

pytestmark = pytest.mark.integration


def _metric(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def test_sigkilled_leader_process_leaves_no_gap_or_duplicate(tmp_path):
    ports = free_ports(6)
    peers = ",".join(f"{i}=127.0.0.1:{ports[i - 1]}" for i in (1, 2, 3))
    http = {i: f"127.0.0.1:{ports[2 + i]}" for i in (1, 2, 3)}
    http_peers = ",".join(f"{i}={ep}" for i, ep in http.items())
    uri = str(tmp_path / "tier")
    procs: dict[int, subprocess.Popen] = {}
    for i in (1, 2, 3):
        log = open(tmp_path / f"node{i}.log", "ab")  # noqa: SIM115 - owned by the process
        procs[i] = subprocess.Popen(
            [sys.executable, "-m", "electra.cli", "node", "--id", str(i), "--peers", peers, "--http-addr", http[i],
             "--http-peers", http_peers, "--data-dir", str(tmp_path / f"node{i}"), "--tick-ms", "50",
             "--inactive-master-scan-ms", "3600000", "--tier-uri", uri,
             "--insecure"],  # about tiering; security has its own process tests
            stdout=log, stderr=subprocess.STDOUT)

    async def leader(session, alive) -> int | None:
        for i in alive:
            try:
                async with session.get(f"http://{http[i]}/v1/admin/metadata") as r:
                    if (await r.json())["is_leader"]:
                        return i
            except (aiohttp.ClientError, OSError, TimeoutError):
                continue
        return None

    async def writes(client: ControllerClient, lo: int, hi: int) -> None:
        for k in range(lo, hi):
            name = f"bs{k % 5}"
            try:  # a request in flight at the killed leader fails; its outcome is whatever the log says
                nxt = (await client.next_broker_id("c", name))["header"]["nextBrokerId"]
                await client.apply_broker_id("c", name, nxt, f"10.0.{k % 5}.{nxt}:1;{nxt}")
                await client.register("c", name, 1, f"10.9.{k % 3}.1:1")  # an address change every few writes
            except (aiohttp.ClientError, OSError, TimeoutError, KeyError):
                await asyncio.sleep(0.1)

    async def scenario() -> int:
        client = ControllerClient(list(http.values()), deadline_s=20)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
            try:
                deadline = time.monotonic() + 20
                while (old := await leader(session, procs)) is None:
                    assert time.monotonic() < deadline, "no leader"
                    await asyncio.sleep(0.1)
                await writes(client, 0, 25)
                load = asyncio.create_task(writes(client, 25, 60))
                await asyncio.sleep(0.3)
                procs[old].send_signal(signal.SIGKILL)  # mid-load, with un-uploaded entries
                procs[old].wait(10)
                await load
                alive = [i for i in procs if i != old]
                deadline = time.monotonic() + 20
                while True:
                    assert time.monotonic() < deadline, "the new leader's upload did not catch up"
                    new = await leader(session, alive)
                    if new is not None:
                        async with session.get(f"http://{http[new]}/metrics") as r:
                            text = await r.text()
                        up = _metric(text, "electra_tier_uploaded_index")
                        applied = _metric(text, "electra_raft_applied_index")
                        if _metric(text, "electra_tier_uploading") == 1.0 and up >= applied:
                            return new
                    await asyncio.sleep(0.2)
            finally:
                await client.close()

    try:
        new = asyncio.run(asyncio.wait_for(scenario(), 60))
    finally:
        stop_processes(list(procs.values()))
    # Replay the new leader's durable log: every entry in it was committed (its upload covered them all).
    rec = LogStorage(tmp_path / f"node{new}" / "raft-log", fsync=False).open()
    assert rec.snapshot_index == 0
    sm = ControllerStateMachine()
    expected: list[JournalEntry] = []

    def on_event(index, ev):
        expected.append(entry_for(sm, index, rec.terms[index - 1], ev))

    sm.on_event(on_event)
    for i, data in enumerate(rec.datas, start=1):
        if data:
            sm.apply(i, data)
    progress = TierStore(uri).progress()
    # All of it was uploaded, but for what the final stop appended: a leader stopped with SIGTERM hands over first,
    # and the next leader's first entry (a no-op, no event) reaches this log before it stops.
    assert progress.upto <= rec.last_index and not any(rec.datas[progress.upto:]), (progress, rec.last_index)
    rows = TierStore(uri).read("events").to_pylist()
    assert not [r for r in rows if r["type"] == GAP]
    key = ("index", "seq", "term", "ts_ms", "type", "cluster", "broker_set", "payload", "state")
    got = sorted(tuple(r[k] for k in key) for r in rows)
    want = sorted(tuple(r[k] for k in key) for r in event_rows(expected, 0))
    assert len(set(g[:2] for g in got)) == len(got)
    assert got == want and len(got) > 60
    # `electra history` over what the processes wrote, as an operator runs it: it must exit 0 (read through
    # pyarrow's dataset scan, some runs aborted at interpreter exit: TierStore.read, tests/unit/test_tiering.py)
    for _ in range(2):
        run = subprocess.run([sys.executable, "-m", "electra.cli", "history", "--tier-uri", uri, "--at", "now",
                              "--events-from", "0"], capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, (run.returncode, run.stderr[-2000:])
        assert json.loads(run.stdout)["events"]["events"], run.stdout[:500]
