"""The metric names the alert rules and the Grafana dashboard use are the ones real processes export: a 3-node
in-process group with the Kafka pipeline (real tansu) and a Delta tier, and an `electra ingest` process, each
scraped over HTTP after serving a request."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from inprocess_cluster import start_cluster, wait_leader

from electra.local_ports import free_ports
from electra.streaming import records
from electra.streaming.embedded_kafka import EmbeddedKafka
from electra.streaming.kafka_io import ensure_topics
from electra.tiering.uploader import TierConfig

pytestmark = pytest.mark.integration

MONITORING = Path(__file__).resolve().parents[2] / "deploy" / "monitoring"
PROMETHEUS_OWN = {"up"}  # series Prometheus itself creates for every target


def _promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool is missing: `make test-tools` installs the Debian package prometheus"
    return path


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode()


def metric_names(exposition: str) -> set[str]:
    return {re.split(r"[{ ]", line, maxsplit=1)[0] for line in exposition.splitlines()
            if line and not line.startswith("#")}


def used_names() -> set[str]:
    rules = yaml.safe_load((MONITORING / "alerts.yml").read_text())
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    dash = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    exprs += [t["expr"] for p in dash["panels"] for t in p["targets"]]
    names = set()
    for e in exprs:
        names |= set(re.findall(r"\belectra_[a-z0-9_]+", e)) | (PROMETHEUS_OWN & set(re.findall(r"\b[a-z]+\b", e)))
    return names


def test_alerts_and_dashboard_use_exported_metrics(tmp_path):
    with EmbeddedKafka(log_file=tmp_path / "tansu.log") as kafka:
        ensure_topics(kafka.bootstrap, records.Topics().partitions())

        async def scrape_node() -> str:
            nodes, http = await start_cluster(tmp_path, scan_interval_s=0, kafka_bootstrap=kafka.bootstrap,
                                              tier=TierConfig(str(tmp_path / "tier"), interval_s=0.1))
            try:
                leader = await wait_leader(nodes)
                await asyncio.to_thread(_get, f"http://{http[leader]}/v1/broker-sets/m-1/next-broker-id?cluster=c")
                return await asyncio.to_thread(_get, f"http://{http[leader]}/metrics")
            finally:
                for n in nodes.values():
                    await n.stop()

        node_text = asyncio.run(scrape_node())
        node = metric_names(node_text)
        port = free_ports(1)[0]
        proc = subprocess.Popen([sys.executable, "-m", "electra.cli", "--log-level", "WARNING", "ingest", "--listen",
                                 f"127.0.0.1:{port}", "--kafka-bootstrap", kafka.bootstrap, "--workers", "1",
                                 "--insecure"])
        try:
            deadline = time.monotonic() + 30
            ingest = ""
            while "electra_ingest_kafka_healthy" not in ingest:
                assert time.monotonic() < deadline, "ingest worker never answered /metrics"
                with contextlib.suppress(OSError):
                    ingest = _get(f"http://127.0.0.1:{port}/metrics")
                time.sleep(0.2)
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    # Prometheus's own lint: counts that only grow are counters, units are spelled out, every family has help.
    for text in (node_text, ingest):
        lint = subprocess.run([_promtool(), "check", "metrics"], input=text, capture_output=True, text=True,
                              timeout=60)
        assert lint.returncode == 0, lint.stdout + lint.stderr
    assert "# TYPE electra_elections_total counter" in node_text or "# TYPE electra_elections counter" in node_text
    exported = node | metric_names(ingest) | PROMETHEUS_OWN
    used = used_names()
    assert len(used) >= 15
    assert used <= exported, f"not exported by any process: {sorted(used - exported)}"
