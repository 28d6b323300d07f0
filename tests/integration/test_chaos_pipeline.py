"""`electra chaos --pipeline` end to end: 3 secure controller processes, tansu, an ingest worker per node,
the Spark job and a simulated broker fleet, one pipeline for the whole run, faults in sequence.

Selected with `-m chaos_pipeline`. Its wall time is Spark's start-up (60-250 s on the shared 2-core machine,
measured) plus ~25-35 s per episode: the correct-build run (three episodes: the broker faults and an ingest kill)
is in CI, bounded at 420 s; the deliberately broken build's run is behind `--slow`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.chaos_pipeline]

RESULT = re.compile(r"^RESULT (.*)$", re.M)


def test_a_crashed_and_a_hung_master_are_replaced_and_an_ingest_kill_fails_no_master_over(tmp_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("ELECTRA_TEST_MUTATION", None)
    proc = subprocess.run([sys.executable, "-m", "electra.cli", "chaos", "--pipeline", "--episodes", "3", "--seed", "3",
                           "--faults", "broker-kill,ingest-kill,broker-hang", "--out", str(tmp_path / "chaos")],
                          capture_output=True, text=True, timeout=420, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert proc.stdout.rstrip().splitlines()[-1].startswith("RESULT "), out[-3000:]
    r = dict(kv.split("=", 1) for kv in RESULT.findall(proc.stdout)[-1].split())
    assert r["episodes"] == "3" and r["fault_kinds"] == "3", out[-3000:]
    assert r["lin_violations"] == r["invariant_violations"] == r["lost_acked"] == r["false_failovers"] == "0"
    assert 0 < float(r["broker_failover_p99_s"]) <= 60.0
    assert re.search(r"^failover broker-kill: .*\(n=1, bound 60s\)$", proc.stdout, re.M), out[-3000:]
    assert re.search(r"^failover broker-hang: .*\(n=1, bound 60s\)$", proc.stdout, re.M), out[-3000:]
    # The history holds the brokers' views and the fleet's watch streams next to the controller operations.
    [run] = (tmp_path / "chaos").glob("*/")
    records = [json.loads(line) for line in (run / "episode-0000.jsonl").read_text().splitlines()]
    types = {rec["type"] for rec in records}
    assert {"role", "watch", "fleet-baseline", "invoke", "ok", "fault-start", "fault-end"} <= types
    [start] = [rec for rec in records if rec["type"] == "fault-start"]
    assert start["kind"] == "broker-kill" and start["set"].startswith("pipe-set-")
    assert any(rec["type"] == "role" and rec["set"] == start["set"] and rec["role"] == "master"
               and rec["broker"] != start["broker"] and rec["mepoch"] > start["mepoch"] for rec in records)
    assert (run / "report.html").exists()


@pytest.mark.slow
def test_a_build_that_elects_without_a_new_master_epoch_is_caught_by_the_brokers_views(tmp_path):
    """elect_keeps_epoch (consensus/mutations.py): a failover leaves the master epoch where it was, so the
    crashed master and its successor both act as master under one epoch. The run must fail, naming the
    two-masters checker on the simulated brokers' views, and print the replay command."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "ELECTRA_TEST_MUTATION": "elect_keeps_epoch"}
    proc = subprocess.run([sys.executable, "-m", "electra.cli", "chaos", "--pipeline", "--episodes", "1", "--seed", "3",
                           "--faults", "broker-kill", "--failover-bound-s", "20", "--stop-on-failure",
                           "--out", str(tmp_path / "chaos")], capture_output=True, text=True, timeout=420, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-6000:]
    [line] = [ln for ln in proc.stdout.splitlines() if ln.startswith("episode 0 ")]
    assert "one-acting-master-per-epoch: set pipe-set-" in line, line
    assert "ELECTRA_TEST_MUTATION=elect_keeps_epoch electra chaos --pipeline --seed 3 --episode 0" in out
    r = dict(kv.split("=", 1) for kv in RESULT.findall(proc.stdout)[-1].split())
    assert int(r["invariant_violations"]) > 0
