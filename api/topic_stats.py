"""End offsets of the pipeline's Kafka topics, for the dashboard: heartbeats/s through Kafka, dead letters.

A node does not consume the heartbeats or dead-letter topics; it only asks their end offsets
(a dedicated probe consumer, `kafka_io.end_offsets`, which corrects tansu's stale high
watermarks by reading each partition's last record). Blocking: run it in a thread, one
sample at a time.
"""

from __future__ import annotations

import time

from kafka import KafkaConsumer

from electra.streaming.kafka_io import end_offsets, topic_partitions
from electra.streaming.records import Topics


class TopicStats:
    def __init__(self, bootstrap: str, topics: Topics, *, hwm_fix: bool = True) -> None:
        self.bootstrap = bootstrap
        self.topics = topics
        self.hwm_fix = hwm_fix
        self._consumer: KafkaConsumer | None = None
        self._partitions: dict[str, list] = {}
        self._last: tuple[float, int] | None = None  # (monotonic time, heartbeats total)

    def _total(self, topic: str) -> int:
        if topic not in self._partitions:
            self._partitions[topic] = topic_partitions(self._consumer, topic, timeout_s=2.0)
        return sum(end_offsets(self._consumer, self._partitions[topic], self.hwm_fix, poll_ms=300).values())

    def sample(self) -> dict:
        """Records ever written to the heartbeats and dead-letter topics, and heartbeats/s since the last sample."""
        if self._consumer is None:
            self._consumer = KafkaConsumer(bootstrap_servers=self.bootstrap, client_id="electra-dashboard",
                                           enable_auto_commit=False, request_timeout_ms=5000)
        now = time.monotonic()
        heartbeats = self._total(self.topics.heartbeats)
        dead = self._total(self.topics.dead_letters)
        last, self._last = self._last, (now, heartbeats)
        rate = round(max(0, heartbeats - last[1]) / (now - last[0]), 1) if last and now > last[0] else None
        return {"heartbeats_total": heartbeats, "heartbeats_per_s": rate, "dead_letters_total": dead}

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
