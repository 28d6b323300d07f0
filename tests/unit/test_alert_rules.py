"""The Prometheus alert rules in deploy/monitoring/alerts.yml: `promtool check rules`, and `promtool test rules`
with, per alert, one scenario in which it fires (exact labels and rendered summary) and one healthy scenario in
which it stays silent. Every metric the rules use is one the code exports (checked against a real node in
tests/integration/test_exported_metrics.py)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

RULES = Path(__file__).resolve().parents[2] / "deploy" / "monitoring" / "alerts.yml"
CTL = {"job": "electra-controller"}
ING = {"job": "electra-ingest", "instance": "ingest-0:7401"}


def series(name: str, labels: dict, values: str) -> dict:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return {"series": f"{name}{{{inner}}}", "values": values}


def roles(leader: str | None, values_len: int = 40) -> list[dict]:
    """electra_raft_role{role="leader"} of nodes a, b, c: 1 on `leader`, 0 elsewhere."""
    return [series("electra_raft_role", {**CTL, "instance": n, "role": "leader"},
                   f"{1 if n == leader else 0}x{values_len}") for n in "abc"]


# alert -> (series where it fires, eval time, expected extra labels, expected summary, healthy series)
CASES = {
    "ElectraNoLeader": (
        roles(None), "2m", {**CTL, "severity": "critical"}, "No controller leads group electra-controller",
        roles("a"),
    ),
    "ElectraSplitLeadership": (
        [series("electra_raft_role", {**CTL, "instance": n, "role": "leader"}, f"{int(n != 'c')}x40")
         for n in "abc"], "2m", {**CTL, "severity": "critical"},
        "2 controllers of group electra-controller report the leader role",
        roles("a"),
    ),
    "ElectraCommitStalled": (
        [series("electra_raft_commit_stalled_seconds", {**CTL, "instance": "a"}, "0+15x100")], "2m",
        {**CTL, "instance": "a", "severity": "critical"}, "Leader a has not committed for 2m 0s",
        [series("electra_raft_commit_stalled_seconds", {**CTL, "instance": "a"}, "0 2 0 1 0 3 0 0 0 0 0 0")],
    ),
    "ElectraControllerDown": (
        [series("up", {**CTL, "instance": "b:7301"}, "0x10")], "2m",
        {**CTL, "instance": "b:7301", "severity": "warning"}, "Controller b:7301 is not scraped",
        [series("up", {**CTL, "instance": "b:7301"}, "1x10")],
    ),
    "ElectraFollowerLag": (
        [series("electra_raft_commit_index", {**CTL, "instance": n}, "5000x10") for n in ("a", "b")]
        + [series("electra_raft_applied_index", {**CTL, "instance": "a"}, "5000x10"),
           series("electra_raft_applied_index", {**CTL, "instance": "b"}, "2000x10")],
        "2m", {**CTL, "instance": "b", "severity": "warning"},
        "Controller b is 3000 entries behind the group's commit index",
        [series("electra_raft_commit_index", {**CTL, "instance": n}, "5000x10") for n in ("a", "b")]
        + [series("electra_raft_applied_index", {**CTL, "instance": n}, "4500x10") for n in ("a", "b")],
    ),
    "ElectraFailoverStorm": (
        [series("electra_elections_total", {**CTL, "instance": "a", "result": "success"}, "0+2x40")], "8m",
        {**CTL, "severity": "critical"}, "More than 20 master elections in 5 minutes in electra-controller",
        [series("electra_elections_total", {**CTL, "instance": "a", "result": "success"}, "0+1x4 5x36")],
    ),
    "ElectraPipelineLag": (
        [series("electra_raft_commit_index", {**CTL, "instance": "a"}, "2000x10"),
         series("electra_events_published_index", {**CTL, "instance": "a"}, "1000x10")] + roles("a"),
        "2m", {**CTL, "instance": "a", "severity": "warning"},
        "Events topic trails the leader's commit index by 1000 entries",
        [series("electra_raft_commit_index", {**CTL, "instance": "a"}, "2000x10"),
         series("electra_events_published_index", {**CTL, "instance": "a"}, "1990x10")] + roles("a"),
    ),
    "ElectraLivenessStalled": (
        [series("electra_liveness_records_total", {**CTL, "instance": "a"}, "100x40"),
         series("electra_ingest_heartbeats_total", {**ING, "result": "accepted"}, "0+100x40")] + roles("a"),
        "9m", {**CTL, "instance": "a", "severity": "critical"},
        "Heartbeats arrive but no liveness records come back from the streaming job",
        [series("electra_liveness_records_total", {**CTL, "instance": "a"}, "100+10x40"),
         series("electra_ingest_heartbeats_total", {**ING, "result": "accepted"}, "0+100x40")] + roles("a"),
    ),
    "ElectraIngestKafkaDown": (
        [series("electra_ingest_kafka_healthy", ING, "0x10")], "1m", {**ING, "severity": "critical"},
        "Ingest worker ingest-0:7401 cannot reach Kafka",
        [series("electra_ingest_kafka_healthy", ING, "1x10")],
    ),
    "ElectraTierLag": (
        [series("electra_tier_upload_lag_seconds", {**CTL, "instance": "a"}, "300x20")], "4m",
        {**CTL, "severity": "warning"}, "The Delta tier is 300 s behind the controller state",
        [series("electra_tier_upload_lag_seconds", {**CTL, "instance": "a"}, "2x20")],
    ),
    "ElectraTierNotUploading": (
        [series("electra_tier_uploading", {**CTL, "instance": n}, "0x40") for n in "abc"] + roles("a"),
        "7m", {**CTL, "severity": "warning"}, "A leader exists but no node uploads to the tier",
        [series("electra_tier_uploading", {**CTL, "instance": n}, f"{int(n == 'a')}x40") for n in "abc"]
        + roles("a"),
    ),
}
def rules() -> dict[str, dict]:
    doc = yaml.safe_load(RULES.read_text())
    return {r["alert"]: r for g in doc["groups"] for r in g["rules"]}


@pytest.fixture(scope="module")
def promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool is missing: `make test-tools` installs the Debian package prometheus"
    return path


def test_rules_pass_promtool_check(promtool):
    out = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_alert_has_a_firing_and_a_silent_case():
    assert set(CASES) == set(rules())
    for rule in rules().values():
        assert "{{" not in rule["annotations"]["description"], "descriptions are static; templates go in summary"
        assert rule["labels"]["severity"] in ("warning", "critical")


def test_each_alert_fires_on_its_scenario_and_not_on_a_healthy_group(promtool, tmp_path):
    defs = rules()
    tests = []
    for name, (firing, at, labels, summary, healthy) in CASES.items():
        expected = {"exp_labels": labels, "exp_annotations": {"summary": summary,
                                                             "description": defs[name]["annotations"]["description"]}}
        tests.append({"interval": "15s", "input_series": firing,
                      "alert_rule_test": [{"eval_time": at, "alertname": name, "exp_alerts": [expected]}]})
        tests.append({"interval": "15s", "input_series": healthy,
                      "alert_rule_test": [{"eval_time": at, "alertname": name, "exp_alerts": []}]})
    spec = tmp_path / "alerts-test.yml"
    spec.write_text(yaml.safe_dump({"rule_files": [str(RULES)], "evaluation_interval": "15s", "tests": tests}))
    out = subprocess.run([promtool, "test", "rules", str(spec)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_deploy_readme_lists_every_alert():
    """QA: an alert added to the rules was missing from the operators' table in deploy/README.md."""
    rules = yaml.safe_load(RULES.read_text())
    names = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    readme = (RULES.parents[1] / "README.md").read_text()
    assert {n for n in names if f"| `{n}` |" not in readme} == set()
