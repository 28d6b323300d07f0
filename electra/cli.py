"""The `electra` command: run nodes, a local cluster, simulations and benchmarks."""

from __future__ import annotations

import argparse
import asyncio
import errno
import gc
import ipaddress
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from electra.api.ports import port_taken
from electra.cli_args import (
    Parser,
    make_dir,
    optional_server_list,
    parse_addr,
    refuse,
    server_list,
    topic_prefix,
)
from electra.interrupts import exit_if_stop_hangs, terminate_as_interrupt
from electra.malloc_thresholds import keep_read_buffers_off_mmap
from electra.state.limits import MAX_BROKER_ID, is_name
from electra.tiering.options import parse_storage_options, tier_uri


def parse_peers(text: str) -> dict[int, tuple[str, int]]:
    """Parse `1=127.0.0.1:7001,2=[::1]:7002` into {1: ("127.0.0.1", 7001), 2: ("::1", 7002)}: an IPv6 host is
    returned without brackets, as sockets bind and dial it. Written without them (`2=::1:7002`, as deployments
    did), the last group is the port; where the rest is no IPv6 address, brackets are asked for, as `parse_addr`
    asks for them."""
    peers: dict[int, tuple[str, int]] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            ident, addr = part.split("=", 1)
            host, port = addr.strip().rsplit(":", 1)
            node_id = int(ident)
            port_no = int(port)
        except ValueError:
            raise argparse.ArgumentTypeError(f"bad peer {part!r}: expected ID=HOST:PORT") from None
        if "://" in addr:
            raise argparse.ArgumentTypeError(f"bad peer {part!r}: write ID=HOST:PORT, without a scheme")
        if any(c.isspace() for c in host):
            raise argparse.ArgumentTypeError(f"bad peer {part!r}: a host has no blanks")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        elif ":" in host and not _is_ipv6(host):  # `2001:db8::7101`: host 2001:db8: port 7101, or a port left out?
            raise argparse.ArgumentTypeError(f"bad peer {part!r}: write an IPv6 host in brackets, ID=[::1]:PORT")
        if not host or not 0 < port_no < 65536:
            raise argparse.ArgumentTypeError(f"bad peer {part!r}: expected ID=HOST:PORT, port 1-65535")
        if node_id <= 0:
            raise argparse.ArgumentTypeError(f"bad peer {part!r}: node ids start at 1")
        if node_id in peers:
            raise argparse.ArgumentTypeError(f"bad peer {part!r}: node {node_id} is named twice")
        same = [i for i, (h, p) in peers.items() if (_host_key(h), p) == (_host_key(host), port_no)]
        if same:  # both would be one process: the group could never elect
            raise argparse.ArgumentTypeError(f"bad peer {part!r}: node {same[0]} has that address too")
        peers[node_id] = (host, port_no)
    if not peers:
        raise argparse.ArgumentTypeError("at least one peer is required")
    return peers


def _is_ipv6(text: str) -> bool:
    try:
        return ipaddress.ip_address(text).version == 6
    except ValueError:
        return False


def _host_key(host: str) -> str:
    """A host as an address compares: `localhost` is the loopback address, an IP literal in its
    canonical form (`[::1]`, `0:0::1`), a name case-insensitively. Names are not resolved here."""
    h = host.strip("[]").lower().rstrip(".")
    if h == "localhost":
        return "127.0.0.1"
    try:
        return str(ipaddress.ip_address(h))
    except ValueError:
        return h


def parse_http_addr(text: str) -> tuple[str, int]:
    """`--http-addr`: the address this node serves its API on and advertises to its peers (their redirects to
    the leader name it), so a port of 0 ("any free port") is refused as `electra ingest --listen` refuses it."""
    return parse_addr(text, min_port=1)


def join_host_port(host: str, port: int) -> str:
    """`HOST:PORT`, an IPv6 host in brackets (`[::1]:7301`): what an address in a URL looks like."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_http_peers(text: str) -> dict[int, str]:
    return {i: join_host_port(h, p) for i, (h, p) in parse_peers(text).items()}


# --------------------------------------------------------------------------- electra node
NODE_OPTIONS = [
    ("--id", int, "this node's id (ELECTRA_NODE_ID)"),
    ("--peers", parse_peers, "ID=HOST:PORT,... raft addresses of all members"),
    ("--data-dir", str, "where the Raft log and snapshots live"),
    ("--state-machine", str, "controller (default; HTTP API) or kv/counter (engine tests, binary protocol)"),
    ("--http-addr", parse_http_addr, "controller HTTP API address (default 127.0.0.1:7301)"),
    ("--http-peers", parse_http_peers, "ID=HOST:PORT,... HTTP API of every member (for redirects to the leader)"),
    ("--client-addr", parse_addr, "binary client protocol address for kv/counter nodes (default: any port)"),
    ("--tick-ms", int, "Raft tick (default 100 ms; election timeout 10-13 ticks)"),
    ("--election-jitter-ticks", int, "spread of the election timeouts, in ticks (default 4: 10-13 ticks)"),
    ("--snapshot-entries", int, "snapshot every N applied entries (default 100000)"),
    ("--compaction-slack", int, "log entries kept behind a snapshot (default 5000)"),
    ("--inactive-master-scan-ms", int, "how often the leader looks for dead masters at the latest "
                                       "(default 5000, as RocketMQ; "
                                       "the new architecture also looks when a master's heartbeat times out; "
                                       "0 = off, the default with --kafka-bootstrap: the streaming job detects them)"),
    ("--kafka-bootstrap", optional_server_list, "Kafka bootstrap servers: heartbeats, events and liveness go through "
                                                "Kafka (empty: none)"),
    ("--topic-prefix", topic_prefix, "prefix of the Kafka topic names (several Electra clusters on one Kafka)"),
    ("--tier-uri", tier_uri, "upload snapshots and events to Delta tables under this path or object-store URI"),
    ("--tier-options", parse_storage_options, "KEY=VALUE,... delta-rs storage options for --tier-uri"),
    ("--tier-retention-days", float, "history older than this is dropped from the tier, keeping the snapshot it "
                                     "rests on (default 30; docs/tiering.md)"),
    ("--tier-maintenance-every-s", float, "how often the leader applies retention and compacts the tier's files "
                                          "(default 3600)"),
    ("--certs-dir", str, "ca.crt, node-<id>.crt/.key and tokens.json (electra cert ...): mutual TLS between peers, "
                         "HTTPS and token authentication; required unless --insecure"),
    ("--tokens-file", str, "hashed client tokens (default <certs-dir>/tokens.json); re-read when it changes"),
    ("--architecture", str, "new (default) or legacy: RocketMQ 5's single event queue, for comparisons only "
                            "(docs/architectures.md; no Kafka)"),
    ("--front-ends", int, "HTTP front-end processes sharing the API port, linked to this Raft process "
                          "(default 0: the API in the Raft process; docs/controller-api.md#scaling-across-cores)"),
    ("--cluster-id", str, "expected cluster id (default: the one in this node's certificate; checked against the "
                          "data dir and every peer)"),
]
NODE_DEFAULTS = {"state_machine": "controller", "http_addr": ("127.0.0.1", 7301), "client_addr": ("127.0.0.1", 0),
                 "http_peers": None, "tick_ms": 100, "election_jitter_ticks": 4, "snapshot_entries": 100_000,
                 "compaction_slack": 5000,
                 "inactive_master_scan_ms": None, "kafka_bootstrap": None, "topic_prefix": "",
                 "tier_uri": None, "tier_options": None, "bootstrap_from_tier": False,
                 "unsafe_no_fsync": False, "certs_dir": None, "tokens_file": None, "cluster_id": None,
                 "insecure": False, "architecture": "new", "front_ends": 0,
                 "unclean_election": False, "tier_retention_days": 30.0, "tier_maintenance_every_s": 3600.0}
_NODE_TYPES = {opt[2:].replace("-", "_"): typ for opt, typ, _ in NODE_OPTIONS} | {"unsafe_no_fsync": bool,
                                                                                   "insecure": bool}
_NODE_TYPES["bootstrap_from_tier"] = bool
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")
_NODE_TYPES["unclean_election"] = bool


def node_env_name(key: str) -> str:
    """The environment variable an `electra node` setting is read from: ELECTRA_<KEY>, the id's ELECTRA_NODE_ID."""
    return "ELECTRA_NODE_ID" if key == "id" else f"ELECTRA_{key.upper()}"


# Every variable `electra node` reads a setting from (resolve_node_settings): what `electra up` keeps from its nodes.
NODE_ENV = frozenset(node_env_name(key) for key in _NODE_TYPES)


# Numbers a node takes, checked whichever source sets them (a tick of 0 ran Raft's tick in a busy loop).
_NODE_BOUNDS = {"id": (1, 2**31 - 1), "tick_ms": (1, 60_000), "election_jitter_ticks": (1, 1000),
                "snapshot_entries": (1, 2**62), "compaction_slack": (0, 2**62),
                "inactive_master_scan_ms": (0, 3_600_000), "front_ends": (0, 256),
                "tier_retention_days": (0.001, 36_500), "tier_maintenance_every_s": (1, 30 * 86_400)}


def resolve_node_settings(args: argparse.Namespace) -> argparse.Namespace:
    """Fill unset node options from ELECTRA_* variables, then the TOML file, then defaults."""
    import tomllib

    file_values: dict = {}
    if args.config:
        try:
            with open(args.config, "rb") as f:
                file_values = tomllib.load(f)
        except (OSError, ValueError) as exc:  # TOMLDecodeError, or bytes that are not UTF-8
            refuse(f"cannot read --config {args.config}: {exc}")
        unknown = set(file_values) - set(_NODE_TYPES)
        if unknown:
            refuse(f"unknown keys in {args.config}: {', '.join(sorted(unknown))}")
    for key, typ in _NODE_TYPES.items():
        if getattr(args, key) is not None:
            continue
        env_name = node_env_name(key)
        env = os.environ.get(env_name)
        value = env if env is not None else file_values.get(key)
        if isinstance(value, dict):  # TOML tables: {"1" = "host:port", ...}
            value = ",".join(f"{k}={v}" for k, v in value.items())
        if env is None and value is not None:  # from the file: TOML has types; `id = 1.5` is not node 1
            want = bool if typ is bool else int if typ is int else float if typ is float else str
            if not isinstance(value, (int, float) if want is float else want) or (
                    want in (int, float) and isinstance(value, bool)):
                kind = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}[want]
                refuse(f"{key} in {args.config} must be {kind}, not {type(value).__name__}")
        if value is None:
            value = NODE_DEFAULTS.get(key)
        elif typ is bool:
            if not isinstance(value, bool):
                text = str(value).strip().lower()
                if text not in _TRUE + _FALSE:  # `on`/`maybe` meant off before, silently
                    refuse(f"bad value for {key}: expected one of {', '.join(_TRUE + _FALSE)}")
                value = text in _TRUE
        else:
            try:
                value = typ(value) if not isinstance(value, int) or typ is not int else value
            except (argparse.ArgumentTypeError, ValueError) as exc:
                refuse(f"bad value for {key} (from {env_name if env is not None else args.config}): {exc}")
        setattr(args, key, value)
    missing = [k for k in ("id", "peers", "data_dir") if getattr(args, k) is None]
    if missing:
        refuse(f"missing {', '.join(missing)} (give --{missing[0].replace('_', '-')}, "
               f"{node_env_name(missing[0])} or a --config key)")
    if args.inactive_master_scan_ms is None:
        args.inactive_master_scan_ms = 0 if args.kafka_bootstrap else 5000
    if args.architecture not in ("new", "legacy"):
        refuse(f"--architecture must be new or legacy, not {args.architecture!r}")
    if args.architecture == "legacy" and args.kafka_bootstrap:
        refuse("--architecture legacy keeps liveness on the leader: drop --kafka-bootstrap")
    for key, (lo, hi) in _NODE_BOUNDS.items():  # every source: the command line, ELECTRA_* and the TOML file
        value = getattr(args, key)
        if value is not None and not lo <= value <= hi:
            refuse(f"{key.replace('_', '-')} must be from {lo} to {hi}, not {value}")
    if not str(args.data_dir).strip():
        refuse("--data-dir must not be empty (it would be the current directory)")
    if Path(args.data_dir).exists() and not Path(args.data_dir).is_dir():
        refuse(f"--data-dir {args.data_dir} is not a directory")
    if args.http_peers and set(args.http_peers) != set(args.peers):  # a redirect to the leader would name no address
        refuse(f"--http-peers names nodes {sorted(args.http_peers)} but --peers names {sorted(args.peers)}: "
               "give every member's HTTP address")
    if args.bootstrap_from_tier and not args.tier_uri:
        refuse("--bootstrap-from-tier needs --tier-uri: the tier to start this node from")
    if args.state_machine not in ("controller", "kv", "counter"):
        refuse(f"--state-machine must be controller, kv or counter, not {args.state_machine!r}")
    if args.tier_options and not args.tier_uri:
        refuse("--tier-options needs --tier-uri: the options are for that tier's storage")
    if args.state_machine != "controller":  # settings of the controller's API and pipeline, which kv/counter lack
        given = [name for name, value in (("--kafka-bootstrap", args.kafka_bootstrap), ("--tier-uri", args.tier_uri),
                                          ("--http-peers", args.http_peers), ("--front-ends", args.front_ends),
                                          ("--architecture legacy", args.architecture == "legacy"),
                                          ("--unclean-election", args.unclean_election)) if value]
        if given:
            refuse(f"{', '.join(given)}: only a controller node takes {'these' if len(given) > 1 else 'this'}, "
                   f"not --state-machine {args.state_machine}")
    return args


def check_kafka_settings() -> None:
    """Refuse (exit 2) the ELECTRA_KAFKA_* client security settings that no Kafka client could use, before a
    command that talks to Kafka starts anything (security/kafka_settings.py)."""
    from electra.security.kafka_settings import check_kafka_security

    try:
        check_kafka_security()
    except ValueError as exc:
        refuse(str(exc))


def cmd_node(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from electra.consensus.kv import CounterStateMachine, KVStateMachine
    from electra.consensus.node import NodeConfig, RaftNode
    from electra.consensus.service import ClientService

    args = resolve_node_settings(args)
    if args.kafka_bootstrap:
        check_kafka_settings()
    if args.id not in args.peers:
        print(f"error: --id {args.id} is not among --peers {sorted(args.peers)}", file=sys.stderr)
        return 2
    if args.unsafe_no_fsync:
        logging.warning("UNSAFE: fsync is off; acknowledged writes can be lost on power failure")
    from electra.security.node_security import INSECURE_BANNER, resolve_node_security

    if args.state_machine != "controller" and not args.insecure:
        print(f"error: --state-machine {args.state_machine} serves an unauthenticated binary client protocol; "
              "it runs only with --insecure", file=sys.stderr)
        return 2
    try:
        security = resolve_node_security(args.id, args.certs_dir, insecure=args.insecure,
                                         cluster_id=args.cluster_id, tokens_file=args.tokens_file)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if security.insecure:
        print(INSECURE_BANNER, file=sys.stderr, flush=True)
        logging.warning(INSECURE_BANNER)
    from electra.consensus.data_dir_claims import (
        ClusterIdMismatch,
        DataDirInUse,
        MemberMismatch,
        RejoinRefused,
        check_cluster_stamp,
        check_member_stamp,
        lock_data_dir,
        mark_rejoining,
    )

    try:  # what the data dir belongs to, and that no other process serves it (consensus/data_dir_claims.py)
        lock_data_dir(args.data_dir)  # held until this process exits
        check_cluster_stamp(args.data_dir, security.cluster_id)
        check_member_stamp(args.data_dir, args.id, list(args.peers), accept_new=args.accept_new_peers)
        if args.rejoin:
            if len(args.peers) == 1:
                raise RejoinRefused("--rejoin needs other members to catch this node up; a group of one that lost "
                                   "its data starts over without it")
            if mark_rejoining(args.data_dir, fsync=not args.unsafe_no_fsync):
                print(f"node {args.id} rejoins with an empty data dir: it votes and campaigns again once a leader "
                      "has brought it up to date", file=sys.stderr, flush=True)
            else:
                print(f"node {args.id}: --rejoin changes nothing, {args.data_dir} already holds a Raft log",
                      file=sys.stderr, flush=True)
    except (DataDirInUse, ClusterIdMismatch, MemberMismatch, RejoinRefused, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    cfg = NodeConfig(node_id=args.id, peers=args.peers, data_dir=Path(args.data_dir),
                     tick_s=args.tick_ms / 1000, fsync=not args.unsafe_no_fsync,
                     snapshot_entries=args.snapshot_entries, compaction_slack=args.compaction_slack,
                     cluster_id=security.cluster_id,
                     peer_server_ssl=security.tls.peer_server_context() if security.tls else None,
                     peer_client_ssl=security.tls.peer_client_context() if security.tls else None)
    if args.election_jitter_ticks < 1:
        print("error: --election-jitter-ticks must be at least 1", file=sys.stderr)
        return 2
    cfg.raft = replace(cfg.raft, election_jitter_ticks=args.election_jitter_ticks)
    raft = join_host_port(*args.peers[args.id])
    if args.state_machine == "controller":
        from electra.api.server import start_controller_node

        host, port = args.http_addr
        http_peers = args.http_peers or {args.id: f"{host}:{port}"}

        async def start():
            from electra.streaming.records import Topics

            tier = None
            if args.tier_uri:
                from electra.tiering.uploader import TierConfig

                tier = TierConfig(args.tier_uri, args.tier_options, retention_days=args.tier_retention_days,
                                  maintenance_every_s=args.tier_maintenance_every_s)
            ctl = await start_controller_node(cfg, host, port, http_peers,
                                              scan_interval_s=args.inactive_master_scan_ms / 1000,
                                              kafka_bootstrap=args.kafka_bootstrap,
                                              topics=Topics.prefixed(args.topic_prefix),
                                              tier=tier, bootstrap_from_tier=args.bootstrap_from_tier,
                                              security=None if security.insecure else security,
                                              architecture=args.architecture, front_ends=args.front_ends,
                                              unclean_election=args.unclean_election)
            scheme = "http" if security.insecure else "https"
            print(f"controller node {args.id} raft={raft} http={scheme}://{host}:{port} data={args.data_dir} "
                  f"cluster-id={ctl.node.cluster_id}", flush=True)
            return ctl.stop, ctl.node

        return _serve_until_signal(start)
    sm = KVStateMachine() if args.state_machine == "kv" else CounterStateMachine()

    async def start_kv():
        node = RaftNode(cfg, sm)
        await node.start()
        service = ClientService(node, *args.client_addr)
        await service.start()
        print(f"node {args.id} raft={raft} client={service.host}:{service.port} data={args.data_dir}", flush=True)

        async def stop() -> None:
            await service.stop()
            await node.stop()

        return stop, node

    return _serve_until_signal(start_kv)


EXIT_DISK_FAILURE = 74  # EX_IOERR: the Raft log could not be made durable (fail-stop)


# A young collection every 20,000 container allocations instead of CPython's 700: a request's
# objects are freed by reference counting long before, so each collection finds little to walk,
# and they run 30x less often (measured: 5.7 µs of the leader's CPU per write in GC at 700).
GC_THRESHOLDS = (20_000, 10, 10)


def freeze_startup_heap() -> None:
    """Put what startup built (modules, the FastAPI application, the restored state) out of the cyclic
    garbage collector's sight: otherwise every full collection walks those ~80,000 objects again, a
    pause of tens of ms that every request in flight waits for (docs/controller-api.md). The
    performance report's load generator does the same before it measures (its pauses would count as
    the controllers' latency)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def _serve_until_signal(start) -> int:
    """Run `await start()` (which returns an async stop function and the RaftNode) until SIGINT or
    SIGTERM, or until the node fails on its disk: then exit with EXIT_DISK_FAILURE at once."""

    async def main() -> None:
        stop_fn, node = await start()
        freeze_startup_heap()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        signalled = asyncio.ensure_future(stop.wait())
        await asyncio.wait([signalled, node.failed], return_when=asyncio.FIRST_COMPLETED)
        if node.failed.done():
            # Fail-stop: the node already stopped serving; exit now, running nothing that could
            # touch the disk or answer a client (etcd and PostgreSQL panic on a failed fsync too).
            failure = node.failed.result()
            print(f"FATAL: {failure}; exiting with code {EXIT_DISK_FAILURE} ({failure.advice})",
                  file=sys.stderr, flush=True)
            logging.shutdown()
            os._exit(EXIT_DISK_FAILURE)
        exit_if_stop_hangs(f"node {node.cfg.node_id}")
        await stop_fn()

    try:
        import uvloop  # the node's event loop in C: sockets, timers and callbacks (HTTP, Raft peers)

        from electra.api.http_limits import tls_bounded_loop

        uvloop.run(main(), loop_factory=tls_bounded_loop)
    except Exception as exc:  # startup errors (corrupt log, port in use) get one clear line
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0



# --------------------------------------------------------------------------- electra ingest
def _ingest_node_id(text: str) -> int:
    """`--node-id`, whose default is `ELECTRA_NODE_ID` (a systemd unit or pod sets it, not the user's command
    line): the refusal names both, not only the option nobody typed."""
    if not (text.isascii() and text.isdigit() and int(text) >= 1):
        raise argparse.ArgumentTypeError(f"expected a node id, an integer of at least 1 (from --node-id or "
                                         f"ELECTRA_NODE_ID), got {text!r}")
    return int(text)


def ingest_topics(topic: str | None, prefix: str | None) -> tuple[str, str]:
    """`electra ingest`'s heartbeats and liveness topics, from `--topic` and `--topic-prefix`. The liveness topic
    must be the nodes' (`<prefix>electra.liveness`): given `--topic P.electra.heartbeats` alone, as deployments
    said before sessions wrote there, the prefix is P; any other `--topic` needs `--topic-prefix` (ValueError)."""
    from electra.streaming.records import HEARTBEATS, LIVENESS, Topics, is_topic_name

    if topic is not None and prefix is None:
        if not topic.endswith(HEARTBEATS):
            raise ValueError(f"with --topic {topic!r}, give --topic-prefix too: sessions also write to "
                             f"<prefix>{LIVENESS}, which must be the nodes' liveness topic")
        prefix = topic[:-len(HEARTBEATS)]
    topics = Topics.prefixed(prefix or "")
    heartbeats = topics.heartbeats if topic is None else topic
    for option, name in (("--topic", heartbeats), ("--topic-prefix", topics.liveness)):
        if not is_topic_name(name):
            raise ValueError(f"{option}: {name!r} is not a Kafka topic name (1-249 of A-Z a-z 0-9 . _ -)")
    others = {topics.liveness, topics.events, topics.dead_letters, topics.job_stats}
    if heartbeats in others:
        raise ValueError(f"--topic {heartbeats!r} is one of Electra's other topics (liveness, events, dead letters, "
                         "job stats): heartbeats need a topic of their own")
    return heartbeats, topics.liveness


def cmd_ingest(args: argparse.Namespace) -> int:
    """Heartbeat ingest workers: POST /v1/heartbeat → Kafka, in `--workers` processes on one port."""
    from electra.api.ingest_server import serve_ingest

    host, port = args.listen
    check_kafka_settings()
    tls_files = tokens_file = None
    if args.insecure:
        from electra.security.node_security import INSECURE_BANNER

        print(INSECURE_BANNER, file=sys.stderr, flush=True)
    elif not args.certs_dir or args.node_id is None:
        print("error: refusing to serve without TLS and authentication: give --certs-dir DIR --node-id N "
              "(the ingest serves node N's certificate and checks tokens.json), or --insecure", file=sys.stderr)
        return 2
    else:
        from electra.security.node_security import TOKENS_FILE
        from electra.security.pki import node_cert_paths

        tls_files = tuple(str(p) for p in node_cert_paths(args.certs_dir, args.node_id))
        tokens_file = args.tokens_file or str(Path(args.certs_dir) / TOKENS_FILE)
        missing = [f for f in (*tls_files, tokens_file) if not Path(f).is_file()]
        if missing:
            print(f"error: missing {', '.join(missing)}", file=sys.stderr)
            return 2
        from electra.api.ingest_server import check_ingest_files

        try:  # as each worker will load them: a bad file is one line here, not a traceback from every worker
            check_ingest_files(tls_files, tokens_file)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    scheme = "http" if args.insecure else "https"
    try:
        heartbeats, liveness = ingest_topics(args.topic, args.topic_prefix)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    taken = port_taken(host, port)  # before the workers: their SO_REUSEPORT binds would share another process's port
    if taken is not None:
        print(f"error: cannot listen on {host}:{port} (--listen): {taken.strerror or taken}", file=sys.stderr)
        return 1
    print(f"ingest: {args.workers} worker process(es) on {scheme}://{host}:{port}/v1/heartbeat -> Kafka "
          f"{args.kafka_bootstrap} topic {heartbeats} (session records also to {liveness})", flush=True)
    serve_ingest(host, port, args.kafka_bootstrap, workers=args.workers, topic=heartbeats,
                 log_level=args.log_level.lower(), tls_files=tls_files, tokens_file=tokens_file,
                 liveness_topic=liveness)
    return 0


# --------------------------------------------------------------------------- electra up
def status_env_line(endpoints: Iterable[str], creds=None) -> str:
    """The `export` line that points `electra status`/`admin` at this stack: its endpoints (else they default to
    127.0.0.1:7301-7303, another stack or none when `up` ran with --http-port) and, when secure, CA and token."""
    line = f"export ELECTRA_ENDPOINTS={','.join(endpoints)}"
    if creds is not None:
        line += f" ELECTRA_CA_FILE={creds.ca_file} ELECTRA_TOKEN_FILE={creds.token_file('admin')}"
    return line


def dashboard_hint(endpoint: str, creds) -> str:
    """The dashboard URL of a secure local stack, signed in by the observer token in its fragment (which the
    browser never sends: the page exchanges it for a read-only cookie), and how to trust the local CA."""
    from urllib.parse import quote

    token = creds.token_file("observer").read_text().strip()
    return (f"dashboard (signed in as observer): https://{endpoint}/dashboard#token={quote(token, safe='')}\n"
            f"  the browser must trust the local CA {creds.ca_file}: import it as an authority (Chromium: "
            f"Settings > Privacy and security > Security > Manage certificates > Authorities > Import; Firefox: "
            f"Settings > Certificates > View Certificates > Authorities > Import), or accept the warning once")


UP_SPARK_MASTER = "local[2]"  # `electra up`'s streaming job: local mode on this machine's two cores


def cmd_up(args: argparse.Namespace) -> int:
    """The whole local stack: Kafka-compatible broker, controller nodes, ingest workers, the Spark job
    and, with --demo, simulated brokers. Ctrl-C (or SIGTERM) stops everything."""
    for option in ("raft_port", "http_port", "ingest_port"):  # node i listens on the first port + i - 1
        if getattr(args, option) + args.nodes - 1 > 65535:
            print(f"error: --{option.replace('_', '-')} {getattr(args, option)}: {args.nodes} nodes need ports up to "
                  f"{getattr(args, option) + args.nodes - 1}, past 65535", file=sys.stderr)
            return 2
    _refuse_overlapping_ports(args)
    if not str(args.data_dir).strip():
        refuse("--data-dir must not be empty (it would be the current directory)")
    if Path(args.data_dir).exists() and not Path(args.data_dir).is_dir():
        refuse(f"--data-dir {args.data_dir} is not a directory")
    if args.tier_uri and args.no_tier:
        refuse("--tier-uri and --no-tier contradict each other: give one")
    if args.architecture == "legacy":  # no Kafka, ingest workers or Spark job to give these to
        ignored = [name for name, value in (("--kafka-bootstrap", args.kafka_bootstrap),
                                            ("--topic-prefix", args.topic_prefix),
                                            ("--ingest-workers", args.ingest_workers != 1),
                                            ("--spark-master", args.spark_master != UP_SPARK_MASTER),
                                            ("--disconnect-grace-ms", args.disconnect_grace_ms)) if value]
        if ignored:
            refuse(f"{', '.join(ignored)}: the legacy stack has no Kafka, ingest workers or streaming job "
                   "(drop --architecture legacy or these options)")
    if args.architecture != "legacy":  # its nodes, ingest workers and job read them (the legacy stack has no Kafka)
        check_kafka_settings()
    make_dir(args.data_dir, "--data-dir")
    claim = _claim_data_dir(args)  # first: a second `up` on a data dir in use is told so, not that its ports are
    try:
        _refuse_ports_in_use(args)
        return _up(args)
    finally:
        os.close(claim)  # the stack's lock, for a caller that goes on (tests); an exit releases it anyway


def _up(args: argparse.Namespace) -> int:
    """`electra up` once its data dir is claimed and its ports are free: configure the stack, run it."""
    from electra.local_stack import LocalStack, StackConfig

    cfg = StackConfig(data_dir=Path(args.data_dir), secure=not args.insecure, nodes=args.nodes,
                      raft_port=args.raft_port,
                      http_port=args.http_port, ingest_port=args.ingest_port, ingest_workers=args.ingest_workers,
                      kafka_bootstrap=args.kafka_bootstrap, kafka_port=args.kafka_port,
                      topic_prefix=args.topic_prefix, spark_master=args.spark_master, log_level=args.log_level,
                      tier_uri=args.tier_uri or ("default" if not args.no_tier else None),
                      architecture=args.architecture, accept_new_peers=args.accept_new_peers,
                      job_args=["--disconnect-grace-ms", str(args.disconnect_grace_ms)] if args.disconnect_grace_ms
                      else [])
    from electra.security.local import LocalCredentialsError

    try:  # creates <data-dir>/logs and, for a secure stack, the CA, node certificates and role tokens
        stack = LocalStack(cfg)
    except LocalCredentialsError as exc:
        refuse(str(exc))
    except OSError as exc:  # <data-dir>/logs: a full disk, no permission
        refuse(f"--data-dir {args.data_dir}: cannot create its logs directory ({exc.strerror or exc})")

    with terminate_as_interrupt():  # SIGTERM, or the terminal closing (SIGHUP), stops the stack as Ctrl-C does
        return _run_stack(stack, cfg, args)


def _refuse_overlapping_ports(args: argparse.Namespace) -> None:
    """Two of the stack's port ranges sharing a port would fail late, one process into the start."""
    legacy = args.architecture == "legacy"  # no Kafka, no ingest workers
    ranges = {option: range(getattr(args, option), getattr(args, option) + args.nodes)
              for option in ("raft_port", "http_port") + (() if legacy else ("ingest_port",))}
    if not args.kafka_bootstrap and not legacy:
        ranges["kafka_port"] = range(args.kafka_port, args.kafka_port + 1)
    names = list(ranges)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            shared = set(ranges[a]) & set(ranges[b])
            if shared:
                refuse(f"--{a.replace('_', '-')} {getattr(args, a)} and --{b.replace('_', '-')} {getattr(args, b)} "
                       f"overlap at port {min(shared)} (node i listens on each first port + i - 1)")


def _claim_data_dir(args: argparse.Namespace) -> int:
    """Lock `<data-dir>/LOCK` for this `up` (the descriptor holds it) and check that no process serves a node's data
    dir, before anything starts or a log opens: a second `up` on a data dir in use started tansu and ingest workers,
    truncated the running stack's kafka.log and wrote to its logs before its nodes refused. The nodes' locks are only
    checked, not taken: each node takes its own (consensus/data_dir_claims.py)."""
    from electra.consensus.data_dir_claims import DataDirInUse, check_data_dir_free, lock_data_dir

    try:
        claim = lock_data_dir(args.data_dir)
    except (DataDirInUse, OSError) as exc:
        refuse(str(exc))
    try:
        for i in range(1, args.nodes + 1):
            check_data_dir_free(Path(args.data_dir) / f"node{i}")
    except (DataDirInUse, OSError) as exc:
        os.close(claim)
        refuse(str(exc))
    return claim


def _refuse_ports_in_use(args: argparse.Namespace) -> None:
    """Every port the stack will listen on (on 127.0.0.1) must be free before anything starts. A taken one failed
    late and said something else: nodes crash-looping while `up` announced the leader of the stack that held their
    HTTP ports, tansu exiting without its reason, 20 s of Kafka client errors."""
    legacy = args.architecture == "legacy"  # no Kafka, no ingest workers
    roles = {"raft_port": "Raft", "http_port": "HTTP", **({} if legacy else {"ingest_port": "heartbeat ingest"})}
    ports = [(getattr(args, option) + i - 1, option, f"node {i}'s {role}")
             for option, role in roles.items() for i in range(1, args.nodes + 1)]
    if not args.kafka_bootstrap and not legacy:
        ports.append((args.kafka_port, "kafka_port", "the embedded Kafka broker"))
    for port, option, what in ports:
        taken = port_taken("127.0.0.1", port)
        if taken is not None:
            said = f"port {port} (--{option.replace('_', '-')}, {what})"
            refuse(f"{said} is already in use on 127.0.0.1" if taken.errno == errno.EADDRINUSE
                   else f"{said}: cannot listen on 127.0.0.1: {taken.strerror or taken}")


def _run_stack(stack, cfg, args: argparse.Namespace) -> int:
    """`electra up` once its stack is configured: start it, watch it, stop it (whatever happens)."""
    from electra.security.node_security import INSECURE_BANNER
    from electra.streaming.embedded_kafka import KafkaBinaryMissing, KafkaDidNotStart
    from electra.streaming.kafka_io import KafkaUnreachable

    try:
        if cfg.legacy:
            print("architecture: legacy (RocketMQ 5's single event queue, for comparisons only; "
                  "heartbeats go to the controllers, no Kafka, ingest or streaming job)")
        else:
            try:
                bootstrap = stack.start_kafka()
            except (KafkaBinaryMissing, KafkaDidNotStart, KafkaUnreachable) as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 1
            where = ("external" if args.kafka_bootstrap
                     else f"embedded tansu, memory only; log {stack.logs / 'kafka.log'}")
            print(f"Kafka: {bootstrap} ({where})")
        stack.start_controllers()
        ingest = "" if cfg.legacy else f" and {cfg.nodes} x {cfg.ingest_workers} ingest workers"
        print(f"started {cfg.nodes} controller nodes (raft {stack.raft_peers}){ingest}; logs in {stack.logs}")
        scheme = "https" if stack.creds else "http"
        for i, ep in stack.endpoints.items():
            print(f"  {scheme}://{ep}  (API docs /docs, metrics /metrics, dashboard /dashboard)   "
                  f"heartbeats: {scheme}://{ep if cfg.legacy else stack.ingest_endpoints[i]}/v1/heartbeat")
        print("waiting for a leader ...", flush=True)
        if stack.creds is not None:
            print(f"secure: mutual TLS between nodes, HTTPS, tokens (cluster id {stack.creds.cluster_id}); "
                  f"CA, certificates and role tokens in {stack.creds.certs_dir}. For `electra status/admin`:\n"
                  f"  {status_env_line(stack.endpoints.values(), stack.creds)}")
            print(dashboard_hint(next(iter(stack.endpoints.values())), stack.creds), flush=True)
        else:
            print(INSECURE_BANNER, flush=True)
            print(f"for `electra status/admin`: {status_env_line(stack.endpoints.values())}", flush=True)
        leader = asyncio.run(_wait_for_http_leader(list(stack.endpoints.values()), timeout=30,
                                                   credentials=stack.creds.credentials("admin")
                                                   if stack.creds else None, exited=stack.exited))
        print(f"leader elected: node {leader}", flush=True)
        if not args.no_streaming and not cfg.legacy:
            stack.start_job()
            print(f"streaming job: Spark {cfg.spark_master}, checkpoint {stack.checkpoint} "
                  f"(first batch after 10-30 s: JVM and Python workers start)", flush=True)
        if args.demo:
            interactive = bool(sys.stdin) and sys.stdin.isatty()
            stack.spawn("brokers", [*stack._py(), "simulate-brokers", "--endpoints", ",".join(stack.endpoints.values()),
                                    *([] if cfg.legacy else
                                      ["--ingest-endpoints", ",".join(stack.ingest_endpoints.values())]),
                                    "--groups", str(args.demo_groups), *([] if interactive else ["--no-stdin"]),
                                    "--ids-file", str(Path(cfg.data_dir) / "demo-broker-ids.json")],
                        log_to_file=False, stdin=sys.stdin if interactive else None, role="broker")
            print(f"demo: {args.demo_groups} simulated broker sets x 3 replicas; " + (
                "type `kill-master SET` (e.g. kill-master sim-set-0) to watch a failover, `hang-master SET`, "
                "`status`, `quit`" if interactive else
                "stdin is not a terminal, so demo commands are off (they are read from a terminal: run `electra up "
                "--demo` in one, or `electra simulate-brokers`, whose stdin takes kill, hang, revive, kill-master)"),
                  flush=True)
        if stack.tier_uri:
            print(f"Delta tier: {stack.tier_uri} (`electra history --tier-uri {stack.tier_uri} --at <ISO time>`)")
        print("the stack is up; Ctrl-C stops it. `electra status` shows the controllers.", flush=True)
        restarts: dict[str, list[float]] = {}  # name -> when it was restarted (the last minute's)
        while True:
            gone = stack.exited()
            if gone == ["brokers (exit 0)"]:  # the simulator was told to quit: keep the rest running
                stack.procs.pop("brokers")
                print("demo brokers stopped; the controllers, ingest and the streaming job keep running "
                      "(Ctrl-C stops them)", flush=True)
                continue
            if gone:
                stopping = _restart_or_stop(stack, restarts)
                if stopping:
                    print(f"stopping the stack: {stopping} (logs in {stack.logs})", file=sys.stderr)
                    return 1
            time.sleep(0.5)
    except KeyboardInterrupt:
        return 0
    except TimeoutError as exc:
        print(f"error: {exc} (logs in {stack.logs})", file=sys.stderr)
        return 1
    except PermissionError as exc:  # HTTP 401/403 from a node (an OSError: before the clause below)
        print(f"error: {exc} (a node refused the stack's own admin token; logs in {stack.logs})", file=sys.stderr)
        return 1
    except OSError as exc:  # whoever read our output is gone (`electra up | tee`, then Ctrl-C; a closed terminal)
        if not isinstance(exc, BrokenPipeError) and exc.errno != errno.EIO:
            raise
        return 0
    finally:
        # Every process the stack started is stopped, whatever happened to our output or a second Ctrl-C.
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        _print_or_drop("stopping ...")
        stack.stop_all()


def _print_or_drop(text: str) -> None:
    """Print, or, when stdout is gone (a closed pipe: EPIPE; a closed terminal: EIO), send it and
    everything later to /dev/null."""
    try:
        print(text, flush=True)
    except OSError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the flush at exit does not fail again
        os.close(devnull)


ENDPOINTS_HELP = "controllers' HTTP addresses, HOST:PORT,... (default: $ELECTRA_ENDPOINTS when set; now %(default)s)"
RESTARTS_PER_MINUTE = 3  # `up` restarts a process that ended at most this often, then stops the stack


def _restart_or_stop(stack, restarts: dict[str, list[float]]) -> str | None:
    """Restart the stack's processes that ended (a controller node killed, the Spark job crashed: the rest of
    the stack goes on, as it would in production); why the stack must stop instead, or None."""
    now = time.monotonic()
    ended = [(name, p.returncode) for name, p in stack.procs.items() if p.poll() is not None]
    if len(ended) != len(stack.exited()):  # the embedded Kafka broker: its data went with it
        return ", ".join(stack.exited()) + " exited"
    for name, code in ended:
        recent = [t for t in restarts.get(name, []) if now - t < 60]
        if len(recent) >= RESTARTS_PER_MINUTE:
            return (f"{name} keeps exiting (exit {code}{stack.why_exited(name)}; {len(recent)} restarts in the "
                    "last minute)")
        if not stack.restart(name):
            return f"{name} (exit {code}) exited"
        restarts[name] = [*recent, now]
        print(f"{name} exited (exit {code}{stack.why_exited(name)}); restarted it (log {stack.logs / (name + '.log')})",
              flush=True)
    return None


async def _wait_for_http_leader(endpoints: list[str], timeout: float, credentials=None,
                                exited: Callable[[], list[str]] | None = None) -> int:
    """The leader's id once one answers; TimeoutError after `timeout`, or at once when processes of the stack
    exited (`exited()` names them: a node that cannot start is said so, not waited for)."""
    from electra.api.client import ControllerClient

    client = ControllerClient(endpoints, credentials=credentials)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            gone = exited() if exited is not None else []
            if gone:
                raise TimeoutError(f"no leader: {', '.join(gone)} exited")
            leader = await client.find_leader()
            if leader is not None:
                return leader
            await asyncio.sleep(0.2)
        raise TimeoutError(f"no leader within {timeout}s")
    finally:
        await client.close()


# --------------------------------------------------------------------------- electra status / admin
DEFAULT_ENDPOINTS = "127.0.0.1:7301,127.0.0.1:7302,127.0.0.1:7303"


def _endpoints(args: argparse.Namespace) -> list[str]:
    eps = [e.strip() for e in args.endpoints.split(",") if e.strip()]
    if not eps:
        refuse("--endpoints is empty")
    for ep in eps:
        try:
            parse_addr(ep, min_port=1)  # an address to dial: port 1-65535, one message for every bad port
        except argparse.ArgumentTypeError as exc:
            refuse(f"--endpoints: {exc}")
    return eps


def _status_failure(exc: BaseException, scheme: str) -> str:
    """Why a node gave no metadata, in one line, with the likely fix when the cause is TLS."""
    import ssl

    import aiohttp

    from electra.api.client import describe_failure

    if isinstance(exc, aiohttp.ClientConnectorCertificateError | ssl.SSLError) or \
            isinstance(getattr(exc, "os_error", None), ssl.SSLError):
        return f"TLS failed: {describe_failure(exc)} (is ELECTRA_CA_FILE the cluster's ca.crt?)"
    if scheme == "http" and isinstance(exc, aiohttp.ServerDisconnectedError):
        return "closed the connection: a secure node speaks HTTPS (set ELECTRA_CA_FILE and ELECTRA_TOKEN_FILE)"
    return f"unreachable: {describe_failure(exc)}"


def cmd_status(args: argparse.Namespace) -> int:
    """One line per controller node: role, term, leader, indexes, broker sets."""
    from electra.api.client import ControllerClient

    async def main() -> int:
        client = ControllerClient(_endpoints(args), timeout=2.0)
        rc = 0
        try:
            print(f"{'endpoint':<22} {'id':>3} {'role':<13} {'term':>5} {'leader':>6} {'commit':>9} "
                  f"{'applied':>9} {'snapshot':>9} {'sets':>6} {'live':>6} {'known':>6}")
            for ep in client.endpoints:
                try:
                    m = await client.metadata(ep)
                except PermissionError as exc:
                    print(f"{ep:<22} refused: {exc} (set ELECTRA_TOKEN_FILE and ELECTRA_CA_FILE)")
                    rc = 1
                    continue
                except Exception as exc:
                    print(f"{ep:<22} {_status_failure(exc, client.scheme)}")
                    rc = 1
                    continue
                print(f"{ep:<22} {m['node_id']:>3} {m['role']:<13} {m['term']:>5} {m['leader_id']:>6} "
                      f"{m['commit_index']:>9} {m['applied_index']:>9} {m['snapshot_index']:>9} "
                      f"{m['broker_sets']:>6} {m['live_brokers']:>6} {m.get('known_brokers', '-'):>6}")
        finally:
            await client.close()
        return rc

    return asyncio.run(main())


def _broker_set_arg(args: argparse.Namespace) -> str:
    """The broker set of an admin verb: positional NAME, or `--broker-set NAME` (the older spelling)."""
    given = [n for n in (args.broker_set, args.broker_set_option) if n]
    if not given:
        refuse(f"admin {args.verb}: give the broker set name (e.g. `admin {args.verb} broker-0`)")
    if len(set(given)) > 1:
        refuse(f"admin {args.verb}: two different broker sets given: {given[0]!r} and {given[1]!r}")
    name = given[0]
    if not (len(name) <= 255 and is_name(name)):  # `..` or `a/b` would change the URL's path, not name a set
        refuse(f"admin {args.verb}: {name!r} is no broker set name (1-255 letters, digits and _.:%-, not . or ..)")
    return name


async def _every_node_metadata(client) -> dict:
    """`admin metadata`: each node's metadata in endpoint order; a node that gives none is an entry naming it and
    why (an operator asks this when a node is in trouble, so the others still answer). Code 1 if any gave none."""
    body: list[dict] = []
    for ep in client.endpoints:
        try:
            body.append({"endpoint": ep, **await client.metadata(ep)})
        except PermissionError:
            raise
        except Exception as exc:  # noqa: BLE001 - one node's failure, reported as its entry
            body.append({"endpoint": ep, "error": _status_failure(exc, client.scheme)})
    failed = sum("error" in m for m in body)
    if failed:
        return {"code": 1, "remark": f"{failed} of {len(body)} nodes gave no metadata", "body": body}
    return {"code": 0, "body": body}


def cmd_admin(args: argparse.Namespace) -> int:
    """mqadmin-style verbs; prints the RocketMQ response as JSON, exit 0 only for code 0."""
    import json

    from electra.api.client import ControllerClient

    if args.verb == "get-sync-state":
        names = [*args.broker_sets, *(args.broker_set_option or [])]
        if not names:
            refuse("admin get-sync-state: give at least one broker set name")
    elif args.verb not in ("metadata", "transfer-leader"):
        name = _broker_set_arg(args)

    async def main() -> int:
        client = ControllerClient(_endpoints(args))
        try:
            if args.verb == "get-sync-state":
                res = await client.sync_state_data(names)
            elif args.verb == "elect-master":
                res = await client.elect_master(args.cluster, name, args.broker_id, admin=True, unclean=args.unclean)
            elif args.verb == "clean-broker-data":
                res = await client.clean_broker_data(name, cluster=args.cluster,
                                                     ids=args.broker_ids or None, clean_living=args.clean_living)
            elif args.verb == "replica-info":
                res = await client.replica_info(name)
            elif args.verb == "transfer-leader":
                res = await client.transfer_leadership(args.to)
            else:  # metadata
                res = await _every_node_metadata(client)
        except PermissionError as exc:
            print(f"error: {exc} (set ELECTRA_TOKEN_FILE and ELECTRA_CA_FILE)", file=sys.stderr)
            return 1
        finally:
            await client.close()
        print(json.dumps(res, indent=2, sort_keys=True))
        return 0 if res.get("code") == 0 else 1

    return asyncio.run(main())


def cmd_simulate_brokers(args: argparse.Namespace) -> int:
    from electra.broker_simulator import run_simulator

    async def stdin_lines():
        """stdin's lines, read by a daemon thread: a blocked read never holds up Ctrl-C or the end of
        `--duration` (the loop's executor, which the read used before, is joined at shutdown)."""
        import threading

        loop = asyncio.get_running_loop()
        lines: asyncio.Queue[str | None] = asyncio.Queue()

        def read() -> None:
            try:
                for line in sys.stdin:
                    loop.call_soon_threadsafe(lines.put_nowait, line)
                loop.call_soon_threadsafe(lines.put_nowait, None)
            except (RuntimeError, OSError, ValueError):  # the loop closed, or stdin did
                return

        threading.Thread(target=read, name="stdin", daemon=True).start()
        while (line := await lines.get()) is not None:
            yield line

    if args.ids_file:  # written at the end of the run: a path that cannot hold the file is refused before it starts
        ids = Path(args.ids_file)
        if ids.is_dir():
            refuse(f"--ids-file {ids} is a directory: name the file the broker ids are kept in")
        if not ids.parent.is_dir():
            refuse(f"--ids-file {ids}: directory {ids.parent} does not exist")
    commands = None if args.no_stdin or not sys.stdin or sys.stdin.closed else stdin_lines()
    ingest = [e.strip() for e in (args.ingest_endpoints or "").split(",") if e.strip()]
    for ep in ingest:  # the sessions dial HOST:PORT as given: no scheme, no default port (as --endpoints)
        try:
            parse_addr(ep, min_port=1)
        except argparse.ArgumentTypeError as exc:
            refuse(f"--ingest-endpoints (or ELECTRA_INGEST_ENDPOINTS): {exc}")
    import uvloop  # the simulator multiplexes thousands of sessions: uvloop's TLS and sockets cost less per heartbeat

    stats = uvloop.run(run_simulator(_endpoints(args), args.groups, args.replicas, duration_s=args.duration,
                                      commands=commands, ingest_endpoints=ingest or None,
                                      timeout_ms=args.heartbeat_timeout_ms,
                                      ids_file=Path(args.ids_file) if args.ids_file else None))
    print(f"simulator stopped: {stats}")
    return 0 if stats["registered"] or stats.get("quit") else 1  # quitting before registration is no failure


# --------------------------------------------------------------------------- electra sim
def cmd_sim(args: argparse.Namespace) -> int:
    """Seeds of every workload on the node runtime, then each deliberate bug must be caught."""
    from electra.consensus import mutations
    from electra.consensus.simulation import WORKLOADS, SimConfig, SimulationFailure, hunt_mutation, run_seed

    if args.seed is not None and (args.seeds is not None or args.start is not None):
        refuse("--seed replays one seed: drop --seeds and --start (or drop --seed to run a range)")
    args.seeds = 1000 if args.seeds is None else args.seeds
    args.start = 0 if args.start is None else args.start
    workloads = list(WORKLOADS) if args.workload == "all" else [args.workload]
    if args.mutations.strip() and not args.mutations.strip(" ,"):
        refuse(f"--mutations {args.mutations!r} names none: write all, none, or a comma-separated list")
    if args.mutations in ("all", "none", ""):
        muts = sorted(mutations.KNOWN) if args.mutations == "all" else []
    else:
        muts = [m.strip() for m in args.mutations.split(",") if m.strip()]
        unknown = set(muts) - mutations.KNOWN.keys()
        if unknown:
            print(f"unknown mutation(s) {sorted(unknown)}; known: {sorted(mutations.KNOWN)}", file=sys.stderr)
            return 2
    replay = args.seed is not None

    def config(workload: str) -> SimConfig:
        return SimConfig(workload=workload, nodes=args.nodes, duration_ms=args.duration_ms,
                         settle_ms=args.settle_ms, trace=replay)

    total = len(workloads) if replay else args.seeds
    # generated as they run: a large --seeds must not first build its whole list
    runs = (((w, args.seed) for w in workloads) if replay else
            ((workloads[k % len(workloads)], args.start + k) for k in range(args.seeds)))
    t0 = shown = time.monotonic()
    violations = k = caught = 0
    interrupted, elapsed = False, None
    with terminate_as_interrupt():  # SIGTERM stops it as Ctrl-C does: the seeds that ran are still reported
        try:
            for workload, seed in runs:
                try:
                    result = run_seed(seed, config(workload))
                    if replay:
                        print(f"seed {seed} ({workload}) passed: {result}")
                except SimulationFailure as exc:
                    violations += 1
                    print(f"FAIL ({workload}) {exc.reason}" if not replay else f"FAIL ({workload}) {exc}", flush=True)
                    if replay:
                        print("--- full trace ---\n" + "\n".join(exc.trace))
                    else:
                        print(f"replay with: electra sim --seed {seed} --workload {workload} --nodes {args.nodes} "
                              f"--duration-ms {args.duration_ms} --settle-ms {args.settle_ms} --mutations none")
                    if not args.keep_going:
                        k += 1
                        break
                k += 1  # seeds that ran to the end
                if not replay and (k % max(1, total // 10) == 0 or k == total or time.monotonic() - shown >= 30):
                    shown = time.monotonic()  # each tenth of the run, and at least every 30 s
                    print(f"  {k}/{total} seeds, {violations} failed, {shown - t0:.1f}s", flush=True)
            elapsed = time.monotonic() - t0
            for name in muts:
                exc = hunt_mutation(name)
                if exc is not None:
                    caught += 1
                    print(f"mutation {name}: caught by seed {exc.seed}: {exc.reason}")
                else:
                    print(f"mutation {name}: NOT caught")
        except KeyboardInterrupt:
            interrupted = True
            elapsed = time.monotonic() - t0 if elapsed is None else elapsed
            print(f"interrupted: reporting the {k} seed(s) that ran", flush=True)
    print(f"RESULT seeds={k} workloads={','.join(workloads)} runtime=node violations={violations} "
          f"seeds_per_s={k / max(elapsed, 1e-9):.1f} mutations_caught={caught}/{len(muts)}")
    if interrupted:
        print("electra sim: interrupted", file=sys.stderr)
        return 130
    return 1 if violations or caught < len(muts) else 0


# --------------------------------------------------------------------------- electra bench
def cmd_bench(args: argparse.Namespace, extra: list[str]) -> int:
    from electra.bench import BENCHMARKS, run_benchmark

    if args.name is None or args.name in ("-h", "--help"):
        print("usage: electra bench NAME [options]   (`electra bench NAME --help` shows NAME's options)\n"
              f"benchmarks: {', '.join(sorted(BENCHMARKS))}")
        return 0 if args.name or "-h" in extra or "--help" in extra else 2
    return _interruptible(f"bench {args.name}", lambda: run_benchmark(args.name, extra))


def _interruptible(what: str, run: Callable[[], int]) -> int:
    """Run a command that starts processes: SIGTERM and SIGHUP unwind it as Ctrl-C does (its `finally`
    blocks stop what it started: electra/interrupts.py), and an interrupt ends it with 130, not a traceback."""
    with terminate_as_interrupt():
        try:
            return run()
        except KeyboardInterrupt:
            print(f"electra {what}: interrupted", file=sys.stderr)
            return 130


# --------------------------------------------------------------------------- electra report
REPORTS = {"performance": "electra.bench.performance_report"}


def cmd_report(args: argparse.Namespace, extra: list[str]) -> int:
    """`electra report NAME [options]`: a report directory (HTML, Markdown, JSON) and a RESULT line."""
    import importlib

    if args.name is None or args.name in ("-h", "--help"):  # as `electra bench`: a bare command is a usage error
        print(f"usage: electra report NAME [options]   (`electra report NAME --help`)\nreports: {', '.join(REPORTS)}")
        return 0 if args.name or "-h" in extra or "--help" in extra else 2
    if args.name not in REPORTS:
        print(f"error: unknown report {args.name!r}; available: {', '.join(REPORTS)}", file=sys.stderr)
        return 2
    return _interruptible(f"report {args.name}", lambda: importlib.import_module(REPORTS[args.name]).main(extra))


def _add_broker_set_args(verb: argparse.ArgumentParser) -> None:
    verb.add_argument("broker_set", nargs="?", metavar="NAME", help="the broker set")
    verb.add_argument("--broker-set", dest="broker_set_option", help=argparse.SUPPRESS)


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="electra", description=__doc__)
    p.add_argument("--log-level", default=os.environ.get("ELECTRA_LOG_LEVEL", "INFO"))
    sub = p.add_subparsers(dest="cmd", required=True)

    n = sub.add_parser("node", help="run one controller (or test) node",
                       description="Settings come from the command line, else ELECTRA_<OPTION> environment "
                                   "variables (e.g. ELECTRA_NODE_ID, ELECTRA_PEERS), else the --config TOML file; "
                                   "--rejoin and --accept-new-peers, one start's decisions, come from the command "
                                   "line only.")
    n.add_argument("--config", help="TOML file with the options below as keys (id, peers, data_dir, ...)")
    for opt, typ, help_text in NODE_OPTIONS:
        # a bounded number is checked once its source is known, against _NODE_BOUNDS (one message for every source)
        unbounded = {"minimum": None} if typ in (int, float) and opt[2:].replace("-", "_") in _NODE_BOUNDS else {}
        n.add_argument(opt, type=typ, default=None, help=help_text, **unbounded)
    n.add_argument("--unsafe-no-fsync", action="store_true", default=None,
                   help="benchmarks only: acks before data is durable")
    n.add_argument("--bootstrap-from-tier", action="store_true", default=None,
                   help="with --tier-uri: an empty data dir starts from the tier's newest state")
    n.add_argument("--accept-new-peers", action="store_true", default=False,
                   help="this start's --peers replace the members recorded in the data dir; only with every node "
                        "of the cluster stopped first (Electra has no online reconfiguration)")
    n.add_argument("--rejoin", action="store_true", default=False,
                   help="this node's data dir was emptied (lost, damaged, moved aside): it neither votes nor "
                        "campaigns until a leader of the running cluster has brought it up to date (it forgot "
                        "the entries it acknowledged and its vote); has no effect on a data dir with a log")
    n.add_argument("--unclean-election", action="store_true", default=None,
                   help="elections may pick a live broker outside the sync-state set when none in it is alive "
                        "(RocketMQ's enableElectUncleanMaster; it may lack acknowledged messages)")
    n.add_argument("--insecure", action="store_true", default=None,
                   help="plaintext and no authentication (tests only; printed loudly)")
    n.set_defaults(fn=cmd_node)

    u = sub.add_parser("up", help="run the whole local stack (Kafka, controllers, ingest, Spark job); Ctrl-C stops it")
    u.add_argument("--nodes", type=int, default=3, choices=[1, 3, 5])
    u.add_argument("--data-dir", default=".electra/local")
    u.add_argument("--raft-port", type=int, minimum=1, maximum=65535, default=7101)
    u.add_argument("--http-port", type=int, minimum=1, maximum=65535, default=7301)
    u.add_argument("--ingest-port", type=int, minimum=1, maximum=65535, default=7401,
                   help="first node's heartbeat ingest port")
    u.add_argument("--ingest-workers", type=int, minimum=1, maximum=256, default=1,
                   help="ingest worker processes per node (1 to 256)")
    u.add_argument("--kafka-bootstrap", type=optional_server_list,
                   help="use this Kafka (HOST:PORT[,HOST:PORT]) instead of starting the embedded broker")
    u.add_argument("--kafka-port", type=int, minimum=1, maximum=65535, default=19092, help="embedded broker port")
    u.add_argument("--topic-prefix", type=topic_prefix, default="")
    u.add_argument("--spark-master", default=UP_SPARK_MASTER, help="Spark master URL for the streaming job")
    u.add_argument("--no-streaming", action="store_true", help="do not start the Spark job")
    u.add_argument("--tier-uri", type=tier_uri, help="Delta tables for snapshots and events (default <data-dir>/tier)")
    u.add_argument("--no-tier", action="store_true", help="no Delta tiering")
    u.add_argument("--demo", action="store_true", help="also run simulated RocketMQ brokers")
    u.add_argument("--demo-groups", type=int, minimum=1, maximum=64_000, default=20,
                   help="broker sets the demo simulates (1 to 64000, as simulate-brokers)")
    u.add_argument("--disconnect-grace-ms", type=int, minimum=0, maximum=3_600_000, default=0,
                   help="the streaming job's grace for a lost session connection: a master whose connection drops "
                        "is failed over this long after (0: at once, RocketMQ's rule; docs/failover-signal.md)")
    u.add_argument("--insecure", action="store_true", help="no TLS, no credentials (tests only)")
    u.add_argument("--architecture", choices=["new", "legacy"], default="new",
                   help="legacy: RocketMQ 5's single event queue on the controllers, no Kafka, ingest or Spark job "
                        "(for comparisons only, docs/architectures.md)")
    u.add_argument("--accept-new-peers", action="store_true",
                   help="start the nodes of an existing --data-dir with another --nodes count (their data dirs "
                        "recorded the old member list and refuse otherwise); the whole stack restarts together, "
                        "so no old and new member lists run at once")
    u.set_defaults(fn=cmd_up)

    ing = sub.add_parser("ingest", help="heartbeat ingest workers (HTTP -> Kafka), several processes on one port")
    ing.add_argument("--listen", type=lambda t: parse_addr(t, min_port=1), default=("127.0.0.1", 7401),
                     help="HOST:PORT (default 127.0.0.1:7401; every worker shares this port, so it is not 0)")
    ing.add_argument("--kafka-bootstrap", type=server_list, required=True,
                     help="Kafka bootstrap servers, HOST:PORT[,HOST:PORT]")
    ing.add_argument("--workers", type=int, minimum=1, maximum=256, default=2,
                     help="worker processes sharing the port (default 2, at most 256)")
    ing.add_argument("--topic-prefix", type=topic_prefix, default=os.environ.get("ELECTRA_TOPIC_PREFIX"),
                     help="prefix of the Kafka topic names, as given to the nodes and the streaming job (default: "
                          "ELECTRA_TOPIC_PREFIX, as the nodes read it, else the prefix of --topic, else none)")
    ing.add_argument("--topic", default=None,
                     help="the heartbeats topic (default <prefix>electra.heartbeats); session records also go to "
                          "<prefix>electra.liveness, for the nodes' connection-loss lane")
    ing.add_argument("--certs-dir", default=os.environ.get("ELECTRA_CERTS_DIR"),
                     help="serve HTTPS with node-<node-id>.crt and check tokens.json from here (ELECTRA_CERTS_DIR)")
    ing.add_argument("--node-id", type=_ingest_node_id, default=os.environ.get("ELECTRA_NODE_ID") or None,
                     help="whose certificate the ingest serves, the node it runs next to (ELECTRA_NODE_ID)")
    ing.add_argument("--tokens-file", default=os.environ.get("ELECTRA_TOKENS_FILE"),
                     help="hashed client tokens (default <certs-dir>/tokens.json; ELECTRA_TOKENS_FILE)")
    ing.add_argument("--insecure", action="store_true", help="plaintext, no authentication (tests only)")
    ing.set_defaults(fn=cmd_ingest)

    s = sub.add_parser("sim", help="deterministic simulation of the node runtime with fault injection",
                       description="The real RaftNode (engine, storage, state machine) on a virtual clock, network and "
                                   "disk with injected faults, seed after seed, each history checked for "
                                   "linearizability and the controller's invariants; then every deliberate bug "
                                   "(ELECTRA_TEST_MUTATION) must be caught. A failing seed prints the command that "
                                   "replays it with a full trace. Ends with a RESULT line.")
    s.add_argument("--seeds", type=int, minimum=1, maximum=100_000_000, default=None,
                   help="seeds in all, shared by the workloads (default 1000)")
    s.add_argument("--start", type=int, minimum=0, default=None, help="the first seed (default 0)")
    s.add_argument("--seed", type=int, help="replay exactly one seed (per workload) and print its trace on failure")
    s.add_argument("--workload", choices=("all", "kv", "controller"), default="all")
    s.add_argument("--nodes", type=int, minimum=1, maximum=15, default=3)
    s.add_argument("--duration-ms", type=int, minimum=1, maximum=3_600_000, default=500,
                   help="the safety phase (clients and faults), in virtual time")
    s.add_argument("--settle-ms", type=int, minimum=500, default=1500,
                   help="the liveness phase's limit (faults healed; at least 500: the group needs a few election "
                        "timeouts of 100-130 ms to converge, so less reports a liveness failure of the setting)")
    s.add_argument("--mutations", default="all",
                   help="deliberate bugs the simulator must catch: all, none, or a comma-separated list")
    s.add_argument("--keep-going", action="store_true")
    s.set_defaults(fn=cmd_sim)

    from electra.chaos.cli import register as register_chaos

    register_chaos(sub)  # electra chaos: fault injection on real processes (chaos/)

    st = sub.add_parser("status", help="role, term, leader and indexes of every controller node")
    st.add_argument("--endpoints", default=os.environ.get("ELECTRA_ENDPOINTS", DEFAULT_ENDPOINTS),
                    help=ENDPOINTS_HELP)
    st.set_defaults(fn=cmd_status)

    ad = sub.add_parser("admin", help="mqadmin-style controller verbs")
    ad.add_argument("--endpoints", default=os.environ.get("ELECTRA_ENDPOINTS", DEFAULT_ENDPOINTS),
                    help=ENDPOINTS_HELP)
    verbs = ad.add_subparsers(dest="verb", required=True)
    # One style for every verb: the broker set is positional (`admin replica-info broker-0`);
    # `--broker-set NAME`, the older spelling of some verbs, is still accepted.
    v = verbs.add_parser("get-sync-state", help="sync-state data of broker sets (GET_SYNC_STATE_DATA)")
    v.add_argument("broker_sets", nargs="*", metavar="NAME")
    v.add_argument("--broker-set", dest="broker_set_option", action="append", help=argparse.SUPPRESS)
    v = verbs.add_parser("elect-master", help="admin-designated election (mqadmin electMaster)")
    _add_broker_set_args(v)
    v.add_argument("--cluster", required=True)
    v.add_argument("--broker-id", type=int, minimum=1, maximum=MAX_BROKER_ID, required=True)
    v.add_argument("--unclean", action="store_true",
                   help="may pick a live broker outside the sync-state set (it may lack acknowledged messages)")
    v = verbs.add_parser("clean-broker-data", help="remove broker ids, or a whole set (CLEAN_BROKER_DATA)")
    _add_broker_set_args(v)
    v.add_argument("--cluster")
    v.add_argument("--broker-ids", type=int, minimum=1, maximum=MAX_BROKER_ID, nargs="+", metavar="ID",
                   help="the ids to remove (leave the option out to remove the whole set; an empty list is refused, "
                        "not taken for the whole set). It takes every word after it: give NAME first "
                        "(`clean-broker-data NAME --broker-ids 1 2`) or end the ids with `--`")
    v.add_argument("--clean-living", action="store_true", help="also clean brokers that are alive")
    v = verbs.add_parser("replica-info", help="master, epochs and sync-state set of one broker set")
    _add_broker_set_args(v)
    verbs.add_parser("metadata", help="every node's controller metadata")
    v = verbs.add_parser("transfer-leader", help="move leadership off the current leader (before maintenance on its "
                                                 "host); a leader stopped with SIGTERM hands over by itself")
    v.add_argument("--to", type=int, minimum=1, help="the node to lead (default: the most caught-up follower)")
    ad.set_defaults(fn=cmd_admin)

    sb = sub.add_parser("simulate-brokers", help="RocketMQ-5-like brokers over HTTP (kill/hang/revive from stdin)",
                        description="Simulated RocketMQ 5 brokers: apply for ids, register, elect, heartbeat, poll "
                                    "their replica info and keep their sync-state sets, against the controllers. "
                                    "Commands on stdin, one a line: kill SET ID (a crash: connections reset), "
                                    "hang SET ID (no traffic, connections open), revive SET ID, kill-master SET, "
                                    "hang-master SET, list [SET], status, quit. status and quit answer at once; "
                                    "the others wait until every broker is registered. EOF ends the run.")
    sb.add_argument("--endpoints", default=os.environ.get("ELECTRA_ENDPOINTS", DEFAULT_ENDPOINTS),
                    help=ENDPOINTS_HELP)
    # bounded by the simulator's addresses (10.<g // 250>.<g % 250>.<replica>) and the sync-state set's 64
    sb.add_argument("--groups", type=int, minimum=1, maximum=64_000, default=10)
    sb.add_argument("--replicas", type=int, minimum=1, maximum=64, default=3)
    sb.add_argument("--duration", type=float, minimum=0.001, default=None,
                    help="seconds to run (default: until quit/EOF)")
    sb.add_argument("--no-stdin", action="store_true", help="ignore stdin commands")
    sb.add_argument("--ingest-endpoints", type=optional_server_list, default=os.environ.get("ELECTRA_INGEST_ENDPOINTS"),
                    help="HOST:PORT,... heartbeat ingest endpoints (Kafka pipeline); default: every controller")
    sb.add_argument("--heartbeat-timeout-ms", type=int, minimum=100, maximum=3_600_000, default=10_000,
                    help="heartbeatTimeoutMillis the brokers send")
    sb.add_argument("--ids-file", help="where the brokers keep their broker ids across runs, as RocketMQ brokers "
                                       "keep theirs in their store (default: none: new ids every run)")
    sb.set_defaults(fn=cmd_simulate_brokers)

    from electra.tiering.cli import add_history_command

    add_history_command(sub)

    from electra.security.cli import add_cert_command

    add_cert_command(sub)

    # No -h of its own: `electra bench NAME --help` reaches that benchmark's parser.
    b = sub.add_parser("bench", help="run a benchmark from bench/ (ends with a RESULT line)", add_help=False)
    b.add_argument("name", nargs="?")
    b.set_defaults(fn=None)

    r = sub.add_parser("report", help="write a report (performance: old vs new architecture, HTML + Markdown)",
                       add_help=False)
    r.add_argument("name", nargs="?")
    r.set_defaults(fn=None)
    return p


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def main(argv: list[str] | None = None) -> int:
    keep_read_buffers_off_mmap()  # every command that serves or sends TLS (electra/malloc_thresholds.py)
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.log_level.upper() not in LOG_LEVELS:
        parser.error(f"argument --log-level (or ELECTRA_LOG_LEVEL): choose from {', '.join(LOG_LEVELS)}, "
                     f"not {args.log_level!r}")
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # kafka-python logs every connection at INFO; its warnings and errors still show.
    logging.getLogger("kafka").setLevel(max(logging.WARNING, logging.getLogger().level))
    try:
        if args.cmd == "bench":
            return cmd_bench(args, extra)
        if args.cmd == "report":
            return cmd_report(args, extra)
        if extra:  # blamed on the sub-command's own parser, whose usage says what it takes
            args.command_parser.error(f"unrecognized arguments: {' '.join(extra)}")
        return args.fn(args)
    except KeyboardInterrupt:  # a command without its own handling (status, admin, ...): no traceback
        print(f"electra {args.cmd}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if isinstance(exc, BrokenPipeError) and _stdout_reader_gone():
            return 128 + signal.SIGPIPE  # `electra history ... | head`: the reader had what it wanted, as `cat` ends
        message = explain_error(exc)
        if message is None:
            raise  # a bug: keep the traceback
        print(f"error: {message}", file=sys.stderr)
        return 1


def _stdout_reader_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it; if so, stdout is pointed at /dev/null, so the
    interpreter's flush at exit does not fail on it again ("Exception ignored ... BrokenPipeError")."""
    import select

    try:
        fd = sys.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        gone = any(ev & select.POLLERR for _, ev in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no real stdout (captured, closed)
        return False
    if gone:
        os.dup2(os.open(os.devnull, os.O_WRONLY), fd)
    return gone


def explain_error(exc: BaseException) -> str | None:
    """The one place that turns expected failures of a command into one line; None for bugs."""
    import aiohttp

    from electra.api.client import UnexpectedResponse, describe_failure
    from electra.security.credentials import CredentialsError

    if isinstance(exc, UnexpectedResponse | CredentialsError):
        return str(exc)
    if isinstance(exc, aiohttp.ClientError | TimeoutError | ConnectionError):
        return describe_failure(exc)
    return None


if __name__ == "__main__":
    sys.exit(main())
