"""The pipeline as Kafka shows it, for the dashboard: heartbeats/s, dead letters, the job's batches and lag.

A node does not consume the heartbeats or dead-letter topics; it only asks their end offsets
(a dedicated probe consumer, `kafka_io.end_offsets`, which corrects tansu's stale high
watermarks by reading each partition's last record), and reads the newest record of the
job-stats topic (streaming/job_stats.py): the job's last batch and the offsets it consumed,
so its consumer lag is the heartbeats topic's end offsets minus those. Blocking: run it in
a thread, one sample at a time.
"""

from __future__ import annotations

import json
import time

from kafka import KafkaConsumer

from electra.streaming.kafka_io import end_offsets, last_record, topic_partitions
from electra.streaming.records import Topics

JOB_FIELDS = ("batchId", "rows", "batchMs", "proposals", "liveness", "deadLetters", "ts")  # a batch report's numbers


class TopicStats:
    def __init__(self, bootstrap: str, topics: Topics, *, hwm_fix: bool = True) -> None:
        self.bootstrap = bootstrap
        self.topics = topics
        self.hwm_fix = hwm_fix
        self._consumer: KafkaConsumer | None = None
        self._partitions: dict[str, list] = {}
        self._last: tuple[float, int] | None = None  # (monotonic time, heartbeats total)

    def _tps(self, topic: str) -> list:
        if topic not in self._partitions:
            self._partitions[topic] = topic_partitions(self._consumer, topic, timeout_s=2.0)
        return self._partitions[topic]

    def _ends(self, topic: str) -> dict[str, int]:
        ends = end_offsets(self._consumer, self._tps(topic), self.hwm_fix, poll_ms=300)
        return {f"{tp.topic}:{tp.partition}": n for tp, n in ends.items()}

    def _job(self, heartbeat_ends: dict[str, int]) -> dict | None:
        """The job's newest batch report and its lag on the heartbeats topic (None: no report yet; a report
        that is not the job's shape: `{"invalid": why}`, which blanks nothing else of the sample).

        The topic is as writable as the heartbeats topic: only the report's numbers are taken, as numbers,
        so nothing written there reaches a dashboard page as markup."""
        (tp,) = self._tps(self.topics.job_stats)
        rec = last_record(self._consumer, tp, self.hwm_fix, poll_ms=500)
        if rec is None:
            return None
        try:
            report = json.loads(rec.value)
        except (ValueError, TypeError) as exc:
            return {"invalid": f"not JSON ({type(exc).__name__})"}
        if not isinstance(report, dict):
            return {"invalid": "not a JSON object"}
        job: dict[str, int | None] = {}
        for key in JOB_FIELDS:
            value = report.get(key)
            if value is not None and (type(value) is not int or value < 0):
                return {"invalid": f"{key} is not a non-negative integer"}
            job[key] = value
        consumed = report.get("consumed", {})
        if not isinstance(consumed, dict) or any(type(v) is not int for v in consumed.values()):
            return {"invalid": "consumed is not a map of offsets"}
        job["heartbeatsLag"] = sum(max(0, end - consumed.get(key, 0)) for key, end in heartbeat_ends.items())
        return job

    def sample(self) -> dict:
        """Records ever written to the heartbeats and dead-letter topics, heartbeats/s since the last
        sample, and the streaming job's last batch with its consumer lag."""
        if self._consumer is None:
            self._consumer = KafkaConsumer(bootstrap_servers=self.bootstrap, client_id="electra-dashboard",
                                           enable_auto_commit=False, request_timeout_ms=5000)
        now = time.monotonic()
        heartbeat_ends = self._ends(self.topics.heartbeats)
        heartbeats = sum(heartbeat_ends.values())
        dead = sum(self._ends(self.topics.dead_letters).values())
        last, self._last = self._last, (now, heartbeats)
        rate = round(max(0, heartbeats - last[1]) / (now - last[0]), 1) if last and now > last[0] else None
        return {"heartbeats_total": heartbeats, "heartbeats_per_s": rate, "dead_letters_total": dead,
                "job": self._job(heartbeat_ends)}

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
