"""The legacy architecture (RocketMQ 5's single event queue) answers exactly as the new one.

One request script (broker ids, registration, elections, sync-state sets, every error the
script can provoke) runs against three real `electra node` processes of each architecture;
the answers (HTTP status and RocketMQ body) must be identical. The legacy nodes must also
really be legacy: reads are log entries there and not in the new mode.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from electra.api.client import ControllerClient
from electra.bench.common import start_controller_processes, stop_processes
from electra.security.credentials import ClientCredentials

pytestmark = pytest.mark.integration

C, S, T = "cl", "set-a", "set-b"
ADDR = {1: "10.0.0.1:10911", 2: "10.0.0.2:10911", 3: "10.0.0.3:10911"}


async def _leader_client(endpoints: list[str]) -> tuple[ControllerClient, str]:
    probe = ControllerClient(endpoints, credentials=ClientCredentials())
    try:
        for _ in range(150):  # bounded: 30 s
            for ep in endpoints:
                try:
                    if (await probe.metadata(ep)).get("is_leader"):
                        return ControllerClient([ep], credentials=ClientCredentials()), ep
                except Exception:
                    pass
            await asyncio.sleep(0.2)
        raise TimeoutError("no leader within 30 s")
    finally:
        await probe.close()


async def _script(c: ControllerClient) -> list[tuple[str, dict]]:
    out: list[tuple[str, dict]] = []

    async def step(label: str, coro) -> dict:
        res = await coro
        out.append((label, res))
        return res

    await step("next id of a new set", c.next_broker_id(C, S))
    await step("apply id 2 to a new set (2014)", c.apply_broker_id(C, S, 2, f"{ADDR[2]};1"))
    for i in (1, 2, 3):
        await step(f"apply id {i}", c.apply_broker_id(C, S, i, f"{ADDR[i]};{i}"))
        await step(f"next id after {i}", c.next_broker_id(C, S))
        await c.heartbeat(C, S, i, ADDR[i], epoch=0, maxOffset=100 * i, electionPriority=i)
    await step("apply a taken id with another code (2014)", c.apply_broker_id(C, S, 1, "other:1;9"))
    await step("apply retry by the same broker", c.apply_broker_id(C, S, 1, f"{ADDR[1]};1"))
    await step("replica info before any master", c.replica_info(S))
    for i in (1, 2, 3):
        await step(f"register {i} without a master", c.register(C, S, i, ADDR[i]))
    await step("register an unknown id (2010)", c.register(C, S, 7, "10.0.0.7:1"))
    await step("register in an unknown set (2010)", c.register(C, T, 1, "10.1.0.1:1"))
    await step("first election by 2", c.elect_master(C, S, 2))
    await step("election while the master lives (2011)", c.elect_master(C, S, 1))
    await step("register 1 with a master", c.register(C, S, 1, ADDR[1]))
    await step("register 3 at a new address", c.register(C, S, 3, "10.0.0.33:10911"))
    await step("grow the sync-state set", c.alter_sync_state_set(S, 2, 1, [1, 2, 3], 1))
    await step("stale sync-state epoch (2001)", c.alter_sync_state_set(S, 2, 1, [1, 2], 1))
    await step("not the master (2002)", c.alter_sync_state_set(S, 1, 1, [1, 2], 2))
    await step("fenced master epoch (2000)", c.alter_sync_state_set(S, 2, 0, [1, 2], 2))
    await step("replica info with a master", c.replica_info(S))
    await step("replica info of an unknown set (2008)", c.replica_info(T))
    await step("admin designates 3", c.elect_master(C, S, 3, admin=True))
    await step("replica info after the admin election", c.replica_info(S))
    await step("clean a living broker without the flag", c.clean_broker_data(S, cluster=C, ids=[1]))
    await step("clean broker 1", c.clean_broker_data(S, cluster=C, ids=[1], clean_living=True))
    await step("replica info after the clean", c.replica_info(S))
    await step("invalid broker id (422)", c.request("POST", f"/v1/broker-sets/{S}/register",
                                                    json={"clusterName": C, "brokerId": 0, "brokerAddress": "x"}))
    return out


async def _run(endpoints: list[str]) -> tuple[list[tuple[str, dict]], dict, dict]:
    client, leader = await _leader_client(endpoints)
    try:
        answers = await _script(client)
        before = await client.metadata(leader)
        for _ in range(5):
            await client.replica_info(S)
        after = await client.metadata(leader)
        return answers, before, after
    finally:
        await client.close()


def _cluster_run(tmp_path, architecture: str):
    # No inactive-master scan: a controller-triggered election must not race the script.
    args = ("--architecture", architecture, "--tick-ms", "50", "--inactive-master-scan-ms", "0")
    procs, endpoints = start_controller_processes(tmp_path / architecture, args, secure=False)
    try:
        time.sleep(1.0)
        return asyncio.run(_run(endpoints))
    finally:
        stop_processes(procs)


def test_legacy_and_new_answer_the_same_script_identically(tmp_path):
    new, new_before, new_after = _cluster_run(tmp_path, "new")
    old, old_before, old_after = _cluster_run(tmp_path, "legacy")
    assert [label for label, _ in new] == [label for label, _ in old]
    for (label, a), (_, b) in zip(new, old, strict=True):
        assert a == b, f"{label}: new answered {a}, legacy answered {b}"
    # The script exercises what it claims: successes and RocketMQ errors alike.
    codes = {res.get("code") for _, res in new}
    assert {0, 2000, 2001, 2002, 2008, 2010, 2011, 2014}.issubset(codes), codes
    # Legacy reads are log entries (READ_EVENT); new-mode reads are ReadIndex reads, no entry.
    assert old_after["commit_index"] - old_before["commit_index"] >= 5
    assert new_after["commit_index"] == new_before["commit_index"]
    assert old_after["architecture"] == "legacy" and old_after["events_processed"] > len(old) - 5
