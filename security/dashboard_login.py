"""Browser sign-in for the dashboard: a token exchanged for a session cookie that only opens read routes.

A browser cannot put `Authorization` on a page load or on an EventSource. So the dashboard page
(public: the HTML shell and its scripts hold no data) takes a token from its URL fragment
(`/dashboard#token=...`: a fragment never reaches a server, a proxy or a log) or from a small form,
and POSTs it as JSON to `/v1/dashboard/login`. The node checks it like any bearer token, opens a
session (a random id, kept in this node's memory with the token's SHA-256 and an expiry) and answers
with the session id in a cookie that is

  HttpOnly           no script can read it (an injected script cannot steal the session)
  Secure, __Host-    sent over HTTPS only, to this host only, for path / (no Domain attribute)
  SameSite=Strict    never sent with a request another site's page starts

The cookie never holds the token: browsers send a host's cookies to every port of that host, and
an admin token must not travel to whatever else listens there. A session id opens this node's
dashboard reads and nothing more; every request looks the token's hash up in the tokens file
again, so revoking the token ends its sessions at once. The middleware (electra.security.http_auth)
accepts the cookie only on GET routes whose rule says `cookie_ok` (the dashboard's data routes),
never on a write or an admin call, so a cookie cannot be used for cross-site request forgery.
Login wants `Content-Type: application/json`, which a cross-site HTML form cannot send (and a
cross-site script cannot without a CORS preflight, which the node never grants).
Logout ends the session and clears the cookie. Sessions live in the node's memory: after a
restart, or on another node, the page asks for the token again.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import threading
import time

from electra.api.invalid import invalid_request
from electra.state.codes import Code
from electra.state.limits import content_length

from .auth import READERS, AuthError, Principal, TokenStore

COOKIE = "__Host-electra-dashboard"  # + "-<port>": a browser keeps one session per node of a host
LOGIN_PATH = "/v1/dashboard/login"
LOGOUT_PATH = "/v1/dashboard/logout"
MAX_AGE_S = 12 * 3600  # a browser session lasts a working day; the token itself stays valid until revoked
MAX_SESSIONS = 10_000  # the oldest session goes first beyond this
MAX_LOGIN_BODY = 4096
_TOKEN_CHARS = re.compile(r"^[A-Za-z0-9._~+/=-]{1,512}$")


class Sessions:
    """This node's dashboard sessions: random id -> (SHA-256 of the token, expiry on the monotonic clock)."""

    def __init__(self, max_age_s: float = MAX_AGE_S, max_sessions: int = MAX_SESSIONS) -> None:
        self.max_age_s = max_age_s
        self.max_sessions = max_sessions
        self._lock = threading.Lock()
        self._by_id: dict[str, tuple[str, float]] = {}

    def open(self, token: str) -> str:
        sid = secrets.token_urlsafe(32)
        now = time.monotonic()
        with self._lock:
            for old in [s for s, (_, expiry) in self._by_id.items() if expiry <= now]:
                del self._by_id[old]
            while len(self._by_id) >= self.max_sessions:
                del self._by_id[next(iter(self._by_id))]
            self._by_id[sid] = (hashlib.sha256(token.encode()).hexdigest(), now + self.max_age_s)
        return sid

    def close(self, sid: str | None) -> None:
        with self._lock:
            self._by_id.pop(sid or "", None)

    def principal(self, tokens: TokenStore, sid: str) -> Principal:
        """The signed-in principal, or AuthError(401): unknown or expired session, or its token revoked."""
        with self._lock:
            digest, expiry = self._by_id.get(sid, ("", 0.0))
        principal = tokens.principal_for_digest(digest) if expiry > time.monotonic() else None
        if principal is None:
            self.close(sid)
            raise AuthError(401, "dashboard session expired, ended or its token revoked: sign in again")
        return principal

    def __len__(self) -> int:
        return len(self._by_id)


def cookie_name(scope) -> str:
    """Browsers scope cookies by host, not port: the nodes of a host (`electra up`: 7301-7303) need one name each."""
    server = scope.get("server")
    return f"{COOKIE}-{server[1]}" if server else COOKIE


def session_id(scope) -> str | None:
    """The dashboard session id in the request's Cookie header(s), if any."""
    wanted = cookie_name(scope)
    for key, value in scope["headers"]:
        if key != b"cookie":
            continue
        for part in value.decode("latin-1").split(";"):
            name, _, value = part.strip().partition("=")
            if name == wanted and value:
                return value
    return None


def _set_cookie(scope, sid: str, max_age: int) -> tuple[bytes, bytes]:
    return (b"set-cookie", f"{cookie_name(scope)}={sid}; Max-Age={max_age}; Path=/; Secure; HttpOnly; "
                           f"SameSite=Strict".encode())


async def _answer(send, status: int, body: dict | None, extra: list[tuple[bytes, bytes]] = ()) -> None:
    data = json.dumps(body).encode() if body is not None else b""
    headers = [(b"cache-control", b"no-store"), *extra]
    if body is not None:
        headers += [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


class _TooLarge(Exception):
    pass


async def _read_body(receive) -> bytes | None:
    """The body (None if the client went away); _TooLarge once it passes MAX_LOGIN_BODY."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        if size > MAX_LOGIN_BODY:
            raise _TooLarge
        if not message.get("more_body"):
            return b"".join(chunks)


_SEND_JSON = "send the token as JSON: {\"token\": \"...\"}"
_INVALID = int(Code.CONTROLLER_INVALID_REQUEST)


async def handle(tokens: TokenStore | None, sessions: Sessions, scope, receive, send) -> None:
    """POST /v1/dashboard/login {"token": "..."} -> 204 + cookie (401/403 otherwise); POST .../logout -> 204."""
    if scope["path"] == LOGOUT_PATH:
        sessions.close(session_id(scope))
        return await _answer(send, 204, None, [_set_cookie(scope, "", 0)])
    # The node API's refusals (docs/controller-api.md): 415, then 413 (from Content-Length before reading,
    # or once the body passes the limit), then 422 for a body that does not hold a token.
    content_type = next((v for k, v in scope["headers"] if k == b"content-type"), b"").decode("latin-1")
    if content_type.split(";")[0].strip().lower() != "application/json":
        return await _answer(send, 415, {"code": _INVALID, "remark": _SEND_JSON})
    too_large = {"code": _INVALID, "remark": f"request body over {MAX_LOGIN_BODY} bytes"}
    length = next((v for k, v in scope["headers"] if k == b"content-length"), None)
    if length is not None and ((n := content_length(length)) is None or n > MAX_LOGIN_BODY):
        return await _answer(send, 413, too_large, [(b"connection", b"close")])
    try:
        body = await _read_body(receive)
    except _TooLarge:
        return await _answer(send, 413, too_large, [(b"connection", b"close")])
    try:
        token = json.loads(body)["token"] if body else None
    except (ValueError, KeyError, TypeError, RecursionError):
        token = None
    if not isinstance(token, str) or not token.strip():
        return await _answer(send, 422, invalid_request([{"field": "body.token", "problem": _SEND_JSON}]))
    token = token.strip()
    if tokens is None:  # insecure mode: nothing to sign in to
        return await _answer(send, 204, None)
    try:
        if not _TOKEN_CHARS.match(token):
            raise AuthError(401, "invalid or revoked token")
        principal = tokens.authenticate(f"Bearer {token}")
        if principal.role not in READERS:
            raise AuthError(403, f"role {principal.role!r} ({principal.name}) may not read the dashboard "
                                 f"(allowed: {', '.join(sorted(READERS))})")
    except AuthError as err:
        return await _answer(send, err.status, err.body(), [(k.lower().encode(), v.encode())
                                                             for k, v in err.headers().items()])
    return await _answer(send, 204, None, [_set_cookie(scope, sessions.open(token), int(sessions.max_age_s))])
