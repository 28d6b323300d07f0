"""The performance report's load generator: thousands of simulated RocketMQ brokers in one process.

It must cost less than the controllers it measures (the machine has 2 cores), so it is not
`BrokerFleet` (aiohttp, a JSON encode and a client-side redirect check per request): like the
simulator's sessions (`electra/broker_session.py`, whose HTTP answer parser it shares), every
connection is an asyncio `Protocol` with one request in flight, every request is HTTP/1.1 bytes
encoded once, and only the replies a broker acts on (replica info, elections) are decoded. The
broker side of the protocol is the same as the simulator's (reference §4): ids 1..3 applied per
set, heartbeats every second to every controller (as RocketMQ brokers and `ControllerClient`
send them: whichever node leads next already knows who is alive), register, the first replica
asks for the election, the master grows its sync-state set to the live replicas, replicas poll
their replica info every 5 s and adopt a new master; a broker whose set has no master asks for
an election.

The phases the report runs on the same brokers (bench/performance_report.py):

* **real mix** (open loop): the brokers at their real periods, nothing else. Every request has an
  intended send time on its broker's schedule and its latency runs from that time, so a slow
  answer that delays the broker's next request counts against the controller (no coordinated
  omission); how late the generator itself sent (`send_lag`) is kept apart to show it kept up;
* **capacity** (closed loop): the real mix continues and `wrk` (bench/wrk.py: C, far cheaper per
  request than this process) adds kept-alive connections that repeat GetReplicaInfo back to back
  over all sets: the controller's throughput;
* **storm**: 20% of the masters die at once (no more heartbeats or requests), and a watcher polls
  the affected sets until each has a new master committed.

Requests that follow the leader (everything but heartbeats) share 256 kept-alive connections; a
redirect moves them to the new leader. The heartbeats of each controller go over 256 more
(`HeartbeatLane`; a node accepts 1,000): each lane carries a fixed group of brokers' heartbeats,
one in flight at a time, driven by callbacks and one timer per idle gap (no task, future or
timeout per heartbeat). They are most of the generator's requests (3 per broker-second), so their
cost decides whether the generator keeps up and how much CPU it leaves the controllers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from dataclasses import dataclass, field

from electra.broker_session import AnswerConnection, StatusProtocol

HEARTBEAT_PERIOD_S = 1.0  # BrokerConfig.brokerHeartbeatInterval
REPLICA_INFO_PERIOD_S = 5.0  # syncBrokerMetadataPeriod / checkSyncStateSetPeriod
REQUEST_CONNECTIONS = 256  # to the leader, shared by all brokers' controller requests
HEARTBEAT_CONNECTIONS = 256  # lanes to each controller, for heartbeats (a slow request queue must not delay them)
REGISTER_HEARTBEAT_CONNECTIONS = 64  # to each controller, for the heartbeats of registration (64 sets at a time)
REQUEST_TIMEOUT_S = 10.0  # a broker gives up on a controller request (legacy answers 504 after 5 s itself)
CONTROLLER_KINDS = ("replica_info", "alter_sync_state_set", "elect_master")  # what legacy's event queue serves


class HttpConn:
    """One kept-alive HTTP/1.1 connection; `call(raw, endpoint)` sends pre-encoded bytes, returns (status, body).

    It reconnects when asked for another endpoint (the leader moved) or after the server closed it. No
    answer within `timeout_s` (a stopped or partitioned controller) closes it and raises TimeoutError."""

    def __init__(self, timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self.endpoint: str | None = None
        self._proto: AnswerConnection | None = None

    async def call(self, raw: bytes, endpoint: str) -> tuple[int, bytes]:
        if endpoint != self.endpoint:
            self.close()
            self.endpoint = endpoint
        for attempt in (0, 1):  # a connection the server closed (idle timeout) is reopened once
            try:
                async with asyncio.timeout(self.timeout_s):
                    if self._proto is None or self._proto.closed:
                        host, _, port = endpoint.rpartition(":")
                        _, self._proto = await asyncio.get_running_loop().create_connection(AnswerConnection, host,
                                                                                            int(port))
                    proto = self._proto
                    proto.waiter = asyncio.get_running_loop().create_future()
                    proto.transport.write(raw)
                    return await proto.waiter
            except TimeoutError:
                self.close()
                raise
            except ConnectionError:
                self.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._proto is not None:
            self._proto.close()
        self._proto = None


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
    """Completed requests of one phase: (completion time, latency s) by kind, failures by kind, and how
    late the generator sent open-loop requests (s after their intended time)."""

    t0: float
    done: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    failed: dict[str, int] = field(default_factory=dict)
    failure_statuses: dict[str, int] = field(default_factory=dict)  # "kind status" -> count (0: no connection)
    send_lag: list[float] = field(default_factory=list)

    def add(self, kind: str, started: float, status: int, code: int | None = None) -> None:
        now = time.monotonic()
        if status == 200:
            self.done.setdefault(kind, []).append((now - self.t0, now - started))
        else:
            self.failed[kind] = self.failed.get(kind, 0) + 1
            key = f"{kind} {status}" + (f"/{code}" if code is not None else "")
            self.failure_statuses[key] = self.failure_statuses.get(key, 0) + 1


async def saturate(endpoint_of, raws: list[bytes], connections: int, stop: asyncio.Event, samples_of,
                   kind: str) -> None:
    """A closed loop: `connections` kept-alive connections repeat `raws` (round robin) back to back until
    `stop`; each answer goes to `samples_of()` under `kind`. `endpoint_of()` names the target per request.
    For work that needs the answers in Python (seeding); a saturating load is wrk's (bench/wrk.py)."""

    async def worker(i: int) -> None:
        conn = HttpConn()
        n = i
        try:
            while not stop.is_set():
                raw = raws[n % len(raws)]
                n += connections
                t = time.monotonic()
                try:
                    status, _ = await conn.call(raw, endpoint_of())
                except OSError:
                    samples_of().add(kind, t, 0)
                    await asyncio.sleep(0.05)
                    continue
                samples_of().add(kind, t, status)
        finally:
            conn.close()

    await asyncio.gather(*(worker(i) for i in range(connections)))


class HeartbeatLane:
    """One kept-alive connection to one controller carrying the heartbeats of a fixed group of brokers, each
    once a period at its own phase (fixed rate, as the broker's scheduleAtFixedRate), one in flight at a time.

    Callbacks only: the answer's status (`StatusProtocol`) sends the next heartbeat if it is due, else one
    timer waits for it. A heartbeat due while the one before is in flight waits for it; its latency runs from
    its intended time, so the wait counts (and its lateness is the generator's send lag). Dead brokers
    (`alive` False) are skipped. `endpoint_of()` names the controller: a lane that follows the leader
    reconnects when it moves. `overdue()` lets the owner abort a request the controller never answers."""

    def __init__(self, load: BrokerLoad, endpoint_of, brokers: list[Broker], first_due: list[float]) -> None:
        order = sorted(range(len(brokers)), key=first_due.__getitem__)
        self.load, self.endpoint_of = load, endpoint_of
        self.brokers = [brokers[i] for i in order]
        self.due = [first_due[i] for i in order]  # stays sorted round the ring: each due moves on by one period
        self.pos = 0
        self.proto: StatusProtocol | None = None
        self.endpoint: str | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.connecting = False
        self.stopped = False

    def start(self) -> None:
        self._next()

    def stop(self) -> None:
        self.stopped = True
        if self.timer is not None:
            self.timer.cancel()
        if self.proto is not None:
            self.proto.on_answer = None
            self.proto.abort()

    def overdue(self, now: float) -> bool:
        p = self.proto
        return p is not None and p.on_answer is not None and now - p.sent_at > REQUEST_TIMEOUT_S

    def _next(self) -> None:
        self.timer = None
        if self.stopped or self.connecting:
            return
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        for _ in range(len(self.brokers)):  # bounded: skip the dead ones once round the ring
            if self.brokers[self.pos].alive:
                break
            self.due[self.pos] += HEARTBEAT_PERIOD_S
            self.pos = (self.pos + 1) % len(self.brokers)
        else:
            self.timer = loop.call_later(HEARTBEAT_PERIOD_S, self._next)
            return
        due = self.due[self.pos]
        if due > now:
            self.timer = loop.call_at(due, self._next)
            return
        endpoint = self.endpoint_of()
        p = self.proto
        if p is None or p.closed or endpoint != self.endpoint:
            self._connect(endpoint)
            return
        self.load.samples.send_lag.append(now - due)
        p.on_answer = self._answered
        p.sent_at = now
        p.transport.write(self.brokers[self.pos].heartbeat)

    def _answered(self, status: int) -> None:
        self.load.samples.add("heartbeat", self.due[self.pos], status)
        self.due[self.pos] += HEARTBEAT_PERIOD_S
        self.pos = (self.pos + 1) % len(self.brokers)
        if status == 0:  # the connection failed: reconnect (`_next` does) after a pause
            self.proto = None
            self.timer = asyncio.get_running_loop().call_later(0.05, self._next)
            return
        self._next()

    def _connect(self, endpoint: str) -> None:
        if self.proto is not None:
            self.proto.on_answer = None
            self.proto.abort()
        self.proto, self.endpoint, self.connecting = None, endpoint, True

        async def connect() -> None:
            host, _, port = endpoint.rpartition(":")
            try:
                async with asyncio.timeout(REQUEST_TIMEOUT_S):
                    _, self.proto = await asyncio.get_running_loop().create_connection(StatusProtocol, host,
                                                                                       int(port))
            except (OSError, TimeoutError):
                self.proto = None
                await asyncio.sleep(0.2)
            finally:
                self.connecting = False
            self._next()

        self.load.spawn(connect())


async def open_loop(endpoint: str, raws: list[bytes], period_s: float, stop: asyncio.Event, samples_of,
                    kind: str, rng: random.Random) -> None:
    """Each of `raws` sent once every `period_s` on its own schedule (random phase) until `stop`, latency
    from the intended send time; connections pooled as the brokers' are."""
    pool = ConnPool(min(len(raws), REQUEST_CONNECTIONS))

    async def one(raw: bytes) -> None:
        due = time.monotonic() + rng.uniform(0, period_s)
        while not stop.is_set():
            wait = due - time.monotonic()
            if wait > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await stop.wait()
                continue
            s = samples_of()
            s.send_lag.append(-wait)
            try:
                status, _ = await pool.call(raw, endpoint)
            except OSError:
                status = 0
            s.add(kind, due, status)
            due += period_s

    try:
        await asyncio.gather(*(one(r) for r in raws))
    finally:
        pool.close()


def set_sizes(brokers: int, replicas: int = 3) -> list[int]:
    """Replicas per set for exactly `brokers` brokers: sets of `replicas`, the remainder one more each in the
    first sets (1,000 brokers: 332 sets of 3 and one of 4), so a point asked for N brokers runs N."""
    sets = max(1, brokers // replicas)
    extra = max(0, brokers - sets * replicas)
    return [replicas + extra // sets + (1 if g < extra % sets else 0) for g in range(sets)]


class BrokerLoad:
    """`brokers` simulated brokers (sets of `replicas`, `set_sizes`) against a controller group's HTTP endpoints."""

    def __init__(self, leader: str, brokers: int, *, endpoints: list[str] | None = None, replicas: int = 3,
                 cluster: str = "perf", heartbeat_timeout_ms: int = 10_000, heartbeats_to: str = "all",
                 seed: int = 0) -> None:
        """`heartbeats_to`: "all" controllers (RocketMQ's brokers, `ControllerClient`) or only the "leader"
        (the report's first version: a new leader's liveness table then starts empty)."""
        self.leader = leader
        self.endpoints = list(endpoints or [leader])
        self.heartbeat_targets: list[str | None] = list(self.endpoints) if heartbeats_to == "all" else [None]
        self.timeout_ms = heartbeat_timeout_ms
        self.rng = random.Random(seed)
        self.sets: dict[str, list[Broker]] = {}
        for g, size in enumerate(set_sizes(brokers, replicas)):
            name = f"{cluster}-{g}"
            self.sets[name] = [Broker(cluster, name, r + 1, f"10.{g // 250}.{g % 250}.{r + 1}:10911")
                               for r in range(size)]
        self.brokers = [b for bs in self.sets.values() for b in bs]
        for b in self.brokers:
            b.replica_info = get("controller", f"/v1/broker-sets/{b.name}/replica-info")
            self._encode_heartbeat(b)
        self.requests = ConnPool(min(len(self.brokers), REQUEST_CONNECTIONS))
        self.heartbeats = {ep: ConnPool(min(len(self.brokers), REGISTER_HEARTBEAT_CONNECTIONS))
                           for ep in self.endpoints}
        self.lanes: list[HeartbeatLane] = []
        self.leader_changes = 0
        self.samples = Samples(time.monotonic())
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task] = []

    def _encode_heartbeat(self, b: Broker) -> None:
        b.heartbeat = post("controller", "/v1/heartbeat", {
            "clusterName": b.cluster, "brokerName": b.name, "brokerAddr": b.addr, "brokerId": b.broker_id,
            "epoch": b.master_epoch, "maxOffset": 1000, "confirmOffset": 1000,
            "heartbeatTimeoutMillis": self.timeout_ms, "electionPriority": b.broker_id})

    async def _call(self, kind: str, raw: bytes, started: float | None = None, endpoint: str | None = None
                    ) -> dict | None:
        """One request (to the leader unless `endpoint`); a redirect or a 503 naming another leader moves every
        later request. `started`: the intended send time (open loop), else now."""
        pool = self.heartbeats.get(endpoint or self.leader, self.requests) if kind == "heartbeat" else self.requests
        t = time.monotonic() if started is None else started
        try:
            status, body = await pool.call(raw, endpoint or self.leader)
        except OSError:
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
        if leader and leader != self.leader and kind != "heartbeat":
            self.leader = leader
            self.leader_changes += 1
        return res or {"code": -1, "httpStatus": status}

    # ------------------------------------------------------------------ following the leader
    def follow_leader(self, every_s: float = 0.5) -> None:
        """Ask the current target for its metadata and move to the leader it names: follower reads are
        answered by any node (200), so only this notices a new leader in time."""

        async def follow() -> None:
            conn = HttpConn(timeout_s=1.0)
            ask = self.leader
            try:
                while not self._stop.is_set():
                    try:
                        status, body = await conn.call(get("controller", "/v1/admin/metadata"), ask)
                        md = json.loads(body) if status == 200 else {}
                    except (OSError, ValueError):
                        md = {}
                    moved = ask if md.get("is_leader") else md.get("leader_address")
                    if moved and moved != self.leader:
                        self.leader = moved
                        self.leader_changes += 1
                    if moved:
                        ask = self.leader
                    else:  # no answer (a stopped node) or no leader known there: ask the next controller
                        i = self.endpoints.index(ask) if ask in self.endpoints else -1
                        ask = self.endpoints[(i + 1) % len(self.endpoints)]
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(every_s):
                            await self._stop.wait()
            finally:
                conn.close()

        self._tasks.append(asyncio.create_task(follow()))

    # ------------------------------------------------------------------ open-loop schedules
    async def _every(self, period_s: float, first_s: float, step) -> None:
        """Run `step(intended_time)` every `period_s` from `first_s` on, at a fixed rate as the broker's
        scheduleAtFixedRate: a late step delays the next ones (they catch up) and its lateness counts in
        their latency. Ends when `step` returns False; `stop()` cancels it."""
        due = time.monotonic() + first_s
        while True:
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
                continue
            self.samples.send_lag.append(-wait)
            if await step(due) is False:
                return
            due += period_s

    def spawn(self, coro) -> None:
        """A background task of this load, cancelled by `stop()`."""
        self._tasks = [t for t in self._tasks if not t.done()]
        self._tasks.append(asyncio.create_task(coro))

    def start_heartbeats(self) -> None:
        """Every broker heartbeats every controller (or the leader, see `heartbeats_to`) once a second, over
        `HEARTBEAT_CONNECTIONS` lanes per controller."""
        now = time.monotonic()
        lanes = min(len(self.brokers), HEARTBEAT_CONNECTIONS)
        for ep in self.heartbeat_targets:
            endpoint_of = (lambda ep=ep: ep) if ep is not None else (lambda: self.leader)
            for i in range(lanes):
                group = self.brokers[i::lanes]
                lane = HeartbeatLane(self, endpoint_of, group,
                                     [now + self.rng.uniform(0, HEARTBEAT_PERIOD_S) for _ in group])
                self.lanes.append(lane)
                lane.start()

        async def abort_overdue() -> None:  # a controller that never answers (stopped) holds no lane forever
            while True:
                await asyncio.sleep(1.0)
                now = time.monotonic()
                for lane in self.lanes:
                    if lane.overdue(now) and lane.proto is not None:
                        lane.proto.abort()  # answers 0 to the lane: counted as failed, then it reconnects

        self.spawn(abort_overdue())

    def start_brokers(self) -> None:
        """Every broker's GetReplicaInfo every 5 s, with what follows from its answer."""
        for b in self.brokers:
            self._tasks.append(asyncio.create_task(
                self._every(REPLICA_INFO_PERIOD_S, self.rng.uniform(0, REPLICA_INFO_PERIOD_S),
                            lambda due, b=b: self._sync(b, due))))

    async def _sync(self, b: Broker, due: float) -> bool:
        """One GetReplicaInfo; adopt; a broker whose set has no master asks for an election; the master grows
        its sync-state set. False once the broker is dead (its schedule ends)."""
        if not b.alive:
            return False
        res = await self._call("replica_info", b.replica_info, due)
        if res is not None and res.get("code") == 0:
            self._adopt(b, res["header"], res.get("body"))
            if res["header"].get("masterBrokerId") is None:
                elected = await self._call("elect_master", post(
                    "controller", f"/v1/broker-sets/{b.name}/elect-master",
                    {"clusterName": b.cluster, "brokerId": b.broker_id}))
                if elected is not None and elected.get("code") in (0, 2011):
                    self._adopt(b, elected["header"], elected.get("body"))
            if b.master_id == b.broker_id:
                await self._grow(self.sets[b.name])
        return True

    # ------------------------------------------------------------------ register at start
    async def register_all(self, parallel_sets: int = 64) -> float:
        """Every set: apply ids, register, elect its first replica, grow the sync-state set. Returns seconds."""
        t0 = time.monotonic()
        sem = asyncio.Semaphore(parallel_sets)

        async def until(kind: str, raw, accept=(0,)) -> dict | None:
            """A start-up step, retried as a broker retries it (a leader change, a busy queue), 20 times at most."""
            res = None
            for _ in range(20):
                res = await self._call(kind, raw)
                if res is not None and res.get("code") in accept:
                    return res
                await asyncio.sleep(0.2)
            return res

        async def one(brokers: list[Broker]) -> None:
            async with sem:
                for b in brokers:
                    await until("apply_broker_id", post(
                        "controller", f"/v1/broker-sets/{b.name}/apply-broker-id",
                        {"clusterName": b.cluster, "brokerId": b.broker_id,
                         "registerCheckCode": f"{b.addr};{b.broker_id}"}))
                for b in brokers:  # alive before the master asks to add it to the sync-state set
                    await asyncio.gather(*(self._call("heartbeat", b.heartbeat, endpoint=ep)
                                           for ep in self.heartbeat_targets))
                for b in brokers:
                    await until("register", post(
                        "controller", f"/v1/broker-sets/{b.name}/register",
                        {"clusterName": b.cluster, "brokerId": b.broker_id, "brokerAddress": b.addr}))
                first = brokers[0]
                res = await until("elect_master", post(
                    "controller", f"/v1/broker-sets/{first.name}/elect-master",
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
            "controller", f"/v1/broker-sets/{master.name}/sync-state-set",
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

    # ------------------------------------------------------------------ the failover storm
    async def storm(self, fraction: float, limit_s: float, poll_s: float = 0.25) -> dict:
        """Kill `fraction` of the masters at once; returns the kill time, each set's recovery (s) and, for a
        set that did not recover, what the leader finally said about it (master, epochs, sync-state set)."""
        victims = [bs for bs in self.sets.values() if any(b.master_id == b.broker_id for b in bs)]
        victims = victims[::max(1, round(1 / fraction))] if fraction > 0 else []
        killed: dict[str, tuple[int, int]] = {}
        t_kill = time.monotonic() - self.samples.t0
        kill_clock = time.monotonic()
        for bs in victims:
            master = next(b for b in bs if b.master_id == b.broker_id)
            master.alive = False
            killed[master.name] = (master.broker_id, master.master_epoch)
        recovered: dict[str, float] = {}
        last: dict[str, dict] = {}
        conns = [HttpConn(timeout_s=2.0) for _ in range(min(16, len(killed)))]

        async def watch(names: list[str], conn: HttpConn) -> None:
            while names and time.monotonic() - kill_clock < limit_s:
                for name in list(names):
                    old_id, old_epoch = killed[name]
                    try:
                        status, body = await conn.call(get("controller", f"/v1/broker-sets/{name}/replica-info"),
                                                       self.leader)
                        res = json.loads(body) if status == 200 else {}
                    except (OSError, ValueError):
                        res = {}
                    h = res.get("header") or {}
                    if res.get("code") == 0:
                        last[name] = {"master": h.get("masterBrokerId"), "master_epoch": h.get("masterEpoch"),
                                      "sync_state_set": (res.get("body") or {}).get("syncStateSet")}
                    if res.get("code") == 0 and h.get("masterBrokerId") not in (None, old_id) \
                            and h.get("masterEpoch", 0) > old_epoch:
                        recovered[name] = time.monotonic() - kill_clock
                        names.remove(name)
                await asyncio.sleep(poll_s)

        names = list(killed)
        try:
            await asyncio.gather(*(watch(names[i::len(conns)], c) for i, c in enumerate(conns)))
        finally:
            for c in conns:
                c.close()
        unrecovered = sorted(set(killed) - set(recovered))
        return {"t_kill": t_kill, "sets": len(killed), "recovered": recovered, "unrecovered": unrecovered,
                "unrecovered_state": {n: {"killed_master": killed[n][0], "killed_epoch": killed[n][1],
                                          **last.get(n, {})} for n in unrecovered}}

    async def stop(self) -> None:
        self._stop.set()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for lane in self.lanes:
            lane.stop()
        self.requests.close()
        for pool in self.heartbeats.values():
            pool.close()
