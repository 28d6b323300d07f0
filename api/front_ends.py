"""A node's front-end processes, from the Raft process's side: spawn, supervise, link, stop.

With `electra node --front-ends N` (N >= 1) the Raft process does not listen on the API port.
It owns a private directory (mode 0700) holding two unix sockets:

* `link.sock`: one link per front-end (`api/local_link.py`); each call is answered by the
  node's `LeanPath.execute`, the very code a single-process node runs after auth and decoding;
* `app.sock`: the node's FastAPI application (with its auth middleware and audit log), for
  what the front-ends relay (`api/raft_process_proxy.py`); `X-Forwarded-*` are trusted here
  only, since only the node's user can open the directory.

Each front-end (`api/front_end.py`) is restarted when it exits (after a short back-off that
grows while it keeps failing), stopped with the node (SIGTERM, then SIGKILL after a grace
period), and ends by itself when the node dies (it holds the read end of a pipe whose write end
only the node has).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from electra.security.auth import Principal

from .http_limits import HTTPLimits
from .lean_path import ROUTES_BY_ENDPOINT, LeanPath, LeanRequest
from .local_link import Answer, Call, LinkServerProtocol
from .raft_process_proxy import CLIENT_PORT
from .replies import Reply

log = logging.getLogger("electra.api.front_ends")

STOP_GRACE_S = 10.0
MAX_BACKOFF_S = 5.0
STABLE_AFTER_S = 10.0  # a front-end that ran this long restarts at once
# A live front-end sends something on its link at least every second (a ping when idle: local_link's
# PROBE_AFTER_S). One silent this long is stopped (SIGSTOP) or blocked, while the kernel still hands it its
# share of new connections (SO_REUSEPORT): it is killed, and replaced as a crashed one is.
SILENT_KILL_S = 6.0
WATCH_EVERY_S = 1.0


def link_executor(lean: LeanPath):
    """Answers front-ends' calls with `lean.execute`: an Answer, or an awaitable one."""
    encode = lean.encode

    def answer(cid: int, r: Reply) -> Answer:
        return Answer(cid, r.status, encode(r.body), r.headers)

    async def later(cid: int, pending) -> Answer:
        return answer(cid, await pending)

    def execute(c: Call):
        route = ROUTES_BY_ENDPOINT[c.endpoint]
        obj = route.struct(*c.args) if route.struct is not None else None
        req = LeanRequest(route, c.path, c.name, c.query, c.cluster, None, time.perf_counter(),
                          Principal(c.limited[0], "broker", (), c.limited[1]) if c.limited is not None else None)
        out = lean.execute(req, obj, c.scheme)
        return answer(c.id, out) if isinstance(out, Reply) else later(c.id, out)

    return execute


class ServedAs:
    """The Raft process's application behind its front-ends: every request reports the node's own HTTP
    address as `server`, as it does without front-ends (the app socket's is a path), and its caller's port
    (the audit log's `remote`). The dashboard's cookie is named by the server's port, one per node on a
    host; from the socket it was `...-None` on every node."""

    def __init__(self, app: Any, server: tuple[str, int]) -> None:
        self.app = app
        self.server = server

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket"):
            scope = {**scope, "server": self.server}
            client = scope.get("client")
            port = next((v for k, v in scope["headers"] if k == CLIENT_PORT), None)
            if client and port is not None and port.isdigit() and int(port) < 65536:
                scope["client"] = (client[0], int(port))  # X-Forwarded-For gave the address, the relay the port
        await self.app(scope, receive, send)


class FrontEnds:
    """`count` front-end processes serving `host:port` for this node (see the module docstring)."""

    def __init__(self, count: int, host: str, port: int, lean: LeanPath, *, limits: HTTPLimits,
                 tls_files: tuple | None, tokens_file: str | None, log_level: str = "WARNING") -> None:
        if count < 1:
            raise ValueError("a node runs at least one front-end process (0 = none: the API in the Raft process)")
        self.count = count
        self.host, self.port = host, port
        self.lean = lean
        self.limits = limits
        self.tls_files = tls_files
        self.tokens_file = tokens_file
        self.log_level = log_level
        self.dir = Path(tempfile.mkdtemp(prefix="electra-fe-"))  # mode 0700: only this user reaches the sockets
        self.link_path = str(self.dir / "link.sock")
        self.app_socket = str(self.dir / "app.sock")
        self.links: set[LinkServerProtocol] = set()
        self.procs: list[asyncio.subprocess.Process | None] = [None] * count
        self.stats = {"started": 0, "restarts": 0, "killed_silent": 0}
        self._stopping = False
        self._tasks: list[asyncio.Task] = []
        self._link_server: asyncio.AbstractServer | None = None
        self._pipe_r, self._pipe_w = os.pipe()  # the front-ends hold the read end; EOF = the node is gone

    async def start(self, ready_timeout_s: float = 60.0) -> None:
        """Listen on the link socket, start the front-ends and wait until each has linked (bounded)."""
        from .ports import port_taken

        # Fail here, clearly, if another process listens there: the front-ends' SO_REUSEPORT binds would succeed
        # beside another node's (or any SO_REUSEPORT listener) and the kernel would split the connections.
        taken = port_taken(self.host, self.port)
        if taken is not None:
            raise RuntimeError(f"cannot listen on {self.host}:{self.port} (--http-addr): {taken.strerror or taken}")
        loop = asyncio.get_running_loop()
        execute = link_executor(self.lean)
        self._link_server = await loop.create_unix_server(
            lambda: LinkServerProtocol(execute, self.links, on_counts=self._add_counts), path=self.link_path)
        self._tasks = [asyncio.ensure_future(self._supervise(i)) for i in range(self.count)]
        self._tasks.append(asyncio.ensure_future(self._watch_links()))
        await self.wait_linked(self.count, ready_timeout_s)

    def _add_counts(self, rows: list) -> None:
        """A front-end's own request counts (the refusals it answered itself) into this node's metrics, where
        `electra_requests_total` is scraped: token guessing through a front-end shows as it does without."""
        for row in rows[:1000]:  # bounded: a front-end has a few dozen series
            if (isinstance(row, list) and len(row) == 3 and isinstance(row[0], str) and isinstance(row[1], str)
                    and type(row[2]) is int and 0 < row[2] < 1 << 40):
                self.lean.metrics.count(row[0], row[1], row[2])

    async def wait_linked(self, count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.links) < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(self.links)} of {count} front-end processes linked within "
                                   f"{timeout_s:.0f}s (see their log lines above)")
            await asyncio.sleep(0.05)

    def _argv(self) -> list[str]:
        from .front_end import options

        opts = options(host=self.host, port=self.port, link=self.link_path, app_socket=self.app_socket,
                       parent_fd=self._pipe_r, tls=self.tls_files, tokens_file=self.tokens_file,
                       limits=self.limits, log_level=self.log_level)
        return [sys.executable, "-m", "electra.api.front_end", json.dumps(opts)]

    async def _supervise(self, slot: int) -> None:
        failures = 0
        while not self._stopping:  # ends with the node (stop() cancels it)
            try:
                proc = await asyncio.create_subprocess_exec(*self._argv(), pass_fds=(self._pipe_r,),
                                                            stdin=asyncio.subprocess.DEVNULL)
            except OSError as exc:  # out of processes or descriptors: try again after a back-off
                failures += 1
                log.error("cannot start front-end %d: %s", slot, exc)
                await asyncio.sleep(min(MAX_BACKOFF_S, 0.1 * 2 ** failures))
                continue
            self.procs[slot] = proc
            self.stats["started"] += 1
            began = time.monotonic()
            rc = await proc.wait()
            if self._stopping:
                return
            self.stats["restarts"] += 1
            failures = 0 if time.monotonic() - began > STABLE_AFTER_S else failures + 1
            delay = min(MAX_BACKOFF_S, 0.1 * 2 ** failures) if failures else 0.0
            log.warning("front-end %d (pid %d) exited with %s; restarting in %.1fs", slot, proc.pid, rc, delay)
            await asyncio.sleep(delay)

    async def _watch_links(self) -> None:
        """Kill a front-end whose link has been silent for SILENT_KILL_S (its supervisor starts a new one)."""
        loop = asyncio.get_running_loop()
        last = loop.time()
        while not self._stopping:
            await asyncio.sleep(WATCH_EVERY_S)
            now = loop.time()
            if now - last > 3 * WATCH_EVERY_S:  # this loop was blocked: the links' frames wait unread, not missing
                for link in list(self.links):
                    link.heard_at = now
            last = now
            running = set(self.pids())
            for link in list(self.links):
                silent = now - link.heard_at
                if silent > SILENT_KILL_S and link.peer_pid in running:
                    log.error("front-end pid %d has sent nothing on its link for %.0fs (stopped or blocked; a live "
                              "one pings every second): killing it, a new one takes its place", link.peer_pid, silent)
                    link.heard_at = now
                    self.stats["killed_silent"] += 1
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(link.peer_pid, signal.SIGKILL)

    def collect(self):
        """Prometheus: front-ends linked, restarts, and calls answered per front-end process (`/metrics`)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        yield GaugeMetricFamily("electra_front_ends_linked", "front-end processes linked to this Raft process",
                                value=len(self.links))
        yield CounterMetricFamily("electra_front_end_restarts", "front-end processes restarted after they exited",
                                  value=self.stats["restarts"])
        yield CounterMetricFamily("electra_front_end_killed_silent",
                                  "front-end processes killed (then replaced) after their link went silent",
                                  value=self.stats["killed_silent"])
        calls = CounterMetricFamily("electra_front_end_calls", "broker requests answered over each front-end link",
                                    labels=["pid"])
        for link in list(self.links):
            calls.add_metric([str(link.peer_pid)], link.stats["calls"])
        yield calls

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p is not None and p.returncode is None]

    async def stop(self) -> None:
        """Stop the front-ends (SIGTERM, then SIGKILL after STOP_GRACE_S), the link socket, the directory."""
        self._stopping = True
        running = [p for p in self.procs if p is not None and p.returncode is None]
        for p in running:
            p.send_signal(signal.SIGTERM)
        if running:
            await asyncio.wait([asyncio.ensure_future(p.wait()) for p in running], timeout=STOP_GRACE_S)
            for p in running:
                if p.returncode is None:
                    p.kill()
                    await p.wait()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._link_server is not None:
            self._link_server.close()
        for link in list(self.links):
            link.transport.close()
        os.close(self._pipe_w)
        os.close(self._pipe_r)
        shutil.rmtree(self.dir, ignore_errors=True)
