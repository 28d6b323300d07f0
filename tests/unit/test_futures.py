"""api/futures.py: a write's answer chained by callbacks behaves as awaiting it in a coroutine would."""

from __future__ import annotations

import asyncio

import pytest

from electra.api.futures import failed, then
from electra.consensus.errors import NotLeader


def test_then_maps_results_passes_errors_and_recovers_them() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        src = loop.create_future()
        doubled = then(src, lambda x: 2 * x)
        src.set_result(21)
        assert await doubled == 42

        src = loop.create_future()
        passed = then(src, lambda x: x)
        src.set_exception(NotLeader(2, "127.0.0.1:1"))
        with pytest.raises(NotLeader):
            await passed

        src = loop.create_future()
        recovered = then(src, lambda x: x, lambda exc: f"refused: {type(exc).__name__}")
        src.set_exception(NotLeader(2, None))
        assert await recovered == "refused: NotLeader"

        src = loop.create_future()
        broken = then(src, lambda x: 1 // x)  # a bug in the mapping reaches the awaiting caller
        src.set_result(0)
        with pytest.raises(ZeroDivisionError):
            await broken

        with pytest.raises(NotLeader):
            await failed(NotLeader(0, None))

    asyncio.run(main())


def test_cancelling_the_answer_leaves_the_proposal_alone_and_a_cancelled_proposal_cancels_the_answer() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        src = loop.create_future()
        out = then(src, lambda x: x)
        out.cancel()
        src.set_result(1)  # the engine resolves the proposal later; nobody listens, nothing breaks
        await asyncio.sleep(0)
        assert out.cancelled() and src.result() == 1

        src = loop.create_future()
        out = then(src, lambda x: x)
        src.cancel()
        with pytest.raises(asyncio.CancelledError):
            await out

    asyncio.run(main())


def test_a_proposal_failing_after_its_caller_left_logs_nothing() -> None:
    """Review: a scan or a client cancelled while its proposal was pending, and the node's stop then failed the
    proposal: its error was never read, and asyncio logged "Future exception was never retrieved" at every stop."""
    import gc

    from electra.consensus.errors import NodeStopped

    reported: list[dict] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, context: reported.append(context))
        src = loop.create_future()
        answer = then(src, lambda x: x)
        answer.cancel()  # the caller left
        src.set_exception(NodeStopped("stopping"))  # the node's stop fails what is pending
        await asyncio.sleep(0)
        del src, answer
        gc.collect()

    asyncio.run(main())
    assert not [c for c in reported if "never retrieved" in c.get("message", "")], reported
