"""`electra node --front-ends 2`: three secure nodes whose API port is served by front-end processes.

Real processes throughout: each node's Raft process spawns two front-ends that share its HTTPS
port (SO_REUSEPORT). The test writes and reads through every front-end (the node's /metrics counts
calls per front-end pid), SIGKILLs one front-end of the leader while requests keep succeeding,
sees the node replace it and the new one serve, and SIGKILLs a node to see its front-ends go too.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time

import httpx
import pytest

from electra.api.client import ControllerClient
from electra.bench.common import bench_credentials, start_controller_processes, stop_processes
from electra.state.codes import Code

pytestmark = pytest.mark.integration
CONNECTIONS = 16  # per node: the kernel hashes each to one of the two front-ends


def _front_end_pids(node_pid: int) -> set[int]:
    out = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == node_pid and b"electra.api.front_end" in cmd:
            out.add(int(entry))
    return out


def _calls_by_pid(metrics_text: str) -> dict[int, float]:
    return {int(pid): float(v) for pid, v in
            re.findall(r'^electra_front_end_calls_total\{pid="(\d+)"\} ([\d.e+]+)$', metrics_text, re.M)}


async def _until(cond, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not await cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.2)


def test_front_ends_serve_each_node_and_are_replaced_when_killed(tmp_path):
    procs, endpoints = start_controller_processes(tmp_path, ("--front-ends", "2", "--tick-ms", "50"))
    creds = bench_credentials(tmp_path)
    broker, observer = creds.credentials("broker"), creds.credentials("observer")

    async def write_and_read(ep: str, name: str, n: int) -> None:
        """On one new connection: a write (register with a new address) and a read (replica info)."""
        async with httpx.AsyncClient(verify=broker.ssl_context(), headers=broker.headers(), timeout=10) as c:
            addr = f"10.0.{n // 250}.{n % 250}:1"
            r = await c.post(f"https://{ep}/v1/broker-sets/{name}/register",
                             json={"clusterName": "bench", "brokerId": 1, "brokerAddress": addr})
            if r.status_code == 307:  # a follower's answer: the same request at the leader, over HTTPS
                assert r.headers["location"].startswith("https://") and ep not in r.headers["location"], r.headers
                r = await c.post(r.headers["location"],
                                 json={"clusterName": "bench", "brokerId": 1, "brokerAddress": addr})
            assert r.status_code == 200 and r.json()["code"] == Code.SUCCESS, r.text
            r = await c.get(f"https://{ep}/v1/broker-sets/{name}/replica-info")
            assert r.status_code == 200 and r.json()["code"] == Code.SUCCESS, r.text

    async def metrics(ep: str) -> str:
        async with httpx.AsyncClient(verify=observer.ssl_context(), headers=observer.headers(), timeout=10) as c:
            r = await c.get(f"https://{ep}/metrics")
            assert r.status_code == 200, r.text
            return r.text

    async def scenario() -> None:
        client = ControllerClient(endpoints, credentials=broker, deadline_s=20)
        obs = ControllerClient(endpoints, credentials=observer)
        try:
            leader = None
            for _ in range(450):  # bounded: 90 s (each node and front-end imports the HTTP stack)
                leader = await obs.find_leader()
                if leader is not None:
                    break
                await asyncio.sleep(0.2)
            assert leader is not None
            for i in range(3):
                r = await client.apply_broker_id("bench", f"s{i}", 1, "10.0.0.1:1;1")
                assert r["code"] == Code.SUCCESS, r
            leader_ep = endpoints[leader - 1]
            # A leader is found once two nodes are up; the third (and its front-ends, still importing their
            # HTTP stack) may not listen yet. Each node is ready once both its front-ends have linked.
            for ep in endpoints:
                async def linked(ep: str = ep) -> bool:
                    try:
                        return "electra_front_ends_linked 2.0" in await metrics(ep)
                    except httpx.TransportError:
                        return False
                await _until(linked, f"both front-ends of {ep} linked", 90)
            fronts = {ep: _front_end_pids(p.pid) for ep, p in zip(endpoints, procs, strict=True)}
            seen.update(*fronts.values())
            assert all(len(pids) == 2 for pids in fronts.values()), fronts
            # A write and a read through every front-end of every node, each pair on a new connection.
            # A follower's front-end answers the write with a 307 to the leader (then sent there) and
            # serves the read; the node's /metrics counts the calls of each front-end pid.
            n = 0
            for ep in endpoints:
                await asyncio.gather(*(write_and_read(ep, f"s{k % 3}", n + k) for k in range(CONNECTIONS)))
                n += CONNECTIONS
                calls = _calls_by_pid(await metrics(ep))
                assert set(calls) == fronts[ep] and all(v >= 2 for v in calls.values()), (ep, calls, fronts[ep])
            # What the Raft process answers for its front-ends (QA: through the relay, a follower's redirect said
            # http:// to an HTTPS client, and the dashboard cookie was named `...-None` on every node).
            follower_ep = endpoints[next(i for i in range(3) if i != leader - 1)]
            host, port = follower_ep.rsplit(":", 1)
            body = b'{"clusterName":"bench","brokerId":1,"brokerAddress":"10.9.9.9:1"}'
            reader, writer = await asyncio.open_connection(host, int(port), ssl=broker.ssl_context())
            writer.write(b"POST /v1/broker-sets/s1/register HTTP/1.0\r\nHost: %s\r\nAuthorization: %s\r\n"
                         b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                         % (follower_ep.encode(), broker.headers()["Authorization"].encode(), len(body), body))
            answer = (await asyncio.wait_for(reader.read(), 15)).decode(errors="replace")  # HTTP/1.0: relayed
            writer.close()
            assert answer.startswith("HTTP/1.1 307") and f"location: https://{leader_ep}/" in answer.lower(), answer
            async with httpx.AsyncClient(verify=observer.ssl_context(), timeout=10) as c:
                token = observer.headers()["Authorization"].removeprefix("Bearer ")
                r = await c.post(f"https://{follower_ep}/v1/dashboard/login", json={"token": token})
                assert r.status_code == 204 and f"__Host-electra-dashboard-{port}=" in r.headers["set-cookie"], \
                    (r.status_code, r.headers.get("set-cookie"))
            # Refusals a front-end answers itself (a bad token on a broker route) are counted in the node's
            # /metrics, where an operator alerts on token guessing (QA: they were counted nowhere scraped).
            def refused_count(text: str) -> float:
                m = re.search(r'^electra_requests_total\{code="16",endpoint="unauthenticated"\} ([\d.e+]+)$', text,
                              re.M)
                return float(m.group(1)) if m else 0.0
            before = refused_count(await metrics(follower_ep))
            async with httpx.AsyncClient(verify=broker.ssl_context(), timeout=10) as c:
                for _ in range(5):
                    r = await c.get(f"https://{follower_ep}/v1/broker-sets/s0/replica-info",
                                    headers={"authorization": "Bearer not-a-token"})
                    assert r.status_code == 401, r.text

            async def counted() -> bool:
                return refused_count(await metrics(follower_ep)) >= before + 5
            await _until(counted, "front-ends' refusals in the node's /metrics", 15)
            # SIGKILL one front-end of the leader: new connections keep being served meanwhile (a client
            # connecting in the instant the process dies may be reset, as with any server process dying).
            victim = min(fronts[leader_ep])
            os.kill(victim, signal.SIGKILL)

            async def victim_dead() -> bool:  # its listening socket is closed once it is a zombie or reaped
                return _state(victim) in ("Z", "X")
            await _until(victim_dead, "the SIGKILLed front-end to die", 10)
            for k in range(10):
                n += 1
                await write_and_read(leader_ep, f"s{k % 3}", n)

            async def replaced() -> bool:
                pids = _front_end_pids(procs[leader - 1].pid)
                text = await metrics(leader_ep)
                return (len(pids) == 2 and victim not in pids and "electra_front_ends_linked 2.0" in text
                        and "electra_front_end_restarts_total 1.0" in text)
            await _until(replaced, "the killed front-end replaced", 60)
            newcomer = (_front_end_pids(procs[leader - 1].pid) - fronts[leader_ep]).pop()
            seen.add(newcomer)

            async def newcomer_serves() -> bool:
                nonlocal n
                n += 1
                await write_and_read(leader_ep, "s0", n)
                return _calls_by_pid(await metrics(leader_ep)).get(newcomer, 0) >= 2
            await _until(newcomer_serves, "the new front-end serving", 30)
            # SIGSTOP one front-end: the kernel would keep handing it new connections (QA: half of a node's
            # connections hung in the TLS handshake for good); its silent link gets it killed and replaced.
            stopped = min(_front_end_pids(procs[leader - 1].pid))
            os.kill(stopped, signal.SIGSTOP)
            seen.add(stopped)

            async def stopped_replaced() -> bool:
                pids = _front_end_pids(procs[leader - 1].pid)
                try:
                    text = await metrics(leader_ep)
                except httpx.TransportError:  # hashed to the stopped one (a handshake timeout), or reset as it dies
                    return False
                return (stopped not in pids and len(pids) == 2 and "electra_front_end_killed_silent_total 1.0" in text
                        and "electra_front_ends_linked 2.0" in text)
            await _until(stopped_replaced, "the stopped front-end killed and replaced", 30)
            for k in range(CONNECTIONS):  # every new connection is served again
                n += 1
                await write_and_read(leader_ep, f"s{k % 3}", n)
            # SIGSTOP a follower node's Raft process: its front-ends, alive, notice the link's unanswered ping
            # and answer at once, a lean read and a relayed route alike, 503 (no waiting on a stopped process);
            # after SIGCONT they serve again.
            follower = next(i for i in range(3) if i != leader - 1)
            follower_ep = endpoints[follower]
            procs[follower].send_signal(signal.SIGSTOP)
            try:
                async with httpx.AsyncClient(verify=broker.ssl_context(), headers=broker.headers(),
                                             timeout=15) as c:
                    t0 = time.monotonic()
                    r = await c.get(f"https://{follower_ep}/v1/broker-sets/s0/replica-info")
                    assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
                    r = await c.get(f"https://{follower_ep}/healthz")
                    assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
                    assert r.json()["ok"] is False and "not answering" in r.json()["reason"], r.text  # its own shape
                    assert time.monotonic() - t0 < 8, "a stopped Raft process kept its front-ends' callers waiting"
                    # a write the relay never sent (a content type the lean path hands on) has a known outcome
                    r = await c.post(f"https://{follower_ep}/v1/broker-sets/s0/register",
                                     content=b'{"clusterName":"bench","brokerId":1,"brokerAddress":"10.8.8.8:1"}',
                                     headers={"content-type": "application/json; charset=utf-8"})
                    assert r.status_code == 503 and r.headers["retry-after"] == "1" and "nothing was sent" in r.text, \
                        (r.status_code, r.text)
            finally:
                procs[follower].send_signal(signal.SIGCONT)

            async def serves_again() -> bool:
                nonlocal n
                n += 1
                try:
                    await write_and_read(follower_ep, "s2", n)
                except AssertionError:
                    return False
                return True
            await _until(serves_again, "the resumed node's front-ends serving", 30)
            # SIGKILL a follower node: its front-ends end with it (they hold a pipe from it).
            orphans = fronts[endpoints[follower]]
            procs[follower].send_signal(signal.SIGKILL)
            procs[follower].wait(timeout=10)

            async def gone() -> bool:
                return not any(os.path.exists(f"/proc/{p}") and _state(p) != "Z" for p in orphans)
            await _until(gone, "the killed node's front-ends to exit", 20)
            n += 1
            await write_and_read(leader_ep, "s1", n)  # the other two nodes still serve
        finally:
            await client.close()
            await obs.close()

    seen: set[int] = set()  # every front-end pid seen, so that a failed run leaves none behind
    try:
        asyncio.run(asyncio.wait_for(scenario(), 240))
    finally:
        stop_processes(procs)
        for pid in seen:
            if _state(pid) not in ("Z", "X"):
                os.kill(pid, signal.SIGKILL)
    for p in procs:  # a stopped node leaves no front-end behind
        assert not _front_end_pids(p.pid)


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "X"
