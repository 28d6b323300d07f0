"""`electra up`'s secure stack without Spark: every process of LocalStack with the certificates and role
tokens it created, and each client with its role: brokers through the HTTPS ingest workers, the job's
sink with the pipeline credential, `electra status` with the admin token from the environment."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import pytest

from electra.api.client import ControllerClient
from electra.broker_simulator import BrokerFleet
from electra.cli import dashboard_hint
from electra.local_ports import free_ports
from electra.local_stack import LocalStack, StackConfig
from electra.streaming.sink import ControllerClient as SinkClient

pytestmark = pytest.mark.integration


def test_secure_local_stack_serves_every_role(tmp_path):
    ports = free_ports(9)
    stack = LocalStack(StackConfig(data_dir=tmp_path, tick_ms=50, tier_uri=None, log_level="INFO"))
    stack.raft_peers = ",".join(f"{i}=127.0.0.1:{ports[i - 1]}" for i in (1, 2, 3))
    stack.endpoints = {i: f"127.0.0.1:{ports[2 + i]}" for i in (1, 2, 3)}
    stack.ingest_endpoints = {i: f"127.0.0.1:{ports[5 + i]}" for i in (1, 2, 3)}
    creds = stack.creds
    assert creds is not None and (tmp_path / "certs" / "ca.crt").exists()

    async def scenario() -> None:
        endpoints = list(stack.endpoints.values())
        admin = ControllerClient(endpoints, credentials=creds.credentials("admin"), deadline_s=30)
        fleet = BrokerFleet(endpoints, 3, 3, heartbeat_s=0.5, poll_s=1.0, timeout_ms=3000,
                            ingest_endpoints=list(stack.ingest_endpoints.values()),
                            credentials=creds.credentials("broker"))
        try:
            deadline = time.monotonic() + 30
            while await admin.find_leader() is None:
                assert time.monotonic() < deadline, "no leader"
                await asyncio.sleep(0.2)
            await fleet.start()  # apply/register/elect over HTTPS, heartbeats through the HTTPS ingest workers
            assert fleet.stats["heartbeats"] > 0 or fleet.stats["requests"] > 0
            info = await admin.replica_info("sim-set-0")
            assert info["httpStatus"] == 200 and info["header"]["masterBrokerId"] == 1, info
            # the heartbeats went through the authenticated ingest workers into Kafka
            hb = await fleet.client.heartbeat("sim", "sim-set-0", 1, "10.0.0.1:10911")
            assert hb["httpStatus"] == 200, hb
            # the job's sink: pipeline credential accepted, the broker's refused
            proposal = {"clusterName": "sim", "brokerName": "sim-set-0", "expectedMasterEpoch": 0, "live": []}
            sink = SinkClient(endpoints, credentials=creds.credentials("pipeline"), deadline_s=10)
            out = await asyncio.to_thread(sink.propose, proposal)
            assert out.status == 409 and out.result == "fenced", out  # authenticated, then fenced by the epoch
            as_broker = SinkClient(endpoints, credentials=creds.credentials("broker"), deadline_s=10)
            out = await asyncio.to_thread(as_broker.propose, proposal)
            assert out.status in (401, 403) and out.result == "rejected", out
        finally:
            await fleet.stop()
            await admin.close()

    try:
        stack.start_kafka()
        stack.start_controllers()
        for i in (1, 2, 3):
            stack.wait_log(f"node{i}", "https://", timeout=60)
            stack.wait_log(f"ingest{i}", "https://", timeout=60)
        asyncio.run(asyncio.wait_for(scenario(), 180))
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("ELECTRA_")}, **creds.env("admin"),
               "ELECTRA_ENDPOINTS": ",".join(stack.endpoints.values())}
        st = subprocess.run([sys.executable, "-m", "electra.cli", "status"], capture_output=True, text=True,
                            timeout=60, env=env)
        assert st.returncode == 0 and st.stdout.count("leader") >= 1, (st.stdout, st.stderr)
        no_token = {k: v for k, v in env.items() if k != "ELECTRA_TOKEN_FILE"}
        st = subprocess.run([sys.executable, "-m", "electra.cli", "admin", "get-sync-state", "sim-set-0"],
                            capture_output=True, text=True, timeout=60, env=no_token)
        assert st.returncode == 1 and '"code": 16' in st.stdout, (st.stdout, st.stderr)
        st = subprocess.run([sys.executable, "-m", "electra.cli", "status"], capture_output=True, text=True,
                            timeout=60, env=no_token)
        assert st.returncode == 1 and "refused" in st.stdout and "401" in st.stdout, (st.stdout, st.stderr)
        _dashboard_sign_in_as_electra_up_prints_it(stack)
    except BaseException:
        for name in ("node1", "node2", "ingest1"):
            print(f"----- {name} -----\n{stack.log_tail(name, 30)}")
        raise
    finally:
        stack.stop_all()


def _dashboard_sign_in_as_electra_up_prints_it(stack: LocalStack) -> None:
    """The URL `electra up` prints, used over real HTTPS as the page does: the fragment's token buys a cookie
    that reads the dashboard's data and nothing else."""
    import http.client
    import json
    from urllib.parse import unquote, urlsplit

    creds = stack.creds
    hint = dashboard_hint(stack.endpoints[1], creds)
    url = urlsplit(next(w for w in hint.split() if w.startswith("https://")))
    token = unquote(url.fragment.removeprefix("token="))
    host, port = url.netloc.rsplit(":", 1)

    def call(method: str, path: str, headers: dict, body: bytes | None = None) -> http.client.HTTPResponse:
        conn = http.client.HTTPSConnection(host, int(port), context=creds.credentials("observer").ssl_context(),
                                           timeout=10)
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        resp.read()
        conn.close()
        return resp

    assert call("GET", url.path, {}).status == 200  # the page shell is public
    assert call("GET", "/v1/dashboard/session", {}).status == 401
    bad = call("POST", "/v1/dashboard/login", {"Content-Type": "application/json"}, b'{"token": "nope"}')
    assert bad.status == 401 and bad.getheader("set-cookie") is None
    json_body = {"Content-Type": "application/json"}
    ok = call("POST", "/v1/dashboard/login", json_body, json.dumps({"token": token}).encode())
    assert ok.status == 204, ok.status
    cookie = {"Cookie": ok.getheader("set-cookie").split(";")[0]}
    assert call("GET", "/v1/dashboard/session", cookie).status == 200
    assert call("GET", "/v1/admin/metadata", cookie).status == 401  # the cookie is no credential off the dashboard
    assert call("POST", "/v1/admin/broker-sets/sim-set-0/clean", cookie).status == 401
