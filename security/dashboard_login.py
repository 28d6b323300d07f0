"""Browser sign-in for the dashboard: a bearer token carried by a cookie that only opens read routes.

A browser cannot put `Authorization` on a page load or on an EventSource. So the dashboard page
(public: the HTML shell and its scripts hold no data) takes a token from its URL fragment
(`/dashboard#token=...`: a fragment never reaches a server, a proxy or a log) or from a small form,
and POSTs it as JSON to `/v1/dashboard/login`. The node checks it like any bearer token and answers
with a cookie that is

  HttpOnly           no script can read it (an injected script cannot steal the token)
  Secure, __Host-    sent over HTTPS only, to this host only, for path / (no Domain attribute)
  SameSite=Strict    never sent with a request another site's page starts

The middleware (electra.security.http_auth) accepts the cookie only on GET routes whose rule says
`cookie_ok` (the dashboard's data routes), never on a write or an admin call, so a cookie cannot
be used for cross-site request forgery. Login wants `Content-Type: application/json`, which a
cross-site HTML form cannot send (and a cross-site script cannot without a CORS preflight, which
the node never grants). Logout clears the cookie.
"""

from __future__ import annotations

import json
import re

from .auth import READERS, AuthError, TokenStore

COOKIE = "__Host-electra-dashboard"
LOGIN_PATH = "/v1/dashboard/login"
LOGOUT_PATH = "/v1/dashboard/logout"
MAX_AGE_S = 12 * 3600  # a browser session lasts a working day; the token itself stays valid until revoked
MAX_LOGIN_BODY = 4096
_TOKEN_CHARS = re.compile(r"^[A-Za-z0-9._~+/=-]{1,512}$")  # what a cookie value may hold unquoted


def cookie_token(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The dashboard token in the request's Cookie header(s), if any."""
    for key, value in headers:
        if key != b"cookie":
            continue
        for part in value.decode("latin-1").split(";"):
            name, _, token = part.strip().partition("=")
            if name == COOKIE and token:
                return token
    return None


def _set_cookie(token: str, max_age: int) -> tuple[bytes, bytes]:
    return (b"set-cookie", f"{COOKIE}={token}; Max-Age={max_age}; Path=/; Secure; HttpOnly; "
                           f"SameSite=Strict".encode())


async def _answer(send, status: int, body: dict | None, extra: list[tuple[bytes, bytes]] = ()) -> None:
    data = json.dumps(body).encode() if body is not None else b""
    headers = [(b"cache-control", b"no-store"), *extra]
    if body is not None:
        headers += [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


async def _read_body(receive) -> bytes | None:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        if size > MAX_LOGIN_BODY:
            return None
        if not message.get("more_body"):
            return b"".join(chunks)


async def handle(tokens: TokenStore | None, scope, receive, send) -> None:
    """POST /v1/dashboard/login {"token": "..."} -> 204 + cookie (401/403 otherwise); POST .../logout -> 204."""
    if scope["path"] == LOGOUT_PATH:
        return await _answer(send, 204, None, [_set_cookie("", 0)])
    content_type = next((v for k, v in scope["headers"] if k == b"content-type"), b"").decode("latin-1")
    if content_type.split(";")[0].strip().lower() != "application/json":
        return await _answer(send, 415, {"code": 400, "remark": "send the token as JSON: {\"token\": \"...\"}"})
    body = await _read_body(receive)
    try:
        token = json.loads(body)["token"] if body else None
    except (ValueError, KeyError, TypeError):
        token = None
    if not isinstance(token, str) or not token.strip():
        return await _answer(send, 400, {"code": 400, "remark": "send the token as JSON: {\"token\": \"...\"}"})
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
    return await _answer(send, 204, None, [_set_cookie(token, MAX_AGE_S)])
