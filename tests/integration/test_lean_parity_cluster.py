"""The lean path and FastAPI give the same answers from a real controller group (api/lean_path.py).

tests/unit/test_lean_parity.py compares the two paths request by request in front of a stand-in
handler; this test uses three real nodes. Each request goes twice to the same node: as it is
(the lean path serves it) and with a variation only FastAPI takes (`charset` in the content
type, an ignored query parameter), which the lean path hands over. Only requests whose second
sending answers like the first are used (reads, unchanged registrations, refused or no-op writes).
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from inprocess_cluster import start_cluster

from electra.api.client import ControllerClient
from electra.state.codes import Code

pytestmark = pytest.mark.integration
MATTER = ("content-type", "retry-after")


async def _both(raw: httpx.AsyncClient, ep: str, method: str, path: str, body: dict | None = None):
    url = f"http://{ep}{path}"
    if body is None:
        lean = await raw.request(method, url)
        fast = await raw.request(method, url + ("&" if "?" in path else "?") + "via=fastapi")
    else:
        data = json.dumps(body).encode()
        lean = await raw.request(method, url, content=data, headers={"Content-Type": "application/json"})
        fast = await raw.request(method, url, content=data,
                                 headers={"Content-Type": "application/json; charset=utf-8"})
    return lean, fast


def test_real_nodes_answer_alike_through_both_paths(tmp_path):
    async def main():
        nodes, http = await start_cluster(tmp_path, scan_interval_s=0)
        leader_id = next(i for i, n in nodes.items() if n.node.is_leader)
        leader, follower = http[leader_id], next(ep for i, ep in http.items() if i != leader_id)
        client = ControllerClient(list(http.values()))
        try:
            for bid in (1, 2):
                addr = f"10.0.0.{bid}:10911"
                await client.apply_broker_id("c", "b", bid, f"{addr};{bid}")
                await client.heartbeat("c", "b", bid, addr, epoch=1, heartbeatTimeoutMillis=60_000)
                await client.register("c", "b", bid, addr)
            assert (await client.elect_master("c", "b", 1))["code"] == Code.SUCCESS
            reg = {"clusterName": "c", "brokerId": 2, "brokerAddress": "10.0.0.2:10911"}
            rows = [
                (leader, "GET", "/v1/broker-sets/b/replica-info", None),
                (follower, "GET", "/v1/broker-sets/b/replica-info", None),
                (leader, "GET", "/v1/broker-sets/b/next-broker-id?cluster=c", None),
                (leader, "GET", "/v1/broker-sets/nope/replica-info", None),
                (leader, "POST", "/v1/broker-sets/b/register", reg),
                (leader, "POST", "/v1/broker-sets/b/register", {**reg, "brokerId": 9}),
                (leader, "POST", "/v1/broker-sets/b/elect-master", {"clusterName": "c", "brokerId": 2}),
                (leader, "POST", "/v1/broker-sets/b/apply-broker-id",
                 {"clusterName": "c", "brokerId": 2, "registerCheckCode": "10.0.0.2:10911;2"}),
                (leader, "POST", "/v1/broker-sets/b/apply-broker-id",
                 {"clusterName": "c", "brokerId": 2, "registerCheckCode": "other;2"}),
                (leader, "POST", "/v1/broker-sets/b/sync-state-set",
                 {"masterBrokerId": 1, "masterEpoch": 1, "syncStateSet": [1, 2], "syncStateSetEpoch": 7}),
                (leader, "POST", "/v1/heartbeat", {"clusterName": "c", "brokerName": "b", "brokerId": 2,
                                                   "brokerAddr": "10.0.0.2:10911", "heartbeatTimeoutMillis": 60_000}),
                (follower, "POST", "/v1/broker-sets/b/register", reg),  # 307 to the leader
                (follower, "GET", "/v1/broker-sets/b/next-broker-id?cluster=c", None),
            ]
            lean_of = {ep: nodes[i].lean for i, ep in http.items()}
            async with httpx.AsyncClient(timeout=10) as raw:
                for ep, method, path, body in rows:
                    for _ in range(10):  # a loaded machine: a follower may briefly not hear its leader (503)
                        before = lean_of[ep].stats["served"]
                        lean, fast = await _both(raw, ep, method, path, body)
                        if 503 not in (lean.status_code, fast.status_code):
                            break
                        await asyncio.sleep(0.3)
                    assert lean_of[ep].stats["served"] == before + 1, path  # the first one only
                    assert lean.status_code == fast.status_code, (path, lean.text, fast.text)
                    loc = [r.headers.get("location", "").replace("via=fastapi", "").rstrip("?&")
                           for r in (lean, fast)]
                    assert loc[0] == loc[1], (path, loc)
                    assert lean.content == fast.content, (path, lean.content, fast.content)
                    for h in MATTER:
                        assert lean.headers.get(h) == fast.headers.get(h), (path, h)
        finally:
            await client.close()
            for n in nodes.values():
                await n.stop()

    asyncio.run(asyncio.wait_for(main(), 60))
