"""Run one controller node: Raft node + controller state machine + HTTP API, in one event loop."""

from __future__ import annotations

import asyncio
import logging
import socket
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import uvicorn

from electra.consensus.node import NodeConfig, RaftNode
from electra.security.audit import AuditLog
from electra.security.http_auth import AuthMiddleware
from electra.state.machine import ControllerStateMachine
from electra.streaming.records import Topics

from .app import create_app
from .controller import Controller, ControllerConfig
from .front_ends import FrontEnds, ServedAs
from .http_limits import DEFAULT_LIMITS, HTTPLimits
from .lean_http import lean_protocol
from .lean_path import LeanPath
from .legacy import ARCHITECTURES, LegacyControllerService
from .ports import bind_listening
from .replies import count_auth_refusal
from .service import ControllerService

log = logging.getLogger("electra.api.server")

if TYPE_CHECKING:
    from electra.security.node_security import NodeSecurity
    from electra.tiering.uploader import TierConfig, TierUploader


@dataclass
class ControllerNode:
    """A running controller node; `stop()` shuts the HTTP server, the controller and Raft down in order."""

    node: RaftNode
    service: Controller  # every piece of the node's controller (api/controller.py)
    server: uvicorn.Server
    task: asyncio.Task = field(repr=False)
    audit: AuditLog | None = None
    tls_watch: asyncio.Task | None = field(default=None, repr=False)
    lean: LeanPath | None = field(default=None, repr=False)  # the broker routes' lean path (its stats)
    front_ends: FrontEnds | None = field(default=None, repr=False)  # with --front-ends N: the API processes

    @property
    def tier(self) -> TierUploader | None:
        return self.service.tier

    async def stop(self) -> None:
        await self.node.hand_over_leadership()  # a leader's stop costs writes a vote, not an election timeout
        if self.front_ends is not None:
            await self.front_ends.stop()
        self.service.watchers.close()  # watch streams never end by themselves
        self.server.should_exit = True
        await asyncio.gather(self.task, return_exceptions=True)
        if self.tls_watch is not None:
            self.tls_watch.cancel()
        await self.service.stop()
        await self.node.stop()
        if self.audit is not None:
            self.audit.close()


async def start_controller_node(cfg: NodeConfig, http_host: str, http_port: int, http_peers: dict[int, str], *,
                                unclean_election: bool = False, scan_interval_s: float = 5.0,
                                kafka_bootstrap: str | None = None, topics: Topics | None = None,
                                tier: TierConfig | None = None, bootstrap_from_tier: bool = False,
                                http_limits: HTTPLimits = DEFAULT_LIMITS,
                                security: NodeSecurity | None = None, architecture: str = "new",
                                front_ends: int = 0) -> ControllerNode:
    """Start Raft, the controller service and the HTTP API; with `kafka_bootstrap`, also the pipeline links.

    With Kafka, heartbeats sent to this node go to the heartbeats topic, applied events are
    published to the events topic while this node leads, and liveness comes from the
    streaming job's liveness topic. With `tier`, the leader uploads snapshots and events to
    Delta tables; with `bootstrap_from_tier`, an empty data directory starts from the tier.
    With `security` (TLS files and tokens), the API serves HTTPS and asks every caller for a token;
    without it the node is in insecure mode. Admin actions go to `<data_dir>/audit.log` either way.
    `architecture="legacy"` serves requests the RocketMQ 5 way, for comparisons only (api/legacy.py).
    With `front_ends=N` (N >= 1), N front-end processes serve the API port and this process only
    their link and relayed requests (api/front_ends.py); 0 serves the port from this process.
    """
    if front_ends < 0:
        raise ValueError(f"front_ends must be 0 (none) or more, not {front_ends}")
    if architecture not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {architecture!r}; expected one of {', '.join(ARCHITECTURES)}")
    if architecture == "legacy" and kafka_bootstrap:
        raise ValueError("the legacy architecture keeps liveness on the leader: it runs without --kafka-bootstrap")
    if tier is not None and bootstrap_from_tier:  # an empty data dir starts from the tier's newest state
        from electra.consensus.snapshots import SnapshotUnreadable
        from electra.consensus.storage import CorruptLogError
        from electra.tiering.bootstrap import BootstrapError
        from electra.tiering.bootstrap import bootstrap_from_tier as bootstrap
        from electra.tiering.reader import tier_failure

        try:
            await asyncio.to_thread(bootstrap, cfg.data_dir, tier.uri, tier.storage_options, fsync=cfg.fsync,
                                    keep=cfg.snapshots_kept)
        except (BootstrapError, SnapshotUnreadable, CorruptLogError):
            raise  # said as they are: the local data dir's own problem is not the tier's
        except Exception as exc:  # the tier unreadable: say that it was the bootstrap that failed, and why
            raise BootstrapError(f"bootstrap from the tier at {tier.uri}: {tier_failure(exc)}") from exc
    sm = ControllerStateMachine()
    node = RaftNode(cfg, sm)
    await node.start()
    controller = Controller(node, sm, ControllerConfig(
        http_peers=http_peers, unclean_election=unclean_election, scan_interval_s=scan_interval_s,
        kafka_bootstrap=kafka_bootstrap, topics=topics or Topics(), tier=tier,
        make_requests=LegacyControllerService if architecture == "legacy" else ControllerService))
    controller.start()
    app = create_app(controller, http_limits)
    audit = AuditLog(cfg.data_dir / "audit.log")
    tokens = security.tokens if security else None
    app.add_middleware(AuthMiddleware, tokens=tokens, audit=audit,
                       on_refusal=lambda status: count_auth_refusal(app.state.request_metrics, status),
                       cluster_of=sm.cluster_of)
    # The broker routes' lean path shares the port with the FastAPI app (api/lean_http.py).
    lean = LeanPath(controller.requests, app.state.request_metrics, tokens, controller.heartbeat_producer,
                    cluster_of=sm.cluster_of)
    http_ssl = security.tls.http_server_context() if security and security.tls else None
    fronts = None
    if front_ends:  # the API port belongs to the front-ends; this process serves them on unix sockets
        fronts = FrontEnds(front_ends, http_host, http_port, lean, limits=http_limits,
                           tls_files=(security.tls.cert, security.tls.key, security.tls.ca)
                           if security and security.tls else None,
                           tokens_file=str(tokens.path) if tokens is not None else None,
                           log_level=logging.getLevelName(logging.getLogger().level))
        app.state.request_metrics.registry.register(fronts)  # electra_front_end_* in /metrics
        # The front-ends' clients' scheme and the node's port, which this socket does not see: the lean path's
        # redirects and the dashboard cookie's name (one per node on a host) depend on them.
        config = uvicorn.Config(ServedAs(app, (http_host, http_port)), uds=fronts.app_socket, log_level="warning",
                                lifespan="off", access_log=False,
                                http=lean_protocol(lean, http_limits, scheme="https" if http_ssl else "http"),
                                timeout_keep_alive=http_limits.idle_timeout_s,
                                timeout_graceful_shutdown=http_limits.stop_grace_s,
                                proxy_headers=True, forwarded_allow_ips="*")
    else:
        # proxy_headers off: no proxy stands in front of a node, so X-Forwarded-* from a client (uvicorn
        # believes them from 127.0.0.1 by default) must not change the address audited or the scheme redirected to.
        config = uvicorn.Config(app, host=http_host, port=http_port, log_level="warning", lifespan="off",
                                access_log=False, http=lean_protocol(lean, http_limits), proxy_headers=False,
                                timeout_keep_alive=http_limits.idle_timeout_s,
                                timeout_graceful_shutdown=http_limits.stop_grace_s,
                                ssl_context_factory=(lambda _cfg, _default: http_ssl) if http_ssl else None)
    server = uvicorn.Server(config)
    server.install_signal_handlers = lambda: None  # the caller owns signals
    # The listening socket is bound here, so a busy or bad address is one `error:` line from `electra node`
    # (uvicorn itself logs its own message and exits the process with code 1 on that error).
    try:
        sockets = None if fronts is not None else [_bound_socket(http_host, http_port)]
    except RuntimeError:
        await controller.stop()
        await node.stop()
        audit.close()
        raise
    task = asyncio.create_task(server.serve(sockets=sockets))
    for _ in range(200):  # bounded wait for the socket
        if server.started or task.done():
            break
        await asyncio.sleep(0.01)
    failure = None
    if task.done():
        failure = f"HTTP server on {http_host}:{http_port} failed to start: {task.exception()!r}"
    elif fronts is not None:
        try:
            await fronts.start()
        except (OSError, RuntimeError) as exc:
            failure = f"front-end processes on {http_host}:{http_port} failed to start: {exc}"
            await fronts.stop()
            server.should_exit = True
            await asyncio.gather(task, return_exceptions=True)
    if failure is not None:
        await controller.stop()
        await node.stop()
        audit.close()
        raise RuntimeError(failure)
    scheme = "https" if http_ssl else "http"
    log.info("controller node %d: %s://%s:%d", cfg.node_id, scheme, http_host, http_port)
    watch = asyncio.create_task(security.tls.watch()) if security and security.tls else None
    return ControllerNode(node, controller, server, task, audit, watch, lean, fronts)


def _bound_socket(host: str, port: int) -> socket.socket:
    """The API's listening socket (as uvicorn binds it: SO_REUSEADDR); RuntimeError naming the address."""
    try:
        sock = bind_listening(host, port)
    except OSError as exc:
        raise RuntimeError(f"cannot listen on {host}:{port} (--http-addr): {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock
