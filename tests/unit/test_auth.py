"""Role credentials: the route table, scope checks, the token store (reload, rotation, revocation), the
ingest server's checks and the client credentials."""

from __future__ import annotations

import asyncio
import json
import os
import time

import pytest
from test_ingest_server import FakeProducer, FakeTransport

from electra.api.ingest_server import IngestProtocol
from electra.security.auth import AuthError, Principal, TokenStore, authorize, create_token, revoke_tokens, rule_for
from electra.security.credentials import ClientCredentials, CredentialsError

BROKER_A = Principal("a", "broker", ("set-a", "grp-*"), ("c",))


@pytest.mark.parametrize("method,path,allowed,denied", [
    ("POST", "/v1/heartbeat", {"broker"}, {"pipeline", "admin", "observer"}),
    ("POST", "/v1/broker-sets/set-a/register", {"broker"}, {"pipeline", "admin", "observer"}),
    ("POST", "/v1/broker-sets/set-a/apply-broker-id", {"broker"}, {"pipeline", "admin", "observer"}),
    ("GET", "/v1/broker-sets/set-a/replica-info", {"broker", "observer", "admin", "pipeline"}, set()),
    ("POST", "/v1/internal/broker-sets/set-a/elect-master", {"pipeline"}, {"broker", "admin", "observer"}),
    ("POST", "/v1/admin/broker-sets/set-a/elect-master", {"admin"}, {"broker", "pipeline", "observer"}),
    ("POST", "/v1/admin/broker-sets/set-a/clean", {"admin"}, {"broker", "pipeline", "observer"}),
    ("GET", "/v1/admin/metadata", {"observer", "admin", "pipeline"}, {"broker"}),
    ("GET", "/metrics", {"observer", "admin", "pipeline"}, {"broker"}),
    ("GET", "/v1/dashboard/stream", {"observer", "admin", "pipeline"}, {"broker"}),
    ("POST", "/v1/something-new", {"admin"}, {"broker", "pipeline", "observer"}),  # deny by default
])
def test_route_table(method, path, allowed, denied):
    rule = rule_for(method, path)
    for role in allowed:
        authorize(Principal("p", role, ("*",), ("*",)), rule)
    for role in denied:
        with pytest.raises(AuthError) as e:
            authorize(Principal("p", role, ("*",), ("*",)), rule)
        assert e.value.status == 403


def test_public_routes_and_audited_admin_routes():
    assert rule_for("GET", "/healthz").public and rule_for("GET", "/openapi.json").public
    # the path as routes match it (decoded once): `b%2D1` is a set of that name, not `b-1`
    r = rule_for("POST", "/v1/admin/broker-sets/b%2D1/clean")
    assert r.audited and r.action == "clean b%2D1"
    assert rule_for("POST", "/v1/broker-sets/pa%41/register").broker_set == "pa%41"
    assert not rule_for("POST", "/v1/broker-sets/b/register").audited


def test_broker_scope_covers_set_and_cluster():
    reg = rule_for("POST", "/v1/broker-sets/set-a/register")
    authorize(BROKER_A, reg, cluster="c")
    authorize(BROKER_A, rule_for("POST", "/v1/broker-sets/grp-7/register"), cluster="c")
    for rule, cluster in ((rule_for("POST", "/v1/broker-sets/set-b/register"), "c"), (reg, "other")):
        with pytest.raises(AuthError, match="not scoped to") as e:
            authorize(BROKER_A, rule, cluster=cluster)
        assert e.value.status == 403 and e.value.body()["code"] == 16
    with pytest.raises(AuthError):  # heartbeat: the set comes from the body
        authorize(BROKER_A, rule_for("POST", "/v1/heartbeat"), cluster="c", broker_set="set-b")


def test_token_store_reloads_rotates_and_revokes(tmp_path):
    path = tmp_path / "tokens.json"
    old = create_token(path, "admin", "ops")
    store = TokenStore(path, check_interval_s=0)
    assert store.authenticate(f"Bearer {old}").role == "admin"
    for bad in (None, "", "Basic abc", "Bearer ", f"Bearer {old}x"):
        with pytest.raises(AuthError) as e:
            store.authenticate(bad)
        assert e.value.status == 401 and "WWW-Authenticate" in e.value.headers()
    new = create_token(path, "admin", "ops")  # rotation: both work during the rollover
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 1_000_000))
    assert store.authenticate(f"Bearer {new}").name == "ops" and store.authenticate(f"Bearer {old}").name == "ops"
    assert revoke_tokens(path, "ops", keep_newest=True) == 1
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 2_000_000))
    with pytest.raises(AuthError, match="revoked"):
        store.authenticate(f"Bearer {old}")
    assert store.authenticate(f"Bearer {new}").role == "admin"
    assert old not in path.read_text() and new not in path.read_text()  # only hashes on disk
    path.write_text("{broken")  # a half-written file keeps the loaded tokens
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 3_000_000))
    assert store.authenticate(f"Bearer {new}").role == "admin"
    with pytest.raises(ValueError, match="broker set"):
        create_token(path.with_name("t2.json"), "broker", "b")
    with pytest.raises(ValueError, match="role"):
        create_token(path.with_name("t2.json"), "root", "b")


def _request(proto: IngestProtocol, body: dict, token: str | None) -> bytes:
    raw = json.dumps(body).encode()
    auth = f"authorization: Bearer {token}\r\n".encode() if token else b""
    proto.data_received(b"POST /v1/heartbeat HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n" + auth +
                        b"content-length: %d\r\n\r\n" % len(raw) + raw)
    return proto.transport.data


def test_ingest_server_asks_brokers_for_a_token_scoped_to_the_heartbeat_set(tmp_path):
    path = tmp_path / "tokens.json"
    tok = create_token(path, "broker", "a", broker_sets=["set-a"])
    obs = create_token(path, "observer", "o")
    hb = {"clusterName": "c", "brokerName": "set-a", "brokerId": 1, "brokerAddr": "10.0.0.1:1", "epoch": 1}
    cases = [(None, b"401"), ("nope", b"401"), (obs, b"403"), (tok, b"200")]
    for token, status in cases:
        producer = FakeProducer()
        proto = IngestProtocol(producer, tokens=TokenStore(path))
        proto.connection_made(FakeTransport())
        out = _request(proto, hb, token)
        assert out.startswith(b"HTTP/1.1 " + status), (token, out)
        assert len(producer.sent) == (1 if status == b"200" else 0)
    producer = FakeProducer()
    proto = IngestProtocol(producer, tokens=TokenStore(path))
    proto.connection_made(FakeTransport())
    assert _request(proto, {**hb, "brokerName": "set-b"}, tok).startswith(b"HTTP/1.1 403")
    assert producer.sent == []
    # Bytes Python's json refuses but the server's msgspec decoder skips (an unknown field): the scope is
    # checked against the names the server decoded and acts on, so the forgery is refused all the same.
    forged = json.dumps({**hb, "brokerName": "set-b", "clusterName": "other"}).encode()[:-1]
    for junk in (b', "x": ' + b"9" * 4400 + b"}", b', "x": "\xff"}', b', "x": ' + b"[" * 20_000 + b"]" * 20_000 + b"}"):
        proto.transport.data = b""
        raw = forged + junk
        proto.data_received(b"POST /v1/heartbeat HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                            b"authorization: Bearer " + tok.encode()
                            + b"\r\ncontent-length: %d\r\n\r\n" % len(raw) + raw)
        assert proto.transport.data[9:12] in (b"403", b"422"), (junk[:12], proto.transport.data)
    assert producer.sent == []
    proto.transport.data = b""
    proto.data_received(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")  # probes need no token
    assert proto.transport.data.startswith(b"HTTP/1.1 200")


def test_ingest_connection_checks_a_token_once_per_scope_and_again_after_the_tokens_file_changes(tmp_path,
                                                                                                     monkeypatch):
    path = tmp_path / "tokens.json"
    tok = create_token(path, "broker", "a", broker_sets=["set-a"])
    create_token(path, "broker", "b", broker_sets=["set-b"])
    hb = {"clusterName": "c", "brokerName": "set-a", "brokerId": 1, "brokerAddr": "10.0.0.1:1", "epoch": 1}
    store = TokenStore(path, check_interval_s=0)
    checks = []
    real = TokenStore.authenticate
    monkeypatch.setattr(TokenStore, "authenticate", lambda self, auth: checks.append(auth) or real(self, auth))
    producer = FakeProducer()
    proto = IngestProtocol(producer, tokens=store)
    proto.connection_made(FakeTransport())

    def status(body: dict, token: str | None = tok) -> bytes:
        proto.transport.data = b""
        return _request(proto, body, token)[9:12]

    assert [status({**hb, "epoch": e}) for e in range(5)] == [b"200"] * 5
    assert len(checks) == 1  # a session's heartbeats: the token is hashed and its scope matched once
    assert status({**hb, "brokerName": "set-b"}) == b"403"  # another scope on the same connection: checked
    assert status({**hb, "brokerId": 0}) == b"422"  # the scope passed already; the heartbeat is invalid
    assert status(hb, "other") == b"401"  # another token: checked
    assert status(hb) == b"200" and len(checks) == 3
    time.sleep(0.01)
    revoke_tokens(path, "a")  # the tokens file changes: the next request checks the token again
    assert status(hb) == b"401" and len(checks) == 4
    assert len(producer.sent) == 6


def test_client_credentials_from_env(tmp_path):
    (tmp_path / "t").write_text("tok\n")
    (tmp_path / "ca.crt").write_text("not a certificate")
    c = ClientCredentials.from_env({"ELECTRA_TOKEN_FILE": str(tmp_path / "t"),
                                    "ELECTRA_CA_FILE": str(tmp_path / "ca.crt")})
    assert c.token == "tok" and c.scheme == "https" and c.headers() == {"Authorization": "Bearer tok"}
    assert ClientCredentials.from_env({"ELECTRA_TOKEN": "x"}).scheme == "http"
    assert ClientCredentials.from_env({}).headers() == {}
    # what a command reports in one line (CredentialsError), naming the variable and file, never the token
    (tmp_path / "two").write_text("secret-one\nsecret-two\n")
    (tmp_path / "spaced").write_text("secret one\n")
    for env, problem in [({"ELECTRA_TOKEN_FILE": str(tmp_path / "missing")}, "cannot read ELECTRA_TOKEN_FILE"),
                         ({"ELECTRA_TOKEN_FILE": str(tmp_path)}, "cannot read ELECTRA_TOKEN_FILE"),
                         ({"ELECTRA_TOKEN_FILE": str(tmp_path / "two")}, "more than one line"),
                         ({"ELECTRA_TOKEN_FILE": str(tmp_path / "spaced")}, "does not hold a token"),
                         ({"ELECTRA_CA_FILE": str(tmp_path / "nope.crt")}, "ELECTRA_CA_FILE")]:
        with pytest.raises(CredentialsError, match=problem) as err:
            ClientCredentials.from_env(env)
        assert "secret" not in str(err.value)
    with pytest.raises(CredentialsError, match="does not hold a CA certificate"):
        c.ssl_context()


def test_admin_action_is_audited_before_the_answer_leaves(tmp_path):
    import asyncio

    from electra.security.audit import AuditLog
    from electra.security.http_auth import AuthMiddleware

    tokens = tmp_path / "tokens.json"
    admin = create_token(tokens, "admin", "ops")
    audit = AuditLog(tmp_path / "audit.log")

    async def route(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b'{"code":0}'})

    seen_at_last_byte = []

    async def send(message):
        if message["type"] == "http.response.body":
            seen_at_last_byte.append((tmp_path / "audit.log").read_text())

    async def receive():
        return {"type": "http.request", "body": b"{}", "more_body": False}

    app = AuthMiddleware(route, TokenStore(tokens), audit)
    for auth in (f"Bearer {admin}", None):
        headers = [(b"authorization", auth.encode())] if auth else []
        scope = {"type": "http", "method": "POST", "path": "/v1/admin/broker-sets/s/clean", "headers": headers,
                 "query_string": b"", "client": ("127.0.0.1", 5)}
        asyncio.run(app(scope, receive, send))
    audit.close()
    first = json.loads(seen_at_last_byte[0].splitlines()[0])
    assert (first["who"], first["action"], first["outcome"], first["code"]) == ("ops", "clean s", "ok", 0)
    lines = [json.loads(x) for x in (tmp_path / "audit.log").read_text().splitlines()]
    assert lines[1]["who"] == "unauthenticated" and lines[1]["status"] == 401 and lines[1]["outcome"] == "refused"


def _through_middleware(middleware, method: str, path: str, token: str, answer: bytes = b'{"code":0}') -> list[dict]:
    """One request through `middleware` to a route answering 200 `answer`; the ASGI messages sent back."""
    middleware.app = _answering(answer)
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "query_string": b"", "client": ("127.0.0.1", 5),
             "server": ("127.0.0.1", 7301), "headers": [(b"authorization", f"Bearer {token}".encode())]}
    asyncio.run(middleware(scope, receive, send))
    return sent


def _answering(answer: bytes):
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": answer})

    return app


def test_attempts_at_the_jobs_election_proposals_by_other_roles_are_audited(tmp_path):
    from electra.security.audit import AuditLog
    from electra.security.http_auth import AuthMiddleware

    rule = rule_for("POST", "/v1/internal/broker-sets/b/elect-master")
    assert rule.audit_refusals and not rule.audited and rule.roles == frozenset({"pipeline"})
    path = tmp_path / "tokens.json"
    tokens = {role: create_token(path, role, f"t-{role}") for role in ("admin", "pipeline")}
    middleware = AuthMiddleware(None, TokenStore(path), AuditLog(tmp_path / "audit.log"))
    for role in ("admin", "pipeline"):
        _through_middleware(middleware, "POST", "/v1/internal/broker-sets/b/elect-master", tokens[role])
    [line] = (tmp_path / "audit.log").read_text().splitlines()  # the admin's refused attempt, not the job's call
    assert '"role":"admin"' in line and '"outcome":"refused"' in line


def test_an_audit_record_the_disk_refuses_leaves_the_answer_whole_and_goes_to_the_log(tmp_path, monkeypatch, caplog):
    """The action is done by the time its outcome is recorded: a full disk must not cut the answer off (the client
    got a truncated 200 and the node a traceback); the record goes to the node's log, marked as not written."""
    from electra.security.audit import AuditLog
    from electra.security.http_auth import AuthMiddleware

    path = tmp_path / "tokens.json"
    admin = create_token(path, "admin", "ops")
    audit = AuditLog(tmp_path / "audit.log")

    def enospc(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("os.fsync", enospc)
    sent = _through_middleware(AuthMiddleware(None, TokenStore(path), audit), "POST", "/v1/admin/broker-sets/b/clean",
                               admin, answer=b'{"code":0,"remark":"cleaned"}')
    assert [m.get("status") for m in sent if m["type"] == "http.response.start"] == [200]
    assert b"".join(m.get("body", b"") for m in sent) == b'{"code":0,"remark":"cleaned"}'
    assert audit.failures == 1 and "audit record NOT written" in caplog.text and "clean b" in caplog.text


def test_rewriting_the_tokens_file_keeps_its_mode_whatever_the_umask(tmp_path):
    """QA: under umask 077 a create/revoke made tokens.json 0600, the node (another user) could not re-read it,
    and a revocation silently did not take effect."""
    import os
    import stat

    path = tmp_path / "tokens.json"
    create_token(path, "observer", "a")
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # hashes only: readable by the node's user
    os.chmod(path, 0o640)
    old = os.umask(0o077)
    try:
        create_token(path, "observer", "b")
        revoke_tokens(path, "a")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert [t["name"] for t in json.loads(path.read_text())["tokens"]] == ["b"]


def test_an_audited_redirect_is_not_a_failure(tmp_path):
    """QA: a follower's 307 to the leader was recorded as `failed`; the leader records the action itself."""
    from electra.security.audit import AuditLog

    log = AuditLog(tmp_path / "audit.log")
    rec = log.record(who="ops", role="admin", action="clean s", status=307, code=2007)
    assert rec["outcome"] == "redirected"
    assert log.record(who="ops", role="admin", action="clean s", status=504, code=1)["outcome"] == "failed"


def test_a_symlinked_tokens_file_is_rewritten_where_it_points(tmp_path):
    real = tmp_path / "shared" / "tokens.json"
    real.parent.mkdir()
    create_token(real, "observer", "a")
    link = tmp_path / "tokens.json"
    link.symlink_to(real)
    create_token(link, "observer", "b")
    assert link.is_symlink() and [t["name"] for t in json.loads(real.read_text())["tokens"]] == ["a", "b"]


def test_create_token_refuses_a_scope_it_would_drop_and_an_out_path_before_adding_the_credential(tmp_path, capsys):
    """`electra cert create-token`: a broker set or cluster on an admin or observer token would be dropped (the
    holder would get an unscoped credential); an --out that cannot take the file is refused before the token
    is added to tokens.json (it was added before, with its secret shown nowhere)."""
    from electra import cli

    d = str(tmp_path)
    base = ["cert", "create-token", "--certs-dir", d]
    for args, match in ((["--role", "admin", "--name", "ops", "--broker-set", "b0"], "scope broker credentials only"),
                        (["--role", "observer", "--name", "o", "--cluster", "c1"], "scope broker credentials only"),
                        (["--role", "broker", "--name", "b", "--broker-set", ""], "empty broker set"),
                        (["--role", "broker", "--name", "b", "--broker-set", "b0", "--out", d], "is a directory"),
                        (["--role", "broker", "--name", "b", "--broker-set", "b0", "--out", f"{d}/no/t"],
                         "cannot write the token there")):
        assert cli.main(base + args) == 1
        assert match in capsys.readouterr().err
    assert not (tmp_path / "tokens.json").exists()  # nothing was added
    assert cli.main(base + ["--role", "broker", "--name", "b", "--broker-set", "b0", "--out", f"{d}/tok"]) == 0
    assert len(json.loads((tmp_path / "tokens.json").read_text())["tokens"]) == 1
