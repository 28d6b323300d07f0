"""`electra report performance` on a tiny sweep: the report files and the RESULT line are well formed.

The numbers are not checked (they depend on the machine); the shape is: both architectures
and etcd ran both phases (real mix, capacity) at every point, the storm ran at the largest one,
the HTML stands alone (inline SVG, no script and no outside address), and the last line carries
every RESULT key with a number.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

KEYS = ("brokers", "new_per_s", "old_per_s", "new_vs_old", "new_p99_ms", "old_p99_ms", "storm_recovery_s")


def test_tiny_sweep_writes_the_report_and_a_result_line(tmp_path):
    out = tmp_path / "report"
    proc = subprocess.run([sys.executable, "-m", "electra.cli", "--log-level", "WARNING", "report", "performance",
                           "--brokers", "6,15", "--duration", "2", "--heartbeat-timeout-ms", "2000",
                           "--scan-ms", "1000", "--storm-limit-s", "30", "--etcd", "on", "--out", str(out)],
                          capture_output=True, text=True, timeout=400, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    m = re.fullmatch(r"RESULT " + " ".join(rf"{k}=(\S+)" for k in KEYS), last)
    assert m, last
    values = dict(zip(KEYS, (float(v) for v in m.groups()), strict=True))
    assert values["brokers"] == 15

    report = json.loads((out / "performance.json").read_text())
    assert not (out / "points.partial.json").exists()  # kept per point while the sweep ran, replaced at the end
    for system in ("new", "legacy", "etcd"):
        points = report["points"][system]
        assert [p["brokers"] for p in points] == [6, 15]
        for p in points:
            assert p["capacity"]["count"] > 0 and p["capacity"]["load_cpu_s"] > 0, (system, p)
        assert points[-1]["mix"]["controller"]["count"] > 0, (system, points[-1])
    for arch in ("new", "legacy"):
        points = report["points"][arch]
        assert "storm" in points[-1] and "storm" not in points[0]
        assert points[0]["mix"]["heartbeat"]["count"] > 0
    page = (out / "performance.html").read_text()
    assert page.count("<svg") == 5 and "<script" not in page
    assert not re.search(r"(src|href)=['\"]?https?://", page)  # nothing fetched from the network
    for heading in ("Machine and versions", "Settings", "Real request mix", "Capacity", "Failover storm"):
        assert heading in page
    md = (out / "performance.md").read_text()
    assert md.startswith("# Electra performance report") and "| architecture | brokers |" in md
    assert last in md
