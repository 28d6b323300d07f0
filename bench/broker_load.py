"""The performance report's load generator: thousands of simulated RocketMQ brokers in one process.

It must cost less than the controllers it measures (the machine has 2 cores), so it is not
`BrokerFleet` (aiohttp, a JSON encode and a client-side redirect check per request): as
`broker_session.py` does for heartbeats, every request is HTTP/1.1 bytes encoded once and sent
over a kept-alive connection to the leader, and only the replies the broker acts on (replica
info, elections) are decoded. The broker side of the protocol is the same as the simulator's
(reference §4): ids 1..3 applied per set, heartbeats every second, register, the first replica
asks for the election, the master grows its sync-state set to the live replicas, replicas poll
their replica info and adopt a new master.

Two phases run on the same brokers:

* `measure`: heartbeats keep their real period (1 s), while every broker repeats its controller
  requests (GetReplicaInfo, AlterSyncStateSet when its set changed) back to back: the controller's
  throughput for N concurrent brokers. Brokers share 256 kept-alive connections to the leader for
  requests and 256 for heartbeats (a node accepts 1,000); a redirect moves them to a new leader;
* `storm`: brokers go back to their real periods (replica info every 5 s), 20% of the masters
  die at once (no more heartbeats or requests), and a watcher polls the affected sets until
  each has a new master committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from dataclasses import dataclass, field

HEARTBEAT_PERIOD_S = 1.0  # BrokerConfig.brokerHeartbeatInterval
REPLICA_INFO_PERIOD_S = 5.0  # syncBrokerMetadataPeriod / checkSyncStateSetPeriod
BROKERS_PER_HEARTBEAT_TASK = 4  # heartbeats of a task's brokers go one after another
REQUEST_CONNECTIONS = 256  # to the leader, shared by all brokers' controller requests
HEARTBEAT_CONNECTIONS = 256  # to the leader, for heartbeats (separate: a slow queue must not delay them)


class HttpConn:
    """One kept-alive HTTP/1.1 connection; `call(raw, endpoint)` sends pre-encoded bytes, returns (status, body).

    It reconnects when asked for another endpoint (the leader moved) or after the server closed it."""

    def __init__(self) -> None:
        self.endpoint: str | None = None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def call(self, raw: bytes, endpoint: str) -> tuple[int, bytes]:
        if endpoint != self.endpoint:
            self.close()
            self.endpoint = endpoint
        for attempt in (0, 1):  # a connection the server closed (idle timeout) is reopened once
            if self._writer is None:
                host, _, port = endpoint.rpartition(":")
                self._reader, self._writer = await asyncio.open_connection(host, int(port), limit=1 << 20)
            try:
                self._writer.write(raw)
                head = await self._reader.readuntil(b"\r\n\r\n")
                status = int(head[9:12])
                lower = head.lower()
                i = lower.find(b"content-length:")
                n = int(lower[i + 15:lower.index(b"\r\n", i)]) if i >= 0 else 0
                return status, (await self._reader.readexactly(n)) if n else b""
            except (ConnectionError, asyncio.IncompleteReadError):
                self.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None


class ConnPool:
    """`size` connections shared by many brokers: a request waits for a free one (the controller's
    connection limit, `HTTPLimits.max_connections`, is far below 5,000 brokers)."""

    def __init__(self, size: int) -> None:
        self._free: asyncio.Queue[HttpConn] = asyncio.Queue()
        self._all = [HttpConn() for _ in range(max(1, size))]
        for c in self._all:
            self._free.put_nowait(c)

    async def call(self, raw: bytes, endpoint: str) -> tuple[int, bytes]:
        conn = await self._free.get()
        try:
            return await conn.call(raw, endpoint)
        finally:
            self._free.put_nowait(conn)

    def close(self) -> None:
        for c in self._all:
            c.close()


def get(endpoint: str, path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: {endpoint}\r\n\r\n".encode()


def post(endpoint: str, path: str, body: dict) -> bytes:
    data = json.dumps(body, separators=(",", ":")).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: {endpoint}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n").encode() + data


@dataclass
class Broker:
    cluster: str
    name: str
    broker_id: int  # 1..replicas: the set's brokers apply their ids in order
    addr: str
    alive: bool = True
    master_id: int | None = None
    master_epoch: int = 0
    sync_state_set: list[int] = field(default_factory=list)
    sync_state_set_epoch: int = 0
    heartbeat: bytes = b""
    replica_info: bytes = b""


@dataclass
class Samples:
    """Completed requests of one phase: (completion time, latency s) by kind, and failures by kind."""

    t0: float
    done: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    failed: dict[str, int] = field(default_factory=dict)
    failure_statuses: dict[str, int] = field(default_factory=dict)  # "kind status" -> count (0: no connection)

    def add(self, kind: str, started: float, status: int, code: int | None = None) -> None:
        now = time.perf_counter()
        if status == 200:
            self.done.setdefault(kind, []).append((now - self.t0, now - started))
        else:
            self.failed[kind] = self.failed.get(kind, 0) + 1
            key = f"{kind} {status}" + (f"/{code}" if code is not None else "")
            self.failure_statuses[key] = self.failure_statuses.get(key, 0) + 1


class BrokerLoad:
    """`brokers` simulated brokers (sets of `replicas`) against the leader's HTTP endpoint."""

    def __init__(self, leader: str, brokers: int, *, replicas: int = 3, cluster: str = "perf",
                 heartbeat_timeout_ms: int = 10_000, seed: int = 0) -> None:
        self.leader = leader
        self.timeout_ms = heartbeat_timeout_ms
        self.rng = random.Random(seed)
        sets = max(1, brokers // replicas)
        self.sets: dict[str, list[Broker]] = {}
        for g in range(sets):
            name = f"{cluster}-{g}"
            self.sets[name] = [Broker(cluster, name, r + 1, f"10.{g // 250}.{g % 250}.{r + 1}:10911")
                               for r in range(replicas)]
        self.brokers = [b for bs in self.sets.values() for b in bs]
        for b in self.brokers:
            b.replica_info = get(leader, f"/v1/broker-sets/{b.name}/replica-info")
            self._encode_heartbeat(b)
        self.requests = ConnPool(min(len(self.brokers), REQUEST_CONNECTIONS))
        self.heartbeats = ConnPool(min(-(-len(self.brokers) // BROKERS_PER_HEARTBEAT_TASK), HEARTBEAT_CONNECTIONS))
        self.leader_changes = 0
        self.samples = Samples(time.perf_counter())
        self.closed_loop = False
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task] = []

    def _encode_heartbeat(self, b: Broker) -> None:
        b.heartbeat = post(self.leader, "/v1/heartbeat", {
            "clusterName": b.cluster, "brokerName": b.name, "brokerAddr": b.addr, "brokerId": b.broker_id,
            "epoch": b.master_epoch, "maxOffset": 1000, "confirmOffset": 1000,
            "heartbeatTimeoutMillis": self.timeout_ms, "electionPriority": b.broker_id})

    async def _call(self, kind: str, raw: bytes) -> dict | None:
        """One request to the leader; a redirect or a 503 naming another leader moves every later request."""
        pool = self.heartbeats if kind == "heartbeat" else self.requests
        t = time.perf_counter()
        try:
            status, body = await pool.call(raw, self.leader)
        except (OSError, asyncio.IncompleteReadError):
            self.samples.add(kind, t, 0)
            return None
        res = None
        if kind != "heartbeat" or status != 200:  # the only reply no broker acts on
            try:
                res = json.loads(body)
            except ValueError:
                res = None
        self.samples.add(kind, t, status, (res or {}).get("code") if status != 200 else 0)
        if status == 200:
            return res
        leader = (res or {}).get("leaderAddress")
        if leader and leader != self.leader:
            self.leader = leader
            self.leader_changes += 1
        return res or {"code": -1, "httpStatus": status}

    # ------------------------------------------------------------------ following the leader
    def follow_leader(self, every_s: float = 0.5) -> None:
        """Ask the current target for its metadata and move to the leader it names: heartbeats and
        follower reads are answered by any node (200), so only this notices a new leader in time."""

        async def follow() -> None:
            conn = HttpConn()
            try:
                while not self._stop.is_set():
                    try:
                        status, body = await conn.call(get(self.leader, "/v1/admin/metadata"), self.leader)
                        md = json.loads(body) if status == 200 else {}
                    except (OSError, ValueError, asyncio.IncompleteReadError):
                        md = {}
                    moved = md.get("leader_address")
                    if not md.get("is_leader") and moved and moved != self.leader:
                        self.leader = moved
                        self.leader_changes += 1
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stop.wait(), every_s)
            finally:
                conn.close()

        self._tasks.append(asyncio.create_task(follow()))

    # ------------------------------------------------------------------ heartbeats: always at their real period
    def start_heartbeats(self) -> None:
        k = BROKERS_PER_HEARTBEAT_TASK
        for lo in range(0, len(self.brokers), k):
            self._tasks.append(asyncio.create_task(self._beat(self.brokers[lo:lo + k])))

    async def _beat(self, brokers: list[Broker]) -> None:
        await asyncio.sleep(self.rng.uniform(0, HEARTBEAT_PERIOD_S))
        while not self._stop.is_set():
            start = time.monotonic()
            for b in brokers:
                if b.alive:
                    await self._call("heartbeat", b.heartbeat)
            await asyncio.sleep(max(0.0, HEARTBEAT_PERIOD_S - (time.monotonic() - start)))

    # ------------------------------------------------------------------ register at start
    async def register_all(self, parallel_sets: int = 64) -> float:
        """Every set: apply ids, register, elect its first replica, grow the sync-state set. Returns seconds."""
        t0 = time.monotonic()
        sem = asyncio.Semaphore(parallel_sets)

        async def until(kind: str, raw_of, accept=(0,)) -> dict | None:
            """A start-up step, retried as a broker retries it (a leader change, a busy queue), 20 times at most."""
            res = None
            for _ in range(20):
                res = await self._call(kind, raw_of())
                if res is not None and res.get("code") in accept:
                    return res
                await asyncio.sleep(0.2)
            return res

        async def one(brokers: list[Broker]) -> None:
            async with sem:
                for b in brokers:
                    await until("apply_broker_id", lambda b=b: post(
                        self.leader, f"/v1/broker-sets/{b.name}/apply-broker-id",
                        {"clusterName": b.cluster, "brokerId": b.broker_id,
                         "registerCheckCode": f"{b.addr};{b.broker_id}"}))
                for b in brokers:  # alive before the master asks to add it to the sync-state set
                    await self._call("heartbeat", b.heartbeat)
                for b in brokers:
                    await until("register", lambda b=b: post(
                        self.leader, f"/v1/broker-sets/{b.name}/register",
                        {"clusterName": b.cluster, "brokerId": b.broker_id, "brokerAddress": b.addr}))
                first = brokers[0]
                res = await until("elect_master", lambda: post(
                    self.leader, f"/v1/broker-sets/{first.name}/elect-master",
                    {"clusterName": first.cluster, "brokerId": first.broker_id}), accept=(0, 2011))
                if res is not None and res.get("code") in (0, 2011):
                    for b in brokers:
                        self._adopt(b, res["header"], res.get("body"))
                for _ in range(20):
                    if await self._grow(brokers):
                        break
                    await asyncio.sleep(0.2)

        await asyncio.gather(*(one(bs) for bs in self.sets.values()))
        return time.monotonic() - t0

    def _adopt(self, b: Broker, header: dict, body) -> None:
        if header.get("masterEpoch") is None:
            return
        epoch_changed = header["masterEpoch"] != b.master_epoch
        b.master_id, b.master_epoch = header.get("masterBrokerId"), header["masterEpoch"]
        if isinstance(body, dict) and "syncStateSet" in body:
            b.sync_state_set = list(body["syncStateSet"])
            b.sync_state_set_epoch = body.get("syncStateSetEpoch", header.get("syncStateSetEpoch", 0))
        elif header.get("syncStateSetEpoch") is not None:
            b.sync_state_set_epoch = header["syncStateSetEpoch"]
        if epoch_changed:
            self._encode_heartbeat(b)

    async def _grow(self, brokers: list[Broker]) -> bool:
        """The master's AlterSyncStateSet when its set's live replicas differ from the sync-state set;
        False when it was needed and refused (or no master is known)."""
        master = next((b for b in brokers if b.alive and b.master_id == b.broker_id), None)
        if master is None:
            return False
        want = sorted(b.broker_id for b in brokers if b.alive)
        if want == sorted(master.sync_state_set):
            return True
        res = await self._call("alter_sync_state_set", post(
            self.leader, f"/v1/broker-sets/{master.name}/sync-state-set",
            {"masterBrokerId": master.broker_id, "masterEpoch": master.master_epoch, "syncStateSet": want,
             "syncStateSetEpoch": master.sync_state_set_epoch}))
        if res is not None and res.get("code") == 0:
            for b in brokers:
                b.sync_state_set, b.sync_state_set_epoch = want, res["header"]["newSyncStateSetEpoch"]
            return True
        if res is not None and res.get("code") in (2000, 2001, 2002):  # fenced: learn the set's state again
            info = await self._call("replica_info", master.replica_info)
            if info is not None and info.get("code") == 0:
                for b in brokers:
                    self._adopt(b, info["header"], info.get("body"))
        return False

    # ------------------------------------------------------------------ the brokers' controller requests
    def start_brokers(self) -> None:
        for b in self.brokers:
            self._tasks.append(asyncio.create_task(self._sync(b)))

    async def _sync(self, b: Broker) -> None:
        """GetReplicaInfo (closed loop while measuring, every 5 s otherwise); adopt; the master grows its set."""
        next_poll = time.monotonic() + self.rng.uniform(0, REPLICA_INFO_PERIOD_S)
        while not self._stop.is_set():
            if not b.alive:
                break
            if not self.closed_loop:
                wait = next_poll - time.monotonic()
                if wait > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stop.wait(), min(wait, 0.5))
                    continue
                next_poll = time.monotonic() + REPLICA_INFO_PERIOD_S
            res = await self._call("replica_info", b.replica_info)
            if res is None:
                await asyncio.sleep(0.05)
                continue
            if res.get("code") == 0:
                self._adopt(b, res["header"], res.get("body"))
                if res["header"].get("masterBrokerId") is None:  # no master: the broker asks for an election
                    elected = await self._call("elect_master", post(
                        self.leader, f"/v1/broker-sets/{b.name}/elect-master",
                        {"clusterName": b.cluster, "brokerId": b.broker_id}))
                    if elected is not None and elected.get("code") in (0, 2011):
                        self._adopt(b, elected["header"], elected.get("body"))
                if b.master_id == b.broker_id:
                    await self._grow(self.sets[b.name])

    # ------------------------------------------------------------------ the failover storm
    async def storm(self, fraction: float, limit_s: float, poll_s: float = 0.25) -> dict:
        """Kill `fraction` of the masters at once; returns the kill time and each set's recovery (s or None)."""
        victims = [bs for bs in self.sets.values() if any(b.master_id == b.broker_id for b in bs)]
        victims = victims[::max(1, round(1 / fraction))] if fraction > 0 else []
        killed: dict[str, tuple[int, int]] = {}
        t_kill = time.perf_counter() - self.samples.t0
        kill_clock = time.monotonic()
        for bs in victims:
            master = next(b for b in bs if b.master_id == b.broker_id)
            master.alive = False
            killed[master.name] = (master.broker_id, master.master_epoch)
        recovered: dict[str, float] = {}

        async def watch(names: list[str]) -> None:
            while names and time.monotonic() - kill_clock < limit_s:
                for name in list(names):
                    old_id, old_epoch = killed[name]
                    res = await self._call("replica_info", get(self.leader, f"/v1/broker-sets/{name}/replica-info"))
                    h = (res or {}).get("header") or {}
                    if (res or {}).get("code") == 0 and h.get("masterBrokerId") not in (None, old_id) \
                            and h.get("masterEpoch", 0) > old_epoch:
                        recovered[name] = time.monotonic() - kill_clock
                        names.remove(name)
                await asyncio.sleep(poll_s)

        names = list(killed)
        await asyncio.gather(*(watch(names[i::16]) for i in range(min(16, len(names)))))
        return {"t_kill": t_kill, "sets": len(killed), "recovered": recovered,
                "unrecovered": sorted(set(killed) - set(recovered))}

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.requests.close()
        self.heartbeats.close()
