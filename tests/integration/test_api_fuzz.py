"""OpenAPI-driven fuzzing of a real `electra node` process: no server errors for any generated request.

Schemathesis generates valid (positive) and invalid (negative) requests for every operation
the node's /openapi.json declares. Any 5xx other than the intended 503 (not ready, limits)
and 504 (outcome unknown) is a failure, and the node must still be healthy and writable
afterwards. `fuzz_api` takes extra request options (headers, client certificates) so an
authenticated run is the same call with credentials.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from electra.bench.common import stop_processes
from electra.local_ports import free_ports

pytestmark = pytest.mark.integration

INTENDED_5XX = (503, 504)
# endless event streams (each generated request would wait out its timeout); their limits have their own tests
SKIP_PATHS = ("/v1/broker-sets/{name}/watch", "/v1/dashboard/stream")


def fuzz_api(base_url: str, *, examples: int = 25, deadline_s: float = 240.0,
             **request_options: Any) -> tuple[list[str], int]:
    """Fuzz every operation of the API at `base_url`; returns (one line per unintended server error, requests).

    `request_options` go to every request (e.g. `headers={"Authorization": ...}`, `cert=(crt, key)`,
    `verify=ca_file`), so an authenticated deployment is fuzzed the same way.
    """
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json", **request_options)
    failures: list[str] = []
    calls = 0
    stop_at = time.monotonic() + deadline_s

    def _fuzz_one(strategy, label: str):
        @given(case=strategy)
        @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        def run(case) -> None:
            nonlocal calls
            if time.monotonic() > stop_at:
                return
            resp = case.call(base_url=base_url, timeout=10, **request_options)
            calls += 1
            if resp.status_code >= 500 and resp.status_code not in INTENDED_5XX:
                failures.append(f"{label} -> {resp.status_code}: {resp.text[:200]}")

        return run

    for result in schema.get_all_operations():
        op = result.ok()
        if op.path in SKIP_PATHS:
            continue
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            run = _fuzz_one(op.as_strategy(generation_mode=mode), f"{op.method.upper()} {op.path} ({mode.value})")
            with contextlib.suppress(Unsatisfiable):  # e.g. no invalid request for an operation without input
                run()
    return failures, calls


@pytest.fixture(params=["insecure", "authenticated"])
def node(request, tmp_path):
    """One real node: plain HTTP with --insecure, or HTTPS with tokens (fuzzed as admin, the widest role)."""
    http_port, raft_port = free_ports(2)
    ep = f"127.0.0.1:{http_port}"
    if request.param == "insecure":
        security, options, scheme, ctx = ["--insecure"], {}, "http", None
    else:
        from electra.security.local import ensure_local_credentials

        creds = ensure_local_credentials(tmp_path / "certs", [1])
        admin = creds.credentials("admin")
        security, scheme, ctx = ["--certs-dir", str(creds.certs_dir)], "https", admin.ssl_context()
        options = {"headers": admin.headers(), "verify": str(creds.ca_file)}
    with open(tmp_path / "node.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "electra.cli", "node", "--id", "1", "--peers",
                                 f"1=127.0.0.1:{raft_port}", "--http-addr", ep, "--http-peers", f"1={ep}",
                                 "--data-dir", str(tmp_path / "n1"), "--tick-ms", "50", *security],
                                stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                req = urllib.request.Request(f"{scheme}://{ep}/v1/admin/metadata",
                                             headers=options.get("headers", {}))
                with urllib.request.urlopen(req, timeout=1, context=ctx) as r:
                    if json.loads(r.read())["is_leader"]:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the node did not start"
            time.sleep(0.1)
        yield f"{scheme}://{ep}", options
    finally:
        stop_processes([proc])


def test_openapi_fuzzing_finds_no_server_errors_and_the_node_stays_healthy(node, tmp_path):
    base, options = node
    extra = json.loads(os.environ.get("ELECTRA_FUZZ_HEADERS", "{}"))  # e.g. credentials of a deployment
    if extra:
        options = {**options, "headers": {**options.get("headers", {}), **extra}}
    failures, calls = fuzz_api(base, **options)
    assert not failures, "\n".join(failures[:20])
    assert calls >= 300  # every operation was exercised, valid and invalid
    ctx = None
    broker_headers = {}
    if base.startswith("https"):
        from electra.security.local import ensure_local_credentials

        broker = ensure_local_credentials(tmp_path / "certs", [1]).credentials("broker")
        ctx, broker_headers = broker.ssl_context(), broker.headers()
    with urllib.request.urlopen(f"{base}/healthz", timeout=2, context=ctx) as r:
        assert r.status == 200
    body = json.dumps({"clusterName": "c", "brokerId": 1, "registerCheckCode": "10.0.0.1:1;1"}).encode()
    req = urllib.request.Request(f"{base}/v1/broker-sets/after-fuzz/apply-broker-id", body,
                                 {"Content-Type": "application/json", **broker_headers})
    with urllib.request.urlopen(req, timeout=5, context=ctx) as r:
        assert json.loads(r.read())["code"] == 0
