"""`electra bench flood` against the nodes as deployed (HTTPS, tokens): QA found it probing plain HTTP with no
token, so it never saw a leader and died with a traceback; no test ran it."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_bench_flood_runs_against_secure_nodes_and_ends_with_its_result():
    # 6 s: the flood ends on time (each wait is bounded by its end), and on a loaded 2-core machine the brokers'
    # first answers (a TLS handshake each, under the flood) take 2-3 s; a 2 s flood saw only its 413s
    run = subprocess.run([sys.executable, "-m", "electra.cli", "bench", "flood", "--duration", "6",
                          "--concurrency", "10"], capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-3000:])
    last = run.stdout.strip().splitlines()[-1]
    values = dict(kv.split("=", 1) for kv in last.removeprefix("RESULT ").split())
    assert last.startswith("RESULT ") and set(values) == {
        "flood_tick_late_p99_ms", "flood_tick_late_max_ms", "quiet_tick_late_p99_ms", "leader_changes",
        "http_5xx_unintended", "leader_peak_rss_mib"}, last
    assert values["http_5xx_unintended"] == "0" and values["leader_changes"].isdigit(), last
    responses = re.search(r"responses (\{.*\})", run.stdout)
    assert responses and "'2xx'" in responses.group(1), run.stdout  # the flood reached the handlers
