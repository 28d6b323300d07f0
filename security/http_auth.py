"""ASGI middleware that authenticates and authorizes every request to the node API, and audits admin actions.

Everything about HTTP identity happens here, in one place, in front of the FastAPI routes: the
route table (electra.security.auth.rule_for) picks the roles, the token store names the caller,
scope is checked against the broker set and cluster in the path, the query and (for broker
credentials) the JSON body, and refusals get the API's error body. The routes stay unaware of it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import parse_qsl

from electra.state.codes import Code
from electra.state.limits import content_length, printable

from . import dashboard_login
from .audit import AuditLog
from .auth import (
    ANONYMOUS,
    AuthError,
    Principal,
    Rule,
    TokenStore,
    authorize,
    authorize_set_clusters,
    rule_for,
)

MAX_SCOPED_BODY = 1 << 20  # bodies read here to check a broker's scope (larger ones are refused)


def error_reply(err: AuthError) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """The 401/403 answer: status, headers and body."""
    body = json.dumps(err.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in err.headers().items()]
    return err.status, headers, body


class AuthMiddleware:
    """`tokens=None` is the explicit insecure mode: every caller is an anonymous admin (still audited)."""

    def __init__(self, app, tokens: TokenStore | None, audit: AuditLog | None,
                 on_refusal: Callable[[int], None] | None = None,
                 cluster_of: Callable[[str], str | None] | None = None) -> None:
        self.app = app
        self.tokens = tokens
        self.audit = audit
        self.on_refusal = on_refusal  # told each refusal's status (the node counts them in its metrics)
        self.cluster_of = cluster_of  # a broker set's cluster in the node's applied state (None: not checked)
        self.sessions = dashboard_login.Sessions()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        method, path = scope["method"], scope["path"]
        if not printable(path):  # a control character: no route has one (see _send_no_route)
            return await _send_no_route(send)
        if method == "POST" and path in (dashboard_login.LOGIN_PATH, dashboard_login.LOGOUT_PATH):
            return await dashboard_login.handle(self.tokens, self.sessions, scope, receive, send)
        rule = rule_for(method, path)
        if rule.public:
            return await self.app(scope, receive, send)
        if self.tokens is None:  # insecure mode: no checks, but admin actions are still audited
            if rule.audited and self.audit is not None:
                return await self._audited(scope, receive, send, ANONYMOUS, rule)
            return await self.app(scope, receive, send)
        principal: Principal | None = None
        try:
            auth = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"authorization"), None)
            sid = None
            if auth is None and rule.cookie_ok and method in ("GET", "HEAD"):  # a browser on the dashboard's reads
                sid = dashboard_login.session_id(scope)
            if sid is not None:
                principal = self.sessions.principal(self.tokens, sid)
                scope.setdefault("state", {})["signed_in_by_cookie"] = True
            else:
                principal = self.tokens.authenticate(auth)
            cluster = authorize_path(principal, rule, scope.get("query_string", b""))  # before reading a body
            sets = [rule.broker_set]
            if principal.role == "broker" and method in ("POST", "PUT", "PATCH"):
                declared = next((v for k, v in scope["headers"] if k == b"content-length"), None)
                if declared is not None and ((n := content_length(declared)) is None or n > MAX_SCOPED_BODY):
                    return await send_too_large(send, MAX_SCOPED_BODY)  # at once, as on every route
                try:
                    body, receive = await _buffer(receive)
                except _BodyTooLarge:  # a chunked body (no Content-Length) that grew past the bound
                    return await send_too_large(send, MAX_SCOPED_BODY)
                names = body_names(body)
                authorize_body(principal, rule, cluster, names)
                sets.append(_text(names.get("brokerName"), None))
            authorize_set_clusters(principal, sets, self.cluster_of)
        except AuthError as err:
            status, headers, body = error_reply(err)
            if self.on_refusal is not None:
                self.on_refusal(status)
            if (rule.audited or rule.audit_refusals) and self.audit is not None:
                self._audit(scope, principal, rule.action, status, int(err.body()["code"]), err.remark)
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return None
        state = scope.setdefault("state", {})
        state["principal"] = principal
        state["recheck"] = self._recheck(auth, sid, rule, scope.get("query_string", b""))
        if not (rule.audited and self.audit is not None):
            return await self.app(scope, receive, send)
        return await self._audited(scope, receive, send, principal, rule)

    def _recheck(self, authorization: str | None, sid: str | None, rule: Rule, query: bytes) -> Callable[[], bool]:
        """Does the request's credential still pass (not revoked, its dashboard session not ended, its role and
        scope still allowing the route)? Asked by the long-lived answers (watch and dashboard streams) as they
        go: a check at their start alone let a revoked token or a signed-out session keep receiving for as
        long as the stream stayed open."""
        tokens, sessions = self.tokens, self.sessions
        assert tokens is not None

        def still_valid() -> bool:
            try:
                principal = sessions.principal(tokens, sid) if sid is not None else tokens.authenticate(authorization)
                authorize_path(principal, rule, query)
                authorize_set_clusters(principal, [rule.broker_set], self.cluster_of)
            except AuthError:
                return False
            return True

        return still_valid

    async def _audited(self, scope, receive, send, principal: Principal, rule) -> None:
        """Run the route and write its audit record before the last byte of the answer leaves."""
        seen: dict = {"status": 500, "body": b"", "recorded": False}

        def record() -> None:
            if not seen["recorded"]:
                seen["recorded"] = True
                code = _json_fields(seen["body"]).get("code")
                self._audit(scope, principal, rule.action, seen["status"], code if isinstance(code, int) else None,
                            None)

        async def send_and_watch(message):
            if message["type"] == "http.response.start":
                seen["status"] = message["status"]
            elif message["type"] == "http.response.body":
                if len(seen["body"]) < 65536:
                    seen["body"] += message.get("body", b"")
                if not message.get("more_body"):
                    record()
            await send(message)

        try:
            await self.app(scope, receive, send_and_watch)
        finally:
            record()  # the route failed before answering

    def _audit(self, scope, principal, action, status, code, detail) -> None:
        client = scope.get("client")
        self.audit.record(who=principal.name if principal else "unauthenticated",
                          role=principal.role if principal else None, action=action, status=status, code=code,
                          remote=f"{client[0]}:{client[1]}" if client else None, detail=detail)


async def send_too_large(send, max_bytes: int) -> None:
    """The 413 for a body over `max_bytes` (this middleware's, for a broker's scoped body; `BodyLimit`'s for
    every route): one shape, and the connection closed."""
    body = json.dumps({"code": int(Code.CONTROLLER_INVALID_REQUEST),
                       "remark": f"request body over {max_bytes} bytes"}).encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


class _BodyTooLarge(Exception):
    """A broker's body passed MAX_SCOPED_BODY while it was read to check its scope: 413, as with a Content-Length."""


# A path with a control character names no route. Starlette's route patterns end in `$`, which matches before a final
# newline, so `/v1/heartbeat%0A` (decoded "/v1/heartbeat\n") would reach the heartbeat route under the admin catch-all
# rule of `rule_for` instead of the broker-only one: refused as an unknown endpoint first.
NO_ROUTE_REMARK = "no such endpoint"  # the API's one answer to a path it does not serve (app, ingest, this middleware)
NO_ROUTE_BODY = json.dumps({"code": int(Code.REQUEST_CODE_NOT_SUPPORTED), "remark": NO_ROUTE_REMARK},
                           separators=(",", ":")).encode()  # byte for byte as the application's JSONResponse


async def _send_no_route(send) -> None:
    await send({"type": "http.response.start", "status": 404,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(NO_ROUTE_BODY))]})
    await send({"type": "http.response.body", "body": NO_ROUTE_BODY})


async def _buffer(receive):
    """Read the whole request body (bounded) and return it with a `receive` that replays it."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_SCOPED_BODY:
            raise _BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body"):
            break
    body = b"".join(chunks)
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return body, replay


def _json_fields(body: bytes) -> dict:
    try:
        data = json.loads(body) if body else {}
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than the interpreter's stack
        return {}
    return {k: v for k, v in data.items() if isinstance(v, str | int)} if isinstance(data, dict) else {}


def body_names(body: bytes) -> dict[str, str]:
    """The `clusterName` and `brokerName` strings of a JSON body, read as the FastAPI routes read it.

    Starlette's `Request.json()` is `json.loads`: a body it cannot read (not JSON, too deep, a number
    of over 4,300 digits, bytes that are not UTF-8) names nothing here and is refused by the route's
    validation, never acted on. A check must read the body with the parser of the code that acts on
    it: the lean path and the ingest server decode with msgspec and pass the names they decoded.
    """
    return scope_names(_json_fields(body))


def scope_names(decoded: object) -> dict[str, str]:
    """The `clusterName` and `brokerName` strings of a decoded body: what a broker credential's scope is
    checked against (`authorize_body`). A name of another type is left out: validation refuses it
    before anything is acted on (a str field takes no number)."""
    if not isinstance(decoded, dict):
        return {}
    return {k: v for k in ("clusterName", "brokerName") if isinstance(v := decoded.get(k), str)}


def authorize_path(principal: Principal, rule: Rule, query_string: bytes) -> str | None:
    """Role, and for brokers the path's set and the query's `cluster`; returns that cluster (None if absent).

    With `authorize_body`, the checks of the node API for every route but the dashboard's cookie
    sign-in, shared by the ASGI middleware and the lean broker path (api/lean_path.py).
    """
    if principal.role != "broker":
        authorize(principal, rule)
        return None
    # Starlette's query parameters keep every value and a route reads the last one: check that one.
    values = [v for k, v in parse_qsl(query_string.decode("latin-1"), keep_blank_values=True)
              if k == "cluster"] if query_string else []
    cluster = values[-1] if values else None
    authorize(principal, rule, cluster=cluster)
    return cluster


def authorize_body(principal: Principal, rule: Rule, cluster: str | None, names: Mapping[str, object]) -> None:
    """A broker's scope against a write's `clusterName` and `brokerName`, as decoded by the code that acts on
    the body (`body_names` for the FastAPI routes, the decoded struct on the lean path)."""
    if principal.role == "broker":
        authorize(principal, rule, cluster=_text(names.get("clusterName"), cluster),
                  broker_set=_text(names.get("brokerName"), rule.broker_set))


def _text(value: object, default: str | None) -> str | None:
    return value if isinstance(value, str) else default


def check_request(tokens: TokenStore | None, method: str, path: str, authorization: str | None,
                  names: Mapping[str, object] | None = None) -> Principal:
    """The checks for the ingest server (no query): the caller's principal or AuthError. `names`: the
    body's `clusterName` and `brokerName` as the server decoded the body it will act on (None: no body)."""
    rule = rule_for(method, path)
    if rule.public or tokens is None:
        return ANONYMOUS
    principal = tokens.authenticate(authorization)
    if principal.role == "broker" and names is not None:
        authorize_body(principal, rule, None, names)
    else:
        authorize(principal, rule)
    return principal


def credential_still_valid(scope: Mapping[str, Any]) -> bool:
    """For a stream, as it goes: False once the credential that opened it is revoked or its session ended
    (`AuthMiddleware._recheck`; always True in insecure mode and for public routes)."""
    recheck = scope.get("state", {}).get("recheck")
    return recheck is None or recheck()
