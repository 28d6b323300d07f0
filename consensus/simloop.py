"""A deterministic asyncio event loop on virtual time, and the gate of a simulated process.

The simulator runs the real asyncio driver (`RaftNode`) of every node on one
`VirtualTimeLoop`: there is no I/O and no thread, and whenever nothing is ready
the loop jumps its clock to the next timer instead of sleeping. asyncio runs
ready callbacks in FIFO order and timers in deadline order, so one seed always
produces the same interleaving, and `asyncio.sleep`, `wait_for` and `call_later`
inside the driver all run on simulated time.

Every entry into a simulated process (a timer of its clock, a disk completion, a
message delivery, a client request) goes through that process's `Gate`: once the
incarnation is dead the callback is dropped (a killed process does nothing
more), while it is paused the callback waits for the pause to end.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any


class _VirtualSelector:
    """What BaseEventLoop waits on: waiting `timeout` seconds advances the virtual clock."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        self.loop = loop

    def select(self, timeout: float | None) -> list[Any]:
        if timeout is None:
            raise RuntimeError("simulation deadlock: nothing is ready and no timer is armed")
        if timeout > 0:
            self.loop.advance(timeout)
        return []

    def close(self) -> None:
        pass


class VirtualTimeLoop(asyncio.BaseEventLoop):
    def __init__(self) -> None:
        super().__init__()
        self._virtual_now = 0.0
        self._selector = _VirtualSelector(self)
        self._clock_resolution = 1e-9

    def time(self) -> float:
        return self._virtual_now

    def advance(self, seconds: float) -> None:
        self._virtual_now += seconds

    def _process_events(self, event_list: list[Any]) -> None:
        pass

    def _write_to_self(self) -> None:
        pass  # nothing ever wakes this loop from another thread


class _GateHandle:
    """A timer armed through a gate; cancelling it holds even after a pause moved it."""

    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Gate:
    """One incarnation of a simulated process: runs its callbacks while alive, later while paused."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_error: Callable[[BaseException], None]) -> None:
        self.loop = loop
        self.on_error = on_error
        self.alive = True
        self.paused_until = 0.0

    def call_later(self, delay: float, fn: Callable[..., None], *args: Any) -> _GateHandle:
        handle = _GateHandle()
        self.loop.call_later(delay, self._run, handle, fn, args)
        return handle

    def run_soon(self, fn: Callable[..., None], *args: Any) -> None:
        self.loop.call_soon(self._run, _GateHandle(), fn, args)

    def _run(self, handle: _GateHandle, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        if not self.alive or handle.cancelled:
            return
        if self.loop.time() < self.paused_until:
            self.loop.call_at(self.paused_until, self._run, handle, fn, args)
            return
        try:
            fn(*args)
        except Exception as exc:
            self.on_error(exc)
