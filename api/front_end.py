"""One front-end process of a node (`electra node --front-ends N`): the HTTP API on the node's port, Raft elsewhere.

A front-end binds the node's API port with SO_REUSEPORT (the kernel spreads connections over the
front-ends, as over the ingest workers) and runs the node's own HTTP protocol (`api/lean_http.py`:
the containment limits, TLS, the lean broker path with the same auth and validation code). An
admitted broker request is not answered here: `LeanPath.forward` sends it over the front-end's
link (`api/local_link.py`) to the Raft process, which answers it with the same `LeanPath.execute`
as a single-process node. Everything else is relayed to the Raft process's FastAPI application
(`api/raft_process_proxy.py`).

The process is started by `api/front_ends.py` with its settings as one JSON argument. It ends
with its node: on SIGTERM, when the pipe from the node reaches end-of-file (the node died, even by
SIGKILL), and through PR_SET_PDEATHSIG as a second guard. A broken link is re-dialled while the
node lives; requests meanwhile get 503 (LinkDown).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import os
import shutil
import signal
import sys
from dataclasses import asdict
from functools import partial

import msgspec
import uvicorn

from electra.consensus.errors import RaftError
from electra.interrupts import exit_if_stop_hangs
from electra.malloc_thresholds import keep_read_buffers_off_mmap
from electra.security.auth import TokenStore

from .http_limits import HTTPLimits, tls_bounded_loop
from .ingest_server import _listen
from .lean_http import lean_protocol
from .lean_path import LeanPath, LeanRequest
from .local_link import COUNTS, Call, LinkClient, LinkDown
from .raft_process_proxy import RaftProcessProxy
from .replies import Reply, RequestMetrics, refused, request_url_on

log = logging.getLogger("electra.api.front_end")

RECONNECT_S = 0.2
COUNTS_EVERY_S = 1.0  # how often this process's own request counts go to the node's metrics


class FrontEndLink:
    """The lean path's `forward`: admitted requests to the Raft process over the (re-dialled) link."""

    def __init__(self, link_path: str, metrics: RequestMetrics) -> None:
        self.link_path = link_path
        self.metrics = metrics  # this process's own counts (link failures); the node counts the answers
        self.link: LinkClient | None = None

    async def keep_linked(self, stop: asyncio.Event) -> None:
        """Dial the link, and again whenever it breaks, until `stop` is set."""
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            try:
                async with asyncio.timeout(5):
                    _, link = await loop.create_unix_connection(LinkClient, self.link_path)
            except (TimeoutError, OSError) as exc:
                log.warning("front-end %d: cannot reach the Raft process at %s: %s", os.getpid(), self.link_path, exc)
            else:
                self.link = link
                closed = asyncio.ensure_future(link.closed.wait())
                stopping = asyncio.ensure_future(stop.wait())
                await asyncio.wait([closed, stopping], return_when=asyncio.FIRST_COMPLETED)
                closed.cancel()
                stopping.cancel()
                if stop.is_set():
                    link.close()
                    return
                log.warning("front-end %d: the link to the Raft process broke; re-dialling", os.getpid())
            await asyncio.sleep(RECONNECT_S)

    async def report_counts(self, stop: asyncio.Event, every_s: float = COUNTS_EVERY_S) -> None:
        """Send this process's own request counts to the node every `every_s` (and once more at stop):
        the refusals answered here (credentials, a link that is down) are counted where /metrics is served."""
        sent: dict[tuple[str, str], int] = {}
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(every_s):
                    await stop.wait()
            rows = [[e, c, n - sent.get((e, c), 0)] for (e, c), n in self.metrics.counts.items()
                    if n > sent.get((e, c), 0)]
            link = self.link
            if rows and link is not None and link.notify(Call(0, COUNTS, None, None, rows, "", "", "")):
                for e, c, n in rows:
                    sent[(e, c)] = sent.get((e, c), 0) + n
            if stop.is_set():
                return

    def raft_process_stalled(self) -> bool:
        """The link is up but the Raft process has stopped answering it (`LinkClient.stalled`)."""
        return self.link is not None and self.link.stalled

    def forward(self, req: LeanRequest, obj, scheme: str):
        """A future Reply for an admitted request (or a Reply at once when there is no link)."""
        endpoint = req.route.endpoint
        c = Call(0, endpoint, req.name, req.cluster,
                 list(msgspec.structs.astuple(obj)) if obj is not None else None, scheme, req.path, req.query,
                 (req.limited.name, req.limited.clusters) if req.limited is not None else None)
        write = req.route.method == b"POST" and endpoint != "heartbeat"
        link = self.link
        if link is None:
            return self._refused(req, scheme, LinkDown("this front-end has no link to the node's Raft process yet"))
        if not link.has_room():
            return self._when_room(link, c, write, req, scheme)
        try:
            answer = link.submit(c, write)
        except RaftError as exc:
            return self._refused(req, scheme, exc)
        reply = asyncio.get_running_loop().create_future()
        answer.add_done_callback(partial(self._deliver, reply, req, scheme))
        return reply

    async def _when_room(self, link: LinkClient, c: Call, write: bool, req: LeanRequest, scheme: str) -> Reply:
        try:
            a = await link.call(c, write)
        except RaftError as exc:
            return self._refused(req, scheme, exc)
        return Reply(a.status, a.body, a.headers)

    def _deliver(self, reply: asyncio.Future, req: LeanRequest, scheme: str, answer: asyncio.Future) -> None:
        if answer.cancelled():
            if not reply.done():
                reply.cancel()
            return
        exc = answer.exception()  # read even when the client left: no "exception was never retrieved" logged
        if reply.done():
            return
        if exc is None:
            a = answer.result()
            reply.set_result(Reply(a.status, a.body, a.headers))
        elif isinstance(exc, RaftError):
            reply.set_result(self._refused(req, scheme, exc))
        else:
            reply.set_exception(exc)

    def _refused(self, req: LeanRequest, scheme: str, exc: RaftError) -> Reply:
        return refused(self.metrics, req.route.endpoint, exc, None, request_url_on(scheme, req.path, req.query))


def _die_with_parent(parent_fd: int, stop: asyncio.Event) -> None:
    """Stop when the node's end of the pipe closes; PR_SET_PDEATHSIG(SIGTERM) as a second guard."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    loop = asyncio.get_running_loop()

    def readable() -> None:
        try:
            data = os.read(parent_fd, 64)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            loop.remove_reader(parent_fd)
            stop.set()

    os.set_blocking(parent_fd, False)
    loop.add_reader(parent_fd, readable)


async def run(opts: dict) -> None:
    """Serve until SIGTERM/SIGINT or the node's death."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    _die_with_parent(opts["parent_fd"], stop)
    if os.getppid() != opts["parent_pid"]:  # the node died before the guards were in place
        return
    limits = HTTPLimits(**opts["limits"])
    tokens = TokenStore(opts["tokens_file"]) if opts.get("tokens_file") else None
    tls = None
    if opts.get("tls"):
        from electra.security.tls import NodeTLS

        tls = NodeTLS(*opts["tls"])
    metrics = RequestMetrics()
    link = FrontEndLink(opts["link"], metrics)
    lean = LeanPath(None, metrics, tokens, forward=link.forward)
    http_ssl = tls.http_server_context() if tls else None
    relay = RaftProcessProxy(opts["app_socket"], link.raft_process_stalled)
    config = uvicorn.Config(relay, log_level="warning", lifespan="off",
                            access_log=False, http=lean_protocol(lean, limits), proxy_headers=False,
                            timeout_keep_alive=limits.idle_timeout_s,
                            timeout_graceful_shutdown=limits.stop_grace_s,
                            ssl_context_factory=(lambda _cfg, _default: http_ssl) if http_ssl else None)
    server = uvicorn.Server(config)
    server.install_signal_handlers = lambda: None
    linked = asyncio.ensure_future(link.keep_linked(stop))
    counting = asyncio.ensure_future(link.report_counts(stop))
    serving = asyncio.ensure_future(server.serve(sockets=[_listen(opts["host"], opts["port"])]))
    watch = asyncio.ensure_future(tls.watch()) if tls else None
    await asyncio.wait([serving, asyncio.ensure_future(stop.wait())], return_when=asyncio.FIRST_COMPLETED)
    exit_if_stop_hangs(f"front-end {os.getpid()}")
    stop.set()
    server.should_exit = True
    async with asyncio.timeout(15):
        await asyncio.gather(serving, linked, counting, return_exceptions=True)
    if watch is not None:
        watch.cancel()
    if os.getppid() != opts["parent_pid"]:  # the node died without cleaning up: remove its socket directory
        shutil.rmtree(os.path.dirname(opts["link"]), ignore_errors=True)


def options(*, host: str, port: int, link: str, app_socket: str, parent_fd: int, tls: tuple | None,
            tokens_file: str | None, limits: HTTPLimits, log_level: str) -> dict:
    """The settings of a front-end process (its one command-line argument, as JSON)."""
    return {"host": host, "port": port, "link": link, "app_socket": app_socket, "parent_fd": parent_fd,
            "parent_pid": os.getpid(), "tls": [str(p) for p in tls] if tls else None,
            "tokens_file": str(tokens_file) if tokens_file else None, "limits": asdict(limits),
            "log_level": log_level}


def main(argv: list[str]) -> int:
    keep_read_buffers_off_mmap()  # its TLS reads in the heap (electra/malloc_thresholds.py)
    opts = json.loads(argv[0])
    logging.basicConfig(level=opts.get("log_level", "WARNING").upper(),
                        format="%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s")
    import uvloop

    uvloop.run(run(opts), loop_factory=tls_bounded_loop)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
