"""`electra node` settings: command line over ELECTRA_* variables over the TOML file over defaults."""

from __future__ import annotations

import re

import pytest

from electra.cli import build_parser, resolve_node_settings


def _node(argv, monkeypatch, env=None):
    for k in ("ELECTRA_NODE_ID", "ELECTRA_PEERS", "ELECTRA_DATA_DIR", "ELECTRA_HTTP_ADDR", "ELECTRA_TICK_MS",
              "ELECTRA_SNAPSHOT_ENTRIES", "ELECTRA_FRONT_ENDS"):
        monkeypatch.delenv(k, raising=False)
    for k, v in (env or {}).items():
        monkeypatch.setenv(k, v)
    args = build_parser().parse_args(["node", *argv])
    return resolve_node_settings(args)


def test_toml_file_then_environment_then_command_line(tmp_path, monkeypatch):
    cfg = tmp_path / "node.toml"
    cfg.write_text('id = 2\ndata_dir = "/var/electra"\ntick_ms = 50\nhttp_addr = "0.0.0.0:8080"\n'
                   '[peers]\n1 = "10.0.0.1:7101"\n2 = "10.0.0.2:7101"\n3 = "10.0.0.3:7101"\n')
    a = _node(["--config", str(cfg)], monkeypatch)
    assert (a.id, a.data_dir, a.tick_ms, a.http_addr) == (2, "/var/electra", 50, ("0.0.0.0", 8080))
    assert a.peers[3] == ("10.0.0.3", 7101) and a.state_machine == "controller" and a.snapshot_entries == 100_000
    a = _node(["--config", str(cfg)], monkeypatch, {"ELECTRA_TICK_MS": "20", "ELECTRA_NODE_ID": "3"})
    assert (a.id, a.tick_ms) == (3, 20)
    a = _node(["--config", str(cfg), "--tick-ms", "10"], monkeypatch, {"ELECTRA_TICK_MS": "20"})
    assert a.tick_ms == 10


def _refused(capsys, run, match: str) -> None:
    """A bad setting: `error: ...` naming it on stderr and exit 2, as argparse ends on a bad argument."""
    with pytest.raises(SystemExit) as exit_:
        run()
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert re.search(match, err), err


def test_clear_errors_for_missing_and_unknown_settings(tmp_path, monkeypatch, capsys):
    _refused(capsys, lambda: _node(["--peers", "1=127.0.0.1:1", "--data-dir", "x"], monkeypatch), "error: missing id")
    bad = tmp_path / "bad.toml"
    bad.write_text('id = 1\ncolour = "blue"\n')
    _refused(capsys, lambda: _node(["--config", str(bad)], monkeypatch), "unknown keys.*colour")
    _refused(capsys, lambda: _node(["--config", str(tmp_path / "missing.toml")], monkeypatch), "cannot read")
    _refused(capsys, lambda: _node(["--peers", "one=two"], monkeypatch), "ID=HOST:PORT")
    # TOML has types: a value of another type is refused, not coerced (`id = 1.5` ran as node 1) or a traceback
    for line, match in (("id = 1.5", "id in .* must be an integer, not float"),
                        ("id = true", "id in .* must be an integer, not bool"),
                        ("id = [1]", "id in .* must be an integer, not list"),
                        ("peers = 5", "peers in .* must be a string, not int"),
                        ('data_dir = 5\nid = 1\npeers = "1=127.0.0.1:1"', "data_dir in .* must be a string, not int"),
                        ('id = 1\ninsecure = "yes"', "insecure in .* must be a boolean, not str")):
        bad.write_text(line + "\n")
        _refused(capsys, lambda: _node(["--config", str(bad)], monkeypatch), match)
    bad.write_bytes(b"\xff\xfe\x00binary")
    _refused(capsys, lambda: _node(["--config", str(bad)], monkeypatch), "cannot read --config")


@pytest.mark.parametrize(("argv", "env", "match"), [
    (["--tick-ms", "0"], {}, "tick-ms must be from 1 to 60000, not 0"),  # a busy loop before
    ([], {"ELECTRA_TICK_MS": "-100"}, "tick-ms must be from 1"),  # the environment skipped every check
    ([], {"ELECTRA_SNAPSHOT_ENTRIES": "0"}, "snapshot-entries must be from 1"),
    ([], {"ELECTRA_FRONT_ENDS": "-1"}, "front-ends must be from 0"),
    (["--election-jitter-ticks", "0"], {}, "election-jitter-ticks must be from 1"),
    (["--data-dir", ""], {}, "data-dir must not be empty"),  # the current directory before
    (["--http-addr", "127.0.0.1:70000"], {}, "port 1-65535"),  # served on 70000 - 65536 before
    (["--http-addr", "127.0.0.1:0"], {}, "port 1-65535"),  # served on a free port, advertised as port 0
    ([], {"ELECTRA_HTTP_ADDR": "127.0.0.1:0"}, r"http_addr \(from ELECTRA_HTTP_ADDR\).*port 1-65535"),
    (["--peers", "1=127.0.0.1:70000"], {}, "port 1-65535"),
    (["--peers", "1=127.0.0.1:7101,1=127.0.0.1:7102"], {}, "node 1 is named twice"),
    (["--peers", "1=127.0.0.1:7101,2=127.0.0.1:7101"], {}, "node 1 has that address too"),
    (["--peers", "1=localhost:7101,2=127.0.0.1:7101"], {}, "node 1 has that address too"),  # one socket
    (["--peers", "1=[::1]:7101,2=[0:0::1]:7101"], {}, "node 1 has that address too"),
    (["--peers", "1=Node-A:7101,2=node-a.:7101"], {}, "node 1 has that address too"),
    (["--tier-retention-days", "0"], {}, "tier-retention-days must be from"),
    ([], {"ELECTRA_TIER_RETENTION_DAYS": "nan"}, "tier-retention-days must be from"),
    (["--http-addr", "::1:7301"], {}, r"\[::1\]:PORT"),
    (["--peers", "1=2001:db8::7101"], {}, r"write an IPv6 host in brackets, ID=\[::1\]:PORT"),  # port 7101, or none?
    (["--peers", "1=[::1]:7101,2=::1:7101"], {}, "node 1 has that address too"),
    (["--http-addr", "http://127.0.0.1:7301"], {}, "without a scheme"),
    (["--peers", "1=127.0.0.1:7101,2=http://10.0.0.2:7101"], {}, "without a scheme"),  # a node never reachable
    (["--peers", "1=127.0.0.1:7101,2= host :7101"], {}, "a host has no blanks"),
    (["--kafka-bootstrap", ":"], {}, "bad address ':'"),  # logged "unreachable" every few seconds before
    (["--kafka-bootstrap", "kafka:99999"], {}, "port 1-65535"),
    (["--kafka-bootstrap", "kafka:9092,a b:9092"], {}, "bad address 'a b:9092'"),
    (["--http-peers", "1=127.0.0.1:7301,2=127.0.0.1:7302"], {}, "give every member's HTTP address"),
])
def test_node_settings_out_of_bounds_are_refused_from_every_source(argv, env, match, tmp_path, monkeypatch, capsys):
    base = {"--id": "1", "--peers": "1=127.0.0.1:7101", "--data-dir": str(tmp_path)}
    for k, v in zip(argv[::2], argv[1::2], strict=True):
        base[k] = v
    _refused(capsys, lambda: _node([x for kv in base.items() for x in kv], monkeypatch, env), match)


def test_security_settings_come_through_the_same_path(tmp_path, monkeypatch):
    for k in ("ELECTRA_INSECURE", "ELECTRA_CERTS_DIR", "ELECTRA_CLUSTER_ID"):
        monkeypatch.delenv(k, raising=False)
    cfg = tmp_path / "node.toml"
    cfg.write_text(f'id = 1\ndata_dir = "d"\npeers = "1=127.0.0.1:7101"\ncerts_dir = "{tmp_path}"\n')
    a = _node(["--config", str(cfg)], monkeypatch)
    assert a.certs_dir == str(tmp_path) and a.insecure is False and a.cluster_id is None
    a = _node(["--config", str(cfg)], monkeypatch, {"ELECTRA_INSECURE": "true", "ELECTRA_CLUSTER_ID": "c1"})
    assert a.insecure is True and a.cluster_id == "c1"
    a = _node(["--config", str(cfg), "--insecure"], monkeypatch)
    assert a.insecure is True


def test_unclean_election_is_off_unless_a_source_turns_it_on(tmp_path, monkeypatch):
    monkeypatch.delenv("ELECTRA_UNCLEAN_ELECTION", raising=False)
    cfg = tmp_path / "node.toml"
    cfg.write_text('id = 1\ndata_dir = "d"\npeers = "1=127.0.0.1:7101"\n')
    assert _node(["--config", str(cfg)], monkeypatch).unclean_election is False
    assert _node(["--config", str(cfg), "--unclean-election"], monkeypatch).unclean_election is True
    assert _node(["--config", str(cfg)], monkeypatch, {"ELECTRA_UNCLEAN_ELECTION": "true"}).unclean_election is True
    assert _node(["--config", str(cfg)], monkeypatch, {"ELECTRA_UNCLEAN_ELECTION": "off"}).unclean_election is False
    with pytest.raises(SystemExit):  # `maybe` meant off, silently
        _node(["--config", str(cfg)], monkeypatch, {"ELECTRA_UNCLEAN_ELECTION": "maybe"})
    monkeypatch.delenv("ELECTRA_UNCLEAN_ELECTION")
    cfg.write_text('id = 1\ndata_dir = "d"\npeers = "1=127.0.0.1:7101"\nunclean_election = true\n')
    assert _node(["--config", str(cfg)], monkeypatch).unclean_election is True


def test_cert_command_creates_ca_node_certificates_and_tokens(tmp_path, capsys):
    import json

    from electra.cli import main
    from electra.security.auth import TokenStore
    from electra.security.pki import cert_node_identity

    d = tmp_path / "certs"
    assert main(["cert", "create-ca", "--certs-dir", str(d), "--cluster-id", "prod-1"]) == 0
    assert main(["cert", "create-ca", "--certs-dir", str(d)]) == 1  # never silently replaces a CA
    assert "--overwrite" in capsys.readouterr().err
    assert main(["cert", "create-node", "--certs-dir", str(d), "--id", "2", "--host", "10.0.0.2",
                 "--host", "ctl-2.example"]) == 0
    assert cert_node_identity(d / "node-2.crt") == ("prod-1", 2)
    assert oct((d / "node-2.key").stat().st_mode)[-3:] == "600" and oct((d / "ca.key").stat().st_mode)[-3:] == "600"
    capsys.readouterr()
    assert main(["cert", "create-token", "--certs-dir", str(d), "--role", "broker", "--name", "b",
                 "--broker-set", "broker-a"]) == 0
    token = capsys.readouterr().out.strip()
    p = TokenStore(d / "tokens.json").authenticate(f"Bearer {token}")
    assert (p.role, p.broker_sets, p.clusters) == ("broker", ("broker-a",), ("*",))
    assert main(["cert", "create-token", "--certs-dir", str(d), "--role", "broker", "--name", "x"]) == 1
    assert main(["cert", "create-token", "--certs-dir", str(d), "--role", "admin", "--name", "ops",
                 "--out", str(tmp_path / "ops.token")]) == 0
    assert oct((tmp_path / "ops.token").stat().st_mode)[-3:] == "600"
    assert main(["cert", "revoke-token", "--certs-dir", str(d), "--name", "b"]) == 0
    assert [t["name"] for t in json.loads((d / "tokens.json").read_text())["tokens"]] == ["ops"]
    capsys.readouterr()
    assert main(["cert", "revoke-token", "--certs-dir", str(d), "--name", "bb"]) == 1  # a misspelt name
    out = capsys.readouterr()
    assert out.out == "" and out.err.strip() == "error: no credential named 'bb'"  # not "revoked 0" besides


def test_cert_rollover_keeps_one_previous_ca_and_the_cluster_id(tmp_path, capsys):
    """QA: every rollover appended, so every CA ever used stayed trusted; `--cluster-id` silently renamed an
    existing cluster's certs dir; create-node silently replaced a node's key; a bad --host was signed."""
    from cryptography import x509

    from electra.cli import main

    d = tmp_path / "certs"
    assert main(["cert", "create-ca", "--certs-dir", str(d), "--cluster-id", "prod-1"]) == 0
    first = x509.load_pem_x509_certificates((d / "ca.crt").read_bytes())
    for _ in range(3):
        assert main(["cert", "create-ca", "--certs-dir", str(d), "--overwrite"]) == 0
    bundle = x509.load_pem_x509_certificates((d / "ca.crt").read_bytes())
    assert len(bundle) == 2 and first[0] not in bundle  # the newest CA and the one before it, only
    capsys.readouterr()
    assert main(["cert", "create-ca", "--certs-dir", str(d), "--overwrite", "--cluster-id", "prod-2"]) == 1
    assert "belongs to cluster id 'prod-1'" in capsys.readouterr().err
    assert (d / "cluster-id").read_text().strip() == "prod-1"
    assert main(["cert", "create-node", "--certs-dir", str(d), "--id", "1"]) == 0
    key = (d / "node-1.key").read_bytes()
    assert main(["cert", "create-node", "--certs-dir", str(d), "--id", "1"]) == 1
    assert "node-1.key exists (use --overwrite" in capsys.readouterr().err and (d / "node-1.key").read_bytes() == key
    assert main(["cert", "create-node", "--certs-dir", str(d), "--id", "1", "--overwrite"]) == 0
    assert (d / "node-1.key").read_bytes() != key
    for host in ("not a host!", "a..b", "x_y.example", "-x.example"):
        assert main(["cert", "create-node", "--certs-dir", str(d), "--id", "2", f"--host={host}"]) == 1
        assert "is neither an IP address nor a DNS name" in capsys.readouterr().err
    assert main(["cert", "create-node", "--certs-dir", str(d), "--id", "2", "--host", "*.ctl.example.",
                 "--host", "::1"]) == 0
    assert main(["cert", "create-ca", "--certs-dir", str(tmp_path / "x"), "--cluster-id", "bad id!"]) == 1
    assert "cluster id 'bad id!' cannot be named in a certificate: 1-128 characters" in capsys.readouterr().err



def test_a_cert_rollover_over_an_unreadable_bundle_is_refused(tmp_path, capsys):
    """QA: `create-ca --overwrite` over a damaged ca.crt dropped the CA in it without a word: the new bundle
    trusted no node certificate signed so far (every TLS connection refused after distributing it)."""
    from electra.cli import main

    d = tmp_path / "certs"
    assert main(["cert", "create-ca", "--certs-dir", str(d)]) == 0
    key = (d / "ca.key").read_bytes()
    (d / "ca.crt").write_text("junk\n")
    capsys.readouterr()
    assert main(["cert", "create-ca", "--certs-dir", str(d), "--overwrite"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {d / 'ca.crt'} cannot be read as a CA bundle (") and err.count("\n") == 1
    assert (d / "ca.key").read_bytes() == key and (d / "ca.crt").read_text() == "junk\n"  # nothing replaced
    (d / "ca.crt").unlink()  # removed on purpose: a new CA, trusted alone
    assert main(["cert", "create-ca", "--certs-dir", str(d), "--overwrite"]) == 0
    assert (d / "ca.crt").read_text().count("BEGIN CERTIFICATE") == 1


def test_cert_names_a_file_given_for_a_directory(tmp_path, capsys):
    """QA: `create-ca --certs-dir FILE` and `create-node --out-dir FILE` said "error: [Errno 17] File exists"."""
    from electra.cli import main

    d, f = tmp_path / "certs", tmp_path / "afile"
    f.write_text("x")
    assert main(["cert", "create-ca", "--certs-dir", str(d)]) == 0
    capsys.readouterr()
    assert main(["cert", "create-ca", "--certs-dir", str(f)]) == 2
    assert capsys.readouterr().err == f"error: --certs-dir {f} is a file, not a directory\n"
    assert main(["cert", "create-node", "--certs-dir", str(d), "--id", "1", "--out-dir", str(f)]) == 2
    assert capsys.readouterr().err == f"error: --out-dir {f} is a file, not a directory\n"
    assert f.read_text() == "x" and not (d / "node-1.key").exists()

def test_cert_files_are_never_writable_by_others_whatever_the_umask(tmp_path):
    import os
    import stat

    from electra.cli import main

    d = tmp_path / "certs"
    old = os.umask(0)
    try:
        assert main(["cert", "create-ca", "--certs-dir", str(d)]) == 0
        assert main(["cert", "create-node", "--certs-dir", str(d), "--id", "1"]) == 0
        assert main(["cert", "create-token", "--certs-dir", str(d), "--role", "admin", "--name", "ops"]) == 0
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in [d, *d.iterdir()]}
    assert modes == {"certs": 0o755, "ca.crt": 0o644, "ca.key": 0o600, "cluster-id": 0o644, "node-1.crt": 0o644,
                     "node-1.key": 0o600, "tokens.json": 0o644}, modes


def test_architecture_is_new_unless_legacy_is_asked_for(tmp_path, monkeypatch, capsys):
    base = ["--id", "1", "--peers", "1=127.0.0.1:1", "--data-dir", str(tmp_path)]
    assert _node(base, monkeypatch).architecture == "new"
    assert _node(base, monkeypatch, {"ELECTRA_ARCHITECTURE": "legacy"}).architecture == "legacy"
    _refused(capsys, lambda: _node([*base, "--architecture", "dledger"], monkeypatch), "must be new or legacy")
    _refused(capsys, lambda: _node([*base, "--architecture", "legacy", "--kafka-bootstrap", "127.0.0.1:9092"],
                                   monkeypatch), "drop --kafka-bootstrap")


def test_a_node_freezes_its_startup_heap_and_collects_young_objects_rarely():
    """The startup heap out of the collector's sight, and young collections every 20,000 allocations:
    at CPython's 700 the leader spent about 5.7 µs of CPU per write in the collector (docs/controller-api.md)."""
    import gc

    from electra.cli import GC_THRESHOLDS, freeze_startup_heap

    before = gc.get_threshold()
    try:
        freeze_startup_heap()
        assert gc.get_threshold() == GC_THRESHOLDS and GC_THRESHOLDS[0] >= 10_000
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_tier_retention_comes_from_every_source(tmp_path, monkeypatch):
    monkeypatch.delenv("ELECTRA_TIER_RETENTION_DAYS", raising=False)
    cfg = tmp_path / "node.toml"
    cfg.write_text('id = 1\ndata_dir = "d"\npeers = "1=127.0.0.1:7101"\ntier_retention_days = 7\n')
    a = _node(["--config", str(cfg)], monkeypatch)
    assert (a.tier_retention_days, a.tier_maintenance_every_s) == (7, 3600.0)
    a = _node(["--config", str(cfg), "--tier-retention-days", "0.5"], monkeypatch)
    assert a.tier_retention_days == 0.5


def test_an_empty_kafka_bootstrap_or_tier_means_none_and_kafka_clients_forms_are_taken(tmp_path, monkeypatch):
    """An empty ELECTRA_KAFKA_BOOTSTRAP or ELECTRA_TIER_URI (a ConfigMap's or unit file's way to say "none") means
    none, as before; a bootstrap list in the forms Kafka clients take (a protocol prefix, no port) is accepted."""
    base = ["--id", "1", "--peers", "1=127.0.0.1:7101", "--data-dir", str(tmp_path)]
    a = _node(base, monkeypatch, {"ELECTRA_KAFKA_BOOTSTRAP": "", "ELECTRA_TIER_URI": ""})
    assert not a.kafka_bootstrap and not a.tier_uri and a.inactive_master_scan_ms == 5000
    a = _node(base + ["--kafka-bootstrap", "SASL_SSL://b1:9093, b2"], monkeypatch)
    assert a.kafka_bootstrap == "SASL_SSL://b1:9093,b2" and a.inactive_master_scan_ms == 0
    assert _node(["--id", "1", "--peers", "1=::1:7101", "--data-dir", str(tmp_path)], monkeypatch).peers == \
        {1: ("::1", 7101)}  # an IPv6 peer, unbracketed, as before


def test_an_ipv6_peer_is_written_in_brackets_and_dialled_without_them():
    """`--peers 1=[::1]:7101` kept the brackets in the host: the transport could neither bind nor dial "[::1]"."""
    import socket

    from electra.cli import parse_http_peers, parse_peers

    peers = parse_peers("1=[::1]:7101,2=127.0.0.1:7102,3=[fd00::3]:7103")
    assert peers == {1: ("::1", 7101), 2: ("127.0.0.1", 7102), 3: ("fd00::3", 7103)}
    socket.getaddrinfo(peers[1][0], peers[1][1], type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST)
    assert parse_http_peers("1=[::1]:7301,2=node-2:7301") == {1: "[::1]:7301", 2: "node-2:7301"}  # URLs: brackets


def test_settings_a_node_would_ignore_are_refused(monkeypatch, capsys):
    """Options another kind of node or a missing option would have silently dropped: named, exit 2."""
    base = ["--id", "1", "--peers", "1=127.0.0.1:7101", "--data-dir", "d", "--insecure"]
    _refused(capsys, lambda: _node([*base, "--tier-options", "region=x"], monkeypatch),
             "^error: --tier-options needs --tier-uri")
    for extra, named in ((["--kafka-bootstrap", "k:9092"], "--kafka-bootstrap"),
                         (["--tier-uri", "/t"], "--tier-uri"), (["--front-ends", "2"], "--front-ends"),
                         (["--http-peers", "1=127.0.0.1:7301"], "--http-peers"),
                         (["--architecture", "legacy"], "--architecture legacy"),
                         (["--unclean-election"], "--unclean-election")):
        _refused(capsys, lambda extra=extra: _node([*base, "--state-machine", "kv", *extra], monkeypatch),
                 f"^error: {named}: only a controller node takes this, not --state-machine kv")
    _refused(capsys, lambda: _node([*base, "--state-machine", "counter", "--front-ends", "1", "--tier-uri", "/t"],
                                   monkeypatch), "^error: --tier-uri, --front-ends: only a controller node takes these")
    assert _node([*base, "--state-machine", "kv"], monkeypatch).state_machine == "kv"
    assert _node([*base, "--tier-uri", "/t", "--tier-options", "a=b"], monkeypatch).tier_options == {"a": "b"}


def test_up_tells_status_and_admin_its_endpoints(tmp_path):
    """Probe: `electra up --http-port 27301` printed only `export ELECTRA_CA_FILE=... ELECTRA_TOKEN_FILE=...`, so
    `electra status` then asked 127.0.0.1:7301-7303 (nothing there, or another stack) and every row said
    'unreachable'."""
    from types import SimpleNamespace

    from electra.cli import status_env_line

    creds = SimpleNamespace(ca_file=tmp_path / "ca.crt", token_file=lambda role: tmp_path / f"{role}.token")
    assert status_env_line(["127.0.0.1:27301", "127.0.0.1:27302"], creds) == (
        f"export ELECTRA_ENDPOINTS=127.0.0.1:27301,127.0.0.1:27302 ELECTRA_CA_FILE={tmp_path}/ca.crt "
        f"ELECTRA_TOKEN_FILE={tmp_path}/admin.token")
    assert status_env_line(["127.0.0.1:7301"]) == "export ELECTRA_ENDPOINTS=127.0.0.1:7301"
