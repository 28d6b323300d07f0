"""SIGTERM and SIGHUP unwind a command like Ctrl-C (electra/interrupts.py); the real-process check is
tests/integration/test_bench_stops_what_it_started.py."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from electra.interrupts import terminate_as_interrupt


def test_sigterm_and_sighup_unwind_like_ctrl_c_once_then_the_old_handlers_are_back():
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)
    cleaned = False
    with pytest.raises(KeyboardInterrupt), terminate_as_interrupt():
        try:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs before the next bytecode
            raise AssertionError("SIGTERM did not interrupt")
        finally:
            os.kill(os.getpid(), signal.SIGHUP)  # a second signal during the cleanup is ignored
            cleaned = True
    assert cleaned
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)) == before


def test_an_ignored_signal_stays_ignored_and_off_the_main_thread_nothing_is_installed():
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup
    try:
        with terminate_as_interrupt():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_IGN, signal.SIG_DFL)
        errors = []

        def elsewhere() -> None:
            try:
                with terminate_as_interrupt():
                    pass
            except Exception as exc:  # signal.signal off the main thread raises ValueError
                errors.append(exc)

        t = threading.Thread(target=elsewhere)
        t.start()
        t.join(10)
        assert errors == []
    finally:
        signal.signal(signal.SIGHUP, before)


_HANGS = """
import threading
from electra.interrupts import exit_if_stop_hangs
answered = threading.Event()  # the broker's answer: it never comes while the stop hangs
def stuck_in_kafka_close():
    answered.wait(60)  # a call to a broker that died: what the interpreter joins at exit (bounded: 60 s)
threading.Thread(target=stuck_in_kafka_close).start()  # not a daemon: the exit waits for it
exit_if_stop_hangs("node 7", deadline_s={deadline})
{then}
"""


@pytest.mark.parametrize("deadline,then", [(0.5, ""), (30.0, "answered.set()")], ids=["hangs", "in-time"])
def test_a_stop_that_hangs_ends_anyway_and_says_what_hung(deadline, then):
    """A stuck stop ends at the deadline, with code 1 and the stuck thread's stack on stderr; a stop that ends
    in time (here the stuck call is answered) is not held by the timer."""
    import subprocess
    import sys
    import time

    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", _HANGS.format(deadline=deadline, then=then)], capture_output=True,
                          text=True, timeout=20)
    took = time.monotonic() - started
    if then:
        assert done.returncode == 0, done.stderr
        assert "still stopping" not in done.stderr
        assert took < 15  # not held until the 30 s deadline
    else:
        assert done.returncode == 1
        assert "node 7: still stopping after 0.5 s; exiting with code 1 anyway" in done.stderr
        assert "stuck_in_kafka_close" in done.stderr  # the stack says what hung
        assert took < 15


def test_under_run_async_sigterm_cancels_the_coroutine_whose_cleanup_runs_on_the_loop_then_interrupts():
    """Raised from the handler, the KeyboardInterrupt landed in whichever task ran, and asyncio.run's shutdown cut
    the others' cleanup short (`bench controller` under `timeout` dumped aiohttp's unclosed connectors after
    `interrupted`). Under run_async the coroutine is cancelled, awaits its cleanup, and KeyboardInterrupt follows;
    a second signal during the cleanup is ignored, and the handlers are back after the block."""
    import asyncio

    from electra.interrupts import run_async

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)
    steps: list[str] = []

    async def bench() -> None:
        try:
            await asyncio.sleep(0.01)
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.sleep(10)
            steps.append("not interrupted")
        except asyncio.CancelledError:
            steps.append("cancelled")
            raise
        finally:
            os.kill(os.getpid(), signal.SIGHUP)
            await asyncio.sleep(0.05)  # the fleet's stop: it needs the loop
            steps.append("cleaned up")

    with pytest.raises(KeyboardInterrupt), terminate_as_interrupt():
        try:
            run_async(bench())
        finally:
            steps.append("after the loop")
    assert steps == ["cancelled", "cleaned up", "after the loop"]
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)) == before
    assert run_async(asyncio.sleep(0, "done")) == "done"  # no handler of ours: a plain asyncio.run
