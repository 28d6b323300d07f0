"""The dashboard's Kafka numbers against a real Kafka-compatible broker (embedded tansu)."""

from __future__ import annotations

import time

import pytest
from kafka import KafkaProducer

from electra.api.topic_stats import TopicStats
from electra.streaming.embedded_kafka import EmbeddedKafka
from electra.streaming.kafka_io import ensure_topics
from electra.streaming.records import Topics

pytestmark = pytest.mark.integration


def test_heartbeats_per_second_and_dead_letters_from_topic_end_offsets(tmp_path):
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
            for i in range(5):
                producer.send(topics.heartbeats, key=f"set-{i}".encode(), value=b"{}")
            producer.flush(timeout=10)
            time.sleep(0.5)
            second = stats.sample()
            assert second["heartbeats_total"] == 12 and second["dead_letters_total"] == 2
            assert second["heartbeats_per_s"] > 0
        finally:
            producer.close()
            stats.close()
