"""The CLI's surface: benchmark help, one argument style for `admin`, errors as one line, failover lines."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from electra.broker_simulator import BrokerFleet
from electra.cli import main


class _StubController(BaseHTTPRequestHandler):
    """A stand-in controller: records each request, answers what the test queued (JSON or not)."""

    seen: list[tuple[str, str, dict | None]] = []
    reply: tuple[int, str, bytes] = (200, "application/json", b'{"code": 0, "header": {}, "body": null}')

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        type(self).seen.append((self.command, self.path, body))
        status, ctype, payload = type(self).reply
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = _answer

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def stub():
    _StubController.seen = []
    _StubController.reply = (200, "application/json", b'{"code": 0, "header": {}, "body": null}')
    server = ThreadingHTTPServer(("127.0.0.1", 0), _StubController)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}", _StubController
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def test_bench_name_help_shows_that_benchmarks_options(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bench", "raft", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "usage: electra bench raft" in out and "--clients" in out


def test_bench_without_a_name_lists_the_benchmarks(capsys):
    assert main(["bench", "--help"]) == 0
    assert "failover" in capsys.readouterr().out
    assert main(["bench"]) == 2


@pytest.mark.parametrize("argv", [["replica-info", "broker-0"], ["replica-info", "--broker-set", "broker-0"]])
def test_admin_takes_the_broker_set_positionally_and_as_the_old_flag(stub, argv):
    ep, handler = stub
    assert main(["admin", "--endpoints", ep, *argv]) == 0
    assert handler.seen == [("GET", "/v1/broker-sets/broker-0/replica-info", None)]


def test_admin_elect_master_positional(stub):
    ep, handler = stub
    assert main(["admin", "--endpoints", ep, "elect-master", "b1", "--cluster", "c", "--broker-id", "2"]) == 0
    assert handler.seen == [("POST", "/v1/admin/broker-sets/b1/elect-master", {"clusterName": "c", "brokerId": 2})]


def test_admin_get_sync_state_accepts_both_spellings(stub):
    ep, handler = stub
    assert main(["admin", "--endpoints", ep, "get-sync-state", "a", "--broker-set", "b"]) == 0
    assert handler.seen[0][2] == {"brokerNames": ["a", "b"]}


def test_admin_without_a_broker_set_or_with_two_is_a_clear_error(stub, capsys):
    ep, _ = stub
    for argv, match in ((["replica-info"], "give the broker set name"),
                        (["replica-info", "a", "--broker-set", "b"], "two different broker sets"),
                        (["replica-info", ".."], "is no broker set name"),  # a dot segment: the URL's path moved
                        (["clean-broker-data", "a/b"], "is no broker set name"),
                        (["get-sync-state"], "give at least one broker set name")):
        with pytest.raises(SystemExit) as exit_:
            main(["admin", "--endpoints", ep, *argv])
        assert exit_.value.code == 2 and match in capsys.readouterr().err


@pytest.mark.parametrize("endpoint", ["127.0.0.1:0", "127.0.0.1:99999", "127.0.0.1:65536"])
def test_an_endpoint_port_out_of_range_is_one_message(endpoint, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["admin", "--endpoints", endpoint, "metadata"])
    assert exit_.value.code == 2 and "port 1-65535" in capsys.readouterr().err


def test_a_reply_that_is_not_json_is_one_error_line_not_a_traceback(stub, capsys):
    ep, handler = stub
    handler.reply = (500, "text/plain", b"Internal Server Error")
    assert main(["admin", "--endpoints", ep, "elect-master", "b1", "--cluster", "c", "--broker-id", "2"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: POST http://") and "HTTP 500" in err and "Internal Server Error" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_the_simulator_reports_a_killed_masters_replacement_once():
    fleet = BrokerFleet(["127.0.0.1:1"], groups=1, replicas=3)
    seen = []
    fleet.on_failover = seen.append
    brokers = fleet.by_set["sim-set-0"]
    for i, b in enumerate(brokers, 1):
        b.broker_id = i
        fleet._adopt(b, {"masterBrokerId": 1, "masterEpoch": 1}, None)
    fleet.kill("sim-set-0", 1)
    fleet._adopt(brokers[1], {"masterBrokerId": 1, "masterEpoch": 1}, None)  # stale view: no failover yet
    assert seen == []
    fleet._adopt(brokers[1], {"masterBrokerId": 2, "masterEpoch": 2}, None)
    fleet._adopt(brokers[2], {"masterBrokerId": 2, "masterEpoch": 2}, None)
    assert [(f.name, f.old_master, f.new_master, f.master_epoch) for f in seen] == [("sim-set-0", 1, 2, 2)]
    assert seen[0].describe().startswith("failover sim-set-0: master 1 -> 2 (epoch 2) ")


def test_the_simulator_reports_a_failed_election_after_a_kill():
    fleet = BrokerFleet(["127.0.0.1:1"], groups=1, replicas=2)
    seen = []
    fleet.on_failover = seen.append
    for i, b in enumerate(fleet.by_set["sim-set-0"], 1):
        b.broker_id = i
        fleet._adopt(b, {"masterBrokerId": 1, "masterEpoch": 1}, None)
    fleet.kill("sim-set-0", 1)
    fleet._note_failed_election("sim-set-0", {"masterBrokerId": None, "masterEpoch": 1})  # not yet
    assert seen == []
    fleet._note_failed_election("sim-set-0", {"masterBrokerId": None, "masterEpoch": 2})
    assert [(f.old_master, f.new_master, f.master_epoch) for f in seen] == [(1, None, 2)]
    assert "master 1 -> none elected" in seen[0].describe()


def test_status_says_why_a_node_gave_nothing(capsys, monkeypatch):
    """"unreachable: ServerDisconnectedError" hid both a refused port and a secure node asked over HTTP."""
    import socket
    import threading

    for k in ("ELECTRA_CA_FILE", "ELECTRA_TOKEN_FILE", "ELECTRA_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    closer = socket.create_server(("127.0.0.1", 0))  # accepts, then closes: what HTTP sees of a TLS port
    stop = threading.Event()

    def close_each() -> None:
        closer.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = closer.accept()
            except TimeoutError:
                continue
            conn.recv(1024)
            conn.close()

    thread = threading.Thread(target=close_each, daemon=True)
    thread.start()
    refused = socket.create_server(("127.0.0.1", 0))
    refused_port = refused.getsockname()[1]
    refused.close()
    try:
        assert main(["status", "--endpoints", f"127.0.0.1:{closer.getsockname()[1]},127.0.0.1:{refused_port}"]) == 1
    finally:
        stop.set()
        thread.join(5)
        closer.close()
    out = capsys.readouterr().out
    assert "closed the connection: a secure node speaks HTTPS (set ELECTRA_CA_FILE" in out, out
    assert f"unreachable: cannot connect to 127.0.0.1:{refused_port}" in out, out


def test_admin_metadata_answers_for_the_nodes_that_answer_and_names_the_one_that_does_not(capsys, monkeypatch):
    """Asked when a node is in trouble: one unreachable node printed only "error: timed out" before."""
    import http.server
    import json
    import socket
    import threading

    for k in ("ELECTRA_CA_FILE", "ELECTRA_TOKEN_FILE", "ELECTRA_TOKEN"):
        monkeypatch.delenv(k, raising=False)

    class Metadata(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = json.dumps({"node_id": 1, "role": "LEADER"}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    live = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Metadata)
    thread = threading.Thread(target=live.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    refused = socket.create_server(("127.0.0.1", 0))
    refused_port = refused.getsockname()[1]
    refused.close()
    live_ep, dead_ep = f"127.0.0.1:{live.server_address[1]}", f"127.0.0.1:{refused_port}"
    try:
        assert main(["admin", "--endpoints", f"{live_ep},{dead_ep}", "metadata"]) == 1
    finally:
        live.shutdown()
        thread.join(5)
        live.server_close()
    res = json.loads(capsys.readouterr().out)
    assert res["code"] == 1 and res["remark"] == "1 of 2 nodes gave no metadata"
    assert res["body"][0] == {"endpoint": live_ep, "node_id": 1, "role": "LEADER"}
    assert res["body"][1]["endpoint"] == dead_ep
    assert res["body"][1]["error"].startswith(f"unreachable: cannot connect to {dead_ep}")


@pytest.mark.parametrize(("entry", "message"), [("127.0.0.1", "expected HOST:PORT"),
                                                 ("https://127.0.0.1:7401", "without a scheme")])
def test_simulate_brokers_refuses_an_ingest_endpoint_it_cannot_dial(entry, message, monkeypatch, capsys):
    """Kafka's forms (no port, a scheme) were taken, and the simulator's sessions failed on them with a traceback."""
    from electra import broker_simulator

    seen = []

    async def fake_run(endpoints, groups, replicas, **kw):
        seen.append(kw["ingest_endpoints"])
        return {"registered": 1}

    monkeypatch.setattr(broker_simulator, "run_simulator", fake_run)
    argv = ["simulate-brokers", "--endpoints", "127.0.0.1:7301", "--no-stdin", "--ingest-endpoints"]
    with pytest.raises(SystemExit) as exc:
        main([*argv, f"127.0.0.1:7401,{entry}"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.startswith("error: --ingest-endpoints") and message in err, err
    assert err.count("\n") == 1 and not seen
    assert main([*argv, "127.0.0.1:7401, [::1]:7402"]) == 0 and seen == [["127.0.0.1:7401", "[::1]:7402"]]


def test_ingest_refuses_tls_or_tokens_files_it_cannot_load_before_starting_a_worker(tmp_path, monkeypatch, capsys):
    """A malformed tokens file or a key that is not the certificate's killed every worker with a traceback, and
    `electra ingest` said only "an ingest worker exited with 1"; now it loads them once and says which, exit 2."""
    import shutil

    from electra import cli
    from electra.api import ingest_server
    from electra.security.local import ensure_local_credentials

    started = []
    monkeypatch.setattr(ingest_server, "serve_ingest", lambda *a, **kw: started.append(kw))
    monkeypatch.setattr(cli, "port_taken", lambda host, port: None)
    creds = ensure_local_credentials(tmp_path / "good", [1, 2])

    def ingest(certs) -> int:
        return main(["ingest", "--certs-dir", str(certs), "--node-id", "1", "--kafka-bootstrap", "127.0.0.1:1",
                     "--listen", "127.0.0.1:7401", "--workers", "1"])

    def spoilt(name: str, spoil) -> object:
        certs = shutil.copytree(creds.certs_dir, tmp_path / name)
        spoil(certs)
        return certs

    cases = [
        (spoilt("json", lambda d: (d / "tokens.json").write_text('{"tokens": [')), "cannot read tokens file"),
        (spoilt("shape", lambda d: (d / "tokens.json").write_text("[]")), "cannot read tokens file"),
        (spoilt("key", lambda d: shutil.copy(d / "node-2.key", d / "node-1.key")), "cannot load TLS files"),
        (spoilt("cert", lambda d: (d / "node-1.crt").write_text("not a certificate")), "cannot load TLS files"),
    ]
    for certs, message in cases:
        assert ingest(certs) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {message} {certs}") and err.count("\n") == 1, err
    assert not started
    assert ingest(creds.certs_dir) == 0 and len(started) == 1


_SASL = {"ELECTRA_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "ELECTRA_KAFKA_SASL_USERNAME": "electra",
         "ELECTRA_KAFKA_SASL_PASSWORD": "secret"}


@pytest.mark.parametrize(("env", "message"), [
    ({"ELECTRA_KAFKA_SECURITY_PROTOCOL": "SASL_TLS"}, "ELECTRA_KAFKA_SECURITY_PROTOCOL must be one of"),
    ({**_SASL, "ELECTRA_KAFKA_SASL_MECHANISM": "GSSAPI"}, "ELECTRA_KAFKA_SASL_MECHANISM must be one of"),
    ({"ELECTRA_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "ELECTRA_KAFKA_SASL_MECHANISM": "PLAIN",
      "ELECTRA_KAFKA_SASL_USERNAME": "electra", "ELECTRA_KAFKA_SASL_PASSWORD_FILE": "/nonexistent/kafka-password"},
     "cannot read ELECTRA_KAFKA_SASL_PASSWORD_FILE"),
    ({"ELECTRA_KAFKA_SECURITY_PROTOCOL": "SSL", "ELECTRA_KAFKA_CA_FILE": "/nonexistent/kafka-ca.pem"},
     "cannot read ELECTRA_KAFKA_CA_FILE"),
])
def test_bad_kafka_client_settings_are_refused_as_node_ingest_and_up_start(env, message, tmp_path, monkeypatch,
                                                                           capsys):
    """They were found only inside the Kafka clients' retry loops: "Kafka unreachable; retrying", without end."""
    import os

    from electra import cli
    from electra.api import ingest_server

    for k in [k for k in os.environ if k.startswith("ELECTRA_KAFKA_")]:
        monkeypatch.delenv(k)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    started = []
    monkeypatch.setattr(cli, "_serve_until_signal", lambda start: started.append("node") or 0)
    monkeypatch.setattr(ingest_server, "serve_ingest", lambda *a, **kw: started.append("ingest"))
    monkeypatch.setattr(cli, "_run_stack", lambda stack, cfg, args: started.append("up") or 0)
    monkeypatch.setattr(cli, "port_taken", lambda host, port: None)
    node = ["node", "--insecure", "--id", "1", "--peers", "1=127.0.0.1:7101", "--data-dir", str(tmp_path / "n")]
    for argv in ([*node, "--kafka-bootstrap", "kafka:9092"],
                 ["ingest", "--insecure", "--kafka-bootstrap", "kafka:9092"],
                 ["up", "--insecure", "--nodes", "1", "--data-dir", str(tmp_path / "up")]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        err = capsys.readouterr().err
        assert exc.value.code == 2 and err.startswith(f"error: {message}") and err.count("\n") == 1, (argv, err)
    assert not started and not (tmp_path / "up").exists()
    # a node without Kafka reads none of them; a legacy stack has no Kafka
    assert main(node) == 0 and started == ["node"]
    assert main(["up", "--insecure", "--nodes", "1", "--architecture", "legacy", "--data-dir",
                 str(tmp_path / "legacy")]) == 0 and started == ["node", "up"]


def test_up_says_in_one_line_that_tansu_exited_without_waiting_for_its_port(tmp_path, monkeypatch, capsys):
    """`up` waited the whole 15 s for the port of a tansu that had already exited, then ended in a traceback."""
    import signal
    import time
    from types import SimpleNamespace

    from electra import cli
    from electra.local_stack import LocalStack, StackConfig

    fake = tmp_path / "tansu"
    fake.write_text("#!/bin/sh\necho 'tansu: cannot bind' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setenv("ELECTRA_TANSU_BIN", str(fake))
    stack = LocalStack(StackConfig(data_dir=tmp_path / "d", secure=False))
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    t0 = time.monotonic()
    try:  # `_run_stack` ignores these signals while it stops the stack
        assert cli._run_stack(stack, stack.cfg, SimpleNamespace(kafka_bootstrap=None)) == 1
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert time.monotonic() - t0 < 10
    err = capsys.readouterr().err
    assert err.startswith("error: the embedded Kafka broker (tansu) exited with code 3 before it listened on "
                          "127.0.0.1:") and err.endswith(f" (log {stack.logs / 'kafka.log'})\n"), err
    assert "tansu: cannot bind" in (stack.logs / "kafka.log").read_text()


def test_up_reports_a_node_refusing_its_credential_in_one_line(tmp_path, monkeypatch, capsys):
    """HTTP 401/403 while `up` waited for a leader (a PermissionError, an OSError) ended as a traceback."""
    import signal
    from types import SimpleNamespace

    from electra import cli

    async def refused(*args, **kwargs):
        raise PermissionError("127.0.0.1:7301: HTTP 401: invalid or revoked token")

    stopped = []
    stack = SimpleNamespace(start_controllers=lambda: None, raft_peers="1=127.0.0.1:1", logs=tmp_path, creds=None,
                            endpoints={1: "127.0.0.1:7301"}, ingest_endpoints={1: "127.0.0.1:7401"},
                            exited=lambda: [], stop_all=lambda: stopped.append(True))
    cfg = SimpleNamespace(legacy=True, nodes=1, ingest_workers=1, data_dir=tmp_path)
    monkeypatch.setattr(cli, "_wait_for_http_leader", refused)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:  # `_run_stack` ignores these signals while it stops the stack
        assert cli._run_stack(stack, cfg, SimpleNamespace(no_streaming=True, demo=False)) == 1
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert capsys.readouterr().err == ("error: 127.0.0.1:7301: HTTP 401: invalid or revoked token (a node refused the "
                                       f"stack's own admin token; logs in {tmp_path})\n")
    assert stopped


@pytest.mark.parametrize("secure", [False, True], ids=["insecure", "secure"])
def test_up_keeps_the_operators_node_settings_from_the_processes_it_starts(tmp_path, monkeypatch, secure):
    """ELECTRA_CERTS_DIR, ELECTRA_TOKENS_FILE, ELECTRA_UNSAFE_NO_FSYNC, ... of the operator's shell reached the nodes
    (and ingest) `up` starts and overrode or contradicted their command lines (ELECTRA_CERTS_DIR with `up --insecure`:
    every node refused). Variables that set no node option still reach them."""
    import subprocess

    from electra import cli
    from electra.local_stack import LocalStack, StackConfig

    node_settings = {"ELECTRA_CERTS_DIR": "/etc/electra", "ELECTRA_TOKENS_FILE": "/etc/electra/tokens.json",
                     "ELECTRA_CLUSTER_ID": "c0ffee", "ELECTRA_UNSAFE_NO_FSYNC": "1", "ELECTRA_FRONT_ENDS": "4",
                     "ELECTRA_ARCHITECTURE": "legacy", "ELECTRA_NODE_ID": "7", "ELECTRA_TOPIC_PREFIX": "prod."}
    others = {"ELECTRA_LOG_LEVEL": "DEBUG", "ELECTRA_KAFKA_SECURITY_PROTOCOL": "SSL", "ELECTRA_TANSU_BIN": "/bin/true",
              "ELECTRA_TEST_MUTATION": "none", "ELECTRA_CA_FILE": "/etc/ca.crt"}
    for k, v in {**node_settings, **others}.items():
        monkeypatch.setenv(k, v)
    assert set(node_settings) <= cli.NODE_ENV and not set(others) & cli.NODE_ENV
    envs: list[dict | None] = []

    class FakePopen:
        def __init__(self, cmd, env=None, **kw):
            envs.append(env)

    monkeypatch.setattr(subprocess, "Popen", FakePopen)
    stack = LocalStack(StackConfig(data_dir=tmp_path / "d", nodes=1, secure=secure))
    stack.start_controllers()  # node 1 and its ingest (a process without a role: no credential of its own)
    stack.start_job()
    assert len(envs) == 3
    for env in envs:
        assert env is not None and not set(node_settings) & set(env), env
        assert all(env[k] == v for k, v in others.items() if not (secure and k == "ELECTRA_CA_FILE"))
    if secure:  # the job acts as the pipeline role: the stack's CA and token, not the shell's
        assert envs[2]["ELECTRA_CA_FILE"] != "/etc/ca.crt" and "ELECTRA_TOKEN_FILE" in envs[2]


def test_up_completes_a_local_ca_cut_short_and_says_what_to_do_with_one_it_cannot(tmp_path, monkeypatch, capsys):
    """`ca.key` without `ca.crt` (a first `up` killed, or out of disk, between the two writes) raised FileExistsError
    as a traceback on every later `up`; a full disk while writing credentials was a traceback too."""
    import errno
    import shutil

    from electra import cli
    from electra.security import local
    from electra.security.pki import create_ca
    from electra.security.tls import NodeTLS

    started = []
    monkeypatch.setattr(cli, "_run_stack", lambda stack, cfg, args: started.append(stack) or 0)
    monkeypatch.setattr(cli, "port_taken", lambda host, port: None)
    d = tmp_path / "d"
    certs = d / "certs"

    def up() -> int:
        return cli.main(["up", "--nodes", "1", "--data-dir", str(d)])

    for left in (["ca.key"], ["ca.key", "ca.crt"]):  # what create_ca had written when it was cut short
        shutil.rmtree(d, ignore_errors=True)
        create_ca(certs)
        for name in {"ca.key", "ca.crt", "cluster-id"} - set(left):
            (certs / name).unlink()
        assert up() == 0  # nothing was issued from it: started over
        creds = started[-1].creds
        NodeTLS(*creds.node_files(1), creds.ca_file).check()  # node 1's certificate is the new CA's
        assert creds.cluster_id == (certs / "cluster-id").read_text().strip()
    # a CA that issued certificates is not replaced behind the nodes' back: which file, and what to do
    (certs / "ca.crt").unlink()
    with pytest.raises(SystemExit) as exc:
        up()
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err == (f"error: {certs} lacks ca.crt of the CA that issued node-1.crt: restore "
                                           f"it, or remove {certs} to start over (a new cluster id: remove the "
                                           "nodes' data dirs too)\n"), err
    # out of disk while writing them: one line
    shutil.rmtree(d)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(certs / "ca.key.tmp"))

    monkeypatch.setattr(local, "create_ca", full)
    with pytest.raises(SystemExit) as exc:
        up()
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err == (f"error: cannot write the local credentials in {certs} "
                                           f"({certs / 'ca.key.tmp'}): No space left on device\n"), err
    assert len(started) == 2


def test_up_refuses_pipeline_options_for_the_legacy_stack_which_has_no_pipeline(tmp_path, monkeypatch, capsys):
    """The legacy stack starts no Kafka, ingest workers or job: options for them were dropped without a word."""
    from electra import cli

    started = []
    monkeypatch.setattr(cli, "_run_stack", lambda stack, cfg, args: started.append("up") or 0)
    monkeypatch.setattr(cli, "port_taken", lambda host, port: None)
    up = ["up", "--insecure", "--nodes", "1", "--architecture", "legacy", "--data-dir", str(tmp_path / "up")]
    for extra, named in ((["--kafka-bootstrap", "k:9092"], "--kafka-bootstrap"),
                         (["--topic-prefix", "t."], "--topic-prefix"), (["--ingest-workers", "2"], "--ingest-workers"),
                         (["--spark-master", "local[1]"], "--spark-master"),
                         (["--disconnect-grace-ms", "500"], "--disconnect-grace-ms")):
        with pytest.raises(SystemExit) as exc:
            main([*up, *extra])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and err.startswith(f"error: {named}: the legacy stack has no Kafka") \
            and err.count("\n") == 1, err
    assert not started and not (tmp_path / "up").exists()
    assert main(up) == 0 and started == ["up"]


def test_node_rejoin_marks_an_emptied_data_dir_and_leaves_a_used_one_alone(tmp_path, monkeypatch, capsys):
    from electra import cli
    from electra.consensus import data_dir_claims
    from electra.consensus.core import REJOIN_FLOOR
    from electra.consensus.storage import LogStorage

    monkeypatch.setattr(cli, "_serve_until_signal", lambda start: 0)
    monkeypatch.setattr(data_dir_claims, "lock_data_dir", lambda d: -1)  # a node process holds it until its exit
    node = ["node", "--insecure", "--id", "2", "--peers", "1=127.0.0.1:7101,2=127.0.0.1:7102,3=127.0.0.1:7103",
            "--data-dir", str(tmp_path / "n2"), "--rejoin"]
    assert main(node) == 0
    assert "node 2 rejoins with an empty data dir: it votes and campaigns again once a leader has brought it up " \
           "to date" in capsys.readouterr().err
    s = LogStorage(tmp_path / "n2" / "raft-log", fsync=False)
    assert s.open().vote_floor == REJOIN_FLOOR
    s.close()
    assert main(node) == 0  # a restart with the flag still in its unit file
    assert f"node 2: --rejoin changes nothing, {tmp_path / 'n2'} already holds a Raft log" in capsys.readouterr().err
    partly = tmp_path / "partly"  # the log moved aside, its mark left behind: said once, not a traceback
    partly.mkdir()
    (partly / "raft-log.term").write_bytes(b"mark")
    assert main([*node[:-2], str(partly), "--rejoin"]) == 1
    assert capsys.readouterr().err.endswith(
        f"error: {partly}/raft-log.term belongs to the Raft log that was removed from {partly}: move it aside too "
        "(or the whole data dir) before starting with --rejoin\n")
    alone = ["node", "--insecure", "--id", "1", "--peers", "1=127.0.0.1:7101", "--data-dir", str(tmp_path / "n1"),
             "--rejoin"]
    assert main(alone) == 1
    assert "error: --rejoin needs other members to catch this node up" in capsys.readouterr().err
