"""The whole local stack (tansu, 3 nodes with ingest, the Spark job) on fresh loopback ports, for the
pipeline's end-to-end tests: one way to build it, run a scenario against it and show logs on failure."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable

from electra.local_ports import free_ports
from electra.local_stack import LocalStack, StackConfig


def loopback_stack(tmp_path, **config) -> LocalStack:
    """A secure LocalStack whose every process has its own free port (consecutive ones are not guaranteed)."""
    ports = free_ports(9)
    settings = {"trigger_ms": 500, "tick_ms": 50, "log_level": "INFO", **config}
    stack = LocalStack(StackConfig(data_dir=tmp_path, raft_port=ports[0], http_port=ports[3], ingest_port=ports[6],
                                   **settings))
    stack.raft_peers = ",".join(f"{i}=127.0.0.1:{ports[i - 1]}" for i in (1, 2, 3))
    stack.endpoints = {i: f"127.0.0.1:{ports[2 + i]}" for i in (1, 2, 3)}
    stack.ingest_endpoints = {i: f"127.0.0.1:{ports[5 + i]}" for i in (1, 2, 3)}
    return stack


def run_pipeline(stack: LocalStack, scenario: Callable[[LocalStack], Awaitable[None]],
                 show: Iterable[str] = ("streaming", "node1", "node2", "node3")) -> None:
    """Start Kafka, the controllers (with ingest) and the job; run `scenario`; print log tails if it fails."""
    try:
        stack.start_kafka()
        stack.start_controllers()
        stack.start_job()
        asyncio.run(scenario(stack))
    except BaseException:
        for name in show:
            print(f"----- {name} -----\n{stack.log_tail(name, 40)}")
        raise
    finally:
        stack.stop_all()


async def until(pred, what: str, timeout: float, every: float = 0.25):
    """Await `pred()` until truthy (returned) or fail after `timeout` seconds naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        value = await pred()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        await asyncio.sleep(every)
