"""The dashboard's browser sign-in: a token exchanged for a cookie that opens the dashboard's reads and nothing else."""

from __future__ import annotations

import asyncio
import json

import pytest

from electra.security.auth import TokenStore, create_token, revoke_tokens, rule_for
from electra.security.dashboard_login import COOKIE
from electra.security.http_auth import AuthMiddleware


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
             "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]}
    asyncio.run(app(route, scope, receive, send))
    return out["status"], {k.decode(): v.decode() for k, v in out["headers"]}, out["body"], bool(ran)


class App:
    def __init__(self, tokens_file):
        self.tokens = TokenStore(tokens_file, check_interval_s=0)

    async def __call__(self, route, scope, receive, send):
        await AuthMiddleware(route, self.tokens, None)(scope, receive, send)


def login(app, token, content_type="application/json"):
    return call(app, "POST", "/v1/dashboard/login", headers={"Content-Type": content_type},
                body=json.dumps({"token": token}).encode())


def cookie(token: str) -> dict[str, str]:
    return {"Cookie": f"theme=dark; {COOKIE}={token}"}


def test_login_sets_a_strict_httponly_secure_cookie(tokens):
    path, made = tokens
    status, headers, _, _ = login(App(path), made["observer"])
    assert status == 204
    attrs = [a.strip() for a in headers["set-cookie"].split(";")]
    assert attrs[0] == f"{COOKIE}={made['observer']}" and COOKIE.startswith("__Host-")
    assert {"Secure", "HttpOnly", "SameSite=Strict", "Path=/"} <= set(attrs)
    assert not any(a.lower().startswith("domain=") for a in attrs)
    assert headers["cache-control"] == "no-store"


@pytest.mark.parametrize("token,content_type,status", [
    ("not-a-token", "application/json", 401),
    ("bad token; Path=/evil", "application/json", 401),  # never echoed into a header
    ("", "application/json", 400),
    (None, "application/x-www-form-urlencoded", 415),  # a cross-site form cannot send JSON
])
def test_login_refuses_bad_tokens_and_non_json(tokens, token, content_type, status):
    path, made = tokens
    got, headers, body, _ = login(App(path), token if token is not None else made["observer"], content_type)
    assert got == status and "set-cookie" not in headers
    assert json.loads(body)["remark"]


def test_login_refuses_a_role_that_may_not_read_the_dashboard(tokens):
    path, made = tokens
    status, headers, body, _ = login(App(path), made["broker"])
    assert status == 403 and "set-cookie" not in headers and "broker" in json.loads(body)["remark"]


@pytest.mark.parametrize("path_", ["/v1/dashboard/stream", "/v1/dashboard/frame", "/v1/dashboard/sets/a",
                                   "/v1/dashboard/session"])
def test_cookie_opens_the_dashboard_reads(tokens, path_):
    path, made = tokens
    status, _, _, ran = call(App(path), "GET", path_, headers=cookie(made["observer"]))
    assert status == 200 and ran


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
    status, headers, _, ran = call(App(path), method, path_, headers=cookie(made["admin"]))
    assert status == 401 and not ran and "Bearer" in headers["www-authenticate"]


def test_bad_or_revoked_cookie_is_401(tokens):
    path, made = tokens
    app = App(path)
    assert call(app, "GET", "/v1/dashboard/stream", headers=cookie("forged"))[0] == 401
    assert call(app, "GET", "/v1/dashboard/stream", headers=cookie(made["observer"]))[0] == 200
    revoke_tokens(path, "t-observer")
    assert call(app, "GET", "/v1/dashboard/stream", headers=cookie(made["observer"]))[0] == 401


def test_logout_clears_the_cookie(tokens):
    path, _ = tokens
    status, headers, _, ran = call(App(path), "POST", "/v1/dashboard/logout")
    attrs = [a.strip() for a in headers["set-cookie"].split(";")]
    assert status == 204 and not ran
    assert attrs[0] == f"{COOKIE}=" and "Max-Age=0" in attrs and "HttpOnly" in attrs


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
