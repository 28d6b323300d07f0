"""The events publisher's stop closes a Kafka producer its thread was still building (api/kafka_bridge.py)."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import electra.api.kafka_bridge as bridge
from electra.consensus.core import Role
from electra.streaming.records import Topics


def test_a_stop_while_the_producer_is_being_built_closes_it_once_built(monkeypatch):
    entered, release = threading.Event(), threading.Event()
    built: list = []

    class _Producer:
        def __init__(self, **_kw) -> None:
            entered.set()
            release.wait(10)  # a slow bootstrap: the thread cannot be cancelled
            self.closed = False
            built.append(self)

        def close(self, timeout=None) -> None:
            self.closed = True

    monkeypatch.setattr(bridge, "KafkaProducer", _Producer)
    monkeypatch.setattr(bridge, "ensure_topics", lambda *a, **k: None)
    node = SimpleNamespace(role=Role.LEADER, core=SimpleNamespace(term=1))

    async def main() -> None:
        pub = bridge.EventsPublisher(SimpleNamespace(node=node), "k:9092", Topics())
        pub.start()
        assert await asyncio.to_thread(entered.wait, 5), "the publisher never built its producer"
        stopping = asyncio.ensure_future(pub.stop())
        await asyncio.sleep(0.05)
        release.set()  # the build finishes after the task was cancelled
        await asyncio.wait_for(stopping, 10)

    asyncio.run(main())
    assert len(built) == 1 and built[0].closed, "a producer built during the stop was left open"
