"""Client operations on the controller API, recorded for the checkers.

Each broker set gets a few client processes issuing random RocketMQ controller
requests (apply broker id, register, broker and admin elections, alter sync-state
set, replica info, next broker id), a watcher on a node's SSE stream, and a
heartbeat loop that keeps its brokers alive on every node. An observer polls every
node's metadata to record who claims leadership in which term.

One request is one attempt at most once in the log: redirects are followed (a 307
from a follower has not touched the log) and a refusal that certainly did not reach
the log (code 2007 with 503, a refused connection) moves on to the next node, but a
timeout, a reset or a 504 is recorded `unknown` and never retried, because a retry
could apply the command twice. A process whose op is unknown is retired and a new
process id takes its place (as in Jepsen), so each process has one op in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import random
import time
import zlib
from typing import Any

import aiohttp

from electra.api.client import ControllerClient, UnexpectedResponse
from electra.security.credentials import ClientCredentials
from electra.state.codes import Code

from .history import HistoryLog

CLUSTER = "chaos"
BROKERS = (1, 2, 3)
HEARTBEAT_TIMEOUT_MS = 60_000
HEARTBEAT_INTERVAL_S = 2.0
THINK_S = (0.05, 0.2)  # between one client's ops: ~30 ops/s in all, light on a busy 2-core machine
OBSERVER_INTERVAL_S = 0.25  # metadata polls of every node: who leads in which term


def broker_addr(set_name: str, bid: int) -> str:
    return f"10.0.{zlib.crc32(set_name.encode()) % 250}.{bid}:10911"


def check_code(set_name: str, bid: int) -> str:
    return f"{broker_addr(set_name, bid)};chaos-{set_name}-{bid}"


class _Unknown(Exception):
    """The request may or may not have reached the log."""


class _Refused(Exception):
    """The request certainly did not reach the log."""


class ChaosClient(ControllerClient):
    """One attempt per request (see the module docstring); reports which node answered."""

    async def attempt(self, method: str, path: str, body: Any = None, params: dict | None = None,
                      deadline_s: float = 3.0) -> tuple[str, int, dict]:
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            ep = self.preferred or self.endpoints[next(self._rr)]
            try:
                status, out = await self._once(method, f"{self.scheme}://{ep}{path}", body, params)
            except aiohttp.ClientConnectorError:  # nothing was sent
                self.preferred = None
                await asyncio.sleep(0.05)
                continue
            except (aiohttp.ClientError, TimeoutError, UnexpectedResponse) as exc:
                self.preferred = None
                raise _Unknown(f"{type(exc).__name__} from {ep}") from None
            node = self.preferred or ep
            if status == 503 and out.get("code") == Code.CONTROLLER_NOT_LEADER:
                self.preferred = None
                await asyncio.sleep(0.05)
                continue
            if status in (503, 504) or status >= 500:
                self.preferred = None
                raise _Unknown(f"HTTP {status} from {node}: {out.get('remark', '')[:80]}")
            return node, status, out
        raise _Refused("no node accepted the request before the deadline")


def _summary(kind: str, res: dict) -> dict[str, Any]:
    """The response fields the checkers use."""
    h, b = res.get("header") or {}, res.get("body") or {}
    out: dict[str, Any] = {"code": res.get("code")}
    if kind in ("register", "elect", "replica_info"):
        out["master"] = h.get("masterBrokerId")
        if h.get("masterEpoch") is not None:
            out["mepoch"] = h.get("masterEpoch")
    if kind in ("register", "replica_info", "alter_sss") and isinstance(b, dict) and "syncStateSet" in b:
        out["sss"] = b.get("syncStateSet")
        out["sse"] = b.get("syncStateSetEpoch")
    if kind == "elect" and h.get("syncStateSetEpoch") is not None:
        out["sse"] = h.get("syncStateSetEpoch")
    if kind == "next_broker_id":
        out["next"] = h.get("nextBrokerId")
    return out


class Workload:
    def __init__(self, endpoints: list[str], creds: dict[str, ClientCredentials], log: HistoryLog,
                 sets: list[str], seed: int, procs_per_set: int = 2, op_timeout_s: float = 2.0) -> None:
        self.endpoints = endpoints
        self.log = log
        self.sets = sets
        self.rng = random.Random(seed)
        self.procs_per_set = procs_per_set
        self.op_timeout_s = op_timeout_s
        self.broker = ChaosClient(endpoints, credentials=creds["broker"], timeout=op_timeout_s)
        # Lease reads pinned to the node that led when the last fault started ("readers that keep reading at
        # a cut-off leader"): a lease that outlives the leader's term shows as a stale read there.
        self.pinned_reads = ChaosClient(endpoints, credentials=creds["broker"], timeout=op_timeout_s)
        self.pinned: str | None = None
        self.admin = ChaosClient(endpoints, credentials=creds["admin"], timeout=op_timeout_s)
        self.meta = ControllerClient(endpoints, credentials=creds["admin"], timeout=1.0)
        self.creds = creds
        self._ids = itertools.count()
        self._procs = itertools.count()
        self.stop = asyncio.Event()
        self.last_seen: dict[str, dict[str, Any]] = {}  # set -> newest master/epochs a client saw
        self.applied_ids: dict[str, set[int]] = {}  # set -> broker ids whose apply was acknowledged

    async def close(self) -> None:
        for c in (self.broker, self.admin, self.meta, self.pinned_reads):
            await c.close()

    # ------------------------------------------------------------------ operations
    def _choose(self, s: str) -> tuple[str, dict[str, Any]]:
        r = self.rng.random()
        bid = self.rng.choice(BROKERS)
        if r < 0.15:
            # Now and then a new broker id: a write that changes the set, so losing it shows at the end.
            return "apply_broker_id", {"bid": bid if self.rng.random() < 0.5 else self.rng.randint(4, 30)}
        if r < 0.25:
            return "register", {"bid": bid}
        if r < 0.35:
            return "elect", {"bid": bid, "designate": False}
        if r < 0.55:
            return "elect", {"bid": bid, "designate": True}
        if r < 0.75:
            seen = self.last_seen.get(s)
            if seen and seen.get("master") is not None:
                others = [b for b in BROKERS if b != seen["master"] and self.rng.random() < 0.6]
                return "alter_sss", {"master": seen["master"], "mepoch": seen["mepoch"],
                                     "sss": sorted([seen["master"], *others]), "sse": seen["sse"]}
            return "replica_info", self._read_args()
        if r < 0.95:
            return "replica_info", self._read_args()
        return "next_broker_id", {}

    def _read_args(self) -> dict[str, Any]:
        """Half the replica-info reads ask the leader for a lease read: the lease is then checked too."""
        return {"lease": True} if self.rng.random() < 0.5 else {}

    async def _request(self, s: str, kind: str, a: dict[str, Any]) -> tuple[str, dict]:
        base = f"/v1/broker-sets/{s}"
        if a.get("pinned"):
            node, _, res = await self.pinned_reads.attempt("GET", f"{base}/replica-info",
                                                           params={"consistency": "lease"}, deadline_s=0.5)
            return node, res
        if kind == "apply_broker_id":
            node, _, res = await self.broker.attempt("POST", f"{base}/apply-broker-id", {
                "clusterName": CLUSTER, "brokerId": a["bid"], "registerCheckCode": check_code(s, a["bid"])})
        elif kind == "register":
            node, _, res = await self.broker.attempt("POST", f"{base}/register", {
                "clusterName": CLUSTER, "brokerId": a["bid"], "brokerAddress": broker_addr(s, a["bid"])})
        elif kind == "elect":
            client, prefix = (self.admin, "/v1/admin") if a["designate"] else (self.broker, "/v1")
            node, _, res = await client.attempt("POST", f"{prefix}/broker-sets/{s}/elect-master",
                                                {"clusterName": CLUSTER, "brokerId": a["bid"]})
        elif kind == "alter_sss":
            node, _, res = await self.broker.attempt("POST", f"{base}/sync-state-set", {
                "masterBrokerId": a["master"], "masterEpoch": a["mepoch"], "syncStateSet": a["sss"],
                "syncStateSetEpoch": a["sse"]})
        elif kind == "replica_info":
            node, _, res = await self.broker.attempt("GET", f"{base}/replica-info",
                                                     params={"consistency": "lease"} if a.get("lease") else None)
        else:
            node, _, res = await self.broker.attempt("GET", f"{base}/next-broker-id", params={"cluster": CLUSTER})
        return node, res

    async def leader_term(self, ep: str) -> tuple[bool, int]:
        try:
            md = await self.meta.metadata(ep)
            return bool(md.get("is_leader")), int(md.get("term") or 0)
        except (aiohttp.ClientError, TimeoutError, ValueError, PermissionError):
            return False, -1

    async def run_op(self, proc: int, s: str, kind: str, a: dict[str, Any]) -> str:
        op_id = next(self._ids)
        self.log.add("invoke", id=op_id, proc=proc, set=s, op=kind, args=a)
        read = kind in ("replica_info", "next_broker_id")
        before = None
        client = self.pinned_reads if a.get("pinned") else self.broker
        if a.get("pinned"):
            client.preferred = self.pinned
        if read and client.preferred:
            before = (client.preferred, await self.leader_term(client.preferred))
        try:
            async with asyncio.timeout(self.op_timeout_s + 1.0):
                node, res = await self._request(s, kind, a)
        except (_Unknown, TimeoutError) as exc:
            self.log.add("unknown", id=op_id, why=str(exc) or "timed out")
            return "unknown"
        except _Refused as exc:
            self.log.add("fail", id=op_id, why=str(exc))
            return "fail"
        out = _summary(kind, res)
        extra: dict[str, Any] = {}
        if read:
            # A read is linearizable only if the node that served it led the same term before and after.
            after = await self.leader_term(node)
            extra["leader_read"] = bool(before and before[0] == node and before[1][0] and after[0]
                                        and before[1][1] == after[1] and after[1] > 0)
        if out.get("code") == Code.SUCCESS and (kind in ("elect", "alter_sss") or (
                kind == "apply_broker_id" and a["bid"] not in self.applied_ids.setdefault(s, set()))):
            extra["changed"] = True  # this write changed the set: losing it would show
            if kind == "apply_broker_id":
                self.applied_ids[s].add(a["bid"])
        self.log.add("ok", id=op_id, node=node, out=out, **extra)
        self._remember(s, kind, out)
        return "ok"

    def _remember(self, s: str, kind: str, out: dict[str, Any]) -> None:
        if out.get("code") == Code.SUCCESS and kind in ("elect", "replica_info") and out.get("master") is not None:
            seen = self.last_seen.setdefault(s, {})
            if out.get("mepoch", -1) >= seen.get("mepoch", -1):
                seen.update(master=out["master"], mepoch=out["mepoch"], sse=out.get("sse", seen.get("sse", 0)))
        elif out.get("code") == Code.SUCCESS and kind == "alter_sss" and s in self.last_seen:
            self.last_seen[s]["sse"] = out.get("sse")

    async def client_loop(self, s: str) -> None:
        proc = next(self._procs)
        while not self.stop.is_set():
            kind, a = self._choose(s)
            if await self.run_op(proc, s, kind, a) == "unknown":
                proc = next(self._procs)  # a process with an op in doubt is retired
            await asyncio.sleep(self.rng.uniform(*THINK_S))

    async def pinned_reader_loop(self, s: str) -> None:
        """Lease reads of set `s` at the pinned node, one at a time (see `pinned`)."""
        proc = next(self._procs)
        while not self.stop.is_set():
            if self.pinned is None:
                await asyncio.sleep(0.05)
                continue
            if await self.run_op(proc, s, "replica_info", {"lease": True, "pinned": True}) == "unknown":
                proc = next(self._procs)
            await asyncio.sleep(self.rng.uniform(0.02, 0.08))

    async def setup_sets(self) -> None:
        """Create every set with its three brokers and its first master (recorded ops; sets in parallel)."""
        async def one(s: str) -> None:
            proc = next(self._procs)
            for bid in BROKERS:
                if await self.run_op(proc, s, "apply_broker_id", {"bid": bid}) == "unknown":
                    proc = next(self._procs)
            await self.run_op(proc, s, "elect", {"bid": 1, "designate": False})

        await asyncio.gather(*(one(s) for s in self.sets))

    # ------------------------------------------------------------------ liveness, watchers, observer
    async def heartbeat_loop(self) -> None:
        http = self.broker._http()
        while not self.stop.is_set():
            async def one(ep: str, s: str, bid: int) -> None:
                body = {"clusterName": CLUSTER, "brokerName": s, "brokerId": bid, "brokerAddr": broker_addr(s, bid),
                        "heartbeatTimeoutMillis": HEARTBEAT_TIMEOUT_MS}
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with http.post(f"{self.broker.scheme}://{ep}/v1/heartbeat", json=body,
                                         timeout=aiohttp.ClientTimeout(total=1.0)) as r:
                        await r.read()
            await asyncio.gather(*(one(ep, s, b) for ep in self.endpoints for s in self.sets for b in BROKERS))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(HEARTBEAT_INTERVAL_S):
                    await self.stop.wait()

    async def watch_loop(self, s: str) -> None:
        """One watcher of set `s`, as a broker runs it: on any node, reconnecting to a random node when the stream
        ends or fails, and resuming from the last event it received (`Last-Event-ID`)."""
        http = self.broker._http()
        conn = 0
        last_id: str | None = None
        while not self.stop.is_set():
            ep = self.endpoints[self.rng.randrange(len(self.endpoints))]
            conn += 1
            tag = f"{s}#{conn}@{ep}"
            headers = {"Last-Event-ID": last_id} if last_id is not None else {}
            try:
                async with http.get(f"{self.broker.scheme}://{ep}/v1/broker-sets/{s}/watch", headers=headers,
                                    timeout=aiohttp.ClientTimeout(total=None, sock_read=8)) as r:
                    if r.status != 200:
                        await asyncio.sleep(0.2)
                        continue
                    kind, ident = "message", None
                    async for raw in r.content:
                        line = raw.decode(errors="replace").strip()
                        if line.startswith("event:"):
                            kind = line[6:].strip()
                        elif line.startswith("id:"):
                            ident = line[3:].strip()
                        elif line.startswith("data:"):
                            with contextlib.suppress(ValueError):
                                self.log.add("watch", set=s, node=ep, conn=tag, kind=kind, id=ident,
                                             event=json.loads(line[5:]))
                            if ident is not None:
                                last_id = ident
                            kind, ident = "message", None
                        if self.stop.is_set():
                            break
            except (aiohttp.ClientError, TimeoutError):
                await asyncio.sleep(0.1)

    async def observer_loop(self) -> None:
        seen: set[tuple[str, int]] = set()
        while not self.stop.is_set():
            res = await asyncio.gather(*(self.leader_term(ep) for ep in self.endpoints))
            for ep, (leads, term) in zip(self.endpoints, res, strict=True):
                if leads and (ep, term) not in seen:
                    seen.add((ep, term))
                    self.log.add("leader", node=ep, term=term)
            await asyncio.sleep(OBSERVER_INTERVAL_S)
