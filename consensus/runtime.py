"""What `RaftNode` runs on: a clock, a file layer, an executor for disk work and a transport.

`RaftNode` (node.py) is the one driver of `RaftCore`; it reaches the outside world only
through a `NodeRuntime`. `NodeRuntime.system()` is what `electra node` runs: the
monotonic clock, the real file system, a dedicated disk thread and the TCP
`PeerTransport`. The simulator (simulation.py) builds the other one: per-node drifting
clocks on a virtual-time event loop, a simulated disk, a simulated network. Both run
the same driver code: group commit, the persist pipeline, recovery, snapshot transfer,
lease and follower-read checks.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

from .files import Files, OsFiles
from .messages import Message

if TYPE_CHECKING:
    from .node import NodeConfig

T = TypeVar("T")


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    """A node's monotonic clock and its timers (both in the node's own seconds)."""

    def now(self) -> float: ...

    def call_later(self, delay: float, callback: Callable[[], None]) -> Cancellable: ...


class DiskExecutor(Protocol):
    """Where blocking disk work (fsync, snapshot writing) runs, off the event loop."""

    async def run(self, fn: Callable[[], T]) -> T: ...

    def shutdown(self) -> None: ...


class Transport(Protocol):
    stats: dict[str, int]

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def send(self, msg: Message) -> None: ...

    def send_many(self, msgs: list[Message]) -> None: ...


# (config, cluster id, the node's message handler) -> the transport it sends through
TransportFactory = Callable[["NodeConfig", "str | None", Callable[[Message], None]], Transport]


@dataclass
class NodeRuntime:
    clock: Clock
    files: Files
    disk: DiskExecutor  # the log's writes and fsyncs: one at a time, in order
    snapshot_disk: DiskExecutor  # snapshot files: beside the log's fsyncs, never in front of them
    transport: TransportFactory
    rng: random.Random | None = None  # election timeouts; None: seeded from the OS

    @staticmethod
    def system(node_id: int) -> NodeRuntime:
        """Real time, real files, a disk thread, TCP peers: what `electra node` runs."""
        return NodeRuntime(SystemClock(), OsFiles(), ThreadExecutor(f"raft-disk-{node_id}"), LoopExecutor(),
                           _tcp_transport)


class SystemClock:
    def now(self) -> float:
        return time.monotonic()

    def call_later(self, delay: float, callback: Callable[[], None]) -> Cancellable:
        return asyncio.get_running_loop().call_later(delay, callback)


class ThreadExecutor:
    """One dedicated thread: the event loop keeps receiving acks and proposals while the disk works."""

    def __init__(self, name: str) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    async def run(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)


class LoopExecutor:
    """The event loop's default thread pool."""

    async def run(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(None, fn)

    def shutdown(self) -> None:
        pass


def _tcp_transport(cfg: NodeConfig, cluster_id: str | None, on_message: Callable[[Message], None]) -> Transport:
    from .transport import PeerTransport

    return PeerTransport(cfg.node_id, cfg.peers, on_message, cluster=cfg.cluster, cluster_id=cluster_id,
                         server_ssl=cfg.peer_server_ssl, client_ssl=cfg.peer_client_ssl)
