"""The log's disk thread (`runtime.DiskThread`): calls run one at a time, in order, off the event loop; their
results and errors reach the awaiting caller; a cancelled caller's call still runs; shutdown waits for what
was handed over."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from electra.consensus.runtime import DiskThread


def test_calls_run_in_order_on_one_thread_off_the_loop():
    disk = DiskThread("test-disk")
    seen: list[tuple[int, str]] = []

    async def main():
        loop_thread = threading.current_thread().name

        def call(i):
            def fn():
                seen.append((i, threading.current_thread().name))
                return i * 10
            return fn

        results = await asyncio.wait_for(asyncio.gather(*(disk.run(call(i)) for i in range(50))), 5)
        return loop_thread, results

    loop_thread, results = asyncio.run(main())
    disk.shutdown()
    assert results == [i * 10 for i in range(50)]
    assert [i for i, _ in seen] == list(range(50))
    assert {name for _, name in seen} == {"test-disk"} and loop_thread != "test-disk"


def test_an_error_reaches_the_caller_and_the_thread_goes_on():
    disk = DiskThread("test-disk")

    def fails():
        raise OSError(5, "Input/output error")

    def stops():
        raise StopIteration  # an asyncio future cannot hold one: it arrives as a RuntimeError

    async def main():
        with pytest.raises(OSError, match="Input/output error"):
            await asyncio.wait_for(disk.run(fails), 5)
        with pytest.raises(RuntimeError, match="StopIteration"):
            await asyncio.wait_for(disk.run(stops), 5)
        return await asyncio.wait_for(disk.run(lambda: "still here"), 5)

    assert asyncio.run(main()) == "still here"
    disk.shutdown()


def test_a_cancelled_caller_s_call_still_runs_and_shutdown_waits_for_it():
    disk = DiskThread("test-disk")
    ran = threading.Event()

    def slow():
        time.sleep(0.2)
        ran.set()

    async def main():
        task = asyncio.ensure_future(disk.run(slow))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    disk.shutdown()  # waits for the call handed over before it
    assert ran.is_set()

    async def after():
        await disk.run(lambda: None)

    with pytest.raises(RuntimeError, match="shut down"):
        asyncio.run(after())


def test_the_thread_starts_with_the_first_call_and_an_unused_one_shuts_down_at_once():
    """A node that fails to start (a refused data directory) never calls `shutdown()`: no thread is left."""
    before = threading.active_count()
    unused = DiskThread("test-unused")
    assert threading.active_count() == before
    unused.shutdown()
    used = DiskThread("test-used")
    asyncio.run(used.run(lambda: None))
    assert threading.active_count() == before + 1
    used.shutdown()
    assert threading.active_count() == before
