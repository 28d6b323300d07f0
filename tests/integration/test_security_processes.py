"""Secure `electra node` processes: forged peers and forged HTTP callers are refused and change nothing.

Each of these fails on the code before issue #15: any process could claim a member id on the Raft
port, and every HTTP endpoint served anyone.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import httpx
import msgpack
import pytest

from electra.api.client import ControllerClient
from electra.bench.common import stop_processes
from electra.consensus.framing import pack_frame
from electra.consensus.messages import Append
from electra.consensus.transport import PROTO
from electra.local_ports import free_ports
from electra.security.auth import create_token
from electra.security.credentials import ClientCredentials
from electra.security.local import ensure_local_credentials
from electra.security.pki import create_ca, create_node_cert
from electra.security.tls import NodeTLS
from electra.state.codes import Code

pytestmark = pytest.mark.integration


class SecureCluster:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.creds = ensure_local_credentials(tmp / "certs", (1, 2, 3))
        ports = free_ports(6)
        self.raft = {i: ("127.0.0.1", ports[i - 1]) for i in (1, 2, 3)}
        self.http = {i: f"127.0.0.1:{ports[2 + i]}" for i in (1, 2, 3)}
        self.procs: dict[int, subprocess.Popen] = {}

    def start(self) -> None:
        peers = ",".join(f"{i}={h}:{p}" for i, (h, p) in self.raft.items())
        http_peers = ",".join(f"{i}={ep}" for i, ep in self.http.items())
        for i in (1, 2, 3):
            log = open(self.tmp / f"node{i}.log", "ab")  # noqa: SIM115 - owned by the process
            self.procs[i] = subprocess.Popen(
                [sys.executable, "-m", "electra.cli", "node", "--id", str(i), "--peers", peers,
                 "--http-addr", self.http[i], "--http-peers", http_peers, "--data-dir", str(self.tmp / f"node{i}"),
                 "--tick-ms", "50", "--inactive-master-scan-ms", "3600000",
                 "--certs-dir", str(self.creds.certs_dir)], stdout=log, stderr=subprocess.STDOUT)

    def client(self, role: str | None, **kw) -> ControllerClient:
        creds = self.creds.credentials(role) if role else ClientCredentials(None, str(self.creds.ca_file))
        return ControllerClient(list(self.http.values()), credentials=creds, deadline_s=kw.pop("deadline_s", 20), **kw)

    def log(self, i: int) -> str:
        return (self.tmp / f"node{i}.log").read_text(errors="replace")


def _get_metrics(endpoint: str, c: SecureCluster) -> str:
    creds = c.creds.credentials("observer")
    req = urllib.request.Request(f"https://{endpoint}/metrics", headers=creds.headers())
    with urllib.request.urlopen(req, timeout=5, context=creds.ssl_context()) as r:
        return r.read().decode()


def _post_with_forged_forwarded_for(endpoint: str, ca_file: str, path: str) -> int:
    """An unauthenticated admin POST claiming, in X-Forwarded-*, to come from 203.0.113.9 over https."""
    host, port = endpoint.rsplit(":", 1)
    conn = http.client.HTTPSConnection(host, int(port), timeout=10,
                                       context=ssl.create_default_context(cafile=ca_file))
    try:
        conn.request("POST", path, body=b"{}", headers={"Content-Type": "application/json",
                                                        "X-Forwarded-For": "203.0.113.9", "X-Forwarded-Proto": "https"})
        return conn.getresponse().status
    finally:
        conn.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = SecureCluster(tmp_path_factory.mktemp("secure"))
    c.start()
    try:
        yield c
    finally:
        stop_processes(list(c.procs.values()))


async def _leader(c: SecureCluster, timeout: float = 30.0) -> dict:
    client = c.client("observer", timeout=2.0)
    deadline = time.monotonic() + timeout
    try:
        while True:
            for ep in client.endpoints:
                try:
                    md = await client.metadata(ep)
                except Exception:  # not up yet
                    continue
                if md.get("is_leader"):
                    return md
            assert time.monotonic() < deadline, "no leader"
            await asyncio.sleep(0.2)
    finally:
        await client.close()


async def _setup_broker_set(c: SecureCluster, name: str) -> dict:
    """Register three brokers of `name` with a broker credential scoped to it, elect broker 1; its replica info."""
    token = create_token(c.creds.tokens_file, "broker", f"brokers-of-{name}", broker_sets=[name], clusters=["c"])
    await asyncio.sleep(1.2)  # the nodes re-read the tokens file at most once a second
    client = ControllerClient(list(c.http.values()), credentials=ClientCredentials(token, str(c.creds.ca_file)),
                              deadline_s=20)
    try:
        for bid in (1, 2, 3):
            addr = f"10.0.0.{bid}:10911"
            r = await client.apply_broker_id("c", name, bid, f"{addr};{bid}")
            assert r["code"] == Code.SUCCESS, r
            hb = await client.heartbeat("c", name, bid, addr, epoch=1, maxOffset=bid, heartbeatTimeoutMillis=60000)
            assert hb.get("code") == Code.SUCCESS, hb
            assert (await client.register("c", name, bid, addr))["code"] == Code.SUCCESS
        r = await client.elect_master("c", name, 1)
        assert r["code"] == Code.SUCCESS, r
        return await client.replica_info(name)
    finally:
        await client.close()


def test_forged_peers_are_refused_and_change_nothing(cluster):
    c = cluster

    async def scenario():
        md = await _leader(c)
        leader, term = md["node_id"], md["term"]
        victim = next(i for i in (1, 2, 3) if i != leader)
        claimed = next(i for i in (1, 2, 3) if i != victim)  # a member that may dial the victim or not
        host, port = c.raft[victim]
        forged = Append(claimed, victim, term + 50, prev_index=0, ent_terms=[term + 50],
                        ent_data=[b"forged"], commit=1)
        hello = {"proto": PROTO, "cluster": "electra", "cluster_id": c.creds.cluster_id, "from": claimed, "to": victim}
        other = c.tmp / "other-ca"
        create_ca(other)
        create_node_cert(other, claimed, ["127.0.0.1"])
        foreign = c.tmp / "foreign"  # this CA's key, another cluster id
        (c.creds.certs_dir / "cluster-id").write_text("stale-cluster\n")
        create_node_cert(c.creds.certs_dir, claimed, ["127.0.0.1"], out_dir=foreign)
        (c.creds.certs_dir / "cluster-id").write_text(c.creds.cluster_id + "\n")
        impostor = next(i for i in (1, 2, 3) if i not in (victim, claimed))
        attempts = [
            ("no certificate", None),
            ("another CA", NodeTLS(other / f"node-{claimed}.crt", other / f"node-{claimed}.key",
                                   c.creds.ca_file).peer_client_context()),
            (f"node {impostor}'s valid certificate", NodeTLS(*c.creds.node_files(impostor),
                                                             c.creds.ca_file).peer_client_context()),
            ("another cluster id", NodeTLS(foreign / f"node-{claimed}.crt", foreign / f"node-{claimed}.key",
                                           c.creds.ca_file).peer_client_context()),
        ]
        outcomes = []
        for what, ctx in attempts:
            try:
                r, w = await asyncio.wait_for(asyncio.open_connection(host, port, ssl=ctx), 10)
            except ConnectionRefusedError:
                raise AssertionError(f"{what}: nothing listens on node {victim}'s Raft port {port} "
                                     f"(process exit code {c.procs[victim].poll()})") from None
            except ssl.SSLError as exc:  # the node refused the TLS handshake
                outcomes.append((what, f"TLS refused: {exc.reason}"))
                continue
            try:
                w.write(pack_frame(msgpack.packb(hello)) + pack_frame(forged.encode()) * 3)
                answer = await asyncio.wait_for(r.read(), 10)
                outcomes.append((what, "closed"))
            except (ConnectionResetError, BrokenPipeError, ssl.SSLError) as exc:  # refused mid-handshake
                answer = b""
                outcomes.append((what, f"refused: {type(exc).__name__}"))
            w.close()
            assert answer == b"", f"{what}: the node answered the forged handshake"
        # Every attempt was refused by the node itself (not timed out); each refusal is logged.
        deadline = time.monotonic() + 15
        while (text := c.log(victim)).count("rejected connection") < 4 and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert text.count("rejected connection") >= 4, (outcomes, text[-3000:])
        after = await _leader(c)
        assert after["term"] < term + 50, (md, after)  # the forged term never reached Raft
        assert "TLS handshake failed" in text
        assert f"names node {impostor} but the handshake claims node {claimed}" in text
        assert "certificate is for cluster id 'stale-cluster'" in text
        # and the cluster still commits writes
        cl = c.client("admin")
        try:
            r = await cl.sync_state_data(["nothing"])
            assert r["httpStatus"] == 200, r
        finally:
            await cl.close()

    asyncio.run(asyncio.wait_for(scenario(), 120))


def test_forged_http_calls_answer_401_or_403_and_change_nothing(cluster):
    c = cluster

    async def scenario():
        await _leader(c)
        before = await _setup_broker_set(c, "set-a")
        other_token = create_token(c.creds.tokens_file, "broker", "brokers-of-set-b", broker_sets=["set-b"])
        await asyncio.sleep(1.2)
        ca = str(c.creds.ca_file)
        anonymous = ControllerClient(list(c.http.values()), credentials=ClientCredentials(None, ca), deadline_s=10)
        wrong_token = ControllerClient(list(c.http.values()), credentials=ClientCredentials("x" * 43, ca),
                                       deadline_s=10)
        set_b = ControllerClient(list(c.http.values()), credentials=ClientCredentials(other_token, ca),
                                 deadline_s=10)
        broker_a = ControllerClient(list(c.http.values()), credentials=ClientCredentials(
            create_token(c.creds.tokens_file, "broker", "more-brokers-of-set-a", broker_sets=["set-a"],
                         clusters=["c"]), ca),
            deadline_s=10)
        # set-a's name pattern, another cluster: RocketMQ's requests that name no cluster are checked against the
        # cluster the set is in
        cluster_d_token = create_token(c.creds.tokens_file, "broker", "brokers-of-cluster-d", broker_sets=["set-*"],
                                       clusters=["d"])
        other_cluster = ControllerClient(list(c.http.values()), credentials=ClientCredentials(cluster_d_token, ca),
                                         deadline_s=10)
        cluster_c = ControllerClient(list(c.http.values()), credentials=ClientCredentials(
            create_token(c.creds.tokens_file, "broker", "brokers-of-cluster-c", broker_sets=["set-*"],
                         clusters=["c"]), ca), deadline_s=10)
        await asyncio.sleep(1.2)
        observer, pipeline = c.client("observer", deadline_s=10), c.client("pipeline", deadline_s=10)
        proposal = {"clusterName": "c", "expectedMasterEpoch": before["header"]["masterEpoch"],
                    "live": [{"broker_id": 2, "broker_addr": "10.0.0.2:10911", "timeout_ms": 60000, "epoch": 1,
                              "last_update_ms": int(time.time() * 1000), "max_offset": 99}]}

        async def calls(client, only=("internal elect", "admin elect", "clean", "register", "heartbeat")):
            """Every state-changing call an attacker would make against set-a (`only`: the ones to try)."""
            todo = {
                "internal elect": lambda: client.request("POST", "/v1/internal/broker-sets/set-a/elect-master",
                                                         json=proposal),
                "admin elect": lambda: client.elect_master("c", "set-a", 2, admin=True),
                "clean": lambda: client.clean_broker_data("set-a", cluster="c", ids=[2], clean_living=True),
                "register": lambda: client.register("c", "set-a", 3, "6.6.6.6:10911"),
                "heartbeat": lambda: client.heartbeat("c", "set-a", 2, "6.6.6.6:10911", epoch=9, maxOffset=10**9),
            }
            return {what: await todo[what]() for what in only}

        try:
            for who in (anonymous, wrong_token):
                for what, r in (await calls(who)).items():
                    assert r["httpStatus"] == 401 and r["code"] == Code.NO_PERMISSION, (what, r)
                    assert "token" in r["remark"]
            wrong_scope = await calls(set_b)
            for what in ("register", "heartbeat", "internal elect", "admin elect", "clean"):
                assert wrong_scope[what]["httpStatus"] == 403 and wrong_scope[what]["code"] == Code.NO_PERMISSION, \
                    (what, wrong_scope[what])
            assert "not scoped to" in wrong_scope["register"]["remark"]
            assert "may not call" in wrong_scope["clean"]["remark"]
            # the right set, but not the broker role's endpoints
            wrong_role = await calls(broker_a, only=("internal elect", "admin elect", "clean"))
            for what, r in wrong_role.items():
                assert r["httpStatus"] == 403, (what, r)
            for what, r in (await calls(observer)).items():
                assert r["httpStatus"] == 403, (what, r)
            for what, r in (await calls(pipeline, only=("admin elect", "clean", "register", "heartbeat"))).items():
                assert r["httpStatus"] == 403, (what, r)
            # a broker of set-a may not heartbeat for set-a under another cluster name either
            r = await broker_a.heartbeat("other-cluster", "set-a", 2, "6.6.6.6:10911")
            assert r["httpStatus"] == 403, r
            # nor may a broker of cluster d whose set pattern covers set-a read it, alter its sync-state set or
            # watch it: those requests name no cluster
            h = before["header"]
            for r in (await other_cluster.replica_info("set-a"),
                      await other_cluster.alter_sync_state_set("set-a", h["masterBrokerId"], h["masterEpoch"], [1],
                                                               before["body"]["syncStateSetEpoch"]),
                      await other_cluster.request("GET", "/v1/broker-sets/set-a/watch")):
                assert r["httpStatus"] == 403 and "which broker set 'set-a' is in" in r["remark"], r
            # ... nor be told of a set created in cluster c while its resume waits for an index (the leader
            # answers such a resume with the set as it is, once the wait is over: checked again then)
            leader_ep = c.http[(await _leader(c))["node_id"]]
            async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=ca), timeout=10) as raw:
                waiting = asyncio.create_task(raw.get(f"https://{leader_ep}/v1/broker-sets/set-new/watch",
                                                      headers={"authorization": f"Bearer {cluster_d_token}",
                                                               "last-event-id": "99999999"}))
                await asyncio.sleep(0.3)
                r = await cluster_c.apply_broker_id("c", "set-new", 1, "10.0.0.9:10911;1")
                assert r["code"] == Code.SUCCESS, r
                answer = await waiting
                assert answer.status_code == 403 and "10.0.0.9" not in answer.text, answer.text
            # nor can set-b's broker dodge its scope with an extra field Python's json cannot read and msgspec
            # skips (a 4,400-digit number, a byte that is not UTF-8): the heartbeat is refused, never taken
            forged = json.dumps({"clusterName": "c", "brokerName": "set-a", "brokerId": 2,
                                 "brokerAddr": "6.6.6.6:10911", "heartbeatTimeoutMillis": 3_600_000}).encode()[:-1]
            async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=ca), timeout=10) as raw:
                for junk in (b', "x": ' + b"9" * 4400 + b"}", b', "x": "\xff"}'):
                    for ep in c.http.values():
                        r = await raw.post(f"https://{ep}/v1/heartbeat", content=forged + junk,
                                           headers={"content-type": "application/json",
                                                    "authorization": f"Bearer {other_token}"})
                        assert r.status_code in (403, 422), (junk[:10], r.status_code, r.text)
            # observers read; nothing changed
            after = await observer.replica_info("set-a")
            assert after["httpStatus"] == 200
            assert after["header"] == before["header"] and after["body"] == before["body"], (before, after)
            # plain HTTP on the HTTPS port gets nowhere
            plain = ControllerClient(list(c.http.values()), credentials=ClientCredentials(None, None), deadline_s=2)
            with pytest.raises(TimeoutError):
                await plain.replica_info("set-a")
            await plain.close()
            # the admin role may; the audit log names who did what, and the refusals
            admin = c.client("admin")
            r = await admin.elect_master("c", "set-a", 1, admin=True)  # reaches the state machine
            assert r["code"] == Code.CONTROLLER_MASTER_STILL_EXIST, r
            await admin.close()
            # a client cannot write another address into the audit log with X-Forwarded-For (a node has no
            # trusted proxy in front of it; uvicorn would otherwise believe a loopback client's header)
            forged = await asyncio.to_thread(_post_with_forged_forwarded_for, c.http[1], str(c.creds.ca_file),
                                             "/v1/admin/broker-sets/set-a/clean")
            assert forged == 401, forged
            records = [json.loads(line) for i in (1, 2, 3) for line in
                       (c.tmp / f"node{i}" / "audit.log").read_text().splitlines()]
            assert any(x["who"] == "local-admin" and x["action"] == "elect-master set-a" and x["status"] == 409
                       and x["code"] == Code.CONTROLLER_MASTER_STILL_EXIST for x in records), records
            assert any(x["who"] == "brokers-of-set-b" and x["action"] == "clean set-a" and x["status"] == 403
                       for x in records), records
            assert any(x["who"] == "unauthenticated" and x["status"] == 401 for x in records), records
            assert not any("203.0.113.9" in json.dumps(x) for x in records), records
            # refusals are in the metrics, where an operator can alert on token guessing or a misconfigured client
            refusals = 0
            for ep in c.http.values():
                text = await asyncio.to_thread(_get_metrics, ep, c)
                refusals += sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                                if line.startswith("electra_requests_total{") and 'code="16"' in line
                                and ('endpoint="unauthenticated"' in line or 'endpoint="forbidden"' in line))
            assert refusals >= 10, refusals
        finally:
            for cl in (anonymous, wrong_token, set_b, broker_a, other_cluster, cluster_c, observer, pipeline):
                await cl.close()

    asyncio.run(asyncio.wait_for(scenario(), 180))


def test_node_without_certs_or_with_a_foreign_data_dir_refuses_to_start(tmp_path):
    base = [sys.executable, "-m", "electra.cli", "node", "--id", "1", "--peers", f"1=127.0.0.1:{free_ports(1)[0]}",
            "--http-addr", f"127.0.0.1:{free_ports(1)[0]}", "--data-dir", str(tmp_path / "n1")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ELECTRA_")}
    p = subprocess.run(base, capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 2 and "refusing to serve without TLS and authentication" in p.stderr, p.stderr
    assert "--insecure" in p.stderr
    # a data dir of another cluster
    creds = ensure_local_credentials(tmp_path / "certs", (1,))
    (tmp_path / "n1").mkdir()
    (tmp_path / "n1" / "cluster-id").write_text("some-other-cluster\n")
    p = subprocess.run([*base, "--certs-dir", str(creds.certs_dir)], capture_output=True, text=True, timeout=60,
                       env=env)
    assert p.returncode == 1 and "belongs to cluster id 'some-other-cluster'" in p.stderr, (p.stdout, p.stderr)
    # node 2's certificate installed as node 1's
    import shutil

    swapped = shutil.copytree(creds.certs_dir, tmp_path / "swapped")
    create_node_cert(swapped, 2, ["127.0.0.1"])
    for ext in ("crt", "key"):
        shutil.copy(swapped / f"node-2.{ext}", swapped / f"node-1.{ext}")
    p = subprocess.run([*base, "--certs-dir", str(swapped)], capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 2 and "is the certificate of node 2, not of node 1" in p.stderr, p.stderr
    # node 1's certificate with node 2's key (a copy slip): refused in one line, not a traceback at first use
    mismatched = shutil.copytree(creds.certs_dir, tmp_path / "mismatched")
    shutil.copy(swapped / "node-2.key", mismatched / "node-1.key")
    p = subprocess.run([*base, "--certs-dir", str(mismatched)], capture_output=True, text=True, timeout=60,
                       env=env)
    assert p.returncode == 2 and "error: cannot load TLS files" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr, p.stderr


def test_a_node_whose_http_port_is_taken_says_so_in_one_line(tmp_path):
    """It printed uvicorn's own log line and exited with 3 (the Raft port taken: `error:` and 1)."""
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        p = subprocess.run([sys.executable, "-m", "electra.cli", "node", "--id", "1", "--insecure",
                            "--peers", f"1=127.0.0.1:{free_ports(1)[0]}", "--http-addr", f"127.0.0.1:{port}",
                            "--data-dir", str(tmp_path / "n1")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1, (p.returncode, p.stderr)
    assert f"error: cannot listen on 127.0.0.1:{port} (--http-addr): Address already in use" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr


def test_a_connection_that_never_finishes_the_tls_handshake_is_cut_at_the_request_timeout(cluster):
    """The node's HTTPS port: a client that connects and sends nothing is not in any HTTP limit yet (the protocol
    sees a connection only after TLS's handshake). It is closed at the request timeout (10 s), not after the
    event loop's default 60 s, so idle sockets cannot hold the node's file descriptors for a minute each."""
    asyncio.run(_leader(cluster))  # the nodes are up
    host, port = cluster.http[1].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.settimeout(30)
        t0 = time.monotonic()
        try:
            got = s.recv(1024)  # b"" when the server closes
        except (ConnectionResetError, TimeoutError) as exc:
            got = exc
        took = time.monotonic() - t0
    assert got == b"" or isinstance(got, ConnectionResetError), got
    assert 8 <= took <= 15, took


def test_a_broker_body_announced_over_the_limit_is_413_at_once(cluster):
    """QA: a broker's POST whose Content-Length is over the limit waited 10 s for the body (its scope is checked
    on the body) and ended in a 408; every other route answers 413 from the Content-Length alone."""
    asyncio.run(_leader(cluster))
    host, port = cluster.http[1].rsplit(":", 1)
    broker = cluster.creds.credentials("broker")
    for path in ("/v1/heartbeat", "/v1/broker-sets/set-x/register"):
        conn = http.client.HTTPSConnection(host, int(port), timeout=10, context=broker.ssl_context())
        try:
            t0 = time.monotonic()
            conn.putrequest("POST", path)
            for k, v in {**broker.headers(), "Content-Type": "application/json", "Content-Length": "2000000"}.items():
                conn.putheader(k, v)
            conn.endheaders(b'{"brokerName": "set-x"}')  # a short start of the announced 2 MB
            r = conn.getresponse()
            body = r.read()
        finally:
            conn.close()
        assert r.status == 413 and b"request body over 1048576 bytes" in body, (path, r.status, body)
        assert time.monotonic() - t0 < 3, time.monotonic() - t0
