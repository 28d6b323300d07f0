"""The dashboard's Kafka numbers against a real Kafka-compatible broker (embedded tansu)."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest
from kafka import KafkaProducer

from electra.api.topic_stats import TopicStats
from electra.streaming.embedded_kafka import EmbeddedKafka
from electra.streaming.job_stats import batch_record
from electra.streaming.kafka_io import ensure_topics
from electra.streaming.records import Topics
from electra.streaming.sink import KafkaOutput

pytestmark = pytest.mark.integration


def test_heartbeats_per_second_dead_letters_and_the_jobs_batch_and_lag(tmp_path):
    topics = Topics.prefixed("dash.")
    with EmbeddedKafka(log_file=tmp_path / "kafka.log") as kafka:
        ensure_topics(kafka.bootstrap, topics.partitions())
        producer = KafkaProducer(bootstrap_servers=kafka.bootstrap)
        stats = TopicStats(kafka.bootstrap, topics)
        try:
            for i in range(7):
                producer.send(topics.heartbeats, key=f"set-{i}".encode(), value=b"{}")
            for _ in range(2):
                producer.send(topics.dead_letters, value=b"not json")
            producer.flush(timeout=10)
            first = stats.sample()
            assert (first["heartbeats_total"], first["dead_letters_total"], first["heartbeats_per_s"]) == (7, 2, None)
            assert first["job"] is None  # the job has reported no batch yet
            for i in range(5):
                producer.send(topics.heartbeats, key=f"set-{i}".encode(), value=b"{}")
            producer.flush(timeout=10)
            time.sleep(0.5)
            second = stats.sample()
            assert second["heartbeats_total"] == 12 and second["dead_letters_total"] == 2
            assert second["heartbeats_per_s"] > 0

            # The job reports a batch that consumed every heartbeat but 4, as its listener does.
            ends = stats._ends(topics.heartbeats)
            first_key = next(k for k, v in ends.items() if v >= 4)
            consumed = dict(ends, **{first_key: ends[first_key] - 4})
            progress = SimpleNamespace(batchId=3, numInputRows=8, batchDuration=950,
                                       sources=[SimpleNamespace(endOffset=json.dumps(consumed))])
            output = KafkaOutput(kafka.bootstrap, topics.liveness, topics.dead_letters)
            output.send_stats(topics.job_stats, batch_record(progress, {"proposals": 1}, 2, 1, 123))
            output.close()
            job = stats.sample()["job"]
            assert (job["batchId"], job["rows"], job["batchMs"], job["proposals"], job["heartbeatsLag"]) == \
                (3, 8, 950, 1, 4)
            # Anyone who can write to the topic can put anything there: markup in a field, or not JSON. It is
            # reported as not a batch report, and the rest of the sample stands.
            for bad, why in ((b'{"batchId": "<img src=x onerror=alert(1)>", "rows": 1}', "batchId is not"),
                             (b"not json", "not JSON"), (b"[1, 2]", "not a JSON object"),
                             (b'{"batchId": 4, "consumed": {"t:0": "x"}}', "consumed is not")):
                producer.send(topics.job_stats, value=bad)
                producer.flush(timeout=10)
                sample = stats.sample()
                assert why in sample["job"]["invalid"] and sample["heartbeats_total"] == 12, sample
        finally:
            producer.close()
            stats.close()
