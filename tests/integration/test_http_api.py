"""Three controller nodes with real HTTP servers on loopback: the RocketMQ broker flow end to end."""

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


async def _cluster(tmp_path):
    return await start_cluster(tmp_path, scan_interval_s=0.2)


async def _register_group(client: ControllerClient, name: str, n: int = 3) -> None:
    for _ in range(n):
        nxt = (await client.next_broker_id("c", name))["header"]["nextBrokerId"]
        addr = f"10.0.0.{nxt}:10911"
        r = await client.apply_broker_id("c", name, nxt, f"{addr};{nxt}")
        assert r["code"] == Code.SUCCESS, r
        await client.heartbeat("c", name, nxt, addr, epoch=1, maxOffset=100 * nxt, heartbeatTimeoutMillis=800)
        r = await client.register("c", name, nxt, addr)
        assert r["code"] == Code.SUCCESS, r


def test_broker_flow_redirects_follower_reads_errors_metrics_and_watch(tmp_path):
    async def main():
        nodes, http = await _cluster(tmp_path)
        leader_id = next(i for i, n in nodes.items() if n.node.is_leader)
        follower_ep = next(ep for i, ep in http.items() if i != leader_id)
        # The first endpoint tried is a follower: writes get redirected and the client learns the leader.
        client = ControllerClient([follower_ep] + [ep for ep in http.values() if ep != follower_ep])
        try:
            await _register_group(client, "b")
            r = await client.elect_master("c", "b", 1)
            assert r["code"] == Code.SUCCESS and r["header"]["masterBrokerId"] == 1
            assert client.preferred == http[leader_id]  # learned the leader from the 307
            r = await client.alter_sync_state_set("b", 1, 1, [1, 2, 3], 1)
            assert r["code"] == Code.SUCCESS and r["header"]["newSyncStateSetEpoch"] == 2
            # The losing side of a concurrent compare-and-set gets the RocketMQ code and a 409.
            r = await client.alter_sync_state_set("b", 1, 1, [1, 2], 1)
            assert r["code"] == Code.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH and r["httpStatus"] == 409
            # Follower read, served by the follower itself.
            async with httpx.AsyncClient() as raw:
                fr = await raw.get(f"http://{follower_ep}/v1/broker-sets/b/replica-info")
                assert fr.status_code == 200 and fr.json()["header"]["masterBrokerId"] == 1
                bad = await raw.post(f"http://{follower_ep}/v1/broker-sets/b/register",
                                     json={"clusterName": "c", "brokerId": 0, "brokerAddress": "x"})
                assert bad.status_code == 422 and "brokerId" in bad.text
                missing = await raw.get(f"http://{follower_ep}/v1/broker-sets/nope/replica-info")
                assert missing.status_code == 404
                assert missing.json()["code"] == Code.CONTROLLER_BROKER_METADATA_NOT_EXIST
                redirect = await raw.post(f"http://{follower_ep}/v1/broker-sets/b/elect-master",
                                          json={"clusterName": "c", "brokerId": 2})
                assert redirect.status_code == 307 and redirect.json()["code"] == Code.CONTROLLER_NOT_LEADER
                assert redirect.headers["location"].startswith(f"http://{http[leader_id]}/")
                # `%` is a legal name character: the set `pr%41` (sent as `pr%2541`) stays itself through
                # the client and the redirect, and never becomes the set `prA`.
                redirect = await raw.post(f"http://{follower_ep}/v1/broker-sets/pr%2541/apply-broker-id",
                                          json={"clusterName": "c", "brokerId": 1, "registerCheckCode": "x;1"})
                assert redirect.status_code == 307
                assert redirect.headers["location"] == \
                    f"http://{http[leader_id]}/v1/broker-sets/pr%2541/apply-broker-id"
                escaping = ControllerClient([follower_ep])
                try:
                    assert (await escaping.apply_broker_id("c", "pr%41", 1, "x;1"))["code"] == Code.SUCCESS
                finally:
                    await escaping.close()
                assert (await raw.get(f"http://{http[leader_id]}/v1/broker-sets/pr%2541/replica-info")).status_code \
                    == 200
                assert (await raw.get(f"http://{http[leader_id]}/v1/broker-sets/prA/replica-info")).status_code == 404
                metrics = (await raw.get(f"http://{http[leader_id]}/metrics")).text
                assert 'electra_requests_total{code="0",endpoint="elect_master"}' in metrics
                assert "electra_raft_commit_index" in metrics and 'electra_raft_role{role="leader"} 1.0' in metrics
                assert (await raw.get(f"http://{follower_ep}/healthz")).json()["ok"]
                # In sync means alive too: the 800 ms timeouts of the registration heartbeats may have passed on a
                # loaded machine (the CPU-heavy suite beside it: [3] alone was seen), so each broker beats again.
                for bid in (1, 2, 3):
                    await client.heartbeat("c", "b", bid, f"10.0.0.{bid}:10911", epoch=1, maxOffset=100 * bid,
                                           heartbeatTimeoutMillis=800)
                data = await client.sync_state_data(["b"])
                assert [x["brokerId"] for x in data["body"]["replicasInfoTable"]["b"]["inSyncReplicas"]] == [1, 2, 3]

                # Watch the set on a follower, then let the master's heartbeats lapse: the controller
                # re-elects (its inactive-master scan), and the watcher hears the new master at once.
                events: list[dict] = []

                async def watch():
                    async with raw.stream("GET", f"http://{follower_ep}/v1/broker-sets/b/watch",
                                          timeout=10) as resp:
                        async for line in resp.aiter_lines():
                            if line.startswith("data: "):
                                events.append(json.loads(line[6:]))
                                return

                watcher = asyncio.create_task(watch())
                await asyncio.sleep(0.2)
                for _ in range(12):  # brokers 2 and 3 keep heart-beating, 1 (the master) is gone
                    for bid in (2, 3):
                        await client.heartbeat("c", "b", bid, f"10.0.0.{bid}:10911", epoch=1,
                                               maxOffset=100 * bid, heartbeatTimeoutMillis=800)
                    await asyncio.sleep(0.15)
                    if watcher.done():
                        break
                await asyncio.wait_for(watcher, 5)
                assert events and events[0]["masterBrokerId"] == 3  # the highest max offset wins
                assert events[0]["masterEpoch"] == 2
                info = await client.replica_info("b")
                assert info["header"]["masterBrokerId"] == 3
        finally:
            await client.close()
            for n in nodes.values():
                await n.stop()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_leader_failover_keeps_acknowledged_registrations(tmp_path):
    async def main():
        nodes, http = await _cluster(tmp_path)
        client = ControllerClient(list(http.values()))
        try:
            for g in range(10):
                await _register_group(client, f"g{g}", 2)
            leader_id = next(i for i, n in nodes.items() if n.node.is_leader)
            await nodes.pop(leader_id).stop()
            client.preferred = None
            for g in range(10, 15):
                await _register_group(client, f"g{g}", 2)
            for g in range(15):
                r = await client.request("GET", f"/v1/broker-sets/g{g}/next-broker-id", params={"cluster": "c"})
                assert r["header"]["nextBrokerId"] == 3, (g, r)
        finally:
            await client.close()
            for n in nodes.values():
                await n.stop()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_request_naming_another_cluster_than_the_sets_is_refused(tmp_path):
    """A broker set belongs to the cluster it was created in. RocketMQ's controller keys sets by name and never
    compares: here a request naming set `b` (of cluster c) with cluster `other` is a 400 (code 2005), so a
    credential scoped to `other` cannot change `b` by naming its own cluster (docs/security.md)."""
    async def main():
        nodes, http = await _cluster(tmp_path)
        client = ControllerClient(list(http.values()))
        try:
            await _register_group(client, "b", 2)
            before = await client.replica_info("b")
            refusals = [
                await client.register("other", "b", 1, "evil:1"),
                await client.apply_broker_id("other", "b", 3, "evil:1;3"),
                await client.elect_master("other", "b", 2),
                await client.heartbeat("other", "b", 1, "evil:1", epoch=9, maxOffset=10**6),
                await client.request("GET", "/v1/broker-sets/b/next-broker-id", params={"cluster": "other"}),
                await client.request("POST", "/v1/admin/broker-sets/b/clean",
                                     json={"clusterName": "other", "brokerIds": [2]}),
            ]
            for r in refusals:
                assert r["code"] == Code.CONTROLLER_INVALID_REQUEST and r["httpStatus"] == 400, r
                assert "is not in cluster 'other'" in r["remark"], r
            after = await client.replica_info("b")
            assert after == before  # nothing changed: same master, same address, same brokers
            r = await client.register("c", "b", 1, "10.0.0.1:10911")  # the set's own cluster still works
            assert r["code"] == Code.SUCCESS, r
            r = await client.apply_broker_id("other", "fresh", 1, "10.0.0.9:10911;1")  # a new set: any cluster
            assert r["code"] == Code.SUCCESS, r
        finally:
            await client.close()
            for n in nodes.values():
                await n.stop()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_clean_of_the_master_is_watched_and_an_unclean_election_recovers_the_set(tmp_path):
    """CleanBrokerData of a set's master (and only sync-state member) leaves no master and an empty sync-state
    set: watchers are told at once, a normal election can pick nobody (2012: no one in sync), and an admin's
    unclean election (`unclean: true`; RocketMQ's enableElectUncleanMaster) makes a live replica master."""
    async def main():
        nodes, http = await start_cluster(tmp_path, scan_interval_s=0)
        client = ControllerClient(list(http.values()))
        leader_ep = next(http[i] for i, n in nodes.items() if n.node.is_leader)
        try:
            await _register_group(client, "u", 2)
            r = await client.elect_master("c", "u", 1)
            assert r["code"] == Code.SUCCESS and r["header"]["masterBrokerId"] == 1, r
            events: list[dict] = []

            async def watch() -> None:
                async with httpx.AsyncClient(timeout=30) as raw, \
                        raw.stream("GET", f"http://{leader_ep}/v1/broker-sets/u/watch") as resp:
                    async for line in resp.aiter_lines():
                        if line.startswith("data:"):
                            events.append(json.loads(line[5:]))
                            return

            watcher = asyncio.ensure_future(watch())
            await asyncio.sleep(0.5)  # the stream is open
            r = await client.request("POST", "/v1/admin/broker-sets/u/clean",
                                     json={"clusterName": "c", "brokerIds": [1], "cleanLivingBroker": True})
            assert r["code"] == Code.SUCCESS, r
            await asyncio.wait_for(watcher, 10)
            assert events[0]["type"] == "CleanBrokerData" and events[0]["masterBrokerId"] is None, events
            await client.heartbeat("c", "u", 2, "10.0.0.2:10911", epoch=1, maxOffset=200, heartbeatTimeoutMillis=5000)
            r = await client.elect_master("c", "u", 2, admin=True)
            assert r["code"] == Code.CONTROLLER_ELECT_MASTER_FAILED, r
            r = await client.elect_master("c", "u", 2, admin=True, unclean=True)
            assert r["code"] == Code.SUCCESS and r["header"]["masterBrokerId"] == 2, r
            info = await client.replica_info("u")
            assert info["header"]["masterBrokerId"] == 2, info
        finally:
            await client.close()
            for n in nodes.values():
                await n.stop()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_broker_simulator_registers_sets_and_recovers_a_killed_master(tmp_path):
    from electra.broker_simulator import BrokerFleet

    async def main():
        nodes, http = await _cluster(tmp_path)
        fleet = BrokerFleet(list(http.values()), groups=4, replicas=3, heartbeat_s=0.2, poll_s=0.4,
                            timeout_ms=800)
        try:
            await fleet.start()
            await _wait_for(lambda: all(fleet.master_of(n) for n in fleet.by_set), "every set has a master")
            await _wait_for(lambda: all(len(m.sync_state_set) == 3 for m in map(fleet.master_of, fleet.by_set)),
                            "masters put their replicas in sync")
            old = fleet.master_of("sim-set-0")
            fleet.kill("sim-set-0", old.broker_id)
            await _wait_for(lambda: (m := fleet.master_of("sim-set-0")) is not None and m is not old,
                            "a new master in sim-set-0", timeout=15)
            new = fleet.master_of("sim-set-0")
            assert new.master_epoch == old.master_epoch + 1
            assert fleet.stats["errors"] == 0
        finally:
            await fleet.stop()
            for n in nodes.values():
                await n.stop()

    asyncio.run(asyncio.wait_for(main(), 60))


async def _wait_for(cond, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        await asyncio.sleep(0.05)


def test_a_dashboard_set_page_checks_the_name_and_never_repeats_it(tmp_path):
    async def main():
        nodes, http = await _cluster(tmp_path)
        try:
            async with httpx.AsyncClient(base_url=f"http://{next(iter(http.values()))}", timeout=10) as raw:
                long = await raw.get("/v1/dashboard/sets/" + "Q" * 3000)
                assert long.status_code == 422 and "QQQQ" not in long.text
                odd = await raw.get("/v1/dashboard/sets/%3Cscript%3E")
                assert odd.status_code == 422 and "script" not in odd.text
                missing = await raw.get("/v1/dashboard/sets/nope-xyz")
                assert missing.status_code == 404 and "nope-xyz" not in missing.text
                assert missing.json()["code"] == Code.CONTROLLER_BROKER_METADATA_NOT_EXIST
                # The API's description names what the middleware serves and asks for, too.
                spec = (await raw.get("/openapi.json")).json()
                assert {"/v1/dashboard/login", "/v1/dashboard/logout"} <= set(spec["paths"])
                assert spec["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
                assert spec["paths"]["/healthz"]["get"]["security"] == []
                assert "401" in spec["paths"]["/v1/broker-sets/{name}/register"]["post"]["responses"]
                assert "text/plain" in spec["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
                for stream in ("/v1/broker-sets/{name}/watch", "/v1/dashboard/stream"):
                    assert "505" in spec["paths"][stream]["get"]["responses"]
        finally:
            for n in nodes.values():
                await n.stop()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_restarted_fleet_keeps_its_broker_ids_and_its_masters(tmp_path):
    """`electra up --demo` run twice on one data dir: brokers that applied for new ids (4, 5, 6) were in no
    sync-state set, so the job's elections for the old brokers found no candidate and every set lost its master.
    A RocketMQ broker keeps its id in its store; the simulated ones keep theirs in `--ids-file`."""
    from electra.broker_simulator import BrokerFleet

    async def main():
        nodes, http = await _cluster(tmp_path)
        ids_file = tmp_path / "ids.json"
        try:
            first = BrokerFleet(list(http.values()), groups=2, replicas=3, heartbeat_s=0.2, poll_s=0.4,
                                timeout_ms=800, ids_file=ids_file)
            await first.start()
            await _wait_for(lambda: all(first.master_of(n) for n in first.by_set), "every set has a master")
            ids = {(b.name, b.slot): b.broker_id for b in first.brokers}
            masters = {n: first.master_of(n).broker_id for n in first.by_set}
            await first.stop()
            again = BrokerFleet(list(http.values()), groups=2, replicas=3, heartbeat_s=0.2, poll_s=0.4,
                                timeout_ms=800, ids_file=ids_file)
            try:
                await again.start()
                assert {(b.name, b.slot): b.broker_id for b in again.brokers} == ids
                await _wait_for(lambda: all(again.master_of(n) for n in again.by_set), "masters again")
                assert {n: again.master_of(n).broker_id for n in again.by_set} == masters
                client = ControllerClient(list(http.values()))
                r = await client.next_broker_id("sim", "sim-set-0")
                assert r["header"]["nextBrokerId"] == 4  # no new id was applied for
                await client.close()
            finally:
                await again.stop()
        finally:
            for n in nodes.values():
                await n.stop()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_leader_that_stops_hands_leadership_over_first(tmp_path):
    """QA: every leader restart stalled writes for an election timeout (1.1-1.3 s). A leader's graceful stop now
    hands over to its most caught-up follower first (etcd does too): a write right after it succeeds."""
    async def main():
        nodes, http = await _cluster(tmp_path)
        client = ControllerClient(list(http.values()), deadline_s=5)
        try:
            await _register_group(client, "h", 1)
            old = next(i for i, n in nodes.items() if n.node.is_leader)
            term = nodes[old].node.status()["term"]
            await nodes.pop(old).stop()
            now = [i for i, n in nodes.items() if n.node.is_leader]
            assert len(now) == 1, "leadership was not handed over during the stop"
            st = nodes[now[0]].node.status()
            assert st["term"] == term + 1  # one vote, no election timeout and no pre-vote rounds in between
            t0 = time.monotonic()
            r = await client.register("c", "h", 1, "10.0.0.9:10911")
            assert r["code"] == Code.SUCCESS and time.monotonic() - t0 < 1.0, r
        finally:
            await client.close()
            for n in nodes.values():
                await n.stop()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_an_operator_moves_leadership_with_one_request(tmp_path):
    async def main():
        nodes, http = await _cluster(tmp_path)
        client = ControllerClient(list(http.values()), deadline_s=5)
        try:
            old = next(i for i, n in nodes.items() if n.node.is_leader)
            target = next(i for i in nodes if i != old)
            r = await client.transfer_leadership(target)  # sent anywhere: a follower redirects to the leader
            assert r["code"] == Code.SUCCESS and r["leader"] == target, r
            assert nodes[target].node.is_leader and not nodes[old].node.is_leader
            r = await client.transfer_leadership()  # to the most caught-up follower
            assert r["code"] == Code.SUCCESS and r["leader"] != target, r
            leader = r["leader"]
            r = await client.transfer_leadership(leader)  # idempotent
            assert r["code"] == Code.SUCCESS and r["leader"] == leader and nodes[leader].node.is_leader, r
            r = await client.transfer_leadership(9)
            assert r["code"] == Code.CONTROLLER_INVALID_REQUEST and "no such node" in r["remark"], r
            for bad in ({"to": True}, {"too": 3}):
                r = await client.request("POST", "/v1/admin/leadership", json=bad)
                assert r["httpStatus"] == 422, r
            assert nodes[leader].node.is_leader
        finally:
            await client.close()
            for n in nodes.values():
                await n.stop()

    asyncio.run(asyncio.wait_for(main(), 60))
