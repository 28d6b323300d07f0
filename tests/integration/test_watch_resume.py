"""A role-change watcher that reconnects misses nothing: real nodes and HTTP servers on loopback.

Each event's SSE `id` is its Raft index; a watcher resuming with `Last-Event-ID` (or `after`) on any
node gets what it missed from that node's journal, or one `resync` event with the set as it is when
the journal no longer reaches back that far. A watcher too slow for its queue is ended, not skipped.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from inprocess_cluster import start_cluster

from electra.api.client import ControllerClient
from electra.state.codes import Code

pytestmark = pytest.mark.integration


async def _group(client: ControllerClient, name: str) -> None:
    for bid in (1, 2, 3):
        addr = f"10.0.0.{bid}:10911"
        assert (await client.apply_broker_id("c", name, bid, f"{addr};{bid}"))["code"] == Code.SUCCESS
        await client.heartbeat("c", name, bid, addr, epoch=1, maxOffset=100 * bid, heartbeatTimeoutMillis=60_000)
        assert (await client.register("c", name, bid, addr))["code"] == Code.SUCCESS


async def _events(raw: httpx.AsyncClient, url: str, want: int, headers: dict | None = None) -> list[tuple]:
    """The first `want` events of a watch stream: (event, id, data), bounded in time."""
    out: list[tuple] = []

    async def read() -> None:
        async with raw.stream("GET", url, headers=headers or {}, timeout=10) as resp:
            assert resp.status_code == 200, await resp.aread()
            kind = ident = None
            async for line in resp.aiter_lines():
                if line.startswith("event: "):
                    kind = line[7:]
                elif line.startswith("id: "):
                    ident = int(line[4:])
                elif line.startswith("data: "):
                    out.append((kind, ident, json.loads(line[6:])))
                    if len(out) == want:
                        return

    await asyncio.wait_for(read(), 8)
    return out


def test_a_watcher_resumes_on_another_node_from_its_last_event(tmp_path):
    async def main():
        nodes, http = await start_cluster(tmp_path, scan_interval_s=60)
        leader = next(i for i, n in nodes.items() if n.node.is_leader)
        a, b = (ep for i, ep in http.items() if i != leader)
        client = ControllerClient(list(http.values()))
        try:
            await _group(client, "w")
            assert (await client.elect_master("c", "w", 1))["code"] == Code.SUCCESS
            assert (await client.alter_sync_state_set("w", 1, 1, [1, 2, 3], 1))["code"] == Code.SUCCESS
            assert (await client.alter_sync_state_set("w", 1, 1, [1, 2], 2))["code"] == Code.SUCCESS
            await asyncio.sleep(0.3)  # applied on every node
            async with httpx.AsyncClient() as raw:
                # From the start (0: before every index), on one follower: the three changes, in order.
                got = await _events(raw, f"http://{a}/v1/broker-sets/w/watch", 3, {"Last-Event-ID": "0"})
                assert [k for k, _, _ in got] == ["role-change"] * 3
                ids = [i for _, i, _ in got]
                assert ids == sorted(ids) and [d["index"] for _, _, d in got] == ids
                assert [d["type"] for _, _, d in got] == ["ElectMaster", "AlterSyncStateSet", "AlterSyncStateSet"]
                assert got[2][2]["syncStateSet"] == [1, 2] and got[2][2]["syncStateSetEpoch"] == 3
                # Resumed on the other follower after the first: the two it missed, then the live one.
                url_b = f"http://{b}/v1/broker-sets/w/watch"
                reader = asyncio.create_task(_events(raw, url_b, 3, {"Last-Event-ID": str(ids[0])}))
                await asyncio.sleep(0.5)
                assert (await client.alter_sync_state_set("w", 1, 1, [1, 2, 3], 3))["code"] == Code.SUCCESS
                resumed = await reader
                assert [i for _, i, _ in resumed][:2] == ids[1:]
                assert resumed[2][1] > ids[2] and resumed[2][2]["syncStateSetEpoch"] == 4
                # `after` in the query does the same; Last-Event-ID wins over it (an EventSource's reconnect).
                got = await _events(raw, f"{url_b}?after={ids[1]}", 1)
                assert got[0][1] == ids[2]
                got = await _events(raw, f"{url_b}?after=0", 1, {"Last-Event-ID": str(ids[2])})
                assert got[0][1] == resumed[2][1]
                # Bad resume points are refused with the API's validation answer.
                for headers, query in (({"Last-Event-ID": "x1"}, ""), ({"Last-Event-ID": "1" * 30}, ""),
                                       ({}, "?after=-1"), ({}, "?after=ab"), ({}, "?after=%2B5"), ({}, "?after=5.0"),
                                       ({"Last-Event-ID": "+5"}, "")):
                    r = await raw.get(url_b + query, headers=headers)
                    assert r.status_code == 422 and r.json()["code"] == Code.CONTROLLER_INVALID_REQUEST, r.text
                # Leading zeros are the same index (what some clients send back).
                got = await _events(raw, url_b, 1, {"Last-Event-ID": "0" * 15 + str(ids[2])})
                assert got[0][1] == resumed[2][1]
                nodes_by_ep = {ep: nodes[i] for i, ep in http.items()}
                watchers_a = nodes_by_ep[a].service.watchers
                applied = nodes_by_ep[a].service.watchers.sm.applied
                # An index no node has applied: a follower sends the watcher elsewhere (503) after waiting
                # for it a while; the leader, which holds every committed index, answers with a resync.
                t0 = time.monotonic()
                r = await raw.get(f"http://{a}/v1/broker-sets/w/watch", headers={"Last-Event-ID": str(applied + 500)})
                assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
                assert time.monotonic() - t0 >= 1.5
                got = await _events(raw, f"http://{http[leader]}/v1/broker-sets/w/watch", 1,
                                    {"Last-Event-ID": str(applied + 500)})
                assert got[0][0] == "resync" and got[0][1] <= applied + 10 and got[0][2]["syncStateSetEpoch"] == 4
                # A snapshot installed under an open watch (it replaces the state, the changes it covers are
                # not told): the watcher gets a resync on its open stream, then the changes that follow; and
                # a watcher resuming from before it gets a resync too.
                async with raw.stream("GET", f"http://{a}/v1/broker-sets/w/watch", timeout=10) as resp:
                    lines = resp.aiter_lines()
                    assert (await anext(lines)).startswith(": watching")
                    watchers_a._restored(watchers_a.sm.applied)  # noqa: SLF001 - what a snapshot install calls
                    assert (await client.alter_sync_state_set("w", 1, 1, [1, 2], 4))["code"] == Code.SUCCESS
                    seen: list[str] = []

                    async def two_events():
                        async for line in lines:
                            if line.startswith(("event:", "data:")):
                                seen.append(line)
                            if len(seen) == 4:
                                return
                    await asyncio.wait_for(two_events(), 5)
                assert seen[0] == "event: resync" and json.loads(seen[1][6:])["syncStateSetEpoch"] == 4, seen
                assert seen[2] == "event: role-change" and json.loads(seen[3][6:])["syncStateSetEpoch"] == 5, seen
                got = await _events(raw, f"http://{a}/v1/broker-sets/w/watch", 1, {"Last-Event-ID": str(ids[0])})
                kind, ident, data = got[0]
                assert kind == "resync" and ident == watchers_a.sm.applied
                assert data["masterBrokerId"] == 1 and data["syncStateSet"] == [1, 2]
        finally:
            await client.close()
            for n in nodes.values():
                await n.stop()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_watcher_that_falls_behind_is_ended_and_resumes_without_a_gap(tmp_path):
    async def main():
        nodes, http = await start_cluster(tmp_path, scan_interval_s=60)
        leader = next(i for i, n in nodes.items() if n.node.is_leader)
        watchers = nodes[leader].service.watchers
        client = ControllerClient([http[leader]])
        url = f"http://{http[leader]}/v1/broker-sets/s/watch"
        try:
            await _group(client, "s")
            assert (await client.elect_master("c", "s", 1))["code"] == Code.SUCCESS
            async with httpx.AsyncClient() as raw:
                first = (await _events(raw, url, 1, {"Last-Event-ID": "0"}))[0][1]
                async with raw.stream("GET", url, headers={"Last-Event-ID": str(first)}, timeout=10) as resp:
                    assert resp.status_code == 200
                    lines = resp.aiter_lines()
                    assert (await anext(lines)).startswith(": watching")
                    # More changes applied in one turn than the watcher's queue holds (a burst of committed
                    # entries is applied that way): its stream ends instead of skipping one.
                    (queue,) = watchers._queues["s"]
                    watchers.queue_size = queue._maxsize = 2  # noqa: SLF001 - a small queue for the test
                    for epoch in range(1, 7):
                        r = await client.alter_sync_state_set("s", 1, 1, [1, 2, 3] if epoch % 2 else [1, 2], epoch)
                        assert r["code"] == Code.SUCCESS, r
                    for _ in range(3):
                        watchers._on_event(watchers.journal.last_applied,  # noqa: SLF001 - the same event again
                                           {"type": "AlterSyncStateSet", "brokerName": "s"})
                    rest = []

                    async def drain():
                        async for line in lines:
                            rest.append(line)
                    await asyncio.wait_for(drain(), 5)  # the stream ends
                assert any("fell behind" in x for x in rest), rest
                assert "s" not in watchers._queues  # noqa: SLF001 - released
                got = await _events(raw, url, 6, {"Last-Event-ID": str(first)})
                assert [d["syncStateSetEpoch"] for _, _, d in got] == [2, 3, 4, 5, 6, 7]
        finally:
            await client.close()
            for n in nodes.values():
                await n.stop()

    asyncio.run(asyncio.wait_for(main(), 60))
