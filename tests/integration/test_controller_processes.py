"""Three `electra node` controller processes over HTTP: 100 broker sets, master re-election, leader SIGKILL."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time

import pytest

from electra.api.client import ControllerClient
from electra.bench.common import stop_processes
from electra.local_ports import free_ports
from electra.state.codes import Code

pytestmark = pytest.mark.integration


async def _until(cond, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


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
             "--http-peers", http_peers, "--data-dir", str(tmp_path / f"node{i}"), "--tick-ms", "50",
             "--inactive-master-scan-ms", "500", "--insecure"],  # security: test_security_processes.py
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
        from electra.broker_simulator import BrokerFleet

        client = ControllerClient(list(http.values()), deadline_s=20)
        fleet = BrokerFleet(list(http.values()), groups=100, replicas=3, heartbeat_s=0.5, poll_s=1.0,
                            timeout_ms=1500)
        acked: set[str] = set()
        try:
            # The simulator registers 100 broker sets the RocketMQ way and elects their masters.
            await fleet.start()
            await _until(lambda: all(fleet.master_of(n) for n in fleet.by_set), "every set has a master", 30)
            # A master dies; its replicas keep heart-beating, the controller notices and re-elects
            # through ElectMaster, and the brokers learn the new master.
            old = fleet.master_of("sim-set-0")
            await _until(lambda: len(old.sync_state_set) == 3, "replicas in sync", 15)
            fleet.kill("sim-set-0", old.broker_id)
            await _until(lambda: (m := fleet.master_of("sim-set-0")) is not None and m is not old,
                         "a new master for sim-set-0", 30)
            assert fleet.master_of("sim-set-0").master_epoch > old.master_epoch
            # Kill the controller leader under load (the fleet keeps running, plus new registrations).
            md = [await client.metadata(ep) for ep in http.values()]
            leader = next(m["node_id"] for m in md if m["is_leader"])
            # the killed master is still known to the leader, no longer counted alive
            lm = next(m for m in md if m["is_leader"])
            assert 0 < lm["live_brokers"] < lm["known_brokers"], lm
            load = asyncio.gather(*(register(client, f"late-{g}", acked) for g in range(30)),
                                  return_exceptions=True)
            await asyncio.sleep(0.3)
            procs[leader].send_signal(signal.SIGKILL)
            procs[leader].wait(timeout=10)
            await load
            start(leader)
            # Every acknowledged registration is there, read through whichever node answers.
            for name in sorted(acked) + sorted(fleet.by_set):
                r = await client.replica_info(name)
                assert r["code"] == Code.SUCCESS and r["header"]["masterEpoch"] >= 1, (name, r)
                nxt = await client.next_broker_id("c" if name.startswith("late") else "sim", name)
                assert nxt["header"]["nextBrokerId"] == 4, (name, nxt)
            assert len(acked) >= 10  # registrations kept being acknowledged across the failover
        finally:
            await fleet.stop()
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
        stop_processes(list(procs.values()))
        time.sleep(0.1)
