"""The heartbeat pipeline end to end, all real: tansu, 3 `electra node` processes, an ingest process,
the Spark job in local mode, simulated RocketMQ brokers heartbeating over HTTP.

One scenario (Spark's start-up dominates, so it is paid once):
1. brokers register; the job's liveness lets masters grow their sync-state sets;
2. bad records on the heartbeats topic go to the dead-letter topic and change nothing;
3. a killed master is replaced; the new master shows in replica info and on the watch stream;
4. the job restarts from its checkpoint: no election happens twice;
5. a master hangs and the controller leader is killed during detection (its timeout): still replaced;
6. Kafka restarts (tansu loses everything): a master killed afterwards is still replaced.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time

import aiohttp
import pytest
from kafka import KafkaProducer
from stack_helpers import loopback_stack, run_pipeline, until

from electra.api.client import ControllerClient
from electra.broker_simulator import BrokerFleet
from electra.local_stack import LocalStack
from electra.security.credentials import ClientCredentials
from electra.state.codes import Code
from electra.streaming import records

pytestmark = pytest.mark.integration

TIMEOUT_MS = 3000  # the brokers' heartbeatTimeoutMillis
SETS = 4


class Watch:
    """Collects `role-change` events of one broker set from a node's SSE watch stream."""

    def __init__(self, endpoint: str, name: str, creds: ClientCredentials) -> None:
        self.url = f"{creds.scheme}://{endpoint}/v1/broker-sets/{name}/watch"
        self.creds = creds
        self.events: list[dict] = []
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        async with aiohttp.ClientSession(headers=self.creds.headers()) as http, \
                http.get(self.url, timeout=aiohttp.ClientTimeout(total=300), ssl=self.creds.ssl_context() or True) as r:
            async for raw in r.content:
                line = raw.decode().strip()
                if line.startswith("data: "):
                    self.events.append(json.loads(line[6:]))

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


def test_pipeline_end_to_end(tmp_path):
    run_pipeline(loopback_stack(tmp_path), scenario)


async def scenario(stack: LocalStack) -> None:
    endpoints = list(stack.endpoints.values())
    # the stack is secure: the test acts as the brokers (their credential) and as an observer
    client = ControllerClient(endpoints, deadline_s=30, credentials=stack.creds.credentials("broker"))
    observer = ControllerClient(endpoints, deadline_s=30, credentials=stack.creds.credentials("observer"))
    fleet = BrokerFleet(endpoints, SETS, 3, heartbeat_s=0.5, poll_s=1.0, timeout_ms=TIMEOUT_MS,
                        ingest_endpoints=list(stack.ingest_endpoints.values()),
                        credentials=stack.creds.credentials("broker"))
    names = sorted(fleet.by_set)

    async def info(name: str) -> dict:
        r = await client.replica_info(name)
        return r["header"] | r["body"]

    async def epochs() -> dict[str, int]:
        return {n: (await info(n))["masterEpoch"] for n in names}

    async def replaced(name: str, old_master: int, old_epoch: int) -> dict | None:
        i = await info(name)
        if i["masterEpoch"] > old_epoch and i["masterBrokerId"] not in (None, old_master):
            return i
        return None

    try:
        await fleet.start()
        stack.wait_log("streaming", "batch=", timeout=180)

        # 1. Sync-state sets grow to all three replicas once the job's liveness reaches the controllers.
        async def grown():
            sizes = [len((await info(n))["syncStateSet"]) for n in names]
            return all(size == 3 for size in sizes)

        await until(grown, "sync-state sets of 3 (liveness from the streaming job)", 120)
        before = await epochs()
        assert set(before.values()) == {1}

        # 2. Bad records: dead letters, nothing else.
        producer = KafkaProducer(bootstrap_servers=stack.bootstrap)
        producer.send(stack.topics.heartbeats, key=b"junk", value=b"{not json")
        producer.send(stack.topics.heartbeats, key=names[0].encode(),
                      value=records.encode({"clusterName": "sim", "brokerName": names[0], "brokerId": -3}))
        producer.flush()
        producer.close()

        # 3. Kill a master: replaced, visible in replica info and on the watch stream.
        lid = await until(observer.find_leader, "a controller leader", 30)
        watch = Watch(stack.endpoints[lid], names[0], stack.creds.credentials("observer"))
        await asyncio.sleep(0.5)
        killed = fleet.master_of(names[0])
        assert killed is not None
        fleet.kill(names[0], killed.broker_id)
        t_kill = time.monotonic()
        new = await until(lambda: replaced(names[0], killed.broker_id, 1), "a new master of " + names[0], 60)
        print(f"failover of {names[0]}: {time.monotonic() - t_kill:.1f}s after the kill "
              f"(heartbeat timeout {TIMEOUT_MS / 1000}s)")
        await until(lambda: asyncio.sleep(0, any(e.get("type") == "ElectMaster" and e.get("newMasterBrokerId")
                                                  == new["masterBrokerId"] for e in watch.events)),
                    "the election on the watch stream", 10)
        await watch.close()
        assert (await epochs()) == {**before, names[0]: 2}

        # 4. Restart the job from its checkpoint: no election is repeated.
        assert stack.stop("streaming") == 0, stack.log_tail("streaming")
        restarted_at = (stack.logs / "streaming.log").stat().st_size
        stack.start_job()

        async def batches_after_restart():
            text = (stack.logs / "streaming.log").read_bytes()[restarted_at:].decode(errors="replace")
            return text.count("batch=") >= 3

        await until(batches_after_restart, "three batches after the restart", 180, every=1.0)
        await asyncio.sleep(2 * TIMEOUT_MS / 1000)
        assert (await epochs()) == {**before, names[0]: 2}
        text = (stack.logs / "streaming.log").read_text(errors="replace")
        assert "dead_letters_total=" in text
        dead = max(int(x.split()[0]) for x in text.split("dead_letters_total=")[1:])
        assert dead >= 1  # counted (the counter restarts with the job; the topic keeps them all)

        # 5. A master hangs (a crash is detected at once by its lost connection; a hang waits for the
        # timeout) and the controller leader is killed during detection.
        killed = fleet.master_of(names[1])
        fleet.hang(names[1], killed.broker_id)
        lid = await until(observer.find_leader, "a controller leader", 30)
        await asyncio.sleep(TIMEOUT_MS / 1000 / 2)
        stack.stop(f"node{lid}", sig=signal.SIGKILL)
        await until(lambda: replaced(names[1], killed.broker_id, 1), "a new master of " + names[1], 90)

        # 6. Kafka restarts empty; the pipeline recovers and still fails over.
        stack.restart_kafka()
        await asyncio.sleep(3)
        killed = fleet.master_of(names[2])
        fleet.kill(names[2], killed.broker_id)
        await until(lambda: replaced(names[2], killed.broker_id, 1), "a new master of " + names[2]
                    + " after the Kafka restart", 120)
        final = await epochs()
        assert final[names[3]] == 1  # untouched all along: no false election
        assert final[names[0]] == 2 and final[names[1]] == 2 and final[names[2]] == 2
        # Broker-triggered requests use the leader's liveness, fed by the job's liveness topic: it
        # recovers after the restart (a failed broker-triggered election, 2012, changes nothing).

        async def master_seen_alive():
            return (await client.elect_master("sim", names[3], 1))["code"] == Code.CONTROLLER_MASTER_STILL_EXIST

        await until(master_seen_alive, "the leader's liveness after the Kafka restart", 30, every=1.0)
        assert (await epochs())[names[3]] == 1
    finally:
        await fleet.stop()
        await client.close()
        await observer.close()
