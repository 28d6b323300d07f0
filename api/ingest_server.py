"""The ingest workers' HTTP server: HTTP/1.1 straight on httptools' parser, one SO_REUSEPORT socket per process.

uvicorn's ASGI request cycle (scope dicts, receive/send coroutines, a task per request)
was ~40% of the CPU of a heartbeat (docs/heartbeat-pipeline.md). This server has four
routes and no framework: it parses with httptools (the C parser uvicorn uses), answers
each request as soon as its body is complete (the work is synchronous: validation and a
non-blocking `producer.send`), so pipelined requests are answered in order, and keeps
connections alive unless the client asks otherwise. Each worker process binds its own
socket with SO_REUSEPORT; the kernel spreads connections over them.

A broker may open a session on its connection (`POST /v1/session`, `POST /v1/session/goodbye`;
`sessions.py`): when that connection ends without a goodbye, the worker publishes a
`disconnected` record, the signal of fast crash failover.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import multiprocessing
import os
import resource
import signal
import socket
import time
from dataclasses import replace
from urllib.parse import unquote_to_bytes

import httptools

from electra.interrupts import exit_if_stop_hangs
from electra.malloc_thresholds import keep_read_buffers_off_mmap
from electra.security.auth import AuthError, TokenStore
from electra.security.http_auth import NO_ROUTE_BODY, check_request, scope_names
from electra.security.tls import server_context
from electra.state.limits import content_length
from electra.streaming import records

from .http_limits import (
    BUSY_REPLY,
    DEFAULT_LIMITS,
    TIMEOUT_REPLY,
    UPGRADE_REMARK,
    HeadRefused,
    HTTPLimits,
    LazyDeadline,
    head_end_in,
    head_too_large,
    open_line_bytes,
)
from .ingest import HeartbeatProducer, accept_fast, decode_body, fast_heartbeat, handle_heartbeat
from .invalid import SEND_JSON, is_json_media
from .ports import bind_listening, port_taken
from .read_buffer import SharedReadBuffer
from .sessions import SessionRegistry

log = logging.getLogger("electra.api.ingest")

MAX_BODY = 64 << 10
# Every broker holds a session connection to one ingest worker for its whole life (sessions.py), so a
# worker's connections are brokers, not requests in flight: 1,000 sets x 3 replicas hashed over 3
# workers is ~1,000 each, the node API's cap (1,000) refused the rest. Idle sessions cost a file
# descriptor, not CPU; the worker raises its descriptor limit to fit (`_raise_fd_limit`).
INGEST_LIMITS = replace(DEFAULT_LIMITS, max_connections=16_384)
def _route_path(url: bytes) -> bytes:
    """The path a request names, as the node's server reads it: from an absolute-form target (`POST http://host/v1/
    heartbeat`, which RFC 9112 has every server accept) too, and percent-decoded (`/v1/%68eartbeat`)."""
    if url[:1] != b"/":
        try:
            url = httptools.parse_url(url).path or b""
        except httptools.HttpParserInvalidURLError:
            return b""  # no route: a 404
    path = url.split(b"?", 1)[0]
    return unquote_to_bytes(path) if b"%" in path else path


_UPGRADE_BODY = json.dumps({"code": 2005, "remark": UPGRADE_REMARK}).encode()  # as at a node (http_limits)
_TOO_LARGE_BODY = json.dumps({"code": 2005, "remark": f"request body over {MAX_BODY} bytes"}).encode()  # as at a node
_SEND_JSON_BODY = json.dumps({"code": 2005, "remark": SEND_JSON}).encode()
_REASONS = {200: b"OK", 401: b"Unauthorized", 403: b"Forbidden",
            404: b"Not Found", 405: b"Method Not Allowed", 409: b"Conflict", 413: b"Payload Too Large",
            415: b"Unsupported Media Type",
            422: b"Unprocessable Entity", 400: b"Bad Request", 500: b"Internal Server Error",
            503: b"Service Unavailable"}


_NOT_DECODED = object()


_SESSION_NEEDS_KEEP_ALIVE = (b'{"code":2005,"remark":"a session needs a kept-alive connection: HTTP/1.1 '
                             b'without Connection: close"}')


def _response(status: int, body: bytes, *, content_type: bytes = b"application/json", close: bool = False,
              retry_after: bool = False, allow: bytes | None = None, head_only: bool = False) -> bytes:
    head = [b"HTTP/1.1 %d %s" % (status, _REASONS.get(status, b"")), b"content-type: " + content_type,
            b"content-length: %d" % len(body)]
    if retry_after:
        head.append(b"retry-after: 1")
    if allow is not None:
        head.append(b"allow: " + allow)
    if close:
        head.append(b"connection: close")
    return b"\r\n".join(head) + b"\r\n\r\n" + (b"" if head_only else body)  # HEAD: the head alone


_NOT_ALLOWED = b'{"code":3,"remark":"method not allowed on this endpoint"}'



class IngestProtocol(SharedReadBuffer, asyncio.Protocol):
    """One client connection: parse requests, answer each when its body is complete.

    (Read into the process's one buffer, `read_buffer.py`: under TLS a plain Protocol cost a 256 KiB
    allocation per record, i.e. per heartbeat.)"""

    def __init__(self, producer: HeartbeatProducer, limits: HTTPLimits = INGEST_LIMITS,
                 open_connections: set | None = None, tokens: TokenStore | None = None,
                 sessions: SessionRegistry | None = None) -> None:
        self.producer = producer
        self.sessions = sessions if sessions is not None else SessionRegistry(producer)
        self.tokens = tokens  # None: insecure mode, nobody is asked for a credential
        self.authorization: str | None = None
        self.verified: tuple | None = None  # what this connection's credential last passed (`_check_caller`)
        # Containment (api/http_limits.py): connection cap, request deadline, idle timeout, head size.
        self.limits = limits
        self.open = open_connections if open_connections is not None else set()
        self.deadline = LazyDeadline()
        self.head_bytes = 0
        self.in_head = True
        self.head_began = False  # a request head began in the read being parsed
        self.chunk_len = 0
        self.head_size = 0  # the head's bytes as the parser took them
        self.last_bytes = b""  # the end of the previous read (a head's end marker may straddle two reads)
        self.content_length = 0
        self.closed_here = False  # this worker closed the connection (limits, errors): a session says nothing
        self.deadline.on_fire = self._closing_here
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.body: list[bytes] = []
        self.size = 0
        self.too_large = False

    # asyncio.Protocol
    def connection_made(self, transport) -> None:
        self.transport = transport
        if len(self.open) >= self.limits.max_connections:
            transport.write(BUSY_REPLY)
            transport.close()
            return
        self.open.add(self)
        self.deadline.arm(transport, self.limits.request_timeout_s, TIMEOUT_REPLY)

    def _closing_here(self) -> None:
        self.closed_here = True

    def connection_lost(self, exc) -> None:
        self.open.discard(self)
        self.deadline.cancel()
        if self.closed_here:
            self.sessions.closed_by_worker(self)
        else:
            self.sessions.lost(self, int(time.time() * 1000))  # a broker session ended (api/sessions.py)

    def data_received(self, data: bytes) -> None:
        # The head-size limit (as the node's protocol, `http_limits.guarded_protocol`): a head in progress is
        # counted by the bytes read; the part of it in the read where it begins, by what the parser took.
        self.head_began, self.chunk_len = False, len(data)
        if self.in_head:
            end = head_end_in(data, self.last_bytes)
            self.head_bytes += len(data) if end < 0 else end
            if self.head_bytes > self.limits.max_header_bytes:
                self._reply_raw(head_too_large(self.limits.max_header_bytes))
                return
        self.last_bytes = data[-3:]
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._reply(400, _UPGRADE_BODY, close=True)
        except httptools.HttpParserCallbackError as exc:
            # raised by one of our callbacks: a 431 already answered (the connection is closing), or a fault of
            # this worker, which the broker must not take for its own mistake
            if self.transport is not None and not self.transport.is_closing():
                log.error("ingest worker %d: a request failed", os.getpid(), exc_info=exc.__context__ or exc)
                self._reply(500, b'{"code":1,"remark":"internal error in the ingest worker; see its log"}',
                            close=True)
        except httptools.HttpParserError:
            self._reply(400, b'{"code":2005,"remark":"malformed HTTP request"}', close=True)
        else:
            if self.head_began and self.in_head:  # a head began in this read and goes on past it
                self.head_bytes = self.head_size + open_line_bytes(data)
                if self.head_bytes > self.limits.max_header_bytes:
                    self._reply_raw(head_too_large(self.limits.max_header_bytes))

    # httptools callbacks
    def on_message_begin(self) -> None:
        self.url, self.body, self.size, self.too_large = b"", [], 0, False
        self.in_head, self.head_bytes, self.content_length = True, 0, 0
        self.head_began, self.head_size = True, 12  # the request line's method and version
        self.authorization = None
        self.content_type: str | None = None
        self.deadline.arm(self.transport, self.limits.request_timeout_s, TIMEOUT_REPLY)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.head_size += len(name) + len(value) + 4
        lname = name.lower()
        if lname == b"content-length":
            length = content_length(value)
            self.content_length = MAX_BODY + 1 if length is None else length
        elif lname == b"authorization":
            self.authorization = value.decode("latin-1")
        elif lname == b"content-type":
            self.content_type = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.in_head = False
        if self.head_began and self.chunk_len > self.limits.max_header_bytes and \
                self.head_size > self.limits.max_header_bytes:  # begun and ended in one large read
            self._reply_raw(head_too_large(self.limits.max_header_bytes))
            raise HeadRefused  # stops the parser: nothing of this request is acted on
        if self.parser.should_upgrade():  # one answer (the 400), not the route's and then the 400
            self._reply(400, _UPGRADE_BODY, close=True)
        elif self.content_length > MAX_BODY:  # refuse before reading a byte of the body
            self._reply(413, _TOO_LARGE_BODY, close=True)

    def on_url(self, url: bytes) -> None:
        self.url += url
        self.head_size += len(url)

    def on_body(self, body: bytes) -> None:
        self.size += len(body)
        if self.size > MAX_BODY:
            if not self.too_large:  # a chunked body past the limit: refused now, not after it ends
                self._reply(413, _TOO_LARGE_BODY, close=True)
            self.too_large = True
        elif not self.too_large:
            self.body.append(body)

    def on_message_complete(self) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        keep = self.parser.should_keep_alive()
        self.deadline.arm(self.transport, self.sessions.idle_limit_s(self, self.limits.idle_timeout_s))
        path = _route_path(self.url)
        method = self.parser.get_method()
        raw = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        decoded: object = _NOT_DECODED
        fast = None
        if path == b"/v1/heartbeat" and method == b"POST" and not self.too_large:
            # decoded once, for the credential's scope and the heartbeat itself: a valid one in C
            # (msgspec), anything else the slow way, whose answers name the problem
            fast = fast_heartbeat(raw)
            if fast is None:
                try:
                    decoded = decode_body(raw)
                except records.InvalidHeartbeat as exc:
                    decoded = exc
        if self.tokens is not None and not self.too_large:
            try:
                self._check_caller(method, path, raw, decoded if fast is None else
                                   {"clusterName": fast.clusterName, "brokerName": fast.brokerName})
            except AuthError as err:
                # On a session's connection the credential that opened it no longer passes (revoked): the
                # session ends here, closed by this worker, so it says nothing (the heartbeat timeout judges the
                # broker); a refused broker no longer holds a connection open with refused requests.
                held = self.sessions.broker_of(self) is not None
                self._reply(err.status, json.dumps(err.body()).encode(), close=not keep or held)
                return
        if path == b"/v1/heartbeat":
            if method != b"POST":
                self._reply(405, _NOT_ALLOWED, close=not keep, allow=b"POST")
            elif self.too_large:
                self._reply(413, _TOO_LARGE_BODY, close=True)
            elif raw and not is_json_media(self.content_type):  # as the node's API: never read as JSON
                self._reply(415, _SEND_JSON_BODY, close=not keep)
            else:
                now = int(time.time() * 1000)
                hb: dict | None = None
                if fast is not None:
                    status, body = accept_fast(self.producer, fast, now)
                else:  # `hb`: the heartbeat as validated (ints, defaults), not the body's JSON ("2", 2.0)
                    status, body, hb = handle_heartbeat(self.producer, decoded, now, decoded=True)
                # a valid heartbeat (a 503 too: the broker is alive, Kafka is not) shows its session is not silent
                if status in (200, 503) and self.sessions.broker_of(self) is not None:
                    if fast is not None:
                        changed = self.sessions.heard(self, fast.clusterName, fast.brokerName, fast.brokerId,
                                                      fast.heartbeatTimeoutMillis, now)
                    elif hb is not None:  # accepted the slow way
                        changed = self.sessions.heard(self, hb["clusterName"], hb["brokerName"], hb["brokerId"],
                                                      hb["heartbeatTimeoutMillis"], now)
                    else:
                        changed = False
                    if changed:  # a new heartbeat timeout: the connection may idle that long now
                        self.deadline.arm(self.transport, self.sessions.idle_limit_s(self, self.limits.idle_timeout_s))
                self._reply(status, body, close=not keep, retry_after=status == 503)
        elif path in (b"/v1/session", b"/v1/session/goodbye"):
            if method != b"POST":
                self._reply(405, _NOT_ALLOWED, close=not keep, allow=b"POST")
            elif self.too_large:
                self._reply(413, _TOO_LARGE_BODY, close=True)
            elif not keep and path == b"/v1/session":  # it would end with this answer: a session for nothing
                self._reply(400, _SESSION_NEEDS_KEEP_ALIVE, close=True)
            elif self.body and not is_json_media(self.content_type):
                self._reply(415, _SEND_JSON_BODY, close=not keep)
            else:
                now = int(time.time() * 1000)
                status, body = (self.sessions.open(self, b"".join(self.body), now) if path == b"/v1/session"
                                else self.sessions.goodbye(self, now))
                # idle until the next request: a session's connection may idle up to its heartbeat timeout
                self.deadline.arm(self.transport, self.sessions.idle_limit_s(self, self.limits.idle_timeout_s))
                self._reply(status, body, close=not keep, retry_after=status == 503)
        elif path in (b"/healthz", b"/metrics") and method not in (b"GET", b"HEAD"):
            self._reply(405, _NOT_ALLOWED, close=not keep, allow=b"GET, HEAD")
        elif path == b"/healthz":
            ok = self.producer.healthy
            body = json.dumps({"ok": ok, "kafka": self.producer.bootstrap, "pid": os.getpid()}).encode()
            self._reply(200 if ok else 503, body, close=not keep)
        elif path == b"/metrics":
            lines = ["# HELP electra_ingest_heartbeats_total heartbeats this worker answered, by outcome",
                     "# TYPE electra_ingest_heartbeats_total counter"]
            lines += [f'electra_ingest_heartbeats_total{{result="{k}"}} {v}' for k, v in self.producer.stats.items()]
            lines += ["# HELP electra_ingest_kafka_healthy 1 while this worker's Kafka producer is connected",
                      "# TYPE electra_ingest_kafka_healthy gauge",
                      f"electra_ingest_kafka_healthy {int(self.producer.healthy)}",
                      "# HELP electra_ingest_sessions_total broker sessions by what happened to them",
                      "# TYPE electra_ingest_sessions_total counter"]
            lines += [f'electra_ingest_sessions_total{{event="{k}"}} {v}' for k, v in self.sessions.stats.items()]
            lines += ["# HELP electra_ingest_sessions_open broker sessions open on this worker",
                      "# TYPE electra_ingest_sessions_open gauge", f"electra_ingest_sessions_open {len(self.sessions)}"]
            self._reply(200, ("\n".join(lines) + "\n").encode(), content_type=b"text/plain; version=0.0.4",
                        close=not keep)
        else:
            self._reply(404, NO_ROUTE_BODY, close=not keep)

    def _check_caller(self, method: bytes, path: bytes, raw: bytes, decoded: object) -> None:
        """The credential check of `check_request`, skipped when this connection already passed it for the
        same credential, route and scope (the body's cluster and broker set) and the tokens file did not
        change since: a session's every heartbeat carries the same token for the same broker, and hashing
        it and matching its scope each time was CPU for nothing. AuthError as `check_request`."""
        if decoded is _NOT_DECODED and raw:
            try:
                decoded = decode_body(raw)
            except records.InvalidHeartbeat as exc:
                decoded = exc
        names = scope_names(decoded) if raw else None  # the names of the body this server acts on
        key = (self.authorization, method, path, names, self.tokens.generation())
        if key == self.verified:
            return
        check_request(self.tokens, method.decode("latin-1"), path.decode("latin-1"), self.authorization, names)
        self.verified = key

    def _reply(self, status: int, body: bytes, *, close: bool = False, retry_after: bool = False,
               content_type: bytes = b"application/json", allow: bytes | None = None) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        head_only = not self.in_head and self.parser.get_method() == b"HEAD"
        self.transport.write(_response(status, body, content_type=content_type, close=close,
                                       retry_after=retry_after, allow=allow, head_only=head_only))
        if close:
            self.deadline.cancel()
            self.closed_here = True
            self.transport.close()

    def _reply_raw(self, response: bytes) -> None:
        self.deadline.cancel()
        self.closed_here = True
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(response)
            self.transport.close()


SWEEP_S = 0.1  # how often a worker looks for silent sessions: a hung master's failover waits up to this


async def sweep_silent_sessions(sessions: SessionRegistry, every_s: float = SWEEP_S) -> None:
    """Look for sessions whose broker stopped heartbeating (`SessionRegistry.sweep`) until cancelled."""
    while True:
        await asyncio.sleep(every_s)
        try:
            sessions.sweep(int(time.time() * 1000))
        except Exception:  # a fault here must not end the worker's watch for good
            log.exception("ingest worker %d: the sweep for silent sessions failed", os.getpid())


def _listen(host: str, port: int) -> socket.socket:
    sock = bind_listening(host, port, reuse_port=True)  # the workers of one command share the port
    sock.listen(1024)
    sock.setblocking(False)
    return sock


def _raise_fd_limit(wanted: int) -> None:
    """Raise the soft descriptor limit toward `wanted` (up to the hard limit): one per broker session."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted + 256 if hard == resource.RLIM_INFINITY else min(hard, wanted + 256)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-file limit to %d (%s): at most ~%d broker sessions", target, exc, soft)


def run_worker(host: str, port: int, bootstrap: str, topic: str, log_level: str = "warning",
               tls_files: tuple[str, str] | None = None, tokens_file: str | None = None,
               liveness_topic: str | None = None) -> None:
    """One worker process: its own producer and its own SO_REUSEPORT socket; stops on SIGTERM/SIGINT, and when
    its parent dies, even by SIGKILL (PR_SET_PDEATHSIG)."""
    import ctypes

    import uvloop

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG

    keep_read_buffers_off_mmap()  # a spawned process: its TLS reads in the heap (electra/malloc_thresholds.py)
    logging.basicConfig(level=log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s")
    logging.getLogger("kafka").setLevel(max(logging.WARNING, logging.getLogger().level))
    # `electra ingest` loaded both once before starting the workers (check_ingest_files): a bad file is refused there
    tokens = TokenStore(tokens_file) if tokens_file else None
    tls = server_context(*tls_files) if tls_files else None
    _raise_fd_limit(INGEST_LIMITS.max_connections)
    producer = HeartbeatProducer(bootstrap, topic, liveness_topic=liveness_topic).start()
    sessions = SessionRegistry(producer)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        connections: set = set()
        server = await loop.create_server(
            lambda: IngestProtocol(producer, INGEST_LIMITS, connections, tokens, sessions),
            sock=_listen(host, port), ssl=tls,
            ssl_handshake_timeout=INGEST_LIMITS.request_timeout_s if tls is not None else None)  # not 60 s
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        sweeper = asyncio.create_task(sweep_silent_sessions(sessions), name="silent-sessions")
        await stop.wait()
        exit_if_stop_hangs(f"ingest worker {os.getpid()}")
        sweeper.cancel()
        server.close()
        for conn in sessions.stop():  # a stopping worker says nothing about the brokers it disconnects
            if conn.transport is not None:
                conn.transport.close()
        for _ in range(40):  # let connection_lost run for them before the loop ends (bounded: 2 s)
            if not len(sessions):
                break
            await asyncio.sleep(0.05)
        await server.wait_closed()

    try:
        uvloop.run(main())
    finally:
        producer.close()


def check_ingest_files(tls_files: tuple[str, str] | None, tokens_file: str | None) -> None:
    """Load the certificate, key and tokens file once, as every worker will: ValueError naming the file that cannot
    be used (unreadable, malformed, a key that is not the certificate's). Before the workers start: each of them
    failed on it with a traceback, and the command said only that a worker exited."""
    if tls_files:
        server_context(*tls_files)
    if tokens_file:
        TokenStore(tokens_file)


def serve_ingest(host: str, port: int, bootstrap: str, *, workers: int = 2, topic: str = records.HEARTBEATS,
                 log_level: str = "warning", tls_files: tuple[str, str] | None = None,
                 tokens_file: str | None = None, liveness_topic: str | None = None) -> None:
    """Run `workers` ingest processes on host:port until SIGINT/SIGTERM (blocks).

    With `tls_files` (certificate, key) the workers serve HTTPS; with `tokens_file` every request
    but /healthz needs a token (heartbeats: a broker credential scoped to the heartbeat's set). With
    `liveness_topic`, sessions' opening and end also go there (the nodes' connection-loss lane).
    """
    ctx = multiprocessing.get_context("spawn")
    # Fail here, clearly, if another process listens there (`electra ingest` says so before this, naming
    # --listen): the workers' SO_REUSEPORT binds would share its port. This command's workers share it.
    taken = port_taken(host, port)
    if taken is not None:
        raise OSError(taken.errno, f"cannot listen on {host}:{port}: {taken.strerror or taken}")
    procs = [ctx.Process(target=run_worker, args=(host, port, bootstrap, topic, log_level, tls_files, tokens_file,
                               liveness_topic),
                         daemon=False,
                         name=f"ingest-worker-{i}") for i in range(workers)]
    stop = False

    def on_signal(_sig, _frame) -> None:
        nonlocal stop
        stop = True

    # before the workers start: a SIGTERM while they were starting ended this process by default and left
    # them running without a parent (seen when `electra up` was killed just after it came up)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    for p in procs:
        p.start()
    ended = None
    try:
        while not stop and all(p.is_alive() for p in procs):
            time.sleep(0.2)
        ended = next((p for p in procs if not p.is_alive()), None)
    finally:
        exit_if_stop_hangs("ingest")
        for p in procs:
            if p.is_alive():
                p.terminate()  # SIGTERM: the worker stops its server and flushes its producer
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    if ended is not None and not stop:
        # Whatever ended it (a crash, a SIGTERM or SIGKILL sent to the worker alone): this process was not asked to
        # stop, so the service is down by accident. Exit 1, not 0, so a supervisor restarts it.
        raise SystemExit(f"error: ingest worker {ended.name} ended on its own ({_exit_status(ended.exitcode)}); "
                         "stopped the other workers")


def _exit_status(code: int | None) -> str:
    """A child's exit code as an operator reads it: `exit code 1`, or the signal's name for a negative one."""
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
