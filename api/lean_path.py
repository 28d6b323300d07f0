"""The broker requests without a framework: match, authenticate, validate, call the service, answer.

FastAPI with pydantic costs about 400 µs of CPU per request; the Raft work of a write is
about 10 µs. This path serves the hot broker routes (heartbeat, next id, apply id, register,
elect, sync-state set, replica info) straight from the HTTP parser (`api/lean_http.py`):
msgspec decodes and validates the body into structs derived from the FastAPI models (so the
two never describe different inputs), the same auth functions check the caller
(`security/http_auth.py`), the same `api/replies.py` turns outcomes and engine errors into
answers and metrics, and the answer is JSON encoded by msgspec.

It serves only requests it can answer exactly as FastAPI would: a canonical, valid request
(exact types, no field the model does not name, `Content-Type: application/json`, names
without percent-escapes, a Content-Length body). Everything else — every 422, any coercion
pydantic's lax mode would do, odd encodings — is handed to the FastAPI application, which then
answers it. tests/unit/test_lean_parity.py sends one table of requests,
valid and invalid, through both paths and compares status, body and headers.

`serve` is two halves: admission (auth, decoding) and `execute` (the controller's answer). In a
front-end process (`electra node --front-ends N`, api/front_end.py) `forward` carries admitted
requests over the link to the Raft process, which runs `execute` (api/front_ends.py).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any, get_args, get_origin

import msgspec
from annotated_types import Ge, Le, MaxLen, MinLen
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from electra.consensus.errors import RaftError
from electra.security.auth import (
    AuthError,
    Principal,
    TokenStore,
    authorize_set_clusters,
    limited_to_clusters,
    rule_for,
)
from electra.security.http_auth import authorize_body, authorize_path, error_reply
from electra.state.limits import content_length

from . import app as models
from .futures import then
from .replies import Reply, RequestMetrics, answered, count_auth_refusal, pipeline_heartbeat, refused, request_url_on
from .requests import BrokerRequests


# ------------------------------------------------------------------ pydantic models → msgspec types
def _meta(metadata: list) -> msgspec.Meta | None:
    kw: dict[str, Any] = {}
    for m in metadata:
        if isinstance(m, Ge):
            kw["ge"] = m.ge
        elif isinstance(m, Le):
            kw["le"] = m.le
        elif isinstance(m, MinLen):
            kw["min_length"] = m.min_length
        elif isinstance(m, MaxLen):
            kw["max_length"] = m.max_length
        elif m is models.JAVA_INTEGER:
            continue  # msgspec's int is strict: it takes JSON integers only
        elif getattr(m, "pattern", None) is not None:
            # msgspec searches with Python's re, where `$` also matches before a final newline;
            # pydantic's `$` is the end of the string: `\Z` is that in Python.
            pat = m.pattern
            kw["pattern"] = pat[:-1] + r"\Z" if pat.endswith("$") and not pat.endswith(r"\$") else pat
        else:
            raise TypeError(f"no msgspec equivalent for the constraint {m!r}")
    return msgspec.Meta(**kw) if kw else None


def _lean_type(annotation: Any, metadata: list) -> Any:
    """The msgspec type of one pydantic field (scalar, Annotated scalar, or a list of them)."""
    if get_origin(annotation) is Annotated:
        inner, *extra = get_args(annotation)
        infos = [m for e in extra for m in (e.metadata if isinstance(e, FieldInfo) else [e])]
        return _lean_type(inner, infos + metadata)
    if get_origin(annotation) is list:
        (item,) = get_args(annotation)
        annotation = list[_lean_type(item, [])]
    elif annotation not in (int, str, bool):
        raise TypeError(f"no lean type for {annotation!r}")
    meta = _meta(metadata)
    return Annotated[annotation, meta] if meta is not None else annotation


def lean_struct(model: type[BaseModel]) -> type[msgspec.Struct]:
    """A msgspec Struct that accepts exactly the canonical inputs `model` accepts.

    A field `model` does not name is refused here (the application then answers, ignoring it as
    pydantic does): msgspec skips an unknown field without reading it the way Python's `json` would,
    so bytes `json` refuses (a number of over 4,300 digits, invalid UTF-8) would pass here and fail
    there, and the two paths would answer the same request differently."""
    fields = []
    for name, f in model.model_fields.items():
        typ = _lean_type(f.annotation, list(f.metadata))
        fields.append((name, typ) if f.default is PydanticUndefined else (name, typ, f.default))
    return msgspec.defstruct(f"Lean{model.__name__}", fields, forbid_unknown_fields=True)


def lean_scalar(annotated: Any) -> Any:
    """The msgspec type of a path or query parameter's annotation (`models.Name`)."""
    return _lean_type(annotated, [])


def _auth_refusal(metrics: RequestMetrics, err: AuthError) -> Reply:
    status, headers, raw = error_reply(err)
    count_auth_refusal(metrics, status)
    return Reply(status, raw, {k.decode(): v.decode() for k, v in headers if k not in (b"content-length",
                                                                                       b"content-type")})


# ------------------------------------------------------------------ routes
@dataclass(frozen=True)
class Route:
    endpoint: str  # the metrics label, as FastAPI's routes use it
    method: bytes
    struct: type[msgspec.Struct] | None  # the body, for POST routes
    call: Callable[..., Any]  # (service, name, cluster query, body) -> dict | awaitable dict


def _routes() -> dict[str, Route]:
    def hb(s: BrokerRequests, _n, _q, b) -> dict:
        return s.heartbeat(b.clusterName, b.brokerName, b.brokerId, b.brokerAddr, epoch=b.epoch,
                           max_offset=b.maxOffset, confirm_offset=b.confirmOffset,
                           timeout_ms=b.heartbeatTimeoutMillis, priority=b.electionPriority)

    return {
        "heartbeat": Route("heartbeat", b"POST", lean_struct(models.Heartbeat), hb),
        "next-broker-id": Route("next_broker_id", b"GET", None, lambda s, n, q, _b: s.get_next_broker_id(q, n)),
        "apply-broker-id": Route("apply_broker_id", b"POST", lean_struct(models.ApplyBrokerId),
                                 lambda s, n, _q, b: s.apply_broker_id(b.clusterName, n, b.brokerId,
                                                                       b.registerCheckCode)),
        "register": Route("register_broker", b"POST", lean_struct(models.RegisterBroker),
                          lambda s, n, _q, b: s.register_broker(b.clusterName, n, b.brokerId, b.brokerAddress)),
        "elect-master": Route("elect_master", b"POST", lean_struct(models.ElectMaster),
                              lambda s, n, _q, b: s.elect_master(b.clusterName, n, b.brokerId)),
        "sync-state-set": Route("alter_sync_state_set", b"POST", lean_struct(models.AlterSyncStateSet),
                                lambda s, n, _q, b: s.alter_sync_state_set(n, b.masterBrokerId, b.masterEpoch,
                                                                           b.syncStateSet, b.syncStateSetEpoch)),
        "replica-info": Route("replica_info", b"GET", None, lambda s, n, _q, _b: s.get_replica_info(n)),
    }


ROUTES = _routes()
ROUTES_BY_ENDPOINT = {r.endpoint: r for r in ROUTES.values()}
_SET_ROUTE = re.compile(rb"/v1/broker-sets/([^/?#%]+)/([a-z-]+)")
_CLUSTER_QUERY = re.compile(rb"cluster=([^&;%+#=]{1,255})")  # a single, plain value (else FastAPI parses it)
_NAME = lean_scalar(models.Name)


@dataclass(slots=True)
class LeanRequest:
    """One broker request the lean path will serve, once its body is in."""

    route: Route
    path: str
    name: str | None
    query: str
    cluster: str | None
    authorization: str | None
    t0: float
    # A broker credential limited to some clusters: checked against the named sets' clusters where the
    # state is (`execute`; a front-end sends it along with the call).
    limited: Principal | None = None


Forward = Callable[["LeanRequest", "msgspec.Struct | None", str], Awaitable[Reply]]


class LeanPath:
    """Serves the hot broker routes of one node; `prepare` says which requests are its own."""

    PATHS_KEPT = 65_536  # routed URL paths remembered (7 routes per broker set)

    def __init__(self, svc: BrokerRequests | None, metrics: RequestMetrics, tokens: TokenStore | None,
                 heartbeat_producer=None, forward: Forward | None = None,
                 cluster_of: Callable[[str], str | None] | None = None) -> None:
        self.svc = svc  # None in a front-end process: `forward` sends admitted requests to the Raft process
        self.forward = forward
        self.cluster_of = cluster_of  # a broker set's cluster in the applied state (with `svc`)
        self.metrics = metrics
        self.tokens = tokens  # None: insecure mode
        self.heartbeat_producer = heartbeat_producer  # with the Kafka pipeline: heartbeats go there
        self.stats = {"served": 0, "to_app": 0}  # requests answered here / handed to the FastAPI app
        self._decoders = {r.struct: msgspec.json.Decoder(r.struct) for r in ROUTES.values() if r.struct}
        # URL path -> its route, set name and text: a broker set's few paths are routed and their name
        # validated once, not on every request (bounded: emptied when full).
        self._paths: dict[bytes, tuple[Route, str | None, str]] = {}
        self._encode = msgspec.json.Encoder().encode

    def prepare(self, method: bytes, url: bytes, headers: list[tuple[bytes, bytes]]) -> LeanRequest | None:
        """A request of this path (head checked: route, method, body framing, content type), or None."""
        path, _, query = url.partition(b"?")
        known = self._paths.get(path)
        if known is None:
            known = self._route(path)
            if known is None:
                return None
            if len(self._paths) >= self.PATHS_KEPT:
                self._paths.clear()
            self._paths[path] = known
        route, name, path_text = known
        if method != route.method:
            return None
        cluster = None
        if route.endpoint == "next_broker_id":
            q = _CLUSTER_QUERY.fullmatch(query)
            if q is None:
                return None
            try:
                cluster = msgspec.convert(q.group(1).decode("ascii"), _NAME)  # a name, as the body's clusterName
            except (UnicodeDecodeError, msgspec.ValidationError):
                return None
        elif query:
            return None
        length, ctype, authorization = None, None, None
        for k, v in headers:
            if k == b"content-length":
                length = v
            elif k == b"content-type":
                if ctype is not None:  # twice: the application reads the first; it answers, so both paths agree
                    return None
                ctype = v
            elif k == b"authorization":
                if authorization is not None:  # likewise (the auth middleware checks the first)
                    return None
                authorization = v.decode("latin-1")
            elif k == b"transfer-encoding" or k == b"expect":
                return None
        if route.struct is not None:
            if ctype is None or ctype.lower() != b"application/json" or length is None \
                    or not 0 < (content_length(length) or 0) <= (1 << 20):
                return None
        elif length not in (None, b"0"):
            return None
        return LeanRequest(route, path_text, name, query.decode("ascii"), cluster, authorization,
                           time.perf_counter())

    @staticmethod
    def _route(path: bytes) -> tuple[Route, str | None, str] | None:
        """The route, validated set name and text of a URL path this path serves, or None."""
        if path == b"/v1/heartbeat":
            return ROUTES["heartbeat"], None, "/v1/heartbeat"
        m = _SET_ROUTE.fullmatch(path)
        route = ROUTES.get(m.group(2).decode("ascii")) if m else None
        if route is None:
            return None
        try:
            name = msgspec.convert(m.group(1).decode("utf-8"), _NAME)
        except (msgspec.ValidationError, UnicodeDecodeError):
            return None
        return route, name, path.decode("ascii")

    def serve(self, req: LeanRequest, body: bytes, scheme: str) -> Reply | Awaitable[Reply] | None:
        """The answer (or a future one); None hands the request to the FastAPI application."""
        out = self._serve(req, body, scheme)
        self.stats["served" if out is not None else "to_app"] += 1
        return out

    def _serve(self, req: LeanRequest, body: bytes, scheme: str) -> Reply | Awaitable[Reply] | None:
        # The credential first (401/403 before any word on the body, as the middleware answers), then the
        # body, then the credential's scope against the names in the body as decoded: the scope is checked
        # on what this path acts on, never on another parser's reading of the same bytes.
        principal = rule = cluster = None
        if self.tokens is not None:
            try:
                principal = self.tokens.authenticate(req.authorization)
                rule = rule_for(req.route.method.decode(), req.path)
                cluster = authorize_path(principal, rule, req.query.encode())
            except AuthError as err:
                return _auth_refusal(self.metrics, err)
        obj = None
        if req.route.struct is not None:
            try:
                obj = self._decoders[req.route.struct].decode(body)
            except (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError, RecursionError):
                return None  # the application answers it (and checks the scope its own way first)
            if principal is not None:
                try:
                    authorize_body(principal, rule, cluster, {"clusterName": getattr(obj, "clusterName", None),
                                                              "brokerName": getattr(obj, "brokerName", None)})
                except AuthError as err:
                    return _auth_refusal(self.metrics, err)
        if principal is not None and limited_to_clusters(principal):
            req.limited = principal
        if self.forward is not None:
            return self.forward(req, obj, scheme)
        return self.execute(req, obj, scheme)

    def execute(self, req: LeanRequest, obj: msgspec.Struct | None, scheme: str) -> Reply | Awaitable[Reply]:
        """Answer an admitted request (authenticated, its body decoded) from this process's controller."""
        if req.limited is not None:
            try:
                authorize_set_clusters(req.limited, (req.name, getattr(obj, "brokerName", None)), self.cluster_of)
            except AuthError as err:
                return _auth_refusal(self.metrics, err)
        if req.route.endpoint == "heartbeat" and self.heartbeat_producer is not None:
            return pipeline_heartbeat(self.metrics, self.heartbeat_producer, self._encode(obj), self.svc.now_ms())
        try:
            res = req.route.call(self.svc, req.name, req.cluster, obj)
        except RaftError as exc:
            return self._refused(req, exc, scheme)
        if isinstance(res, dict):
            return answered(self.metrics, req.route.endpoint, res, req.t0)
        if isinstance(res, asyncio.Future):  # a read or write: answered from its done-callback (api/futures.py)
            def refused(exc: BaseException) -> Reply:
                if isinstance(exc, RaftError):
                    return self._refused(req, exc, scheme)
                raise exc

            return then(res, lambda out: answered(self.metrics, req.route.endpoint, out, req.t0), refused)
        return self._await(req, res, scheme)

    async def _await(self, req: LeanRequest, coro, scheme: str) -> Reply:
        try:
            res = await coro
        except RaftError as exc:
            return self._refused(req, exc, scheme)
        return answered(self.metrics, req.route.endpoint, res, req.t0)

    def _refused(self, req: LeanRequest, exc: RaftError, scheme: str) -> Reply:
        return refused(self.metrics, req.route.endpoint, exc, self.svc.leader_address(),
                       request_url_on(scheme, req.path, req.query))

    def encode(self, body: dict | bytes) -> bytes:
        return body if isinstance(body, bytes) else self._encode(body)

