"""The HTTP API of one controller node (FastAPI on uvicorn).

RocketMQ response codes travel in the body (`code`, `remark`, `header`, `body`)
with an HTTP status that says the same thing: 200 success, 404 unknown broker
set or broker, 409 a state conflict (fenced epoch, invalid master, ...), 400 an
invalid request, 503 not ready here (no leader known, follower too stale), 504
outcome unknown. Bad input never reaches the state machine: pydantic rejects it
with a 422 naming the field.

Writes sent to a follower are **redirected** (307, `Location` on the leader's
API, body code 2007 CONTROLLER_NOT_LEADER with the leader's id and address):
one hop fewer than forwarding, the client learns the leader, and a 307 keeps the
method and body. Reads on a follower are follower reads, served there.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Annotated, Literal

from fastapi import FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool
from starlette.exceptions import HTTPException as StarletteHTTPException

from electra.consensus.errors import RaftError
from electra.security.auth import limited_to_clusters
from electra.security.dashboard_login import LOGIN_PATH, LOGOUT_PATH
from electra.security.http_auth import NO_ROUTE_REMARK, credential_still_valid
from electra.state.codes import Code
from electra.state.limits import (
    CHECK_CODE_PATTERN,
    FLOAT_EXACT,
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    MAX_BROKER_ID,
)
from electra.state.liveness import BrokerLiveInfo

from .api_docs import api_docs_router
from .controller import Controller
from .dashboard import dashboard_router
from .event_stream import EventStream, refuse_http10
from .http_limits import DEFAULT_LIMITS, BodyLimit, HTTPLimits
from .invalid import SEND_JSON, invalid_request, is_json_media
from .names import NAME_PATTERN, Address, Name
from .replies import RequestMetrics, answered, pipeline_heartbeat, refused, request_url_on
from .watchers import OVERFLOW, RESYNC, NotApplied

_JAVA_LONG_TEXT = re.compile(r"[+-]?[0-9]+")


def _java_integer(value: object) -> object:
    """An integer as RocketMQ's fields carry one: a JSON number, or decimal text as `Long.parseLong` reads it.

    pydantic's lax mode also read `true` as 1 (`{"brokerIds": [true]}` cleaned broker 1), and "1_0" as 10
    and " 1" as 1, which Java refuses. An integral float (2.0) is still read as the number, within +-2**53: past
    that a double no longer holds the integer sent, and pydantic took 4611686018427387903.5 for 2**62."""
    if isinstance(value, bool):
        raise ValueError("a boolean is not a number")
    if isinstance(value, float) and not (value.is_integer() and -FLOAT_EXACT <= value <= FLOAT_EXACT):
        raise ValueError("not an integer (a number with a fraction, or too large to be read exactly)")
    if isinstance(value, str) and not _JAVA_LONG_TEXT.fullmatch(value):
        raise ValueError("not an integer (decimal digits, an optional sign)")
    return value


JAVA_INTEGER = BeforeValidator(_java_integer)
BrokerId = Annotated[int, JAVA_INTEGER, Field(ge=1, le=MAX_BROKER_ID)]
# RocketMQ's Java types (state/limits.py): numbers beyond them are a 422, never stored.
Int32 = Annotated[int, JAVA_INTEGER, Field(ge=INT32_MIN, le=INT32_MAX)]
Int64 = Annotated[int, JAVA_INTEGER, Field(ge=INT64_MIN, le=INT64_MAX)]
Epoch = Annotated[int, JAVA_INTEGER, Field(ge=0, le=INT32_MAX)]
Millis = Annotated[int, JAVA_INTEGER, Field(ge=0, le=INT64_MAX)]
TimeoutMillis = Annotated[int, JAVA_INTEGER, Field(ge=100, le=3_600_000)]


class Heartbeat(BaseModel):
    clusterName: Name
    brokerName: Name
    brokerAddr: Address
    brokerId: BrokerId
    epoch: Int32 = -1
    maxOffset: Int64 = -1
    confirmOffset: Int64 = -1
    heartbeatTimeoutMillis: TimeoutMillis = 10_000
    electionPriority: Int32 = 2**31 - 1


class ApplyBrokerId(BaseModel):
    clusterName: Name
    brokerId: BrokerId
    registerCheckCode: Annotated[str, Field(min_length=1, max_length=512, pattern=CHECK_CODE_PATTERN)]


class RegisterBroker(BaseModel):
    clusterName: Name
    brokerId: BrokerId
    brokerAddress: Address


class ElectMaster(BaseModel):
    clusterName: Name
    brokerId: BrokerId


class AdminElectMaster(ElectMaster):
    # Destructive (a master that may lack acknowledged messages): `true` or `false`, never "yes" or 1.
    unclean: StrictBool = False


class LiveBroker(BaseModel):
    broker_id: BrokerId
    broker_addr: Annotated[str, Field(min_length=1, max_length=255)]
    last_update_ms: Millis
    timeout_ms: TimeoutMillis = 10_000
    epoch: Int32 = -1
    max_offset: Int64 = -1
    confirm_offset: Int64 = -1
    priority: Int32 = 2**31 - 1


class ProposedElection(BaseModel):
    """An ElectMaster proposal from the streaming job: its heartbeat snapshot and the master epoch it saw."""

    clusterName: Name
    expectedMasterEpoch: Epoch
    live: Annotated[list[LiveBroker], Field(max_length=64)]
    proposedAtMs: Millis | None = None  # the instant the job judged liveness at


class LeadershipTransfer(BaseModel):
    model_config = ConfigDict(extra="forbid")  # `{"too": 3}` must not move leadership to anyone at all

    to: Annotated[int, JAVA_INTEGER, Field(ge=1, le=2**31 - 1)] | None = None  # None: the most caught-up follower


class AlterSyncStateSet(BaseModel):
    masterBrokerId: BrokerId
    masterEpoch: Epoch
    syncStateSet: Annotated[list[BrokerId], Field(min_length=1, max_length=64)]
    syncStateSetEpoch: Epoch


class SyncStateDataRequest(BaseModel):
    brokerNames: Annotated[list[Name], Field(min_length=1, max_length=10_000)]


class CleanBrokerData(BaseModel):
    clusterName: Name | None = None
    brokerIds: Annotated[list[BrokerId], Field(max_length=64)] | None = None
    cleanLivingBroker: StrictBool = False  # destructive: `true` or `false`, never "yes" or 1


class _RaftCollector:
    """Raft role, term, indexes and batching, read from the node at scrape time."""

    def __init__(self, svc: Controller) -> None:
        self.svc = svc

    def collect(self):
        st = self.svc.node.status()
        role = GaugeMetricFamily("electra_raft_role", "1 for the current role of this node", labels=["role"])
        for r in ("follower", "pre_candidate", "candidate", "leader"):
            role.add_metric([r], 1.0 if st["role"] == r else 0.0)
        yield role
        for key, doc in (("term", "current term"), ("commit_index", "commit index"),
                         ("applied_index", "applied index"), ("snapshot_index", "newest snapshot index")):
            yield GaugeMetricFamily(f"electra_raft_{key}", doc, value=st[key])
        yield GaugeMetricFamily("electra_raft_commit_stalled_seconds",
                                "how long this leader's commit index has stood still with entries waiting",
                                value=st["commit_stalled_s"])
        yield GaugeMetricFamily("electra_raft_tick_late_p99_seconds", "p99 of how late the last 100 Raft ticks ran",
                                value=st["tick_late_p99_ms"] / 1000)
        # counts that only grow are counters (`rate`, `increase` and reset handling apply; exported with `_total`)
        for key, doc in (("tick_errors", "Raft ticks that raised (logged, counted, re-armed)"),
                         ("snapshot_failures", "snapshots this node failed to take (retried with a growing wait)")):
            yield CounterMetricFamily(f"electra_raft_{key}", doc, value=st[key])
        batches = max(1, st["batches"])
        yield GaugeMetricFamily("electra_raft_proposal_batch_avg", "average proposals per batch",
                                value=st["proposals"] / batches)
        yield GaugeMetricFamily("electra_raft_proposal_batch_max", "largest proposal batch", value=st["max_batch"])
        pipe = self.svc.pipeline_status()
        if "events_published_index" in pipe:
            yield GaugeMetricFamily("electra_events_published_index", "last Raft index in the events topic",
                                    value=pipe["events_published_index"])
        if "liveness" in pipe:
            yield CounterMetricFamily("electra_liveness_records", "liveness records consumed from Kafka",
                                      value=pipe["liveness"]["records"])
            lane = CounterMetricFamily("electra_connection_loss", "disconnected records the connection-loss lane "
                                       "took, and its elections by outcome (api/connection_loss.py)",
                                       labels=["outcome"])
            for k, v in pipe["connection_loss"].items():
                lane.add_metric([k], v)
            yield lane
        el = CounterMetricFamily("electra_elections", "ElectMaster outcomes handled by this node", labels=["result"])
        for k, v in self.svc.elections.items():
            el.add_metric([k], v)
        yield el


def validation_errors(exc: RequestValidationError) -> list[dict[str, str]]:
    """Each bad field and what is wrong with it; never the value sent (it may be huge or hostile)."""
    out = []
    for e in exc.errors()[:20]:
        loc = tuple(e.get("loc", ()))
        if e.get("type") == "json_invalid" and loc[:1] == ("body",):  # FastAPI puts the character's position there
            where = f" at character {loc[1]}" if len(loc) > 1 else ""
            reason = (e.get("ctx") or {}).get("error")
            problem = f"not JSON{where}" + (f": {reason}" if reason else "")
            out.append({"field": "body", "problem": problem[:200]})
            continue
        field = ".".join(str(p) for p in loc)
        out.append({"field": field[:200], "problem": str(e.get("msg", "invalid"))[:200]})
    return out


def _event_index(text: str) -> int | None:
    """A `Last-Event-ID` as an event index (ASCII digits, at most INT64_MAX), else None."""
    text = text.lstrip("0") or "0"  # (no strip(): " 5" is no index, as "+5" is not)
    if len(text) > 19 or not (text.isascii() and text.isdigit()):
        return None
    value = int(text)
    return value if value <= INT64_MAX else None


def _body_not_json(request: Request, exc: RequestValidationError) -> bool:
    """A body refused because it was sent as something else than JSON (`text/plain`, a form: curl's `-d` without
    `-H`) or without a Content-Type, which FastAPI then does not parse: 415 says so, where 422 blamed the body's
    content. (FastAPI's strict content type: a browser sends a body without one, or as text/plain, without asking
    the server first, so reading it as JSON would let any web page write to a node it can reach.) No body at all
    stays a 422 naming the missing body."""
    content_type = request.headers.get("content-type")
    if is_json_media(content_type):
        return False
    refused = [e for e in exc.errors() if tuple(e.get("loc", ()))[:1] == ("body",)]
    if not content_type and all(e.get("type") == "missing" and tuple(e["loc"]) == ("body",) for e in refused):
        return False  # (also when `refused` is empty: no body error at all)
    return bool(refused)


def _invalid(errors: list[dict[str, str]]) -> JSONResponse:
    """422 with code 2005 naming each bad field: every invalid request's answer."""
    return JSONResponse(invalid_request(errors), status_code=422)


class HeadAsGet:
    """ASGI middleware: `HEAD` on a GET route is answered as the GET (uvicorn sends the head without the
    body), as RFC 9110 asks of every server; load balancers probe `/healthz` that way. A stream
    (`/watch`, the dashboard's) has no end to measure, so `HEAD` there stays 405."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        # (rstrip: a route's `$` also matches before a final newline, so `/watch%0A` reaches the watch route)
        if scope["type"] == "http" and scope["method"] == "HEAD" and \
                not scope["path"].rstrip("\n").endswith(("/watch", "/stream")):
            scope = {**scope, "method": "GET"}  # a copy: the server's scope still says HEAD (no body sent)
        await self.app(scope, receive, send)


def create_app(controller: Controller, limits: HTTPLimits = DEFAULT_LIMITS,
               metrics: RequestMetrics | None = None) -> FastAPI:
    """The node's whole API (OpenAPI lists every route); the lean path (api/lean_path.py) serves the hot ones."""
    svc = controller.requests
    # No trailing-slash redirects: Starlette builds their `Location` from the client's `Host` header.
    app = FastAPI(title="Electra controller", version="0.1.0", redirect_slashes=False,
                  description="RocketMQ 5 controller semantics on a Raft-replicated state machine",
                  docs_url=None, redoc_url=None)  # /docs below, from this machine (FastAPI's load from a CDN)
    app.include_router(api_docs_router())
    app.add_middleware(BodyLimit, max_bytes=limits.max_body_bytes)
    app.add_middleware(HeadAsGet)
    watchers = 0  # open SSE watch streams on this node

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        count_invalid(request)
        if _body_not_json(request, exc):
            return JSONResponse({"code": int(Code.CONTROLLER_INVALID_REQUEST), "remark": SEND_JSON}, status_code=415)
        return _invalid(validation_errors(exc))

    def count_invalid(request: Request) -> None:
        """An invalid request to a route is counted like any answer of it, under code 2005."""
        route = getattr(request.scope.get("route"), "name", None)  # named after its metrics label
        if route is not None:
            counted.count(route, str(int(Code.CONTROLLER_INVALID_REQUEST)))

    @app.exception_handler(StarletteHTTPException)
    async def framework_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        """The framework's own refusals (no route, wrong method, a body it cannot parse) in the API's shape."""
        if exc.status_code == 400:  # FastAPI: a body `json.loads` cannot read (too deep, a 4,301-digit number)
            count_invalid(request)
            return _invalid([{"field": "body", "problem": "not JSON that can be read (nested too deep, a number "
                                                          "of over 4,300 digits, or not UTF-8)"}])
        remark = {404: NO_ROUTE_REMARK, 405: "method not allowed on this endpoint"}.get(exc.status_code,
                                                                                           str(exc.detail)[:200])
        if exc.status_code in (404, 405):  # a misconfigured client shows up in the metrics (bounded labels)
            counted.count("no_route" if exc.status_code == 404 else "wrong_method",
                          int(Code.REQUEST_CODE_NOT_SUPPORTED))
        return JSONResponse({"code": int(Code.REQUEST_CODE_NOT_SUPPORTED), "remark": remark},
                            status_code=exc.status_code, headers=exc.headers)
    counted = metrics or RequestMetrics()
    app.state.request_metrics = counted  # shared with the lean path (api/lean_path.py)
    registry = counted.registry
    registry.register(_RaftCollector(controller))
    tier = controller.tier  # electra.tiering: upload lag metrics and GET /v1/admin/history
    if tier is not None:
        from electra.tiering.api import history_router

        registry.register(tier.collector())
        app.include_router(history_router(tier.cfg.uri, tier.cfg.storage_options))
    else:  # (here, not in electra.tiering.api: that module loads pyarrow, which a node without a tier never needs)
        @app.get("/v1/admin/history", include_in_schema=False)
        async def no_history() -> JSONResponse:
            """Said plainly: "no such endpoint" read as a wrong URL, not as a node started without a tier."""
            return JSONResponse({"code": int(Code.REQUEST_CODE_NOT_SUPPORTED),
                                 "remark": "this node keeps no history: start it with --tier-uri, or read the tier "
                                           "with `electra history --tier-uri URI`"}, status_code=404)

    # read-only pages and their SSE stream, whose viewers are capped as the watchers are
    app.include_router(dashboard_router(controller.dashboard, max_viewers=limits.max_watchers))

    async def run(endpoint: str, request: Request, coro) -> JSONResponse:
        t0 = time.perf_counter()
        try:
            reply = answered(counted, endpoint, await coro, t0)
        except RaftError as exc:
            reply = refused(counted, endpoint, exc, svc.leader_address(),
                            request_url_on(request.url.scheme, request.url.path, request.url.query))
        return JSONResponse(reply.body, status_code=reply.status, headers=reply.headers or None)

    async def done(value):
        return value

    # ------------------------------------------------------------------ broker endpoints
    @app.post("/v1/heartbeat", tags=["broker"])
    async def heartbeat(hb: Heartbeat, request: Request):
        """With the heartbeat pipeline on, the heartbeat goes to Kafka (503 + Retry-After if unreachable)."""
        if controller.heartbeat_producer is not None:
            reply = pipeline_heartbeat(counted, controller.heartbeat_producer, hb.model_dump_json().encode(),
                                       svc.now_ms())
            return Response(reply.body, status_code=reply.status, media_type="application/json",
                            headers=reply.headers or None)
        return await run("heartbeat", request, done(svc.heartbeat(
            hb.clusterName, hb.brokerName, hb.brokerId, hb.brokerAddr, epoch=hb.epoch, max_offset=hb.maxOffset,
            confirm_offset=hb.confirmOffset, timeout_ms=hb.heartbeatTimeoutMillis, priority=hb.electionPriority)))

    @app.get("/v1/broker-sets/{name}/next-broker-id", tags=["broker"])
    async def next_broker_id(name: Name, request: Request,
                             cluster: Annotated[str, Query(min_length=1, max_length=255, pattern=NAME_PATTERN)]):
        return await run("next_broker_id", request, svc.get_next_broker_id(cluster, name))

    @app.post("/v1/broker-sets/{name}/apply-broker-id", tags=["broker"])
    async def apply_broker_id(name: Name, req: ApplyBrokerId, request: Request):
        return await run("apply_broker_id", request,
                         svc.apply_broker_id(req.clusterName, name, req.brokerId, req.registerCheckCode))

    @app.post("/v1/broker-sets/{name}/register", tags=["broker"], name="register_broker")
    async def register(name: Name, req: RegisterBroker, request: Request):
        return await run("register_broker", request,
                         svc.register_broker(req.clusterName, name, req.brokerId, req.brokerAddress))

    @app.post("/v1/broker-sets/{name}/elect-master", tags=["broker"])
    async def elect_master(name: Name, req: ElectMaster, request: Request):
        return await run("elect_master", request, svc.elect_master(req.clusterName, name, req.brokerId))

    @app.post("/v1/broker-sets/{name}/sync-state-set", tags=["broker"])
    async def alter_sync_state_set(name: Name, req: AlterSyncStateSet, request: Request):
        return await run("alter_sync_state_set", request, svc.alter_sync_state_set(
            name, req.masterBrokerId, req.masterEpoch, req.syncStateSet, req.syncStateSetEpoch))

    @app.get("/v1/broker-sets/{name}/replica-info", tags=["broker"])
    async def replica_info(name: Name, request: Request,
                           consistency: Literal["linearizable", "lease"] = "linearizable"):
        """`consistency=lease`: the leader answers from its lease, without a heartbeat round
        (linearizable while clocks drift less than the lease's margin, docs/reads-and-snapshots.md)."""
        read = svc.get_replica_info(name, lease=True) if consistency == "lease" else svc.get_replica_info(name)
        return await run("replica_info", request, read)

    @app.get("/v1/broker-sets/{name}/watch", tags=["broker"])
    async def watch(name: Name, request: Request,
                    after: Annotated[str | None, Query(max_length=64, description=(
                        "resume after this event index (the `id` of the last event received: ASCII digits; empty: "
                        "none received yet)"))] = None,
                    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID", description=(
                        "as `after`; sent by an EventSource when it reconnects, and preferred to `after`"))] = None):
        """Server-sent events: one `role-change` event per election or sync-state-set change (503 when full).

        Each event's `id` is its Raft index, the same on every node. A watcher that reconnects (to any
        node) with `Last-Event-ID` or `after` first gets the changes it missed, or one `resync` event
        with the set as it is now when this node no longer holds them. A watcher too slow for its queue
        has its stream ended, and resumes the same way."""
        nonlocal watchers

        def counted_as(code: int, reply: JSONResponse) -> JSONResponse:
            """Every answer of the route is counted, as every other route's (docs/controller-api.md)."""
            counted.count("watch", code)
            return reply

        if (refused := refuse_http10(request)) is not None:
            return counted_as(int(Code.REQUEST_CODE_NOT_SUPPORTED), refused)
        # One rule for both: ASCII digits, empty for none received yet (as the SSE spec). The header wins: it is
        # what an EventSource sends when it reconnects, to the URL (with its `after`) it first opened.
        resume = None
        for field, given in (("header.Last-Event-ID", last_event_id), ("query.after", after)):
            if given:
                resume = _event_index(given)
                if resume is None:
                    return counted_as(int(Code.CONTROLLER_INVALID_REQUEST), _invalid([{
                        "field": field, "problem": "must be the id of an event this stream sent (a Raft index: "
                        "digits)"}]))
                break
        if watchers >= limits.max_watchers:
            return counted_as(int(Code.SYSTEM_BUSY), JSONResponse(
                {"code": int(Code.SYSTEM_BUSY), "remark": f"this node serves at most {limits.max_watchers} watchers"},
                status_code=503, headers={"Retry-After": "5"}))
        watchers += 1
        q = controller.watchers.subscribe(name)

        def release() -> None:
            nonlocal watchers
            watchers -= 1
            controller.watchers.unsubscribe(name, q)

        first: list[tuple[str, dict]] = []
        if resume is not None:
            principal = request.scope.get("state", {}).get("principal")
            cluster_ok = (lambda c: principal.in_scope(c, None)) \
                if principal is not None and limited_to_clusters(principal) else None
            try:
                first = await controller.watchers.resume(name, resume, cluster_ok)
            except NotApplied as exc:
                release()
                return counted_as(int(Code.SYSTEM_BUSY), JSONResponse(
                    {"code": int(Code.SYSTEM_BUSY), "remark": f"{exc}; try another node"},
                    status_code=503, headers={"Retry-After": "1"}))
            # The wait may have seen the set created in another cluster, or the credential revoked: checked
            # again on the state `first` was read from (no await in between), before any of it is sent.
            if not credential_still_valid(request.scope):
                release()
                return counted_as(int(Code.NO_PERMISSION), JSONResponse(
                    {"code": int(Code.NO_PERMISSION),
                     "remark": "the credential no longer allows watching this broker set"}, status_code=403))

        async def stream():
            sent = resume if resume is not None else -1
            yield ": watching " + name + "\n\n"
            for kind, ev in first:
                sent = ev["index"] if kind == RESYNC else max(sent, ev["index"])
                yield f"event: {kind}\nid: {ev['index']}\ndata: {json.dumps(ev)}\n\n"
            while not await request.is_disconnected() and credential_still_valid(request.scope):
                try:
                    async with asyncio.timeout(5.0):
                        ev = await q.get()
                except TimeoutError:
                    yield ": keep-alive\n\n"
                    continue
                if ev is None or not credential_still_valid(request.scope):  # stopping, or the token revoked
                    return
                if ev == OVERFLOW:
                    yield ": this watcher fell behind; reconnect with Last-Event-ID to resume\n\n"
                    return
                if ev == RESYNC:  # a snapshot replaced the state: the set as it has it
                    now = controller.watchers.current(name)
                    sent = now["index"]
                    yield f"event: resync\nid: {sent}\ndata: {json.dumps(now)}\n\n"
                    continue
                if ev["index"] <= sent:  # already sent by the resume, or covered by a resync
                    continue
                sent = ev["index"]
                yield f"event: role-change\nid: {sent}\ndata: {json.dumps(ev)}\n\n"

        counted.count("watch", int(Code.SUCCESS))
        return EventStream(stream(), release)

    @app.post("/v1/internal/broker-sets/{name}/elect-master", tags=["internal"])
    async def proposed_election(name: Name, req: ProposedElection, request: Request):
        """The streaming job's election proposal; fenced by `expectedMasterEpoch` (409, code 2000, when stale)."""
        live = [BrokerLiveInfo(**b.model_dump()) for b in req.live]
        return await run("proposed_election", request,
                         svc.propose_election(req.clusterName, name, req.expectedMasterEpoch, live,
                                              judged_at_ms=req.proposedAtMs))

    # ------------------------------------------------------------------ admin endpoints
    @app.post("/v1/admin/sync-state-data", tags=["admin"])
    async def sync_state_data(req: SyncStateDataRequest, request: Request):
        return await run("sync_state_data", request, sync_state_in_slices(req.brokerNames))

    async def sync_state_in_slices(names: list[str]) -> dict:
        """Up to 10,000 sets, 500 at a time, yielding to the event loop (Raft ticks) in between."""
        res = None
        for lo in range(0, len(names), 500):
            part = svc.get_sync_state_data(names[lo:lo + 500])
            if res is None:
                res = part
            else:
                res["body"]["replicasInfoTable"].update(part["body"]["replicasInfoTable"])
            await asyncio.sleep(0)
        return res

    @app.post("/v1/admin/broker-sets/{name}/clean", tags=["admin"], name="clean_broker_data")
    async def clean(name: Name, req: CleanBrokerData, request: Request):
        return await run("clean_broker_data", request,
                         svc.clean_broker_data(req.clusterName, name, req.brokerIds, req.cleanLivingBroker))

    @app.post("/v1/admin/broker-sets/{name}/elect-master", tags=["admin"], name="admin_elect_master")
    async def admin_elect(name: Name, req: AdminElectMaster, request: Request):
        return await run("admin_elect_master", request,
                         svc.elect_master(req.clusterName, name, req.brokerId, designate=True, unclean=req.unclean))

    @app.post("/v1/admin/leadership", tags=["admin"], name="transfer_leadership")
    async def transfer_leadership(req: LeadershipTransfer, request: Request):
        """Move leadership (before maintenance on the leader's host): to node `to`, or to the most caught-up
        follower; on a follower, a 307 to the leader."""
        return await run("transfer_leadership", request, controller.transfer_leadership(req.to))

    @app.get("/v1/admin/metadata", tags=["admin"])
    async def metadata():
        return controller.metadata()

    # ------------------------------------------------------------------ operations
    @app.get("/healthz", tags=["ops"])
    async def healthz():
        """503 when this node is stopped, its Raft ticks stalled, no leader was known for an election timeout,
        or it leads but its commit index stood still with entries waiting for three election timeouts."""
        st = controller.node.status()
        ok, reason = controller.node.health()
        return JSONResponse({"ok": ok, "reason": reason, "role": st["role"], "leader_id": st["leader_id"]},
                            status_code=200 if ok else 503)

    @app.get("/metrics", tags=["ops"], response_class=PlainTextResponse,
             responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format 0.0.4"}})
    async def metrics():
        return Response(generate_latest(registry), media_type="text/plain; version=0.0.4")

    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


def _openapi(app: FastAPI) -> dict:
    """FastAPI's schema, plus what it cannot see: the bearer token every route but the public ones asks for
    (security/http_auth.py answers 401/403 before any route), and the dashboard's sign-in and sign-out, which
    that middleware serves itself (security/dashboard_login.py)."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    schema.setdefault("components", {})["securitySchemes"] = {
        "bearer": {"type": "http", "scheme": "bearer",
                   "description": "a role token (`electra cert create-token`); the dashboard's reads also take "
                                  "its session cookie"}}
    schema["security"] = [{"bearer": []}]
    refused = {"401": {"description": "no token, or an unknown or revoked one (code 16)"},
               "403": {"description": "the token's role or scope does not allow this call (code 16)"}}
    for path, ops in schema["paths"].items():
        for op in ops.values():
            if path in ("/healthz", "/dashboard") or path.startswith("/dashboard/static"):
                op["security"] = []  # public
            else:
                op.setdefault("responses", {}).update(refused)
            if "requestBody" in op:
                op.setdefault("responses", {})["415"] = {"description": "the body was not sent as JSON (code 2005)"}
            if path.endswith(("/watch", "/dashboard/stream")):  # api/event_stream.py: refuse_http10
                op.setdefault("responses", {})["505"] = {"description": "an HTTP/1.0 client, which cannot read a "
                                                                        "chunked stream (code 3)"}
    schema["paths"][LOGIN_PATH] = {"post": {
        "tags": ["dashboard"], "summary": "Sign in: a token for a session cookie (observer or admin role)",
        "security": [],
        "requestBody": {"required": True, "content": {"application/json": {"schema": {
            "type": "object", "required": ["token"], "properties": {"token": {"type": "string"}}}}}},
        "responses": {"204": {"description": "signed in: `Set-Cookie` holds the session (HttpOnly, Secure, "
                                             "SameSite=Strict)"},
                      "401": {"description": "unknown or revoked token"},
                      "403": {"description": "a role that may not read the dashboard"},
                      "413": {"description": "body too large"}, "415": {"description": "not application/json"},
                      "422": {"description": "no `token` string in the body"}}}}
    schema["paths"][LOGOUT_PATH] = {"post": {
        "tags": ["dashboard"], "summary": "Sign out: the session ends and its cookie is cleared", "security": [],
        "responses": {"204": {"description": "signed out"}}}}
    app.openapi_schema = schema
    return schema
