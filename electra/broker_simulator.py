"""Simulated RocketMQ 5 brokers in controller mode, over real HTTP.

Each broker follows the broker side of the protocol (reference §4): it gets a
broker id (GetNextBrokerId, ApplyBrokerId with `address;timestamp` as check
code), heartbeats every second (to every controller, or to one ingest endpoint
of the Kafka pipeline) with its epoch, max offset,
confirm offset and priority, registers, asks for an election when there is no
master, and polls replica info to learn role changes (over kept-alive connections to every node,
`replica_info_reader.py`). A master grows its
offset, and adds replicas that caught up to its sync-state set; replicas follow
the master's offset.

With ingest endpoints (the Kafka pipeline) each broker holds a session connection to
one ingest worker and heartbeats over it (`broker_session.py`), so brokers fail the
way processes do: `kill` is a crash (the connection is reset, no goodbye: the
controller side learns at once), `hang` is a hung process (the connection stays, no
more heartbeats or requests: only the heartbeat timeout tells), `revive` brings
either back (it reconnects and registers again with its id), and stopping the fleet
is a clean shutdown (every session says goodbye).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from electra.api.client import ControllerClient
from electra.broker_session import BrokerSession, SessionError, SessionTimeout
from electra.replica_info_reader import ReplicaInfoReader
from electra.security.credentials import ClientCredentials, CredentialsError
from electra.state.codes import Code

log = logging.getLogger("electra.broker_simulator")

# A session whose answer is this many session timeouts late is dead and gets reset; a merely slow
# answer keeps the connection (a reset publishes connection_lost: an overloaded ingest worker would
# turn into false crash failovers, as it did at 1,000 sets on the loaded machine).
STUCK_FACTOR = 6


def _quiet_closed_tls_connections(loop: asyncio.AbstractEventLoop) -> None:
    """uvloop reports an ingest worker closing an idle TLS session (its close_notify answered on a socket
    already closed) as a "Fatal error on SSL protocol" with a traceback; for the simulator that is a
    session that ended, which the next heartbeat reopens: log it at debug level, pass on the rest."""
    previous = loop.get_exception_handler()

    def handler(lp, context: dict) -> None:
        exc = context.get("exception")
        if (context.get("message", "").startswith("Fatal error on SSL protocol") and isinstance(exc, RuntimeError)
                and "handler is closed" in str(exc)):
            log.debug("TLS session already closed: %s", exc)
        elif previous is not None:
            previous(lp, context)
        else:
            lp.default_exception_handler(context)

    loop.set_exception_handler(handler)


@dataclass
class SimBroker:
    cluster: str
    name: str
    slot: int  # which replica of its set this is (0-based)
    addr: str
    broker_id: int | None = None
    alive: bool = True
    hung: bool = False  # a hung process: no traffic at all, but its connections stay open
    role: str = "unknown"  # "master" | "slave" | "unknown"
    master_id: int | None = None
    master_epoch: int = 0
    sync_state_set: list[int] = field(default_factory=list)
    sync_state_set_epoch: int = 0
    max_offset: int = 0
    priority: int = 5
    errors: int = 0
    last_heartbeat_at: float = 0.0  # wall clock of the last heartbeat the controller side accepted
    session: BrokerSession | None = None  # its session connection to an ingest worker (with the pipeline)
    session_skip: int = 0                 # how many ingest endpoints past its home one it moved on to
    connecting: bool = False              # a (re)connect of its session is under way
    sync_state_retry_at: float = 0.0      # a refused AlterSyncStateSet is asked again from then on (monotonic)


@dataclass(frozen=True)
class Failover:
    """A killed master replaced: what the demo prints as it happens."""

    name: str
    old_master: int
    new_master: int | None  # None: the controller found no replica to elect (the set has no master)
    master_epoch: int
    seconds: float  # from the kill until a replica of the set learned of the outcome

    def describe(self) -> str:
        new = self.new_master if self.new_master is not None else "none elected (no eligible replica)"
        return (f"failover {self.name}: master {self.old_master} -> {new} "
                f"(epoch {self.master_epoch}) {self.seconds:.1f} s after the kill or hang")


REGISTER_REPORT_S = 10.0  # while registering, failures are reported this often


class BrokerFleet:
    """`groups` broker sets of `replicas` brokers each, all driven from one event loop."""

    def __init__(self, endpoints: list[str], groups: int, replicas: int, *, cluster: str = "sim",
                 heartbeat_s: float = 1.0, poll_s: float = 5.0, timeout_ms: int = 10_000, seed: int = 0,
                 ingest_endpoints: list[str] | None = None, credentials: ClientCredentials | None = None,
                 ids_file: Path | None = None) -> None:
        if groups < 1 or replicas < 1:
            raise ValueError("--groups and --replicas must be at least 1")
        # `credentials`: a broker credential scoped to the simulated sets (default: ELECTRA_TOKEN_FILE, ...)
        self.credentials = credentials if credentials is not None else ClientCredentials.from_env()
        self._ssl = self.credentials.ssl_context()  # one client context (and CA load) for every session
        self._connects = asyncio.Semaphore(64)      # bounded reconnect storms (an ingest restart cuts thousands)
        self.client = ControllerClient(endpoints, deadline_s=30, ingest_endpoints=ingest_endpoints,
                                       credentials=self.credentials)
        # replica-info polls (600 a second at 1,000 sets): kept-alive connections to every node, not aiohttp
        self.reads = ReplicaInfoReader(endpoints, credentials=self.credentials, ssl_context=self._ssl)
        self.ingest_endpoints = list(ingest_endpoints or [])
        self.heartbeat_s, self.poll_s, self.timeout_ms = heartbeat_s, poll_s, timeout_ms
        self.rng = random.Random(seed)
        self.brokers = [SimBroker(cluster, f"{cluster}-set-{g}", r, f"10.{g // 250}.{g % 250}.{r + 1}:10911")
                        for g in range(groups) for r in range(replicas)]
        self.by_set: dict[str, list[SimBroker]] = {}
        for b in self.brokers:
            self.by_set.setdefault(b.name, []).append(b)
        self._tasks: list[asyncio.Task] = []
        self._reconnecting: set[asyncio.Task] = set()
        # A killed master's set -> (old master id, its master epoch, when it was killed): the next
        # master any replica learns of completes the failover, reported to `on_failover`.
        self._killed_masters: dict[str, tuple[int, int, float]] = {}
        self.on_failover: Callable[[Failover], None] | None = None
        self._stopping = False
        self.stats = {"requests": 0, "errors": 0, "elections": 0, "role_changes": 0, "heartbeats": 0,
                      "sessions_opened": 0, "heartbeats_skipped": 0, "replica_info_polls": 0,
                      "heartbeats_refused": 0}
        self.last_error: str | None = None  # the newest failed request's error (shown while registering)
        self.endpoints = list(endpoints)
        self.registered_sets = 0  # sets whose brokers all registered (`start`)
        # Broker ids kept across runs, as a RocketMQ broker keeps its id in its store: a restarted fleet
        # registers its brokers under the ids the controllers know, instead of applying for new ones that
        # are in no sync-state set (then no master could ever be elected again).
        self.ids_file = ids_file
        self._stored_ids: dict[str, int] = _read_ids(ids_file) if ids_file is not None else {}

    # ------------------------------------------------------------------ lifecycle
    async def start(self, progress: bool = False) -> None:
        """Register every broker (sets in parallel, replicas of a set in order), then run them."""
        _quiet_closed_tls_connections(asyncio.get_running_loop())
        total = len(self.by_set)

        async def register_set(brokers: list[SimBroker]) -> None:
            for b in brokers:
                await self._join(b)
            await self._elect_if_needed(brokers[0])
            self.registered_sets += 1
            done = self.registered_sets
            if progress and (done % max(1, total // 10) == 0 or done == total):
                print(f"  brokers: {done}/{total} sets registered", flush=True)

        sem = asyncio.Semaphore(64)

        async def bounded(brokers):
            async with sem:
                await register_set(brokers)

        async def report_failures() -> None:
            """While registering, say every REGISTER_REPORT_S when requests fail (wrong endpoints, no leader)
            or nothing moved at all (requests still retrying inside the client: nothing answers)."""
            seen, before = 0, -1
            while True:
                await asyncio.sleep(REGISTER_REPORT_S)
                done = self.registered_sets
                if self.stats["errors"] > seen:
                    seen = self.stats["errors"]
                    print(f"  brokers: {done}/{total} sets registered; still trying: {seen} requests failed, "
                          f"the last with: {self.last_error}", flush=True)
                elif done == before:
                    print(f"  brokers: {done}/{total} sets registered; still waiting for an answer from "
                          f"{', '.join(self.endpoints)}", flush=True)
                before = done

        if self.ingest_endpoints:  # sessions: every broker's heartbeats from one task, from its registration on
            self._tasks.append(asyncio.create_task(self._beats()))
        reporter = asyncio.create_task(report_failures()) if progress else None
        try:
            await asyncio.gather(*(bounded(bs) for bs in self.by_set.values()))
        finally:
            if reporter is not None:
                reporter.cancel()
        self.save_ids()
        if self.ingest_endpoints:  # (a registration of thousands takes minutes: idle sessions would be cut)
            self._tasks += [asyncio.create_task(self._sync(b)) for b in self.brokers]
        else:
            self._tasks += [asyncio.create_task(self._run(b)) for b in self.brokers]

    def save_ids(self) -> None:
        """Write the brokers' ids to `ids_file` (whole: a temporary file renamed)."""
        if self.ids_file is None:
            return
        tmp = self.ids_file.with_name(self.ids_file.name + ".tmp")
        tmp.write_text(json.dumps(self._stored_ids, sort_keys=True))
        tmp.replace(self.ids_file)

    async def stop(self) -> None:
        """A clean shutdown of every broker: sessions say goodbye."""
        self._stopping = True  # ends every broker's loop even if a cancellation were lost
        self.save_ids()
        tasks = [*self._tasks, *self._reconnecting]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        sessions = [b.session for b in self.brokers if b.session is not None and not b.hung]
        for b in self.brokers:
            if b.hung and b.session is not None:
                b.session.abort()
            b.session = None
        await asyncio.gather(*(s.goodbye() for s in sessions), return_exceptions=True)
        self.reads.close()
        await self.client.close()

    def kill(self, name: str, broker_id: int) -> SimBroker:
        """Crash: all traffic stops and the session connection is reset (no goodbye)."""
        b = self._find(name, broker_id)
        if b.alive and b.role == "master":
            self._killed_masters[name] = (broker_id, b.master_epoch, time.monotonic())
        b.alive = False
        session, b.session = b.session, None
        if session is not None:
            session.abort()
        return b

    def hang(self, name: str, broker_id: int) -> SimBroker:
        """Hang: all traffic stops, but the connections stay open."""
        b = self._find(name, broker_id)
        if b.alive and not b.hung and b.role == "master":
            self._killed_masters[name] = (broker_id, b.master_epoch, time.monotonic())
        b.hung = True
        return b

    def watch_failover(self, name: str, every_s: float = 0.25, limit_s: float = 120.0) -> None:
        """Poll a set whose master was killed until its successor is known, so the failover is
        reported when it commits (as a controller's role-change notice would tell the brokers),
        not at the brokers' next replica-info poll."""

        async def watch() -> None:
            end = time.monotonic() + limit_s
            while name in self._killed_masters and time.monotonic() < end:
                res = await self._call(self.reads.replica_info(name))
                if res.get("code") == Code.SUCCESS:
                    for b in self.by_set[name]:
                        if b.alive:
                            self._adopt(b, res["header"], res.get("body"))
                    self._note_failed_election(name, res["header"])
                await asyncio.sleep(every_s)

        self._tasks.append(asyncio.create_task(watch()))

    def _note_failed_election(self, name: str, header: dict) -> None:
        """A killed master's set whose epoch moved on without a master: the election found nobody."""
        killed = self._killed_masters.get(name)
        epoch = header.get("masterEpoch")
        if killed and header.get("masterBrokerId") is None and epoch is not None and epoch > killed[1]:
            del self._killed_masters[name]
            if self.on_failover is not None:
                self.on_failover(Failover(name, killed[0], None, epoch, time.monotonic() - killed[2]))

    def revive(self, name: str, broker_id: int) -> SimBroker:
        b = self._find(name, broker_id)
        b.alive, b.hung = True, False
        b.role = "unknown"
        return b

    def master_of(self, name: str) -> SimBroker | None:
        return next((b for b in self.by_set[name] if b.role == "master" and b.alive and not b.hung), None)

    def _find(self, name: str, broker_id: int) -> SimBroker:
        for b in self.by_set.get(name, ()):
            if b.broker_id == broker_id:
                return b
        raise KeyError(f"no broker {broker_id} in {name}")

    # ------------------------------------------------------------------ protocol
    async def _call(self, coro) -> dict:
        self.stats["requests"] += 1
        try:
            res = await coro
        except Exception as exc:
            self.stats["errors"] += 1
            self.last_error = str(exc) or repr(exc)
            return {"code": -1, "remark": repr(exc), "header": {}, "body": None}
        if res.get("httpStatus") in (401, 403):  # no retry helps: the fleet stops and says why
            raise CredentialsError(f"the controllers refused this fleet's credential: HTTP {res['httpStatus']}: "
                                   f"{res.get('remark')} (the fleet sends ELECTRA_TOKEN_FILE or ELECTRA_TOKEN: a "
                                   "broker token scoped to its sets)")
        return res

    async def _heartbeat(self, b: SimBroker) -> None:
        if self.ingest_endpoints:
            await self._session_heartbeat(b)
            return
        res = await self._call(self.client.heartbeat(b.cluster, b.name, b.broker_id, b.addr, epoch=b.master_epoch,
                                                     maxOffset=b.max_offset, confirmOffset=b.max_offset,
                                                     heartbeatTimeoutMillis=self.timeout_ms,
                                                     electionPriority=b.priority))
        if res.get("code") == 0:
            b.last_heartbeat_at = time.time()
            self.stats["heartbeats"] += 1

    async def _session_heartbeat(self, b: SimBroker) -> None:
        """Heartbeat over the broker's session, (re)opening it first: to the ingest endpoint its set's
        name hashes to, moving on to the next one after a failure (as ControllerClient does)."""
        self.stats["requests"] += 1
        try:
            if b.session is None or not b.session.is_open:
                status = await self._open_session(b)
                if status is None:
                    return
            else:
                status = await b.session.heartbeat(b.master_epoch, b.max_offset, b.max_offset)
        except SessionTimeout:
            self.stats["errors"] += 1  # slow, not gone: the connection stays (a reset would say "crashed")
            return
        except SessionError:
            status = 0
        self._heartbeat_answered(b, b.session, status)

    async def _open_session(self, b: SimBroker) -> int | None:
        """Open the broker's session (status; None if it was killed meanwhile); SessionError if it cannot."""
        n = len(self.ingest_endpoints)
        ep = self.ingest_endpoints[(zlib.crc32(b.name.encode()) + b.session_skip) % n]
        b.session = session = BrokerSession(ep, {"clusterName": b.cluster, "brokerName": b.name,
                                                 "brokerId": b.broker_id, "brokerAddr": b.addr,
                                                 "heartbeatTimeoutMillis": self.timeout_ms,
                                                 "electionPriority": b.priority},
                                            credentials=self.credentials, ssl_context=self._ssl)
        b.connecting = True  # the heartbeat task leaves it alone meanwhile (no second session)
        try:
            status = await session.open(b.master_epoch, b.max_offset, b.max_offset)
        finally:
            b.connecting = False
        if not b.alive:  # killed while it connected: that connection dies with it
            session.abort()
            return None
        self.stats["sessions_opened"] += status == 200
        return status

    def _heartbeat_answered(self, b: SimBroker, session: BrokerSession | None, status: int) -> None:
        if session is not b.session or not b.alive:
            return  # an answer (or a reset) for a session the broker no longer holds: it was killed
        if status == 200:
            b.last_heartbeat_at = time.time()
            self.stats["heartbeats"] += 1
            return
        self.stats["errors"] += 1
        if status == 503 and session is not None and session.is_open:
            # Kafka is unavailable behind that worker: keep the session. Ending it would publish
            # connection_lost (a false crash failover once Kafka answers again) and, for every broker of
            # that worker at once, cost a TLS reconnect storm; the heartbeat timeout judges a long outage.
            self.stats["heartbeats_refused"] += 1
            return
        b.session_skip += 1
        b.session = None
        if session is not None:
            session.abort()  # closed by a stopping worker, or 503: the next attempt reconnects elsewhere

    async def _reconnect(self, b: SimBroker) -> None:
        b.connecting = True
        try:
            async with self._connects:
                if b.alive and not b.hung and not self._stopping:
                    self.stats["requests"] += 1
                    try:
                        status = await self._open_session(b)
                    except SessionTimeout:
                        self.stats["errors"] += 1  # the session stays; its answer may still come
                        return
                    except SessionError:
                        status = 0
                    if status is not None:
                        self._heartbeat_answered(b, b.session, status)
        finally:
            b.connecting = False

    async def _beats(self) -> None:
        """Every broker's heartbeats, from this one task: each period in 10 slots, a tenth of the brokers
        per slot, each heartbeat written on its session without waiting (the answer arrives through a
        callback). Thousands of brokers then cost a write and a parsed answer each, not a task switch and
        a stream read per heartbeat (docs/failover-signal.md, the load generator)."""
        order = list(self.brokers)
        self.rng.shuffle(order)
        slots = 10
        groups = [order[i::slots] for i in range(slots)]
        step = self.heartbeat_s / slots
        next_at = time.monotonic() + self.rng.uniform(0, step)
        while not self._stopping:
            for group in groups:
                now = time.monotonic()
                for b in group:
                    self._beat_once(b, now)
                next_at += step
                delay = next_at - time.monotonic()
                if delay < -self.heartbeat_s:  # fell a whole period behind: go on from now, no burst
                    next_at, delay = time.monotonic(), 0.0
                await asyncio.sleep(max(0.0, delay))
                if self._stopping:
                    return

    def _beat_once(self, b: SimBroker, now: float) -> None:
        if not b.alive or b.hung or b.broker_id is None:
            return
        if b.role == "master":
            b.max_offset += self.rng.randrange(1000, 5000)
        elif b.role == "slave":
            m = self.master_of(b.name)
            if m is not None:
                b.max_offset = m.max_offset
        s = b.session
        if b.connecting:
            return
        if s is None or not s.is_open:
            b.connecting = True
            task = asyncio.create_task(self._reconnect(b))
            self._reconnecting.add(task)
            task.add_done_callback(self._reconnecting.discard)
            return
        if s.overdue(now, STUCK_FACTOR):
            s.abort()  # no answer for that long: a dead connection (its callback answers 0, the broker reconnects)
            return
        if s.send_heartbeat(b.master_epoch, b.max_offset, b.max_offset,
                            lambda status, b=b, s=s: self._heartbeat_answered(b, s, status)):
            self.stats["requests"] += 1
        else:
            self.stats["heartbeats_skipped"] += 1  # the previous answer has not come yet

    async def _join(self, b: SimBroker) -> None:
        stored = self._stored_ids.get(_id_key(b))
        if stored is not None and b.broker_id is None:  # registered in an earlier run: the same id again
            b.broker_id = stored
            await self._heartbeat(b)
            res = await self._call(self.client.register(b.cluster, b.name, b.broker_id, b.addr))
            if res["code"] == Code.SUCCESS:
                self._adopt(b, res.get("header") or {}, res.get("body"))
                return
            b.broker_id = None  # the controllers do not know it (another cluster, cleaned data): apply again
        while b.broker_id is None:
            nxt = (await self._call(self.client.next_broker_id(b.cluster, b.name)))["header"].get("nextBrokerId")
            if nxt is None:
                await asyncio.sleep(0.2)
                continue
            code = f"{b.addr};{int(time.time() * 1000)}"
            res = await self._call(self.client.apply_broker_id(b.cluster, b.name, nxt, code))
            if res["code"] == Code.SUCCESS:
                b.broker_id = nxt
                self._stored_ids[_id_key(b)] = nxt
            else:
                await asyncio.sleep(self.rng.uniform(0, 0.2))  # lost the race for that id: start over
        await self._heartbeat(b)
        res = await self._call(self.client.register(b.cluster, b.name, b.broker_id, b.addr))
        self._adopt(b, res.get("header") or {}, res.get("body"))

    def _adopt(self, b: SimBroker, header: dict, body) -> None:
        master = header.get("masterBrokerId")
        epoch = header.get("masterEpoch")
        if epoch is None:
            return
        old_role = b.role
        b.master_id, b.master_epoch = master, epoch
        b.role = "master" if master == b.broker_id else ("slave" if master is not None else "unknown")
        if isinstance(body, dict) and "syncStateSet" in body:
            b.sync_state_set = list(body["syncStateSet"])
            b.sync_state_set_epoch = body.get("syncStateSetEpoch", header.get("syncStateSetEpoch", 0))
        elif header.get("syncStateSetEpoch") is not None:
            b.sync_state_set_epoch = header["syncStateSetEpoch"]
        if old_role != b.role:
            self.stats["role_changes"] += 1
        killed = self._killed_masters.get(b.name)
        if killed and master is not None and master != killed[0] and epoch > killed[1]:
            del self._killed_masters[b.name]
            failover = Failover(b.name, killed[0], master, epoch, time.monotonic() - killed[2])
            if self.on_failover is not None:
                self.on_failover(failover)

    async def _elect_if_needed(self, b: SimBroker) -> None:
        res = await self._call(self.reads.replica_info(b.name))
        if res["code"] == Code.SUCCESS and res["header"].get("masterBrokerId") is None:
            res = await self._call(self.client.elect_master(b.cluster, b.name, b.broker_id))
            self.stats["elections"] += 1
            if res["code"] in (Code.SUCCESS, Code.CONTROLLER_MASTER_STILL_EXIST):
                for peer in self.by_set[b.name]:
                    self._adopt(peer, res["header"], res.get("body"))

    async def _run(self, b: SimBroker) -> None:
        """Heartbeat every second and, on its own schedule (as RocketMQ brokers do), poll replica info
        every poll period and keep the sync-state set: a slow controller must not delay heartbeats
        (coupled, a 1,000-set fleet's polls starved its own heartbeats and faked dead masters)."""
        await asyncio.gather(self._beat(b), self._sync(b))

    async def _beat(self, b: SimBroker) -> None:
        await asyncio.sleep(self.rng.uniform(0, self.heartbeat_s))
        while not self._stopping:
            if b.alive and not b.hung:
                if b.role == "master":
                    b.max_offset += self.rng.randrange(1000, 5000)
                elif b.role == "slave":
                    m = self.master_of(b.name)
                    if m is not None:
                        b.max_offset = m.max_offset
                await self._heartbeat(b)
            await asyncio.sleep(self.heartbeat_s)

    async def _sync(self, b: SimBroker) -> None:
        """Poll replica info every poll period; a master also keeps its sync-state set every heartbeat
        period (a replica sleeps until its next poll: thousands of idle wake-ups a second add up)."""
        next_poll = time.monotonic() + self.rng.uniform(0, self.poll_s)
        await asyncio.sleep(self.rng.uniform(0, self.heartbeat_s))
        while not self._stopping:
            if b.alive and not b.hung:
                if time.monotonic() >= next_poll:
                    next_poll = time.monotonic() + self.poll_s
                    self.stats["replica_info_polls"] += 1
                    res = await self._call(self.reads.replica_info(b.name))
                    if res["code"] == Code.SUCCESS:
                        self._adopt(b, res["header"], res.get("body"))
                        if res["header"].get("masterBrokerId") is None:
                            await self._elect_if_needed(b)
                if b.role == "master":
                    await self._grow_sync_state_set(b)
            pause = self.heartbeat_s if b.role == "master" else max(0.05, min(self.heartbeat_s * 5,
                                                                               next_poll - time.monotonic()))
            await asyncio.sleep(pause)

    async def _grow_sync_state_set(self, b: SimBroker) -> None:
        """Ask for every live replica in the sync-state set; after a refusal, again one poll period later.

        (Asked every heartbeat period whatever the answer, a 1,000-set fleet whose replicas the
        controllers did not see alive yet, e.g. before the streaming job's first batch, sent a
        thousand refused writes a second to the leader and spent most of its own CPU on them.)"""
        want = sorted(p.broker_id for p in self.by_set[b.name] if p.alive and p.broker_id is not None)
        if want == sorted(b.sync_state_set) or b.broker_id not in want or time.monotonic() < b.sync_state_retry_at:
            return
        res = await self._call(self.client.alter_sync_state_set(b.name, b.broker_id, b.master_epoch, want,
                                                                b.sync_state_set_epoch))
        if res["code"] == Code.SUCCESS:
            b.sync_state_set, b.sync_state_set_epoch = want, res["header"]["newSyncStateSetEpoch"]
            return
        if res["code"] in (Code.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH, Code.CONTROLLER_FENCED_MASTER_EPOCH,
                           Code.CONTROLLER_INVALID_MASTER):  # stale epochs: learn the current ones, ask again
            info = await self._call(self.reads.replica_info(b.name))
            if info["code"] == Code.SUCCESS:
                self._adopt(b, info["header"], info.get("body"))
        else:  # e.g. a replica not alive yet as the controllers see it
            b.sync_state_retry_at = time.monotonic() + self.poll_s


def _id_key(b: SimBroker) -> str:
    return f"{b.cluster}/{b.name}/{b.addr}"


def _read_ids(path: Path) -> dict[str, int]:
    """The ids an earlier run stored; none if the file is missing or unreadable (then brokers apply anew)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and type(v) is int and v > 0} \
        if isinstance(data, dict) else {}


COMMANDS = ("kill SET ID | hang SET ID | revive SET ID | kill-master SET | hang-master SET | list [SET] | status "
            "| help | quit")
_USAGE = {"kill": "kill SET ID", "hang": "hang SET ID", "revive": "revive SET ID", "kill-master": "kill-master SET",
          "hang-master": "hang-master SET", "list": "list [SET]"}


class _Usage(Exception):
    """A command line that cannot be carried out: the message says what to type instead."""


def _broker_arg(fleet: BrokerFleet, parts: list[str]) -> tuple[str, int]:
    if len(parts) != 3 or not parts[2].isdecimal():
        raise _Usage(f"usage: {_USAGE[parts[0]]} (ID: a broker id, see `list SET`)")
    name = _set_arg(fleet, parts[:2])
    return name, int(parts[2])


def _set_arg(fleet: BrokerFleet, parts: list[str]) -> str:
    if len(parts) != 2:
        raise _Usage(f"usage: {_USAGE[parts[0]]}")
    if parts[1] not in fleet.by_set:
        first = ", ".join(list(fleet.by_set)[:3])
        raise _Usage(f"unknown broker set {parts[1]!r} (this fleet's sets: {first}, ...; `list` shows them)")
    return parts[1]


def _listing(fleet: BrokerFleet, parts: list[str]) -> str:
    if len(parts) == 1:
        names = list(fleet.by_set)
        more = f" ... ({len(names)} sets)" if len(names) > 20 else ""
        return "sets: " + " ".join(names[:20]) + more
    name = _set_arg(fleet, parts)

    def state(b: SimBroker) -> str:
        return "killed" if not b.alive else "hung" if b.hung else b.role

    return f"{name}: " + ", ".join(f"{b.broker_id} {b.addr} {state(b)}" for b in fleet.by_set[name])


def _carry_out(fleet: BrokerFleet, parts: list[str]) -> str:
    """One registered-fleet command; the line to print."""
    verb = parts[0]
    if verb in ("kill", "hang"):
        name, bid = _broker_arg(fleet, parts)
        b = fleet._find(name, bid)
        if not b.alive or (verb == "hang" and b.hung):  # a second kill or hang changed nothing, yet said it did
            return f"broker {bid} of {name} is {'killed' if not b.alive else 'hung'} already (`revive {name} {bid}`)"
        b = (fleet.kill if verb == "kill" else fleet.hang)(name, bid)
        fleet.watch_failover(name)
        return f"{'killed' if verb == 'kill' else 'hung'} {b.addr}"
    if verb == "revive":
        name, bid = _broker_arg(fleet, parts)
        b = fleet._find(name, bid)
        if b.alive and not b.hung:
            return f"broker {bid} of {name} is neither killed nor hung: nothing to revive"
        return f"revived {fleet.revive(name, bid).addr}"
    if verb in ("kill-master", "hang-master"):
        name = _set_arg(fleet, parts)
        m = fleet.master_of(name)
        if m is None:
            return f"{name} has no live master"
        (fleet.kill if verb == "kill-master" else fleet.hang)(name, m.broker_id)
        fleet.watch_failover(name)
        return f"{'killed' if verb == 'kill-master' else 'hung'} master {m.broker_id} of {name}"
    if verb == "list":
        return _listing(fleet, parts)
    if verb == "help":
        return f"commands: {COMMANDS}"
    if verb == "status":
        masters = sum(1 for n in fleet.by_set if fleet.master_of(n))
        return f"sets with a live master: {masters}/{len(fleet.by_set)}; {fleet.stats}"
    raise _Usage(f"unknown command {verb!r}; commands: {COMMANDS}")


async def run_simulator(endpoints: list[str], groups: int, replicas: int, *, duration_s: float | None,
                        commands=None, ingest_endpoints: list[str] | None = None, timeout_ms: int = 10_000,
                        ids_file: Path | None = None) -> dict:
    """Run a fleet; `commands` is an async iterator of text lines (see COMMANDS), EOF ending the run.

    `duration_s` bounds the whole run, registering included (brokers retry for ever, a run does not),
    whatever arrives on `commands`. Commands are read from the start: `quit` and `status` act at
    once, while the others wait for the fleet to be registered (a script piped in works as before)."""
    fleet = BrokerFleet(endpoints, groups, replicas, ingest_endpoints=ingest_endpoints, timeout_ms=timeout_ms,
                        ids_file=ids_file)
    fleet.on_failover = lambda f: print(f.describe(), flush=True)
    t0 = time.monotonic()
    end = t0 + duration_s if duration_s else None
    events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
    starting = asyncio.create_task(fleet.start(progress=True))
    starting.add_done_callback(lambda t: events.put_nowait(("registered", t)))
    feeder = asyncio.create_task(_feed(commands, events)) if commands is not None else None
    registered, waiting, eof, quit_asked = False, [], False, False
    try:
        while True:
            if registered and eof and not waiting:
                break
            timeout = None if end is None else end - time.monotonic()
            if timeout is not None and timeout <= 0:
                if not registered:
                    why = (f"the last failed request: {fleet.last_error}" if fleet.last_error
                           else "no controller answered yet")
                    print(f"not every broker registered within {duration_s:g}s ({why})", flush=True)
                break
            try:
                async with asyncio.timeout(timeout):
                    kind, item = await events.get()
            except TimeoutError:
                continue
            if kind == "registered":
                if item.cancelled():
                    break
                if item.exception() is not None:
                    raise item.exception()
                registered = True
                # With no stdin (`--no-stdin`, `electra up --demo` off a terminal) there are no commands to list.
                print(f"{groups} broker sets x {replicas} replicas registered in {time.monotonic() - t0:.1f}s"
                      + (f"; commands: {COMMANDS}" if commands is not None else ""), flush=True)
                lines, waiting = waiting, []
                if any(_command(fleet, line) for line in lines):
                    quit_asked = True
                    break
                continue
            if kind == "eof":
                eof = True
                continue
            parts = item.split()
            if not parts:
                continue
            if parts[0] == "quit":
                quit_asked = True
                break
            if not registered:
                if parts[0] == "help":
                    print(f"commands: {COMMANDS} (all but status and quit wait for the fleet to register)",
                          flush=True)
                elif parts[0] == "status":
                    print(f"registering: {fleet.registered_sets}/{groups} sets; requests {fleet.stats['requests']}, "
                          f"failed {fleet.stats['errors']}"
                          + (f", the last with: {fleet.last_error}" if fleet.last_error else ""), flush=True)
                else:
                    waiting.append(item)
                continue
            if _command(fleet, item):
                quit_asked = True
                break
    finally:
        for task in (starting, feeder):
            if task is not None and not task.done():
                task.cancel()
        await asyncio.gather(*(t for t in (starting, feeder) if t is not None), return_exceptions=True)
        await fleet.stop()
    return {**fleet.stats, "registered": registered, "quit": quit_asked}


def _command(fleet: BrokerFleet, line: str) -> bool:
    """Carry out one command line of a registered fleet; True for `quit`."""
    parts = line.split()
    if not parts:
        return False
    if parts[0] == "quit":
        return True
    try:
        print(_carry_out(fleet, parts), flush=True)
    except (_Usage, KeyError) as exc:
        print(exc.args[0] if exc.args else str(exc), flush=True)
    return False


async def _feed(commands, events: asyncio.Queue) -> None:
    async for line in commands:
        events.put_nowait(("line", line))
    events.put_nowait(("eof", None))
