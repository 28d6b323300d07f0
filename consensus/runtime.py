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
import contextlib
import logging
import os
import queue
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from .files import Files, OsFiles
from .messages import Message

if TYPE_CHECKING:
    from .node import NodeConfig

T = TypeVar("T")
log = logging.getLogger(__name__)

# Test only (`electra chaos`'s clock-rate fault): a file holding the rate at which this node's
# monotonic clock runs (1.0 = real time). Never set in a deployment; a node using it says so at start.
CLOCK_RATE_ENV = "ELECTRA_TEST_CLOCK_RATE_FILE"


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
        rate_file = os.environ.get(CLOCK_RATE_ENV)
        clock: Clock = SystemClock() if not rate_file else RatedClock(rate_file)
        if rate_file:
            log.warning("TEST BUILD: node %d's monotonic clock runs at the rate in %s (%s). NEVER run this in "
                        "production.", node_id, rate_file, CLOCK_RATE_ENV)
        # two snapshot threads: a snapshot being written never holds up the log's mark (once a second)
        snapshots = ThreadExecutor(f"raft-snapshot-{node_id}", workers=2, wait_on_shutdown=False)
        return NodeRuntime(clock, OsFiles(), DiskThread(f"raft-disk-{node_id}"), snapshots, _tcp_transport)


class SystemClock:
    def now(self) -> float:
        return time.monotonic()

    def call_later(self, delay: float, callback: Callable[[], None]) -> Cancellable:
        return asyncio.get_running_loop().call_later(delay, callback)


class RatedClock:
    """Monotonic time running at a rate read from a file (test only: a host whose clock runs fast or slow).

    Both what the node reads (`now`: leases, follower freshness) and its timers (`call_later`: ticks) follow
    the rate, as they would on such a host. The rate is re-read at most every 50 ms; a change bends the clock,
    never steps it, so it stays monotonic.
    """

    def __init__(self, rate_file: str) -> None:
        self.rate_file = rate_file
        self._real0 = self._fake0 = time.monotonic()
        self._checked = self._real0 - 1.0
        self._rate = 1.0
        self._refresh(self._real0)

    def _refresh(self, real: float) -> None:
        if real - self._checked < 0.05:
            return
        self._checked = real
        try:
            with open(self.rate_file) as f:
                rate = float(f.read().strip() or "1")
        except (OSError, ValueError):
            return
        if rate > 0 and rate != self._rate:
            self._fake0 += (real - self._real0) * self._rate
            self._real0, self._rate = real, rate

    def now(self) -> float:
        real = time.monotonic()
        self._refresh(real)
        return self._fake0 + (real - self._real0) * self._rate

    def call_later(self, delay: float, callback: Callable[[], None]) -> Cancellable:
        return asyncio.get_running_loop().call_later(delay / self._rate, callback)


_DiskCall = tuple[Callable[[], Any], "asyncio.Future[Any]", asyncio.AbstractEventLoop]  # (call, its answer, its loop)


class DiskThread:
    """The log's disk thread: one dedicated thread, handed each call through a queue, answering through the loop.

    Every node awaits one disk round trip per batch of log writes (the fsync before its acks), so the handoff
    is on the write path of the leader and of each follower. Through `run_in_executor` a round trip cost about
    100 µs of CPU on this 2-core VM (the pool's work item, a concurrent future wrapped into an asyncio one,
    the idle-thread semaphore); a queue and `call_soon_threadsafe` cost about 27 µs (`tests/unit/test_disk_thread.py`
    checks the behaviour, docs/raft-engine.md has the measurement). Calls run one at a time, in order.

    The thread is a daemon: a process that exits without `shutdown()` stops it mid-call, as a crash would; the
    log acknowledges nothing before its fsync has returned, so no acknowledged write depends on that call.
    """

    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue[_DiskCall | None] = queue.SimpleQueue()
        self._stopped = False
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)  # started by the first call: a
        # node that fails to start (a refused data directory) never calls shutdown()

    async def run(self, fn: Callable[[], T]) -> T:
        if self._stopped:
            raise RuntimeError(f"{self._thread.name} is shut down")
        if self._thread.ident is None:
            self._thread.start()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        self._queue.put((fn, fut, loop))
        return await fut

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            fn, fut, loop = item
            try:
                result, error = fn(), None
            except BaseException as exc:  # handed to the awaiting caller, as run_in_executor does
                result, error = None, exc
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits any more
                loop.call_soon_threadsafe(_settle, fut, result, error)

    def shutdown(self) -> None:
        """Stop after the calls already handed over, and wait for them."""
        if not self._stopped:
            self._stopped = True
            self._queue.put(None)
        if self._thread.ident is not None and self._thread is not threading.current_thread():
            self._thread.join()


def _settle(fut: asyncio.Future[Any], result: object, error: BaseException | None) -> None:
    if fut.done():  # the caller was cancelled; the call ran anyway (a write cannot be taken back)
        return
    if error is None:
        fut.set_result(result)
    elif isinstance(error, StopIteration):  # a future refuses to hold one
        fut.set_exception(RuntimeError(f"disk call raised {error!r}"))
    else:
        fut.set_exception(error)


class ThreadExecutor:
    """Dedicated threads: the event loop keeps receiving acks and proposals while the disk works.

    Dedicated, not the loop's default pool: that pool also serves slow reads (`/v1/admin/history`
    and the dashboard reading the Delta tier), and a node's snapshots must not queue behind them.
    `wait_on_shutdown=False` for work a stopping node need not finish (a snapshot: the log has it);
    the thread still ends its file, which is written aside and renamed, before the process exits.
    """

    def __init__(self, name: str, workers: int = 1, wait_on_shutdown: bool = True) -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
        self._wait = wait_on_shutdown

    async def run(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=self._wait)


def _tcp_transport(cfg: NodeConfig, cluster_id: str | None, on_message: Callable[[Message], None]) -> Transport:
    from .transport import PeerTransport

    return PeerTransport(cfg.node_id, cfg.peers, on_message, cluster=cfg.cluster, cluster_id=cluster_id,
                         server_ssl=cfg.peer_server_ssl, client_ssl=cfg.peer_client_ssl)
