"""Three `electra node` controller processes over HTTP: 100 broker sets, master re-election, leader SIGKILL."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time

import pytest

from electra.api.client import ControllerClient
from electra.bench.common import free_ports
from electra.state.codes import Code

pytestmark = pytest.mark.integration


def test_broker_sets_survive_a_controller_leader_sigkill(tmp_path):
    ports = free_ports(6)
    peers = ",".join(f"{i}=127.0.0.1:{ports[i - 1]}" for i in (1, 2, 3))
    http = {i: f"127.0.0.1:{ports[2 + i]}" for i in (1, 2, 3)}
    http_peers = ",".join(f"{i}={ep}" for i, ep in http.items())
    procs: dict[int, subprocess.Popen] = {}

    def start(i: int) -> None:
        log = open(tmp_path / f"node{i}.log", "ab")  # noqa: SIM115 - owned by the process
        procs[i] = subprocess.Popen(
            [sys.executable, "-m", "electra.cli", "node", "--id", str(i), "--peers", peers, "--http-addr", http[i],
             "--http-peers", http_peers, "--data-dir", str(tmp_path / f"node{i}"), "--tick-ms", "50"],
            stdout=log, stderr=subprocess.STDOUT)

    async def register(client: ControllerClient, name: str, acked: set) -> None:
        for _ in range(3):
            nxt = (await client.next_broker_id("c", name))["header"]["nextBrokerId"]
            addr = f"10.1.{len(name)}.{nxt}:10911"
            r = await client.apply_broker_id("c", name, nxt, f"{addr};{nxt}")
            assert r["code"] == Code.SUCCESS, r
            await client.heartbeat("c", name, nxt, addr, epoch=1, maxOffset=nxt, heartbeatTimeoutMillis=1500)
            assert (await client.register("c", name, nxt, addr))["code"] == Code.SUCCESS
        r = await client.elect_master("c", name, 1)
        assert r["code"] == Code.SUCCESS, r
        acked.add(name)

    async def scenario() -> None:
        client = ControllerClient(list(http.values()), deadline_s=20)
        acked: set[str] = set()
        try:
            await asyncio.gather(*(register(client, f"set-{g}", acked) for g in range(100)))
            assert len(acked) == 100
            # Broker-triggered re-election: the master puts its replicas in sync, then stops heart-beating;
            # replica 3 (the highest max offset among the live in-sync replicas) asks and wins.
            for bid in (1, 2, 3):  # brokers heartbeat every second; these are fresh
                await client.heartbeat("c", "set-0", bid, f"10.1.5.{bid}:10911", epoch=1, maxOffset=bid,
                                       heartbeatTimeoutMillis=1500)
            r = await client.alter_sync_state_set("set-0", 1, 1, [1, 2, 3], 1)
            assert r["code"] == Code.SUCCESS, r
            await asyncio.sleep(1.6)
            for bid in (2, 3):
                await client.heartbeat("c", "set-0", bid, f"10.1.5.{bid}:10911", epoch=1, maxOffset=bid,
                                       heartbeatTimeoutMillis=1500)
            r = await client.elect_master("c", "set-0", 3)
            assert r["code"] == Code.SUCCESS, r
            assert r["header"]["masterBrokerId"] == 3 and r["header"]["masterEpoch"] == 2
            # Kill the controller leader under load.
            md = [await client.metadata(ep) for ep in http.values()]
            leader = next(m["node_id"] for m in md if m["is_leader"])
            load = asyncio.gather(*(register(client, f"late-{g}", acked) for g in range(30)),
                                  return_exceptions=True)
            await asyncio.sleep(0.3)
            procs[leader].send_signal(signal.SIGKILL)
            procs[leader].wait(timeout=10)
            await load
            start(leader)
            # Every acknowledged registration is there, read through whichever node answers.
            for name in sorted(acked):
                r = await client.replica_info(name)
                # Brokers stopped heart-beating, so the controller may since have recorded "no master"
                # (epoch bumped); the election itself is in the history either way.
                assert r["code"] == Code.SUCCESS and r["header"]["masterEpoch"] >= 1, (name, r)
                nxt = await client.next_broker_id("c", name)
                assert nxt["header"]["nextBrokerId"] == 4, (name, nxt)
            assert len(acked) >= 110  # most late registrations made it through the failover
        finally:
            await client.close()

    for i in (1, 2, 3):
        start(i)
    try:
        asyncio.run(asyncio.wait_for(scenario(), 120))
    except BaseException:
        for i in (1, 2, 3):
            print(f"--- node{i}.log ---\n" + (tmp_path / f"node{i}.log").read_text()[-3000:])
        raise
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.terminate()
        for p in procs.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        time.sleep(0.1)
