"""bench/wrk.py drives a real `wrk` against a loopback server: what it reports is what the server saw.

The rotating script sends every request of its list (GET and POST with a JSON body), the
`WRK_JSON` line's request count matches the server's (wrk counts answered requests; at most one
per connection may still be in flight when it stops), non-2xx answers are counted as such, and
the run's CPU is charged to wrk.
"""

from __future__ import annotations

import asyncio
import json
import shutil

import pytest

from electra.bench import wrk

pytestmark = pytest.mark.integration

CONNECTIONS = 4


async def _server(seen: dict):
    """Answers 200 to every path but /missing (404); counts requests per (method, path, body)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                method, path = head.split(b" ")[:2]
                lower = head.lower()
                body = b""
                if b"content-length:" in lower:
                    i = lower.index(b"content-length:") + 15
                    body = await reader.readexactly(int(lower[i:lower.index(b"\r\n", i)]))
                key = (method.decode(), path.decode(), body.decode())
                seen[key] = seen.get(key, 0) + 1
                status = b"404 Not Found" if path == b"/missing" else b"200 OK"
                writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Length: 2\r\n\r\nok")
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


def test_wrk_sends_every_request_and_reports_what_the_server_answered(tmp_path):
    assert shutil.which("wrk"), "wrk is installed by `make test-tools`"
    requests = [("GET", "/a", None), ("GET", "/missing", None), ("POST", "/b", json.dumps({"key": "x]]y"}))]

    async def main():
        seen: dict = {}
        server = await _server(seen)
        port = server.sockets[0].getsockname()[1]
        try:
            res = await wrk.run_async(f"http://127.0.0.1:{port}", wrk.rotating_script(requests), CONNECTIONS, 1,
                                      tmp_path)
        finally:
            server.close()
        return res, seen

    res, seen = asyncio.run(main())
    assert set(seen) == {("GET", "/a", ""), ("GET", "/missing", ""), ("POST", "/b", '{"key": "x]]y"}')}
    total = sum(seen.values())
    assert res["requests"] > 100
    assert res["requests"] <= total <= res["requests"] + CONNECTIONS
    assert abs(res["non_2xx"] - seen[("GET", "/missing", "")]) <= CONNECTIONS  # a third of them
    assert res["socket_errors"] == 0
    assert 0 < res["p50_ms"] <= res["p99_ms"] and res["cdf"][0][1] == 0 and len(res["cdf"]) == 200
    assert res["rps"] == pytest.approx(res["requests"] / res["seconds"])
    assert res["cpu_s"] > 0


def test_parse_refuses_output_without_a_result():
    with pytest.raises(RuntimeError, match="no result"):
        wrk.parse("unable to connect to 127.0.0.1:1 Connection refused\n")


def test_a_cancelled_run_kills_its_wrk(tmp_path):
    """Ctrl-C in a bench (or a sibling task's failure) cancels the run: wrk must not go on loading the machine."""
    seen: dict = {}

    async def main():
        server = await _server(seen)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        try:
            run = asyncio.ensure_future(wrk.run_async(url, wrk.rotating_script([("GET", "/a", None)]), CONNECTIONS,
                                                      30, tmp_path))
            await asyncio.sleep(1.0)
            children = [p for p in _children() if p[1] == "wrk"]
            assert children, "wrk did not start"
            run.cancel()
            with pytest.raises(asyncio.CancelledError):
                await run
            return children[0][0]
        finally:
            server.close()

    pid = asyncio.run(asyncio.wait_for(main(), 60))
    assert pid not in [p for p, _ in _children()], "wrk is still running after its run was cancelled"


def _children() -> list[tuple[int, str]]:
    import os
    from pathlib import Path

    me, out = os.getpid(), []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            name, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
            if int(rest[1]) == me:
                out.append((int(d), name))
    return out
