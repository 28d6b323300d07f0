"""The job's proposal client against three real controller nodes (Raft + FastAPI on loopback).

A proposal built by the detector reaches the leader through a follower (307), elects a
new master (200, code 0); the same proposal again is fenced (409, code 2000); a proposal
whose snapshot shows the master alive gets 409, code 2011.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from inprocess_cluster import start_cluster

from electra.api.client import ControllerClient as ApiClient
from electra.state.codes import Code
from electra.streaming import detector
from electra.streaming.sink import ControllerClient

pytestmark = pytest.mark.integration


def _hb(bid: int, ts: int) -> dict:
    return {"clusterName": "c", "brokerName": "s", "brokerAddr": f"10.0.0.{bid}:10911", "brokerId": bid, "epoch": 1,
            "maxOffset": 100, "confirmOffset": 100, "heartbeatTimeoutMillis": 1000, "electionPriority": bid,
            "ts": ts}


def _state(master: int, epoch: int) -> dict:
    return {"index": epoch, "brokerName": "s", "clusterName": "c",
            "state": {"clusterName": "c", "masterBrokerId": master, "masterEpoch": epoch, "syncStateSet": [1, 2, 3],
                      "syncStateSetEpoch": 2, "brokers": {}}}


def test_proposals_against_real_controllers(tmp_path):
    async def main():
        # The controller's own scan is off: only the job's proposals elect here.
        nodes, http = await start_cluster(tmp_path, scan_interval_s=0)
        try:
            leader_id = next(i for i, n in nodes.items() if n.node.is_leader)
            follower_ep = next(ep for i, ep in http.items() if i != leader_id)
            api = ApiClient(list(http.values()))
            for _ in range(3):
                nxt = (await api.next_broker_id("c", "s"))["header"]["nextBrokerId"]
                addr = f"10.0.0.{nxt}:10911"
                assert (await api.apply_broker_id("c", "s", nxt, f"{addr};{nxt}"))["code"] == Code.SUCCESS
                await api.heartbeat("c", "s", nxt, addr, epoch=1, maxOffset=100, heartbeatTimeoutMillis=1000)
                assert (await api.register("c", "s", nxt, addr))["code"] == Code.SUCCESS
            r = await api.elect_master("c", "s", 1)
            assert r["code"] == Code.SUCCESS
            epoch = r["header"]["masterEpoch"]
            r = await api.alter_sync_state_set("s", 1, epoch, [1, 2, 3], r["header"]["syncStateSetEpoch"])
            assert r["code"] == Code.SUCCESS

            # The detector's view: master 1 silent for 5 s, brokers 2 and 3 heartbeating all along (a set
            # whose records all stopped would restart its clocks when they resume: no proposal yet).
            now = int(time.time() * 1000)
            beats = [_hb(b, t) for t in range(now - 5000, now + 1, 250) for b in (2, 3)]
            w, _ = detector.process(None, "s", [_hb(1, now - 5000), *beats], [_state(1, epoch)], now - 5000)
            [out] = [o for o in w.evaluate(now) if o.kind == detector.PROPOSAL]
            client = ControllerClient([follower_ep], deadline_s=10)
            client.leader = follower_ep  # first POST goes to a follower: 307 to the leader
            first = await asyncio.to_thread(client.propose, out.payload)
            assert (first.result, first.status, first.code) == ("ok", 200, 0), first
            assert first.endpoint == http[leader_id] and first.body["header"]["masterBrokerId"] in (2, 3)
            assert first.body["header"]["masterEpoch"] == epoch + 1
            again = await asyncio.to_thread(client.propose, out.payload)
            assert (again.result, again.status, again.code) == ("fenced", 409, 2000), again

            # A snapshot in which the new master is alive: the controller keeps it (2011).
            new_master = first.body["header"]["masterBrokerId"]
            now = int(time.time() * 1000)
            w2, _ = detector.process(None, "s", [_hb(b, now) for b in (1, 2, 3)], [_state(new_master, epoch + 1)],
                                     now)
            body = w2.proposal(now)
            still = await asyncio.to_thread(client.propose, body)
            assert (still.result, still.status, still.code) == ("master_still_alive", 409, 2011), still
        finally:
            for n in nodes.values():
                await n.stop()

    asyncio.run(main())
