"""Fault-injecting TCP proxies on the Raft peer links (this kernel has no netem).

Raft nodes keep one connection per pair: the lower id dials the higher one and
both directions share it (consensus/transport.py). Chaos points the lower node's
address for each higher peer at one `LinkProxy`, which forwards bytes to the real
port untouched (mutual TLS passes through as opaque bytes) unless told otherwise:

- `block(direction)`: bytes in that direction are discarded (a silent one-way or,
  with both directions, a full partition; new connections are accepted and held
  without reaching the node, as a black-holed route would). `heal()` resets the
  connections that lost bytes, because a TLS stream with a hole cannot go on.
- `delay_s`: every chunk waits this long before it is forwarded (order kept).
- `loss`: the probability that a chunk makes the proxy reset the connection
  (TCP never loses bytes inside a stream; on a lossy link Raft sees resets and
  timeouts, which is what this gives).

All proxies run on one event loop in a background thread (`ProxyHub`) so that a
busy checker in the runner never stalls the cluster's traffic.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
from collections.abc import Callable
from typing import Any

UP, DOWN = "up", "down"  # up: dialer (lower id) -> listener (higher id); down: the replies' direction


class LinkProxy:
    def __init__(self, low: int, high: int, listen_port: int, target_port: int, rng: random.Random) -> None:
        self.low, self.high = low, high
        self.listen_port, self.target_port = listen_port, target_port
        self.blocked: set[str] = set()
        self.delay_s = 0.0
        self.loss = 0.0
        self.rng = rng
        self._conns: set[_Conn] = set()
        self._server: asyncio.base_events.Server | None = None
        self.stats = {"connections": 0, "bytes": 0, "dropped_bytes": 0, "resets": 0}

    def direction(self, src: int, dst: int) -> str:
        """Which direction of this link carries messages from node `src` to node `dst`."""
        if (src, dst) == (self.low, self.high):
            return UP
        if (src, dst) == (self.high, self.low):
            return DOWN
        raise ValueError(f"link {self.low}-{self.high} does not connect {src} to {dst}")

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.listen_port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for c in list(self._conns):
            c.close()

    def heal(self) -> None:
        self.blocked.clear()
        self.delay_s = 0.0
        self.loss = 0.0
        for c in list(self._conns):
            if c.damaged or c.held:
                self.stats["resets"] += 1
                c.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.stats["connections"] += 1
        conn = _Conn(self, writer)
        self._conns.add(conn)
        try:
            if self.blocked == {UP, DOWN}:  # black hole: hold the connection, reach nobody
                conn.held = True
                await _drain_into_nothing(reader)
                return
            try:
                async with asyncio.timeout(3):
                    up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
            except (OSError, TimeoutError):
                return
            conn.upstream = up_writer
            await asyncio.gather(self._pump(reader, up_writer, UP, conn),
                                 self._pump(up_reader, writer, DOWN, conn), return_exceptions=True)
        finally:
            conn.close()
            self._conns.discard(conn)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, direction: str,
                    conn: _Conn) -> None:
        try:
            while not conn.closed:
                data = await reader.read(65536)
                if not data:
                    break
                if direction in self.blocked:
                    conn.damaged = True
                    self.stats["dropped_bytes"] += len(data)
                    continue
                if self.loss and self.rng.random() < self.loss:
                    self.stats["resets"] += 1
                    break
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                    if direction in self.blocked:  # blocked while this chunk waited
                        conn.damaged = True
                        continue
                self.stats["bytes"] += len(data)
                writer.write(data)
                await writer.drain()
        except (OSError, ConnectionError):
            pass
        finally:
            conn.close()


class _Conn:
    __slots__ = ("proxy", "downstream", "upstream", "damaged", "held", "closed")

    def __init__(self, proxy: LinkProxy, downstream: asyncio.StreamWriter) -> None:
        self.proxy = proxy
        self.downstream = downstream
        self.upstream: asyncio.StreamWriter | None = None
        self.damaged = False
        self.held = False
        self.closed = False

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for w in (self.downstream, self.upstream):
            if w is not None:
                with contextlib.suppress(Exception):
                    w.transport.abort()


async def _drain_into_nothing(reader: asyncio.StreamReader) -> None:
    with contextlib.suppress(OSError, ConnectionError):
        while await reader.read(65536):
            pass


class ProxyHub:
    """Every link proxy of a cluster, on one event loop in a daemon thread; thread-safe controls."""

    def __init__(self, seed: int) -> None:
        self.links: dict[tuple[int, int], LinkProxy] = {}
        self.rng = random.Random(seed)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="chaos-proxies", daemon=True)
        self._thread.start()

    def _call(self, fn: Callable[[], Any]) -> Any:
        async def run() -> Any:
            res = fn()
            return await res if asyncio.iscoroutine(res) else res
        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout=10)

    def add(self, low: int, high: int, listen_port: int, target_port: int) -> LinkProxy:
        link = LinkProxy(low, high, listen_port, target_port, random.Random(self.rng.random()))
        self._call(link.start)
        self.links[(low, high)] = link
        return link

    def link(self, a: int, b: int) -> LinkProxy:
        return self.links[(min(a, b), max(a, b))]

    def cut(self, src: int, dst: int) -> None:
        """Messages from `src` to `dst` are lost from now on (one direction only)."""
        link = self.link(src, dst)
        self._call(lambda: link.blocked.add(link.direction(src, dst)))

    def set_delay(self, a: int, b: int, delay_s: float) -> None:
        link = self.link(a, b)
        self._call(lambda: setattr(link, "delay_s", delay_s))

    def set_loss(self, a: int, b: int, loss: float) -> None:
        link = self.link(a, b)
        self._call(lambda: setattr(link, "loss", loss))

    def heal_all(self) -> None:
        self._call(lambda: [link.heal() for link in self.links.values()])

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._call(lambda: asyncio.gather(*(link.stop() for link in self.links.values())))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():  # its selector and self-pipe: three descriptors an episode otherwise
            self._loop.close()
