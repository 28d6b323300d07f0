"""Fast crash failover through the connection-loss signal, end to end and all real: tansu, 3 `electra node`
processes with their ingest processes, the Spark job in local mode, simulated brokers holding session
connections to the ingest workers (docs/failover-signal.md).

One scenario (Spark's start-up dominates, so it is paid once), with a 10 s heartbeat timeout:
1. every ingest process is restarted in turn (SIGTERM: its sessions close without a word), then the
   controller leader: brokers reconnect and no master is failed over, even after a full timeout;
2. a crashed master (its session connection reset, no goodbye) is replaced well before its timeout, by
   the leader's connection-loss lane (api/connection_loss.py);
3. a hung master (connection open, no heartbeats) is replaced only after its timeout, by the lane too: its
   ingest worker reports the session silent (api/sessions.py);
4. a healthy master is never failed over during the whole run.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from kafka import KafkaConsumer
from stack_helpers import loopback_stack, run_pipeline, until

from electra.api.client import ControllerClient
from electra.broker_simulator import BrokerFleet
from electra.local_stack import LocalStack
from electra.streaming import records

pytestmark = pytest.mark.integration

TIMEOUT_MS = 10_000  # RocketMQ's default heartbeat timeout
SETS = 4


def test_crash_is_detected_by_connection_loss_and_hang_by_timeout(tmp_path):
    run_pipeline(loopback_stack(tmp_path, tier_uri=None), scenario, show=("streaming", "node1", "ingest1", "ingest2"))


def disconnects(stack: LocalStack) -> list[dict]:
    """Every `disconnected` record on the heartbeats topic so far (inside the groups ingest writes)."""
    consumer = KafkaConsumer(stack.topics.heartbeats, bootstrap_servers=stack.bootstrap,
                             auto_offset_reset="earliest", consumer_timeout_ms=3000)
    try:
        values = [v for m in consumer for v in records.heartbeat_records(m.value)]
    finally:
        consumer.close()
    return [v for v in values if records.is_disconnected(v)]


async def scenario(stack: LocalStack) -> None:
    endpoints = list(stack.endpoints.values())
    client = ControllerClient(endpoints, deadline_s=30, credentials=stack.creds.credentials("observer"))
    fleet = BrokerFleet(endpoints, SETS, 3, heartbeat_s=0.5, poll_s=1.0, timeout_ms=TIMEOUT_MS,
                        ingest_endpoints=list(stack.ingest_endpoints.values()),
                        credentials=stack.creds.credentials("broker"))
    names = sorted(fleet.by_set)
    crash, hang, restarted, healthy = names

    async def info(name: str) -> dict:
        r = await client.replica_info(name)
        return r["header"] | r["body"]

    async def epochs() -> dict[str, int]:
        return {n: (await info(n))["masterEpoch"] for n in names}

    async def replaced(name: str, old_master: int) -> dict | None:
        i = await info(name)
        return i if i["masterEpoch"] > 1 and i["masterBrokerId"] not in (None, old_master) else None

    try:
        await fleet.start()
        # Spark's start-up and first batch (Python daemons, RocksDB) took 3-4 min on the shared 2-core machine.
        # (This wait blocks the loop, so the fleet sends nothing meanwhile: every session falls silent before the
        # job has a view, which must fail nothing over: api/connection_loss.py waits for the job's view.)
        stack.wait_log("streaming", "batch=", timeout=300)

        async def grown():
            sizes = [len((await info(n))["syncStateSet"]) for n in names]
            return all(size == 3 for size in sizes)

        await until(grown, "sync-state sets of 3 (liveness from the streaming job)", 120)
        assert set((await epochs()).values()) == {1}
        opened = fleet.stats["sessions_opened"]

        # 1. Ingest restarts cut every session; the stopping workers say nothing, brokers reconnect.
        for i in stack.ingest_endpoints:
            # stop() waits for the process: off the event loop, so that the fleet (on this loop) keeps
            # heartbeating and can answer the stopping process's TLS close_notify (else its shutdown waits
            # out the 30 s TLS shutdown timeout while every broker here is silent)
            assert await asyncio.to_thread(stack.stop, f"ingest{i}") == 0, stack.log_tail(f"ingest{i}")
            stack.start_ingest(i)
            await asyncio.sleep(1.5)
        lid = await until(client.find_leader, "a controller leader", 30)
        await asyncio.to_thread(stack.stop, f"node{lid}")
        stack.start_node(lid)
        await asyncio.sleep(TIMEOUT_MS / 1000 + 3)  # a full timeout plus batches: time for any false election
        assert fleet.stats["sessions_opened"] > opened  # the sessions really were cut and reopened
        assert set((await epochs()).values()) == {1}, "an ingest restart must not fail a master over"
        # Stopping workers said nothing (a reconnecting broker's next heartbeat would also hide a record
        # from the job, but only if it lands in the same micro-batch).
        assert disconnects(stack) == []

        # 2. Crash: the session connection is reset. Replaced well before the heartbeat timeout.
        m = fleet.master_of(crash)
        crashed_id = m.broker_id
        fleet.kill(crash, m.broker_id)
        t_kill = time.time()
        new = await until(lambda: replaced(crash, m.broker_id), f"a new master of {crash}", 60, every=0.1)
        crash_s = time.time() - t_kill
        print(f"crash failover of {crash}: {crash_s:.2f}s after the kill (heartbeat timeout {TIMEOUT_MS / 1000}s)")
        assert crash_s < TIMEOUT_MS / 1000 / 2, "a crash must be detected by the connection loss, not the timeout"
        assert new["masterBrokerId"] in {b.broker_id for b in fleet.by_set[crash] if b.alive}
        # The leader's connection-loss lane proposed the election at once (api/connection_loss.py); it won,
        # or (a loaded machine) the job's proposal a batch later did and the lane's was fenced
        lanes = [(await client.metadata(ep))["pipeline"]["connection_loss"] for ep in endpoints]
        assert sum(lane["proposed"] for lane in lanes) == 1, lanes
        assert sum(lane["elected"] + lane["fenced"] for lane in lanes) == 1, lanes
        print(f"the lane's election: {'won' if sum(lane['elected'] for lane in lanes) else 'fenced by the job'}")

        # 3. Hang: the connection stays open, heartbeats stop. Replaced only after the timeout.
        m = fleet.master_of(hang)
        fleet.hang(hang, m.broker_id)
        t_hang = time.time()
        await until(lambda: replaced(hang, m.broker_id), f"a new master of {hang}", 90, every=0.1)
        since_last = time.time() - m.last_heartbeat_at
        print(f"hang failover of {hang}: {since_last:.2f}s after its last heartbeat, "
              f"{time.time() - t_hang:.2f}s after the hang")
        # The ingest stamp of the last heartbeat precedes the broker seeing its answer by a round trip.
        assert since_last >= TIMEOUT_MS / 1000 - 0.5, "a hung master must not be failed over before its timeout"
        # Its ingest worker reported the session silent after the timeout; the leader's lane proposed the election
        # (the job's view covered the silence): it won, or the job's proposal did and the lane's was fenced
        lanes = [(await client.metadata(ep))["pipeline"]["connection_loss"] for ep in endpoints]
        assert sum(lane["silences"] for lane in lanes) >= 1, lanes
        assert sum(lane["proposed"] for lane in lanes) == 2, lanes
        assert sum(lane["elected"] + lane["fenced"] for lane in lanes) == 2, lanes

        # The only session that ended without a goodbye is the crashed master's; the hung one is still open.
        [dc] = disconnects(stack)
        assert (dc["brokerName"], dc["brokerId"], dc["reason"]) == (crash, crashed_id, "connection_lost")

        # 4. Untouched sets kept their first master all along.
        final = await epochs()
        assert final[restarted] == 1 and final[healthy] == 1
        assert final[crash] == 2 and final[hang] == 2
    finally:
        await fleet.stop()
        await client.close()
