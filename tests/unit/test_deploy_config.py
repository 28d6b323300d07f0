"""Offline checks of everything in deploy/: Kubernetes manifests against the Kubernetes schemas
(kubernetes-validate, strict: unknown fields fail), the StatefulSet's identities as the node itself parses them,
the container entrypoint (run with stand-in binaries), the Dockerfile's stages, the systemd units
(`systemd-analyze verify`), the Databricks job definitions (Jobs API 2.1 shape) and the Grafana dashboard
(PromQL checked by promtool)."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from electra.cli import _NODE_TYPES, build_parser, parse_addr, parse_http_peers, parse_peers, resolve_node_settings
from electra.security.auth import TokenStore, rule_for
from electra.security.credentials import ClientCredentials
from electra.security.node_security import TOKENS_FILE, resolve_node_security
from electra.security.pki import cert_node_identity, node_cert_paths, read_cluster_id

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "kubernetes"
K8S_VERSION = "1.30.0"  # oldest Kubernetes these manifests are meant for
K8S_VERSIONS = [K8S_VERSION, kubernetes_validate.utils.latest_version()]


# --------------------------------------------------------------------------- Kubernetes
def kustomization() -> dict:
    return yaml.safe_load((K8S / "kustomization.yaml").read_text())


def manifests() -> list[dict]:
    docs = []
    for name in kustomization()["resources"]:
        docs += [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]
    return docs


def find(kind: str, name: str) -> dict:
    hits = [d for d in manifests() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(hits) == 1, f"{kind}/{name}: {len(hits)} found"
    return hits[0]


def env_of(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


def test_kustomization_lists_every_manifest():
    listed = set(kustomization()["resources"])
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("doc", manifests(), ids=lambda d: f"{d['kind']}-{d['metadata']['name']}")
def test_manifest_is_valid_kubernetes(doc, version):
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        pytest.fail(f"{doc['kind']}/{doc['metadata']['name']}: {exc.message} at {list(exc.path)}")


def test_schema_validation_catches_a_misspelt_field():
    """Guard for the test above: strict validation rejects what kubectl would reject."""
    sts = json.loads(json.dumps(find("StatefulSet", "electra")))
    sts["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = sts["spec"]["template"]["spec"][
        "containers"][0].pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(sts, K8S_VERSION, strict=True)


def test_controller_identities_follow_the_statefulset():
    """Pod electra-N is node N+1; peers, HTTP peers and the shared CONTROLLERS list name every ordinal."""
    sts = find("StatefulSet", "electra")
    svc = find("Service", sts["spec"]["serviceName"])
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    replicas = sts["spec"]["replicas"]
    c = sts["spec"]["template"]["spec"]["containers"][0]
    env = env_of(c)
    host = [f"{sts['metadata']['name']}-{i}.{svc['metadata']['name']}" for i in range(replicas)]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert parse_peers(env["ELECTRA_PEERS"]["value"]) == {i + 1: (h, ports["raft"]) for i, h in enumerate(host)}
    assert parse_http_peers(env["ELECTRA_HTTP_PEERS"]["value"]) == {
        i + 1: f"{h}:{ports['http']}" for i, h in enumerate(host)}
    assert parse_addr(env["ELECTRA_HTTP_ADDR"]["value"]) == ("0.0.0.0", ports["http"])
    config = find("ConfigMap", "electra-config")["data"]
    assert config["CONTROLLERS"].split(",") == [f"{h}:{ports['http']}" for h in host]
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert [t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]] == ["data"]
    assert env["ELECTRA_DATA_DIR"]["value"] == mounts["data"]
    assert mounts["certs"] == env["ELECTRA_CERTS_DIR"]["value"] == "/etc/electra/certs"
    assert c["args"] == ["controller"]
    pdb = find("PodDisruptionBudget", "electra")
    assert pdb["spec"]["maxUnavailable"] == 1 and pdb["spec"]["selector"] == sts["spec"]["selector"]


def test_node_accepts_the_statefulset_environment(monkeypatch, certs_secret, tmp_path):
    """The node's own settings resolution and security check, fed the manifest's env (plain values), the
    entrypoint's node id and the electra-certs Secret (as `electra cert` writes it) mounted where the pod
    mounts it: the node starts secure (a wrong variable name would end in "refusing to serve without TLS")."""
    sts = find("StatefulSet", "electra")
    pod = sts["spec"]["template"]["spec"]
    container = pod["containers"][0]
    mounted = mount_secrets(pod, container, certs_secret, tmp_path / "root")
    for name, e in env_of(container).items():
        if "value" in e:
            monkeypatch.setenv(name, e["value"])
    monkeypatch.setenv("ELECTRA_KAFKA_BOOTSTRAP", find("ConfigMap", "electra-config")["data"]["KAFKA_BOOTSTRAP"])
    for node_id in range(1, sts["spec"]["replicas"] + 1):
        monkeypatch.setenv("ELECTRA_NODE_ID", str(node_id))
        args = resolve_node_settings(build_parser().parse_args(["node"]))
        assert args.id == node_id and args.id in args.peers and args.data_dir == "/var/lib/electra/data"
        assert args.inactive_master_scan_ms == 0  # with Kafka, the streaming job detects dead masters
        security = resolve_node_security(args.id, mounted(args.certs_dir), insecure=args.insecure,
                                         cluster_id=args.cluster_id, tokens_file=args.tokens_file)
        assert not security.insecure and security.tokens is not None


def test_ingest_deployment_serves_https_with_mounted_files(monkeypatch, certs_secret, tmp_path):
    """`electra ingest` parsed with the Deployment's args and env finds its certificate, key and tokens in the
    mounted Secret (the same files cmd_ingest checks before serving)."""
    dep = find("Deployment", "electra-ingest")
    pod = dep["spec"]["template"]["spec"]
    container = pod["containers"][0]
    mounted = mount_secrets(pod, container, certs_secret, tmp_path / "root")
    for name, e in env_of(container).items():
        if "value" in e:
            monkeypatch.setenv(name, e["value"])
    config = find("ConfigMap", "electra-config")["data"]
    argv = [_expand(a, {"KAFKA_BOOTSTRAP": config["KAFKA_BOOTSTRAP"], "TOPIC_PREFIX": config["TOPIC_PREFIX"]})
            for a in container["args"]]
    assert argv[:2] == ["electra", "ingest"]
    args = build_parser().parse_args(argv[1:])  # the env fallbacks are read when the parser is built
    assert not args.insecure and args.certs_dir and args.node_id is not None
    certs = Path(mounted(args.certs_dir))
    for f in (*node_cert_paths(certs, args.node_id), Path(args.tokens_file or certs / TOKENS_FILE)):
        assert f.is_file(), f"the ingest needs {f.name}, which its mount of electra-certs lacks"
    cluster_id, _ = cert_node_identity(node_cert_paths(certs, args.node_id)[0])
    assert cluster_id == read_cluster_id(certs_secret)


def test_streaming_driver_has_its_client_credentials(monkeypatch, certs_secret, tmp_path):
    """The driver's ELECTRA_TOKEN_FILE / ELECTRA_CA_FILE name files of its Secret mount: the client speaks HTTPS
    with the pipeline token."""
    dep = find("Deployment", "electra-streaming")
    pod = dep["spec"]["template"]["spec"]
    container = pod["containers"][0]
    mounted = mount_secrets(pod, container, certs_secret, tmp_path / "root")
    env = {name: mounted(e["value"]) for name, e in env_of(container).items()
           if name in ("ELECTRA_TOKEN_FILE", "ELECTRA_CA_FILE")}
    creds = ClientCredentials.from_env(env)
    assert creds.scheme == "https" and Path(creds.ca_file).is_file()
    principal = TokenStore(certs_secret / TOKENS_FILE).authenticate(creds.headers()["Authorization"])
    assert principal.role == "pipeline"
    names = {item["key"] for v in pod["volumes"] if "secret" in v for item in v["secret"].get("items", [])}
    assert not any(n.endswith(".key") or n == TOKENS_FILE for n in names), "the driver needs no node keys"


def test_env_variables_set_in_deploy_are_read_by_the_code():
    """Every ELECTRA_* name in deploy/ (manifests, units, env examples, job definitions, docs) is one the code
    reads: a node option (ELECTRA_<OPTION>) or a name the sources spell out (credentials, Kafka security, ...)."""
    read = {"ELECTRA_NODE_ID"} | {f"ELECTRA_{key.upper()}" for key in _NODE_TYPES}
    for src in ROOT.glob("*/**/*.py"):
        if src.parts[len(ROOT.parts)] in ("tests", ".venv", "bench", "notebooks") or "site-packages" in src.parts:
            continue
        read |= set(re.findall(r"[\"'](ELECTRA_[A-Z0-9_]*[A-Z0-9])[\"'=]", src.read_text()))
    assert {"ELECTRA_CERTS_DIR", "ELECTRA_TOKEN_FILE", "ELECTRA_CA_FILE", "ELECTRA_KAFKA_CA_FILE"} <= read
    for path in sorted(p for p in DEPLOY.rglob("*") if p.is_file()):
        used = set(re.findall(r"\b(ELECTRA_[A-Z0-9_]*[A-Z0-9])\b", path.read_text()))
        assert used <= read, f"{path.relative_to(ROOT)} sets {sorted(used - read)}, which nothing reads"


def test_http_probes_and_scrapes_speak_https():
    """The node and the ingest serve HTTPS only: an HTTP probe would fail every check, an HTTP scrape too."""
    for w in (d for d in manifests() if d["kind"] in ("StatefulSet", "Deployment")):
        for c in w["spec"]["template"]["spec"]["containers"]:
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                if "httpGet" in c.get(probe, {}):
                    assert c[probe]["httpGet"].get("scheme") == "HTTPS", f"{w['metadata']['name']} {probe}"
                    assert rule_for("GET", c[probe]["httpGet"]["path"]).public, "probes send no token"
        notes = w["spec"]["template"]["metadata"].get("annotations", {})
        if notes.get("prometheus.io/scrape") == "true":
            assert notes.get("prometheus.io/scheme") == "https", w["metadata"]["name"]


def test_references_between_manifests_resolve():
    """Every ConfigMap/Secret key, Service selector and ServiceAccount a pod refers to exists (Secrets marked
    optional may be absent, and electra-certs is created by whoever issues the certificates)."""
    docs = manifests()
    by_kind = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    workloads = [d for d in docs if d["kind"] in ("StatefulSet", "Deployment")]
    for w in workloads:
        pod = w["spec"]["template"]["spec"]
        for c in pod["containers"]:
            for e in c.get("env", []):
                ref = e.get("valueFrom", {})
                for kind, key in (("ConfigMap", "configMapKeyRef"), ("Secret", "secretKeyRef")):
                    if key in ref:
                        target = by_kind.get((kind, ref[key]["name"]))
                        if target is None:
                            assert ref[key].get("optional"), f"{kind} {ref[key]['name']} missing"
                            continue
                        data = {**target.get("data", {}), **target.get("stringData", {})}
                        assert ref[key]["key"] in data, f"{kind} {ref[key]['name']} has no {ref[key]['key']}"
        for v in pod.get("volumes", []):
            if "secret" in v and ("Secret", v["secret"]["secretName"]) not in by_kind:
                # electra-certs is made by whoever issues certificates (deploy/README.md), the rest is optional
                assert v["secret"]["secretName"] == "electra-certs" or v["secret"].get("optional"), v
            if "persistentVolumeClaim" in v:
                assert ("PersistentVolumeClaim", v["persistentVolumeClaim"]["claimName"]) in by_kind
        if "serviceAccountName" in pod:
            assert ("ServiceAccount", pod["serviceAccountName"]) in by_kind
        sc = pod["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] != 0
        # kustomize's `images:` rewrites containers whose image is the placeholder name
        assert {c["image"] for c in pod["containers"]} == {kustomization()["images"][0]["name"]}
    for d in docs:
        if d["kind"] == "Service":
            sel = d["spec"]["selector"]
            assert any(sel.items() <= w["spec"]["template"]["metadata"]["labels"].items() for w in workloads), d


def _expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion of env values."""
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), value)


def test_streaming_deployment_submits_to_kubernetes(tmp_path):
    """deploy/spark-submit.sh run with the Deployment's environment (a stand-in spark-submit records its argv)."""
    dep = find("Deployment", "electra-streaming")
    c = dep["spec"]["template"]["spec"]["containers"][0]
    config = find("ConfigMap", "electra-config")["data"]
    env = {"POD_NAME": "electra-streaming-abc", "POD_NAMESPACE": "electra", "PATH": os.environ["PATH"]}
    for name, e in env_of(c).items():
        if "value" in e:
            env[name] = _expand(e["value"], env)
        elif "configMapKeyRef" in e.get("valueFrom", {}):
            env[name] = config[e["valueFrom"]["configMapKeyRef"]["key"]]
    argv_file = tmp_path / "argv"
    stub = tmp_path / "spark-submit"
    stub.write_text(f'#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done > {argv_file}\n')
    stub.chmod(0o755)
    env["SPARK_SUBMIT"] = str(stub)
    assert c["args"] == ["/opt/electra/deploy/spark-submit.sh"]
    subprocess.run(["bash", str(DEPLOY / "spark-submit.sh")], env=env, check=True, timeout=30)
    argv = argv_file.read_text().splitlines()
    confs = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--conf")
    assert argv[argv.index("--master") + 1] == "k8s://https://kubernetes.default.svc:443"
    assert argv[argv.index("--deploy-mode") + 1] == "client"
    assert confs["spark.kubernetes.driver.pod.name"] == "electra-streaming-abc"
    assert confs["spark.kubernetes.namespace"] == "electra"
    images = kustomization()["images"][0]
    assert confs["spark.kubernetes.container.image"] == f"{images['newName']}:{images['newTag']}"
    driver_svc = find("Service", "electra-spark-driver")
    svc_ports = {p["name"]: p["port"] for p in driver_svc["spec"]["ports"]}
    assert confs["spark.driver.host"] == "electra-spark-driver.electra.svc"
    assert int(confs["spark.driver.port"]) == svc_ports["driver"]
    assert int(confs["spark.driver.blockManager.port"]) == svc_ports["blockmanager"]
    mount = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}["checkpoint"]
    key = "spark.kubernetes.executor.volumes.persistentVolumeClaim.checkpoint"
    assert confs[f"{key}.mount.path"] == mount == env["CHECKPOINT"]
    assert confs[f"{key}.options.claimName"] == "electra-spark-checkpoint"
    # the executors send proposals too: the driver's two files, from a Secret holding only them
    secret = confs["spark.kubernetes.executor.secrets.electra-pipeline"]
    for name in ("ELECTRA_TOKEN_FILE", "ELECTRA_CA_FILE"):
        assert confs[f"spark.executorEnv.{name}"] == f"{secret}/{Path(env[name]).name}"
    job = argv[argv.index(str(DEPLOY / "run_job.py")) + 1:]
    assert job[job.index("--bootstrap") + 1] == config["KAFKA_BOOTSTRAP"]
    assert job[job.index("--controllers") + 1] == config["CONTROLLERS"]
    assert job[job.index("--checkpoint") + 1] == mount
    assert "--no-hwm-fix" in job


# --------------------------------------------------------------------------- the electra-certs Secret
@pytest.fixture(scope="module")
def certs_secret(tmp_path_factory) -> Path:
    """The files of the electra-certs Secret, written by `electra cert` as deploy/README.md says."""
    d = tmp_path_factory.mktemp("certs")
    parser = build_parser()

    def cert(*argv: str) -> None:
        args = parser.parse_args(["cert", *argv, "--certs-dir", str(d)])
        assert args.fn(args) == 0, argv

    cert("create-ca")
    for node_id in (1, 2, 3, 100):
        cert("create-node", "--id", str(node_id), "--host", f"host-{node_id}")
    for role in ("observer", "pipeline"):
        cert("create-token", "--role", role, "--name", role, "--out", str(d / f"{role}.token"))
    (d / "ca.key").unlink()  # never shipped to the pods
    return d


def mount_secrets(pod: dict, container: dict, secret_dir: Path, root: Path):
    """Copy what the container would see of the Secret volumes under `root`; returns a path mapper."""
    volumes = {v["name"]: v for v in pod["volumes"]}
    for m in container.get("volumeMounts", []):
        v = volumes.get(m["name"], {})  # volumeClaimTemplates are not in `volumes`
        if "secret" not in v:
            continue
        assert v["secret"]["secretName"] == "electra-certs" and not v["secret"].get("optional"), v
        dest = root / m["mountPath"].lstrip("/")
        dest.mkdir(parents=True)
        items = v["secret"].get("items") or [{"key": f.name, "path": f.name} for f in secret_dir.iterdir()]
        for item in items:
            assert (secret_dir / item["key"]).is_file(), f"electra cert writes no {item['key']}"
            shutil.copy(secret_dir / item["key"], dest / item["path"])
    return lambda path: str(root / path.lstrip("/"))


# --------------------------------------------------------------------------- entrypoint
@pytest.fixture
def stub_path(tmp_path) -> str:
    """A PATH whose `electra` and `java` print their argv (and ELECTRA_NODE_ID), one item per line."""
    for name in ("electra", "java"):
        p = tmp_path / name
        p.write_text('#!/bin/sh\necho "NODE_ID=${ELECTRA_NODE_ID:-}"\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
        p.chmod(0o755)
    return f"{tmp_path}:{os.environ['PATH']}"


def entrypoint(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", str(DEPLOY / "entrypoint.sh"), *args], env=env, capture_output=True, text=True,
                          timeout=30)


def test_entrypoint_takes_the_node_id_from_the_pod_ordinal(stub_path):
    out = entrypoint(["controller", "--log-level", "INFO"], {"PATH": stub_path, "HOSTNAME": "electra-2"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["NODE_ID=3", "node", "--log-level", "INFO"]
    out = entrypoint(["controller"], {"PATH": stub_path, "POD_NAME": "my-electra-10", "HOSTNAME": "x"})
    assert out.stdout.splitlines()[0] == "NODE_ID=11"


def test_entrypoint_refuses_a_name_without_ordinal(stub_path):
    out = entrypoint(["controller"], {"PATH": stub_path, "HOSTNAME": "electra"})
    assert out.returncode == 2 and "cannot take a node id" in out.stderr


def test_entrypoint_starts_the_spark_executor_backend(stub_path):
    env = {"PATH": stub_path, "SPARK_HOME": "/opt/spark", "SPARK_EXECUTOR_MEMORY": "1g",
           "SPARK_JAVA_OPT_0": "-Dspark.driver.port=7078", "SPARK_JAVA_OPT_1": "-Dx=a b",
           "SPARK_DRIVER_URL": "spark://CoarseGrainedScheduler@drv:7078", "SPARK_EXECUTOR_ID": "4",
           "SPARK_EXECUTOR_CORES": "1", "SPARK_APPLICATION_ID": "spark-1", "SPARK_EXECUTOR_POD_IP": "10.0.0.9",
           "SPARK_EXECUTOR_POD_NAME": "exec-4"}
    out = entrypoint(["executor"], env)
    assert out.returncode == 0, out.stderr
    argv = out.stdout.splitlines()[1:]
    assert argv[:4] == ["-Xms1g", "-Xmx1g", "-Dspark.driver.port=7078", "-Dx=a b"]
    assert argv[argv.index("-cp") + 1] == "/opt/spark/jars/*"
    env["SPARK_CLASSPATH"] = "/opt/extra/x.jar"  # spark.executor.extraClassPath, as Spark passes it to the pod
    argv = entrypoint(["executor"], env).stdout.splitlines()[1:]
    assert argv[argv.index("-cp") + 1] == "/opt/spark/jars/*:/opt/extra/x.jar"
    assert "org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend" in argv
    pairs = dict(zip(argv[::1], argv[1:]))
    assert pairs["--executor-id"] == "4" and pairs["--podName"] == "exec-4" and pairs["--hostname"] == "10.0.0.9"


def test_entrypoint_runs_other_commands_as_given(stub_path):
    out = entrypoint(["electra", "ingest", "--workers", "2"], {"PATH": stub_path})
    assert out.stdout.splitlines() == ["NODE_ID=", "ingest", "--workers", "2"]


# --------------------------------------------------------------------------- Dockerfile
def dockerfile_stages() -> list[dict]:
    stages: list[dict] = []
    text = (DEPLOY / "Dockerfile").read_text().replace("\\\n", " ")
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        op, _, rest = line.partition(" ")
        op = op.upper()
        if op == "FROM":
            m = re.fullmatch(r"(\S+)(?:\s+AS\s+(\S+))?", rest.strip(), re.IGNORECASE)
            assert m, line
            stages.append({"image": m.group(1), "name": m.group(2), "ops": []})
        else:
            assert stages, f"{op} before FROM"
            stages[-1]["ops"].append((op, rest.strip()))
    return stages


def test_dockerfile_is_multi_stage_non_root_with_java():
    stages = dockerfile_stages()
    assert len(stages) >= 2 and stages[0]["name"] == "build"
    final = stages[-1]
    ops = final["ops"]
    users = [rest for op, rest in ops if op == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root")
    runs = " ".join(rest for op, rest in ops if op == "RUN")
    assert "openjdk-17-jre-headless" in runs
    copies = [rest for op, rest in ops if op == "COPY"]
    assert any(c.startswith("--from=build ") for c in copies), "the runtime copies the build stage's venv"
    assert not any(op == "RUN" and "pip install" in rest for op, rest in ops), "no build tools in the runtime"
    entry = json.loads(next(rest for op, rest in ops if op == "ENTRYPOINT"))
    assert "/opt/electra/deploy/entrypoint.sh" in entry
    # The user the Kubernetes manifests run as is the image's user.
    uid = int(users[-1].split(":")[0])
    for w in (d for d in manifests() if d["kind"] in ("StatefulSet", "Deployment")):
        assert w["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == uid


def test_dockerfile_copies_every_package_and_existing_sources():
    stages = dockerfile_stages()
    sources = []
    for st in stages:
        for op, rest in st["ops"]:
            if op == "COPY" and not rest.startswith("--from="):
                sources += rest.split()[:-1]
    ignored = [p.strip().rstrip("/") for p in (ROOT / ".dockerignore").read_text().splitlines()
               if p.strip() and not p.startswith("#")]
    for src in sources:
        assert (ROOT / src).exists(), f"COPY source {src} does not exist"
        path = src.rstrip("/")
        assert not any(path == pat or path.startswith(pat + "/") or fnmatch.fnmatch(path, pat) for pat in ignored), \
            f"{src} is excluded by .dockerignore"
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    package_dirs = set(pyproject["tool"]["setuptools"]["package-dir"].values())
    copied = {s.rstrip("/") for s in sources}
    assert package_dirs <= copied, f"packages missing from the image: {package_dirs - copied}"


# --------------------------------------------------------------------------- systemd
def test_systemd_units_verify(tmp_path):
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is missing (Debian package systemd)"
    root = tmp_path / "root"
    # A root where the programs the units start exist, with the system's own units (targets) beside ours.
    for exe in ("opt/electra/venv/bin/electra", "opt/electra/deploy/spark-submit.sh"):
        (root / exe).parent.mkdir(parents=True, exist_ok=True)
        (root / exe).write_text("#!/bin/sh\n")
        (root / exe).chmod(0o755)
    system_units = next(p for p in (Path("/usr/lib/systemd/system"), Path("/lib/systemd/system")) if p.is_dir())
    shutil.copytree(system_units, root / "usr/lib/systemd/system", symlinks=True)
    units = root / "etc/systemd/system"
    units.mkdir(parents=True)
    paths = []
    for unit in sorted((DEPLOY / "systemd").glob("*.service")):
        shutil.copy(unit, units / unit.name)
        paths.append(str(units / unit.name))
    assert len(paths) == 3
    out = subprocess.run([analyze, "verify", f"--root={root}", *paths], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and not out.stderr.strip() and not out.stdout.strip(), out.stdout + out.stderr


def test_systemd_node_unit_matches_the_node_settings():
    text = (DEPLOY / "systemd" / "electra-node@.service").read_text()
    assert "Environment=ELECTRA_NODE_ID=%i" in text and "ExecStart=/opt/electra/venv/bin/electra node" in text
    from electra.cli import EXIT_DISK_FAILURE  # a fail-stop is not restarted every 2 s: a restart cannot fix it

    assert f"RestartPreventExitStatus={EXIT_DISK_FAILURE}" in text.splitlines()
    example = dict(line.split("=", 1) for line in (DEPLOY / "systemd" / "node.env.example").read_text().splitlines()
                   if line and not line.startswith("#"))
    parse_peers(example["ELECTRA_PEERS"])
    parse_http_peers(example["ELECTRA_HTTP_PEERS"])
    parse_addr(example["ELECTRA_HTTP_ADDR"])


def unit_settings(name: str, instance: str) -> tuple[dict[str, str], dict[str, str]]:
    """A unit's Environment= variables and LoadCredential= names -> source paths, with %i filled in."""
    env: dict[str, str] = {}
    creds: dict[str, str] = {}
    for line in (DEPLOY / "systemd" / name).read_text().replace("%i", instance).splitlines():
        if line.startswith("Environment="):
            env |= dict(kv.split("=", 1) for kv in line.removeprefix("Environment=").split())
        elif line.startswith("LoadCredential="):
            cred, _, source = line.removeprefix("LoadCredential=").partition(":")
            creds[cred] = source
    return env, creds


def load_credentials(creds: dict[str, str], secret_dir: Path, dest: Path) -> None:
    """What systemd does at start: copy each credential into $CREDENTIALS_DIRECTORY (%d)."""
    dest.mkdir()
    for cred, source in creds.items():
        assert source.startswith("/etc/electra/certs/"), source
        shutil.copy(secret_dir / Path(source).name, dest / cred)


def test_systemd_node_unit_starts_secure(monkeypatch, certs_secret, tmp_path):
    """electra-node@2: the credentials it loads are the files the node looks for in ELECTRA_CERTS_DIR."""
    env, creds = unit_settings("electra-node@.service", "2")
    load_credentials(creds, certs_secret, tmp_path / "credentials")
    for line in (DEPLOY / "systemd" / "node.env.example").read_text().splitlines():
        if line and not line.startswith("#"):
            monkeypatch.setenv(*line.split("=", 1))
    for k, v in env.items():
        v = v.replace("%d", str(tmp_path / "credentials")).replace("/etc/electra/certs/", f"{certs_secret}/")
        monkeypatch.setenv(k, v)
    args = resolve_node_settings(build_parser().parse_args(["node"]))
    assert args.id == 2
    security = resolve_node_security(args.id, args.certs_dir, insecure=args.insecure, cluster_id=args.cluster_id,
                                     tokens_file=args.tokens_file)
    assert not security.insecure and Path(args.tokens_file).parent == certs_secret  # read in place: live rotation


def test_systemd_ingest_and_streaming_units_have_their_files(monkeypatch, certs_secret, tmp_path):
    env, creds = unit_settings("electra-ingest@.service", "100")
    load_credentials(creds, certs_secret, tmp_path / "ingest")
    for k, v in env.items():
        monkeypatch.setenv(k, v.replace("%d", str(tmp_path / "ingest")))
    args = build_parser().parse_args(["ingest", "--kafka-bootstrap", "k:9092"])
    assert not args.insecure and args.node_id == 100
    for f in node_cert_paths(args.certs_dir, args.node_id):
        assert f.is_file(), f
    assert Path(args.tokens_file) == Path("/etc/electra/certs") / TOKENS_FILE
    env, creds = unit_settings("electra-streaming.service", "")
    load_credentials(creds, certs_secret, tmp_path / "streaming")
    creds_env = {k: v.replace("%d", str(tmp_path / "streaming")) for k, v in env.items()}
    client = ClientCredentials.from_env(creds_env)
    assert client.scheme == "https" and client.token == (certs_secret / "pipeline.token").read_text().strip()


# --------------------------------------------------------------------------- Prometheus
def test_prometheus_scrape_config_uses_https_and_an_observer_token(tmp_path, certs_secret):
    """promtool accepts the configuration (with its files present), every job scrapes over HTTPS with the CA and
    a token file, and the job names are the ones the alert rules use."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: `make test-tools` installs the Debian package prometheus"
    config = yaml.safe_load((DEPLOY / "monitoring" / "prometheus-scrape.yml").read_text())
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    alerts = (DEPLOY / "monitoring" / "alerts.yml").read_text()
    assert set(re.findall(r'job="([\w-]+)"', alerts)) <= set(jobs)
    for job in jobs.values():
        assert job["scheme"] == "https" and job["authorization"]["type"] == "Bearer"
        assert Path(job["tls_config"]["ca_file"]).name == "ca.crt"
        job["tls_config"]["ca_file"] = str(certs_secret / "ca.crt")
        job["authorization"]["credentials_file"] = str(certs_secret / "observer.token")
    shutil.copy(DEPLOY / "monitoring" / "alerts.yml", tmp_path / "alerts.yml")
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    out = subprocess.run([promtool, "check", "config", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


# --------------------------------------------------------------------------- Databricks
_TASK_TYPES = ["notebook_task", "spark_python_task", "python_wheel_task", "spark_jar_task", "spark_submit_task",
               "sql_task", "dbt_task", "pipeline_task", "run_job_task", "condition_task", "for_each_task"]
_CLUSTER = {
    "type": "object", "required": ["spark_version"],
    "properties": {"spark_version": {"type": "string", "pattern": r"^\d+\.\d+\.x-(photon-)?scala2\.1[23]$"},
                   "node_type_id": {"type": "string"}, "num_workers": {"type": "integer", "minimum": 0},
                   "autoscale": {"type": "object", "required": ["min_workers", "max_workers"]},
                   "spark_conf": {"type": "object", "additionalProperties": {"type": "string"}},
                   "spark_env_vars": {"type": "object", "additionalProperties": {"type": "string"}},
                   "custom_tags": {"type": "object", "additionalProperties": {"type": "string"}},
                   "data_security_mode": {"enum": ["SINGLE_USER", "USER_ISOLATION", "NONE"]}},
    "oneOf": [{"required": ["num_workers"]}, {"required": ["autoscale"]}],
}
# The parts of the Jobs API 2.1 JobSettings (POST /api/2.1/jobs/create) these definitions use; unknown keys fail.
JOB_SCHEMA = {
    "type": "object", "required": ["name", "tasks"], "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "minLength": 1}, "description": {"type": "string"},
        "tags": {"type": "object", "additionalProperties": {"type": "string"}},
        "max_concurrent_runs": {"type": "integer", "minimum": 1},
        "timeout_seconds": {"type": "integer"}, "email_notifications": {"type": "object"},
        "continuous": {"type": "object", "properties": {"pause_status": {"enum": ["PAUSED", "UNPAUSED"]}},
                       "additionalProperties": False},
        "schedule": {"type": "object", "required": ["quartz_cron_expression", "timezone_id"],
                     "properties": {"quartz_cron_expression": {"type": "string"}, "timezone_id": {"type": "string"},
                                    "pause_status": {"enum": ["PAUSED", "UNPAUSED"]}}, "additionalProperties": False},
        "job_clusters": {"type": "array", "items": {"type": "object", "required": ["job_cluster_key", "new_cluster"],
                                                     "properties": {"job_cluster_key": {"type": "string"},
                                                                    "new_cluster": _CLUSTER},
                                                     "additionalProperties": False}},
        "parameters": {"type": "array", "items": {"type": "object", "required": ["name", "default"],
                                                   "additionalProperties": False,
                                                   "properties": {"name": {"type": "string"},
                                                                  "default": {"type": "string"}}}},
        "tasks": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["task_key"], "additionalProperties": False,
            "properties": {
                "task_key": {"type": "string", "pattern": r"^[\w\-.]{1,100}$"}, "description": {"type": "string"},
                "depends_on": {"type": "array", "items": {"type": "object", "required": ["task_key"]}},
                "job_cluster_key": {"type": "string"}, "existing_cluster_id": {"type": "string"},
                "new_cluster": _CLUSTER,
                "libraries": {"type": "array", "items": {"type": "object", "minProperties": 1, "maxProperties": 1}},
                "max_retries": {"type": "integer", "minimum": -1},
                "min_retry_interval_millis": {"type": "integer"}, "retry_on_timeout": {"type": "boolean"},
                "timeout_seconds": {"type": "integer"},
                "notebook_task": {"type": "object", "required": ["notebook_path"], "additionalProperties": False,
                                  "properties": {"notebook_path": {"type": "string"},
                                                 "base_parameters": {"type": "object",
                                                                     "additionalProperties": {"type": "string"}},
                                                 "source": {"enum": ["WORKSPACE", "GIT"]}}},
                "spark_python_task": {"type": "object", "required": ["python_file"], "additionalProperties": False,
                                      "properties": {"python_file": {"type": "string"},
                                                     "parameters": {"type": "array", "items": {"type": "string"}},
                                                     "source": {"enum": ["WORKSPACE", "GIT"]}}},
                **{t: {"type": "object"} for t in _TASK_TYPES[2:]},
            },
            "oneOf": [{"required": [t]} for t in _TASK_TYPES],
            "allOf": [{"oneOf": [{"required": [k]} for k in ("job_cluster_key", "existing_cluster_id",
                                                              "new_cluster")]}],
        }},
    },
    "not": {"required": ["schedule", "continuous"]},
}


def databricks_jobs() -> list[Path]:
    return sorted((DEPLOY / "databricks").glob("*.json"))


@pytest.mark.parametrize("path", databricks_jobs(), ids=lambda p: p.name)
def test_databricks_job_matches_the_jobs_api(path):
    job = json.loads(path.read_text())
    jsonschema.validate(job, JOB_SCHEMA)
    keys = [t["task_key"] for t in job["tasks"]]
    assert len(keys) == len(set(keys))
    clusters = {c["job_cluster_key"] for c in job.get("job_clusters", [])}
    params = {p["name"] for p in job.get("parameters", [])}
    for t in job["tasks"]:
        assert t.get("job_cluster_key", next(iter(clusters), None)) in clusters
        assert all(d["task_key"] in keys for d in t.get("depends_on", []))
        for ref in re.findall(r"\{\{job\.parameters\.(\w+)\}\}", json.dumps(t)):
            assert ref in params, f"{t['task_key']} uses undefined job parameter {ref}"
        if "notebook_task" in t:
            name = t["notebook_task"]["notebook_path"].rsplit("/", 1)[1]
            assert (ROOT / "notebooks" / f"{name}.ipynb").exists(), f"no notebook {name}"
        if "spark_python_task" in t:
            job_args = t["spark_python_task"]["parameters"]
            # the streaming job's own parser accepts the arguments (job parameters filled in)
            from electra.streaming.job import parse_args
            filled = [re.sub(r"\{\{job\.parameters\.(\w+)\}\}", "x:1", a) for a in job_args]
            parse_args(filled)


def test_jobs_schema_rejects_a_task_without_compute():
    job = json.loads(databricks_jobs()[0].read_text())
    job["tasks"][0].pop("job_cluster_key")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(job, JOB_SCHEMA)


# --------------------------------------------------------------------------- Grafana
def dashboard() -> dict:
    return json.loads((DEPLOY / "monitoring" / "grafana-dashboard.json").read_text())


def dashboard_exprs() -> list[str]:
    return [t["expr"] for p in dashboard()["panels"] for t in p["targets"]]


def test_grafana_dashboard_structure():
    d = dashboard()
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids)) and d["uid"]
    assert {v["name"] for v in d["templating"]["list"]} >= {"datasource"}
    for p in d["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24 and p["targets"]
        assert p["datasource"]["uid"] == "${datasource}"


def test_grafana_queries_are_valid_promql(tmp_path):
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: `make test-tools` installs the Debian package prometheus"
    rules = {"groups": [{"name": "dashboard", "rules": [{"record": f"dashboard:panel_{i}", "expr": e}
                                                        for i, e in enumerate(dashboard_exprs())]}]}
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump(rules))
    out = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def _submit_argv(tmp_path, **env_over: str) -> list[str]:
    argv_file, stub = tmp_path / "argv", tmp_path / "spark-submit"
    stub.write_text(f'#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done > {argv_file}\n')
    stub.chmod(0o755)
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", str(tmp_path)), "BOOTSTRAP": "k:9092",
           "CONTROLLERS": "a:1,b:2,c:3", "CHECKPOINT": str(tmp_path / "cp"), "SPARK_SUBMIT": str(stub), **env_over}
    subprocess.run(["bash", str(DEPLOY / "spark-submit.sh")], env=env, check=True, timeout=120)
    return argv_file.read_text().splitlines()


def _confs(argv: list[str]) -> dict[str, str]:
    return dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--conf")


def test_spark_submit_puts_the_local_file_system_jar_on_both_class_paths(tmp_path):
    """spark-submit.sh finds the job's java.nio local file system (streaming/local_fs_jar.py) with the job's
    Python, names it for the driver and the executors, and leaves Hadoop's when LOCAL_FS_JAR is empty."""
    found = _confs(_submit_argv(tmp_path, PYSPARK_PYTHON=sys.executable))
    jar = found["spark.driver.extraClassPath"]
    assert Path(jar).is_file() and found["spark.executor.extraClassPath"] == jar
    assert found["spark.hadoop.fs.file.impl"] == "electra.hadoop.NioLocalFileSystem"
    assert found["spark.hadoop.fs.AbstractFileSystem.file.impl"] == "electra.hadoop.NioLocalFs"
    given = _confs(_submit_argv(tmp_path, PYSPARK_PYTHON=sys.executable, LOCAL_FS_JAR="/opt/electra/jars/x.jar"))
    assert given["spark.executor.extraClassPath"] == "/opt/electra/jars/x.jar"
    off = _confs(_submit_argv(tmp_path, PYSPARK_PYTHON=sys.executable, LOCAL_FS_JAR=""))
    assert not any(k.startswith("spark.hadoop.fs.") or "extraClassPath" in k for k in off)
