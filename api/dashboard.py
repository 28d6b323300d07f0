"""The live dashboard: one aggregated view per node, pushed to every viewer over server-sent events.

Any node serves it (followers too): `GET /dashboard` is a static page (uPlot vendored in
`dashboard_static/`, nothing from the network) that opens `GET /v1/dashboard/stream`. The
node builds **one** frame per second while at least one viewer is connected and hands the
same encoded bytes to every viewer, so a viewer costs a queue slot and a socket write, not a
rebuild; with no viewer nothing is built. A frame holds what this node knows:

* fleet: broker sets with a live master, with a master whose heartbeats stopped (a failover
  is due or under way), and with no master at all (this node's liveness table);
* failovers: every ElectMaster this node applied that replaced a master, with the instants
  master lost (its last heartbeat seen here), detected (the clock the election command
  carries: when the leader's scan or the streaming job judged the master dead) and
  committed (applied here);
* the controller group: every node's role, term, commit and applied index (asked over
  HTTP, `/v1/admin/metadata`), its lag behind the highest commit index, the leader changes
  this node saw;
* the pipeline: heartbeats/s (this node's own, or into the Kafka topic), dead letters, the
  streaming job's last batch and consumer lag (from its job-stats topic), liveness
  records/s, events-topic lag, ElectMaster outcomes; what the node cannot know right now
  is marked unavailable with the reason rather than guessed;
* the Delta tier's upload lag (leader).

`GET /v1/dashboard/sets/{name}` is a broker set's page: its state here, the failovers seen
here and its event history from the Delta tier. Everything is read-only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import aiohttp
from fastapi import APIRouter, HTTPException, Request
from fastapi import Path as FastAPIPath
from fastapi.responses import FileResponse, JSONResponse

from electra.security.auth import ANONYMOUS
from electra.security.credentials import ClientCredentials
from electra.security.http_auth import credential_still_valid
from electra.state.codes import Code
from electra.state.liveness import PIPELINE_LAG_BOUND_MS

from .event_stream import EventStream, refuse_http10
from .names import NAME_PATTERN
from .topic_stats import JOB_FIELDS, TopicStats

if TYPE_CHECKING:
    from .controller import Controller

log = logging.getLogger("electra.api.dashboard")

STATIC_DIR = Path(__file__).parent / "dashboard_static"
REPLAYED_AFTER_MS = 60_000  # an election older than this when applied here is log replay, not live


class DashboardFeed:
    """Builds the dashboard frame once per `interval_s` while viewers are connected; shares it."""

    def __init__(self, svc: Controller, *, interval_s: float = 1.0, failovers_kept: int = 200,
                 samples_kept: int = 300, clock: Callable[[], float] = time.time) -> None:
        self.svc = svc
        self.interval_s = interval_s
        self.clock = clock
        self.failovers: deque[dict] = deque(maxlen=failovers_kept)
        self.samples: deque[dict] = deque(maxlen=samples_kept)
        self.leader_changes = 0
        self._leader = svc.node.leader_id if svc.node.core else 0
        self._masters: dict[str, int | None] = {}
        self._viewers: set[asyncio.Queue] = set()
        self._task: asyncio.Task | None = None
        self._session: aiohttp.ClientSession | None = None
        # Peers' metadata is an observer read: in a secure group the node needs an observer token
        # and the CA in its environment (ELECTRA_TOKEN_FILE, ELECTRA_CA_FILE; `electra up` sets them).
        self._peer_credentials = ClientCredentials.from_env()
        self._last: dict[str, Any] | None = None  # previous counters, for rates
        self.frame: dict | None = None
        self.encoded = b""
        self.cost = {"frames": 0, "build_s": 0.0, "bytes_sent": 0}
        # With the Kafka pipeline: end offsets of the heartbeats and dead-letter topics, sampled in a
        # thread one at a time; a frame shows the newest finished sample (a slow Kafka never stalls it).
        pub = svc.events_publisher
        self.topic_stats = TopicStats(pub.bootstrap, pub.topics) if pub is not None else None
        self._topic_job: asyncio.Future | None = None
        self._topic_sample: dict | None = None
        self._remember_masters()
        svc.sm.on_event(self._on_event)
        svc.sm.on_restore(lambda _index: self._remember_masters())
        svc.node.on_role_change(self._on_role_change)

    # ------------------------------------------------------------------ what happens between frames
    def _remember_masters(self) -> None:
        self._masters = {name: bs.master_id for name, bs in self.svc.sm.sets.items()}

    def _on_role_change(self, _role, _term: int, leader_id: int) -> None:
        if leader_id and self._leader and leader_id != self._leader:  # learning the first leader is no change
            self.leader_changes += 1
        if leader_id:
            self._leader = leader_id

    def _on_event(self, index: int, ev: dict) -> None:
        if ev.get("type") != "ElectMaster":
            return
        name = ev["brokerName"]
        old = self._masters.get(name)
        new = ev.get("newMasterBrokerId")
        self._masters[name] = new
        if old is None and ev.get("masterEpoch") == 1:
            return  # a new set's first master: not a failover
        now_ms = int(self.clock() * 1000)
        detected = self.svc.sm.apply_time_ms or None
        replayed = detected is not None and now_ms - detected > REPLAYED_AFTER_MS
        bs = self.svc.sm.sets.get(name)
        lost = self.svc.liveness.group(bs.cluster, name).get(old) if bs is not None and old is not None else None
        known = bs is not None and old is not None
        gone = self.svc.liveness.disconnected_at(bs.cluster, name, old) if known else None
        noticed = self.svc.liveness.disconnect_noticed_at(bs.cluster, name, old) if known else None
        self.failovers.append({
            "set": name, "index": index, "old": old, "new": new, "epoch": ev.get("masterEpoch"),
            "elected": bool(ev.get("newMasterElected")),
            # when its session connection ended, or its silent session's last heartbeat (api/connection_loss.py),
            # else its last heartbeat seen here
            "lost_ms": gone if gone is not None else lost.last_update_ms if lost else None,
            # a lost connection is detected when it is lost, a silence when the timeout ran out (the command judges
            # liveness at the job's data horizon, which may be earlier)
            "detected_ms": max(detected, noticed) if detected is not None and noticed is not None else detected,
            "committed_ms": None if replayed else now_ms})

    # ------------------------------------------------------------------ viewers
    def subscribe(self) -> asyncio.Queue:
        q: asyncio.Queue = asyncio.Queue(maxsize=4)
        self._viewers.add(q)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run())
        return q

    def unsubscribe(self, q: asyncio.Queue) -> None:
        self._viewers.discard(q)

    @property
    def viewers(self) -> int:
        return len(self._viewers)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
        if self.topic_stats is not None:
            if self._topic_job is not None:
                await asyncio.gather(self._topic_job, return_exceptions=True)
            await asyncio.to_thread(self.topic_stats.close)

    async def _run(self) -> None:
        """Build and broadcast while anyone watches; end when the last viewer leaves."""
        self._last = None  # rates start afresh after an idle spell
        try:
            while self._viewers:
                await self.refresh()
                for q in list(self._viewers):
                    if q.full():  # a slow viewer skips frames, it never holds the node back
                        with contextlib.suppress(asyncio.QueueEmpty):
                            q.get_nowait()
                    q.put_nowait(self.encoded)
                await asyncio.sleep(self.interval_s)
        except asyncio.CancelledError:
            raise
        except Exception:  # keep the node serving; the next viewer restarts the feed
            log.exception("dashboard feed failed")

    def _poll_topics(self) -> None:
        job = self._topic_job
        if job is not None and not job.done():
            return
        if job is not None:
            exc = job.exception()
            self._topic_sample = {"error": repr(exc)} if exc else job.result()
        self._topic_job = asyncio.ensure_future(asyncio.to_thread(self.topic_stats.sample))

    async def refresh(self) -> dict:
        t0 = time.perf_counter()
        if self.topic_stats is not None:
            self._poll_topics()
        group = await self._group()
        frame = self._build(group)
        self.frame = frame
        self.encoded = f"event: frame\ndata: {json.dumps(frame, separators=(',', ':'))}\n\n".encode()
        self.cost["frames"] += 1
        self.cost["build_s"] += time.perf_counter() - t0
        return frame

    # ------------------------------------------------------------------ the frame
    def _build(self, group: dict) -> dict:
        svc = self.svc
        now = self.clock()
        now_ms = int(now * 1000)
        st = svc.node.status()
        counters = {"t": now, "heartbeats": getattr(svc, "heartbeats_received", 0),
                    "commit": st["commit_index"],
                    "liveness": svc.liveness_consumer.stats["records"] if svc.liveness_consumer else 0}
        last, self._last = self._last, counters
        dt = (now - last["t"]) if last else 0.0

        def rate(key: str) -> float | None:
            return round(max(0, counters[key] - last[key]) / dt, 1) if last and dt > 0 else None

        fleet = self._fleet(now_ms)
        pipeline = self._pipeline(st, rate("heartbeats"), rate("liveness"))
        sample = {"t": now_ms, "heartbeats_per_s": pipeline["heartbeats_per_s"], "commits_per_s": rate("commit"),
                  "live_master": fleet["live_master"], "master_down": fleet["master_down"],
                  "no_master": fleet["no_master"]}
        self.samples.append(sample)
        tier = getattr(svc, "tier", None)
        frames = max(1, self.cost["frames"])
        return {
            "ts": now_ms, "node": {"id": st["node_id"], "role": st["role"], "term": st["term"],
                                   "leader_id": st["leader_id"]},
            "fleet": fleet, "failovers": list(self.failovers)[-30:], "group": group,
            "pipeline": pipeline, "sample": sample,
            "tier": self._tier(tier, st),
            "feed": {"viewers": self.viewers, "frame_bytes": len(self.encoded),
                     "build_ms_avg": round(1000 * self.cost["build_s"] / frames, 2)},
        }

    @staticmethod
    def _tier(tier, st: dict) -> dict:
        if tier is None:
            return {"available": False, "why": "no --tier-uri on this node"}
        if st["role"] != "leader":
            return {"available": False, "why": f"the leader (node {st['leader_id'] or '?'}) uploads; see its dashboard"}
        return {"available": True, "lag_entries": tier.lag_entries(), "lag_seconds": round(tier.lag_seconds(), 1),
                "uploaded_index": tier.uploaded}

    LIVENESS_STALE_MS = PIPELINE_LAG_BOUND_MS  # as old as the liveness table itself stops waiting for the job

    def _liveness_unknown(self, now_ms: int) -> str | None:
        """Why this node's liveness view cannot be trusted (None when it can)."""
        consumer = self.svc.liveness_consumer
        if consumer is None:
            return None  # heartbeats come straight to this node
        last = consumer.stats["last_record_ms"]
        if not last:
            return "no liveness records from the streaming job yet"
        if now_ms - last > self.LIVENESS_STALE_MS:
            return f"the streaming job's last liveness record is {(now_ms - last) // 1000} s old"
        return None

    def _fleet(self, now_ms: int) -> dict:
        live = down = none = unknown = 0
        unhealthy: list[dict] = []
        why_unknown = self._liveness_unknown(now_ms)
        live_ms = self.svc.liveness.judge_at(now_ms)
        for name, bs in self.svc.sm.sets.items():
            if bs.master_id is None:
                none += 1
                state = "no master"
            elif why_unknown:
                unknown += 1
                continue
            else:
                info = self.svc.liveness.group(bs.cluster, name).get(bs.master_id)
                if info is not None and info.alive_at(live_ms):
                    live += 1
                    continue
                down += 1
                state = "master down"
            if len(unhealthy) < 20:
                unhealthy.append({"set": name, "state": state, "master": bs.master_id, "epoch": bs.master_epoch})
        return {"sets": len(self.svc.sm.sets), "live_master": live, "master_down": down, "no_master": none,
                "liveness_unknown": unknown, "liveness_unknown_why": why_unknown, "unhealthy": unhealthy}

    def _pipeline(self, st: dict, hb_rate: float | None, liveness_rate: float | None) -> dict:
        svc = self.svc
        pipe = svc.pipeline_status()
        out: dict[str, Any] = {"kafka": svc.liveness_consumer is not None, "heartbeats_per_s": hb_rate,
                               "heartbeats_note": "received by this node's /v1/heartbeat",
                               "elections": dict(svc.elections)}
        unavailable = {"spark_batch": "reported by the streaming job through Kafka: no Kafka pipeline here",
                       "kafka_consumer_lag": "reported by the streaming job through Kafka: no Kafka pipeline here"}
        if svc.liveness_consumer is not None:
            topics = self._topic_sample or {"error": "first sample pending"}
            if "error" in topics:
                out["heartbeats_per_s"] = None
                out["heartbeats_note"] = f"heartbeats topic offsets unavailable: {topics['error']}"
                unavailable["dead_letters"] = out["heartbeats_note"]
                unavailable["spark_batch"] = unavailable["kafka_consumer_lag"] = out["heartbeats_note"]
            else:
                out["heartbeats_per_s"] = topics["heartbeats_per_s"]
                out["heartbeats_note"] = (f"Kafka records into the heartbeats topic ({topics['heartbeats_total']} "
                                          "in all; an ingest node puts what it accepts for a partition within "
                                          "its linger window in one record)")
                out["dead_letters_total"] = topics["dead_letters_total"]
                job = topics.get("job")
                if job is None:
                    unavailable["spark_batch"] = "no batch report from the streaming job yet (job-stats topic empty)"
                    unavailable["kafka_consumer_lag"] = unavailable["spark_batch"]
                elif "invalid" in job:
                    unavailable["spark_batch"] = f"the newest job-stats record is not a batch report: {job['invalid']}"
                    unavailable["kafka_consumer_lag"] = unavailable["spark_batch"]
                else:
                    out["spark_batch"] = {k: job[k] for k in JOB_FIELDS}
                    out["kafka_consumer_lag"] = job["heartbeatsLag"]
                    del unavailable["spark_batch"], unavailable["kafka_consumer_lag"]
            out["liveness_records_per_s"] = liveness_rate
            out["liveness_last_record_ms"] = pipe["liveness"]["last_record_ms"]
        if svc.events_publisher is not None and st["role"] == "leader":
            out["events_topic_lag"] = max(0, st["applied_index"] - pipe.get("events_published_index", 0))
        out["unavailable"] = unavailable
        return out

    async def _group(self) -> dict:
        """Every member's metadata: this node's from memory, the others' over HTTP (bounded, in parallel)."""
        svc = self.svc
        me = svc.node.cfg.node_id

        async def ask(node_id: int, ep: str) -> dict:
            if node_id == me:
                return svc.metadata()
            creds = self._peer_credentials
            if self._session is None or self._session.closed:
                self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.8),
                                                      headers=creds.headers(),
                                                      connector=aiohttp.TCPConnector(ssl=creds.ssl_context()
                                                                                     or False))
            try:
                async with self._session.get(f"{creds.scheme}://{ep}/v1/admin/metadata") as r:
                    if r.status in (401, 403):  # a secure group: this node needs an observer credential
                        return {"node_id": node_id, "error": "needs an observer credential (ELECTRA_TOKEN_FILE)"}
                    return await r.json(content_type=None)
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                return {"node_id": node_id, "error": type(exc).__name__}

        peers = svc.http_peers or {me: None}
        replies = await asyncio.gather(*(ask(i, ep) for i, ep in sorted(peers.items())))
        top = max((m.get("commit_index", 0) for m in replies if "error" not in m), default=0)
        nodes = []
        for (i, ep), m in zip(sorted(peers.items()), replies, strict=True):
            if "error" in m:
                nodes.append({"id": i, "endpoint": ep, "reachable": False, "error": m["error"]})
                continue
            nodes.append({"id": i, "endpoint": ep, "reachable": True, "role": m.get("role"), "term": m.get("term"),
                          "commit_index": m.get("commit_index"), "applied_index": m.get("applied_index"),
                          "snapshot_index": m.get("snapshot_index"), "lag": top - (m.get("applied_index") or 0)})
        return {"leader_id": svc.node.leader_id, "leader_changes_seen_here": self.leader_changes, "nodes": nodes}

    # ------------------------------------------------------------------ one broker set
    def broker_set(self, name: str) -> dict | None:
        bs = self.svc.sm.sets.get(name)
        if bs is None:
            return None
        live_ms = self.svc.liveness.judge_at(int(self.clock() * 1000))
        live = {str(i): {"last_heartbeat_ms": info.last_update_ms, "alive": info.alive_at(live_ms)}
                for i, info in self.svc.liveness.group(bs.cluster, name).items()}
        return {"set": name, "state": bs.view().to_public(), "liveness": live,
                "failovers": [f for f in self.failovers if f["set"] == name]}


def tier_history(uri: str, storage_options: dict[str, str] | None, name: str, limit: int = 200) -> dict:
    """A broker set's newest `limit` events from the Delta tier (blocking: call in a thread)."""
    import pyarrow.compute as pc

    from electra.tiering.reader import TierReader, iso

    events = TierReader(uri, storage_options).table("events")
    rows = events.filter(pc.equal(events["broker_set"], name)).sort_by([("index", "descending")])
    out = [{"index": r["index"], "term": r["term"], "ts_ms": r["ts_ms"], "time": iso(r["ts_ms"]), "type": r["type"],
            "event": json.loads(r["payload"]), "state": json.loads(r["state"]) if r["state"] else None}
           for r in rows.slice(0, limit).to_pylist()]
    return {"available": True, "events": out, "total": rows.num_rows}


def dashboard_router(feed: DashboardFeed, max_viewers: int = 200) -> APIRouter:
    router = APIRouter()
    static_files = {p.name for p in STATIC_DIR.iterdir() if p.is_file()} if STATIC_DIR.is_dir() else set()

    @router.get("/dashboard", tags=["dashboard"], include_in_schema=False)
    async def page():
        return FileResponse(STATIC_DIR / "index.html", media_type="text/html")

    @router.get("/dashboard/static/{file}", tags=["dashboard"], include_in_schema=False)
    async def static(file: str):
        if file not in static_files:
            raise HTTPException(404)  # the API's one "no such endpoint" answer (api/app.py), the value not echoed
        return FileResponse(STATIC_DIR / file)

    @router.get("/v1/dashboard/stream", tags=["dashboard"])
    async def stream(request: Request):
        """Server-sent events: `history` once (recent samples), then one `frame` per second (503 when full)."""
        if (refused := refuse_http10(request)) is not None:
            return refused
        if feed.viewers >= max_viewers:  # each stream holds a connection and a queue, as a watcher does
            return JSONResponse({"code": int(Code.SYSTEM_BUSY),
                                 "remark": f"this node serves at most {max_viewers} dashboard viewers"},
                                status_code=503, headers={"Retry-After": "5"})
        q = feed.subscribe()

        async def events():
            yield f"event: history\ndata: {json.dumps(list(feed.samples))}\n\n".encode()
            if feed.encoded:
                yield feed.encoded
            while not await request.is_disconnected():
                try:
                    async with asyncio.timeout(5.0):
                        chunk = await q.get()
                except TimeoutError:
                    chunk = None
                if not credential_still_valid(request.scope):  # revoked, or signed out: the stream ends
                    return
                if chunk is None:
                    yield b": keep-alive\n\n"
                    continue
                feed.cost["bytes_sent"] += len(chunk)
                yield chunk

        # the viewer's slot is given back by the response, however the stream ends (even before it began)
        return EventStream(events(), lambda: feed.unsubscribe(q),
                           headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @router.get("/v1/dashboard/session", tags=["dashboard"])
    async def session(request: Request):
        """Who the page is signed in as (401 from the middleware when nobody): the page asks before streaming."""
        state = request.scope.get("state", {})
        principal = state.get("principal", ANONYMOUS)
        return {"name": principal.name, "role": principal.role, "cookie": bool(state.get("signed_in_by_cookie"))}

    @router.get("/v1/dashboard/frame", tags=["dashboard"])
    async def frame():
        """The newest frame (built now when no viewer keeps the feed running)."""
        return feed.frame if feed.viewers and feed.frame else await feed.refresh()

    @router.get("/v1/dashboard/sets/{name}", tags=["dashboard"])
    async def broker_set(name: Annotated[str, FastAPIPath(min_length=1, max_length=255, pattern=NAME_PATTERN)]):
        """One broker set: its state and liveness here, failovers seen here, its history in the Delta tier."""
        info = feed.broker_set(name)
        if info is None:  # the answer does not repeat the name: the page knows what it asked for
            return JSONResponse({"code": int(Code.CONTROLLER_BROKER_METADATA_NOT_EXIST),
                                 "remark": "no such broker set here"}, status_code=404)
        tier = getattr(feed.svc, "tier", None)
        if tier is None:
            info["history"] = {"available": False, "why": "no --tier-uri on this node"}
        else:
            try:
                info["history"] = await asyncio.to_thread(tier_history, tier.cfg.uri, tier.cfg.storage_options, name)
            except Exception as exc:  # an empty or unreachable tier
                info["history"] = {"available": False, "why": f"tier unavailable: {exc!r}"}
        return info

    return router
