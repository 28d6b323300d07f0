"""RegisterBroker with an unchanged address and ElectMaster answering 2011 write no log entry (api/service.py).

Three real nodes on loopback: the leader's last log index stays where it was while such
requests are answered (from a linearizable read), and moves when the address does change.
"""

from __future__ import annotations

import asyncio

import pytest
from inprocess_cluster import start_cluster

from electra.api.client import ControllerClient
from electra.state.codes import Code

pytestmark = pytest.mark.integration


def test_unchanged_register_and_still_alive_election_write_nothing(tmp_path):
    async def main():
        nodes, http = await start_cluster(tmp_path, scan_interval_s=0)
        client = ControllerClient(list(http.values()))
        try:
            for bid in (1, 2):
                addr = f"10.0.0.{bid}:10911"
                assert (await client.apply_broker_id("c", "b", bid, f"{addr};{bid}"))["code"] == Code.SUCCESS
                await client.heartbeat("c", "b", bid, addr, epoch=1, heartbeatTimeoutMillis=60_000)
                assert (await client.register("c", "b", bid, addr))["code"] == Code.SUCCESS
            assert (await client.elect_master("c", "b", 1))["code"] == Code.SUCCESS
            leader = next(n for n in nodes.values() if n.node.is_leader).node
            first = await client.register("c", "b", 2, "10.0.0.2:10911")
            last = leader.status()["last_index"]

            for _ in range(5):
                again = await client.register("c", "b", 2, "10.0.0.2:10911")
                assert again == first and again["header"]["masterBrokerId"] == 1
                still = await client.elect_master("c", "b", 2)
                assert still["code"] == Code.CONTROLLER_MASTER_STILL_EXIST, still
                assert still["header"]["masterBrokerId"] == 1 and still["httpStatus"] == 409
                missing = await client.register("c", "b", 9, "10.0.0.9:10911")  # refused: changes nothing
                assert missing["code"] == Code.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED
            assert leader.status()["last_index"] == last  # not one log entry for fifteen requests

            moved = await client.register("c", "b", 2, "10.0.0.22:10911")  # a new address is a write
            assert moved["code"] == Code.SUCCESS
            assert leader.status()["last_index"] == last + 1
            data = await client.sync_state_data(["b"])
            table = data["body"]["replicasInfoTable"]["b"]
            assert [r["brokerAddress"] for r in table["notInSyncReplicas"]] == ["10.0.0.22:10911"]
            for node in nodes.values():  # the read path changed no replica's state
                assert node.service.sm.sets["b"].brokers[1][0] == "10.0.0.1:10911"
        finally:
            await client.close()
            for n in nodes.values():
                await n.stop()

    asyncio.run(asyncio.wait_for(main(), 60))
