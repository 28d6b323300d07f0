"""`electra node` settings: command line over ELECTRA_* variables over the TOML file over defaults."""

from __future__ import annotations

import pytest

from electra.cli import build_parser, resolve_node_settings


def _node(argv, monkeypatch, env=None):
    for k in ("ELECTRA_NODE_ID", "ELECTRA_PEERS", "ELECTRA_DATA_DIR", "ELECTRA_HTTP_ADDR", "ELECTRA_TICK_MS"):
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


def test_clear_errors_for_missing_and_unknown_settings(tmp_path, monkeypatch):
    with pytest.raises(SystemExit, match="missing id"):
        _node(["--peers", "1=127.0.0.1:1", "--data-dir", "x"], monkeypatch)
    bad = tmp_path / "bad.toml"
    bad.write_text('id = 1\ncolour = "blue"\n')
    with pytest.raises(SystemExit, match="unknown keys.*colour"):
        _node(["--config", str(bad)], monkeypatch)
    with pytest.raises(SystemExit, match="cannot read"):
        _node(["--config", str(tmp_path / "missing.toml")], monkeypatch)
    with pytest.raises(SystemExit):
        _node(["--peers", "one=two"], monkeypatch)  # argparse: ID=HOST:PORT expected
