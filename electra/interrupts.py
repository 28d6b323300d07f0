"""SIGTERM and SIGHUP stop a command the way Ctrl-C does, so whatever it started is stopped too.

Commands that start processes (`electra up`, `chaos`, every benchmark and report) stop them in
`finally` blocks. Python's default SIGTERM ends the process at once, without those blocks: a
benchmark stopped by `timeout`, a CI job's cancel or a closed terminal used to leave its Kafka
broker, controller nodes, ingest workers and Spark job running, with nobody to stop them.

A SIGKILL (the OOM killer, `kill -9`) runs no `finally`: for that, the children are started
through `die_with_parent`, so the kernel sends each a SIGTERM when its parent dies.

A long-running process (a node, an ingest worker) that begins to stop arms `exit_if_stop_hangs`: a stop
that waits on something that never answers (a Kafka call to a broker that died with it, a thread the
interpreter joins at exit) ends anyway, with every thread's stack on stderr to say what hung.
"""

from __future__ import annotations

import asyncio
import faulthandler
import os
import shutil
import signal
import sys
import threading
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")

SIGNALS = (signal.SIGTERM, signal.SIGHUP)


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Inside the block, the first SIGTERM or SIGHUP raises KeyboardInterrupt in the main thread and
    later ones are ignored, so the cleanup the first one started is not cut short (Ctrl-C still
    interrupts). A signal already ignored stays ignored (`nohup` keeps a run going when its terminal
    closes). The handlers before the block are back after it. Off the main thread (where Python
    allows no handlers) it does nothing."""

    def interrupt(_signum: int, _frame: object) -> None:
        for sig in SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in SIGNALS}
    for sig, handler in previous.items():
        if handler is not signal.SIG_IGN:
            signal.signal(sig, interrupt)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_async(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)`, where SIGTERM and SIGHUP cancel `main` as asyncio.run does on Ctrl-C: its `finally`
    blocks then run on the loop (an HTTP session closed, connections shut), and KeyboardInterrupt follows once
    it ended, as `terminate_as_interrupt` would have raised it. Raised from the signal handler instead, the
    KeyboardInterrupt lands in whichever task runs: the others are cancelled by asyncio.run's shutdown halfway
    through their own cleanup, and aiohttp dumps its unclosed connectors after the one-line `interrupted`.
    A signal ignored stays ignored; later signals during the cleanup are ignored, as there."""
    interrupted = False
    installed: list[signal.Signals] = []

    async def run() -> T:
        nonlocal interrupted
        loop, task = asyncio.get_running_loop(), asyncio.current_task()
        assert task is not None

        def cancel() -> None:
            nonlocal interrupted
            if not interrupted:  # the first one: later ones must not cut the cleanup short
                interrupted = True
                task.cancel()

        previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                handler = signal.getsignal(sig)
                if callable(handler):  # one that interrupts (terminate_as_interrupt); default and ignored stay
                    previous[sig] = handler
                    loop.add_signal_handler(sig, cancel)
                    installed.append(sig)
        try:
            return await main
        finally:
            for sig, handler in previous.items():
                loop.remove_signal_handler(sig)  # sets SIG_DFL: the handler before is put back
                signal.signal(sig, handler)

    try:
        result = asyncio.run(run())
    except asyncio.CancelledError:
        if not interrupted:
            raise
    finally:
        if interrupted:  # as terminate_as_interrupt's handler: the cleanup that follows is not cut short
            for sig in installed:
                signal.signal(sig, signal.SIG_IGN)
    if interrupted:
        raise KeyboardInterrupt
    return result


def die_with_parent(cmd: list[str]) -> list[str]:
    """`cmd` run through util-linux's `setpriv --pdeathsig SIGTERM` (Debian's essential util-linux has it):
    the child gets a SIGTERM, and stops as it would on Ctrl-C, when the process that started it dies, even
    by SIGKILL. The kernel sends it when the *thread* that forked the child ends, so call this from the
    main thread, or from one that lives as long as the process. Without `setpriv`, `cmd` unchanged."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "SIGTERM", "--", *cmd] if setpriv else cmd


STOP_DEADLINE_S = 20.0  # a node's stop: hand-over (an election timeout), HTTP grace (2 s), Kafka closes (5-10 s)


def exit_if_stop_hangs(what: str, deadline_s: float = STOP_DEADLINE_S, code: int = 1) -> threading.Timer:
    """Call when a process begins to stop: if it is still alive `deadline_s` later, print every thread's
    stack to stderr and end it at once with `code`. The state on disk is safe to leave that way (what was
    acknowledged is durable; a kill -9 must be survivable anyway), and a process that never ends keeps
    its ports and data directory, so the next start fails. The timer is a daemon thread: it does not
    hold a process that ends in time, and it still runs while the interpreter joins other threads."""

    def expire() -> None:
        try:  # stderr may be a closed pipe or terminal: the exit must not depend on it
            print(f"{what}: still stopping after {deadline_s:g} s; exiting with code {code} anyway. "
                  "What each thread was doing:", file=sys.stderr, flush=True)
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        finally:
            os._exit(code)

    timer = threading.Timer(deadline_s, expire)
    timer.daemon = True
    timer.name = "stop-deadline"
    timer.start()
    return timer
