"""The dashboard's browser sign-in: a token exchanged for a session cookie that opens the dashboard's reads and
nothing else (and never carries the token itself)."""

from __future__ import annotations

import asyncio
import json

import pytest

from electra.security.auth import TokenStore, create_token, revoke_tokens, rule_for
from electra.security.dashboard_login import COOKIE as COOKIE_PREFIX
from electra.security.http_auth import AuthMiddleware

PORT = 7301
COOKIE = f"{COOKIE_PREFIX}-{PORT}"  # one cookie per node of a host


@pytest.fixture
def tokens(tmp_path):
    path = tmp_path / "tokens.json"
    made = {role: create_token(path, role, f"t-{role}", broker_sets=["*"] if role == "broker" else None)
            for role in ("observer", "admin", "broker")}
    return path, made


def call(app, method: str, path: str, *, headers: dict[str, str] | None = None, body: bytes = b""):
    """One request through the middleware; returns (status, headers, body, whether the route ran)."""
    ran = []

    async def route(scope, receive, send):
        ran.append(scope)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b'{"code":0}'})

    out: dict = {"headers": [], "body": b""}

    async def send(message):
        if message["type"] == "http.response.start":
            out["status"], out["headers"] = message["status"], message["headers"]
        else:
            out["body"] += message.get("body", b"")

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    scope = {"type": "http", "method": method, "path": path, "query_string": b"", "client": ("127.0.0.1", 5),
             "server": ("127.0.0.1", PORT),
             "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]}
    asyncio.run(app(route, scope, receive, send))
    return out["status"], {k.decode(): v.decode() for k, v in out["headers"]}, out["body"], bool(ran)


class App:
    """One middleware (and so one session table) in front of whichever route a test passes."""

    def __init__(self, tokens_file):
        self.route = None
        self.middleware = AuthMiddleware(self._route, TokenStore(tokens_file, check_interval_s=0), None)

    async def _route(self, scope, receive, send):
        await self.route(scope, receive, send)

    async def __call__(self, route, scope, receive, send):
        self.route = route
        await self.middleware(scope, receive, send)


def login(app, token, content_type="application/json"):
    return call(app, "POST", "/v1/dashboard/login", headers={"Content-Type": content_type},
                body=json.dumps({"token": token}).encode())


def cookie(sid: str) -> dict[str, str]:
    return {"Cookie": f"theme=dark; {COOKIE}={sid}"}


def signed_in(app, token: str) -> dict[str, str]:
    """The Cookie header a browser sends after signing in with `token`."""
    status, headers, _, _ = login(app, token)
    assert status == 204
    return cookie(headers["set-cookie"].split(";")[0].split("=", 1)[1])


def test_login_sets_a_strict_httponly_secure_cookie(tokens):
    path, made = tokens
    app = App(path)
    status, headers, _, _ = login(app, made["observer"])
    assert status == 204
    attrs = [a.strip() for a in headers["set-cookie"].split(";")]
    name, _, sid = attrs[0].partition("=")
    assert name == COOKIE and COOKIE.startswith("__Host-")
    assert call(app, "GET", "/v1/dashboard/session", headers=cookie(sid))[0] == 200
    other_node = {"Cookie": f"{COOKIE_PREFIX}-7302={sid}"}  # another node's cookie on this host is not ours
    assert call(app, "GET", "/v1/dashboard/session", headers=other_node)[0] == 401
    assert len(sid) >= 32 and made["observer"] not in headers["set-cookie"]  # a session id, not the token
    assert {"Secure", "HttpOnly", "SameSite=Strict", "Path=/"} <= set(attrs)
    assert not any(a.lower().startswith("domain=") for a in attrs)
    assert headers["cache-control"] == "no-store"


@pytest.mark.parametrize("token,content_type,status", [
    ("not-a-token", "application/json", 401),
    ("bad token; Path=/evil", "application/json", 401),  # never echoed into a header
    ("", "application/json", 422),
    (None, "application/x-www-form-urlencoded", 415),  # a cross-site form cannot send JSON
])
def test_login_refuses_bad_tokens_and_non_json(tokens, token, content_type, status):
    path, made = tokens
    got, headers, body, _ = login(App(path), token if token is not None else made["observer"], content_type)
    assert got == status and "set-cookie" not in headers
    assert json.loads(body)["remark"]
    if status == 422:  # the API's 422 shape: the field at fault in `errors`
        assert [e["field"] for e in json.loads(body)["errors"]] == ["body.token"]


def test_login_refuses_big_bodies_with_413_before_reading_them_when_announced(tokens):
    path, made = tokens
    app = App(path)
    announced = call(app, "POST", "/v1/dashboard/login", body=b"{",
                     headers={"Content-Type": "application/json", "Content-Length": "5000000"})
    sent = call(app, "POST", "/v1/dashboard/login", headers={"Content-Type": "application/json"},
                body=json.dumps({"token": made["observer"], "pad": "x" * 5000}).encode())
    # the parser takes any number of leading zeros: int() of more than 4,300 digits raised ValueError (a 500)
    zeros = call(app, "POST", "/v1/dashboard/login", body=b"{",
                 headers={"Content-Type": "application/json", "Content-Length": "0" * 5000 + "5000000"})
    twenty_digits = call(app, "POST", "/v1/dashboard/login", body=b"{",
                         headers={"Content-Type": "application/json", "Content-Length": "1" + "0" * 19})
    for status, headers, body, _ in (announced, sent, zeros, twenty_digits):
        assert status == 413 and json.loads(body) == {"code": 2005, "remark": "request body over 4096 bytes"}
        assert "set-cookie" not in headers
    good = json.dumps({"token": made["observer"]}).encode()
    status, headers, _, _ = call(app, "POST", "/v1/dashboard/login", body=good, headers={
        "Content-Type": "application/json", "Content-Length": "0" * 5000 + str(len(good))})
    assert status == 204 and "set-cookie" in headers  # leading zeros: the length it names


def test_login_refuses_a_role_that_may_not_read_the_dashboard(tokens):
    path, made = tokens
    status, headers, body, _ = login(App(path), made["broker"])
    assert status == 403 and "set-cookie" not in headers and "broker" in json.loads(body)["remark"]


@pytest.mark.parametrize("path_", ["/v1/dashboard/stream", "/v1/dashboard/frame", "/v1/dashboard/sets/a",
                                   "/v1/dashboard/session"])
def test_cookie_opens_the_dashboard_reads(tokens, path_):
    path, made = tokens
    app = App(path)
    status, _, _, ran = call(app, "GET", path_, headers=signed_in(app, made["observer"]))
    assert status == 200 and ran
    assert call(app, "GET", path_, headers=cookie(made["observer"]))[0] == 401  # the token is no session id


@pytest.mark.parametrize("method,path_", [
    ("POST", "/v1/admin/broker-sets/s/elect-master"),  # a write: the cookie is no credential there
    ("POST", "/v1/admin/broker-sets/s/clean"),
    ("GET", "/v1/admin/metadata"),  # a read, but not the dashboard's
    ("GET", "/metrics"),
    ("GET", "/v1/broker-sets/s/replica-info"),
    ("POST", "/v1/dashboard/stream"),  # the dashboard's path with another method
])
def test_cookie_is_refused_outside_the_dashboard_reads(tokens, method, path_):
    path, made = tokens
    app = App(path)
    status, headers, _, ran = call(app, method, path_, headers=signed_in(app, made["admin"]))
    assert status == 401 and not ran and "Bearer" in headers["www-authenticate"]


def test_forged_expired_or_revoked_session_is_401(tokens):
    path, made = tokens
    app = App(path)
    assert call(app, "GET", "/v1/dashboard/stream", headers=cookie("forged"))[0] == 401
    session = signed_in(app, made["observer"])
    assert call(app, "GET", "/v1/dashboard/stream", headers=session)[0] == 200
    revoke_tokens(path, "t-observer")  # the session ends with its token
    assert call(app, "GET", "/v1/dashboard/stream", headers=session)[0] == 401
    app.middleware.sessions.max_age_s = 0  # sessions opened from now on expire at once
    assert call(app, "GET", "/v1/dashboard/stream", headers=signed_in(app, made["admin"]))[0] == 401


def test_logout_ends_the_session_and_clears_the_cookie(tokens):
    path, made = tokens
    app = App(path)
    session = signed_in(app, made["observer"])
    status, headers, _, ran = call(app, "POST", "/v1/dashboard/logout", headers=session)
    attrs = [a.strip() for a in headers["set-cookie"].split(";")]
    assert status == 204 and not ran
    assert attrs[0] == f"{COOKIE}=" and "Max-Age=0" in attrs and "HttpOnly" in attrs
    assert call(app, "GET", "/v1/dashboard/stream", headers=session)[0] == 401  # a kept copy is worth nothing
    assert len(app.middleware.sessions) == 0


def test_sessions_are_bounded():
    from electra.security.dashboard_login import Sessions

    sessions = Sessions(max_sessions=3)
    ids = [sessions.open(f"token-{i}") for i in range(5)]
    assert len(sessions) == 3 and len(set(ids)) == 5


def test_the_page_shell_is_public_and_its_data_is_not():
    for path_ in ("/dashboard", "/dashboard/static/dashboard.js"):
        assert rule_for("GET", path_).public
    data = rule_for("GET", "/v1/dashboard/stream")
    assert not data.public and data.cookie_ok and "broker" not in data.roles
    assert not rule_for("POST", "/dashboard").public
    assert not any(rule_for(m, p).cookie_ok for m, p in [("GET", "/metrics"), ("GET", "/v1/admin/metadata"),
                                                          ("POST", "/v1/dashboard/frame")])


def test_electra_up_prints_a_dashboard_url_that_signs_in_as_observer(tmp_path):
    from urllib.parse import unquote, urlsplit

    from electra.cli import dashboard_hint
    from electra.security.local import ensure_local_credentials

    creds = ensure_local_credentials(tmp_path / "certs", [1])
    hint = dashboard_hint("127.0.0.1:7301", creds)
    url = urlsplit(hint.split()[hint.split().index("observer):") + 1])
    assert (url.scheme, url.netloc, url.path) == ("https", "127.0.0.1:7301", "/dashboard") and not url.query
    token = unquote(url.fragment.removeprefix("token="))  # in the fragment: the browser never sends it
    assert TokenStore(creds.tokens_file).authenticate(f"Bearer {token}").role == "observer"
    assert str(creds.ca_file) in hint


def test_a_stream_learns_when_its_credential_is_revoked_or_its_session_ends(tokens):
    """Streams ask `credential_still_valid` as they go: a check at their start alone let a revoked token or a
    signed-out session keep receiving the fleet's data for as long as the stream stayed open."""
    from electra.security.http_auth import credential_still_valid

    path, made = tokens
    app = App(path)
    opened: list[dict] = []

    async def stream(scope, receive, send):  # what the route keeps: its request's scope
        opened.append(scope)

    async def nothing(*_):
        return {"type": "http.request", "body": b"", "more_body": False}

    session = signed_in(app, made["observer"])
    asyncio.run(app(stream, {"type": "http", "method": "GET", "path": "/v1/dashboard/stream", "query_string": b"",
                             "client": ("127.0.0.1", 5), "server": ("127.0.0.1", PORT),
                             "headers": [(k.lower().encode(), v.encode()) for k, v in session.items()]},
                    nothing, nothing))
    for token in (made["admin"], made["broker"]):
        route = "/v1/dashboard/stream" if token == made["admin"] else "/v1/broker-sets/b/watch"
        asyncio.run(app(stream, {"type": "http", "method": "GET", "path": route, "query_string": b"",
                                 "client": ("127.0.0.1", 5), "server": ("127.0.0.1", PORT),
                                 "headers": [(b"authorization", f"Bearer {token}".encode())]}, nothing, nothing))
    by_cookie, by_admin, by_broker = opened
    assert all(credential_still_valid(s) for s in opened)
    call(app, "POST", "/v1/dashboard/logout", headers=session)
    assert not credential_still_valid(by_cookie) and credential_still_valid(by_admin)
    revoke_tokens(path, "t-broker")
    assert not credential_still_valid(by_broker) and credential_still_valid(by_admin)
    assert credential_still_valid({"type": "http"})  # insecure mode, public routes: nothing to check
