"""A simulated node's clock: its own rate (drift) and forward jumps, over the loop's virtual time.

Leases assume that no two nodes' clocks run at rates further apart than
`max_clock_drift` (NodeConfig); monotonic clocks never go back but may jump
forward (a suspended VM, a slewed clock), which only ever shortens a lease. The
simulator draws each node's rate within the assumed bound, or beyond it on purpose
to show that the checker then sees stale lease reads. A node's rate also changes
over time within that bound, so a leader elected on a fast clock may run slow later.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from .runtime import Cancellable
from .simloop import Gate


class SimClock:
    def __init__(self, loop: asyncio.AbstractEventLoop, rate: float) -> None:
        self.loop = loop
        self.rate = rate  # local seconds per virtual second
        self.offset = 0.0  # accumulated forward jumps
        self.gate: Gate | None = None  # the running incarnation's gate (timers die with it)

    def now(self) -> float:
        return self.loop.time() * self.rate + self.offset

    def set_rate(self, rate: float) -> None:
        """Drift changes (temperature, NTP slewing); the clock stays continuous."""
        t = self.loop.time()
        self.offset += t * (self.rate - rate)
        self.rate = rate

    def jump(self, seconds: float) -> None:
        self.offset += max(0.0, seconds)

    def call_later(self, delay: float, callback: Callable[[], None]) -> Cancellable:
        assert self.gate is not None, "the clock of a process that is not running"
        return self.gate.call_later(delay / self.rate, callback)
