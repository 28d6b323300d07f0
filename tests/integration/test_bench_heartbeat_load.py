"""`bench stream`'s load generator (`bench/heartbeat_load.py`) against real tansu: its hand-built record
batches and Produce requests must land as ordinary records, in the partition Kafka's partitioner picks."""

from __future__ import annotations

import time

import pytest
from kafka import KafkaConsumer, TopicPartition

from electra.bench.heartbeat_load import MAX_BATCH_BYTES, RoundProducer, partition_of
from electra.streaming import kafka_io
from electra.streaming.embedded_kafka import EmbeddedKafka

pytestmark = pytest.mark.integration

TOPIC, PARTS = "t.load", 3


def test_rounds_of_record_batches_arrive_as_records_keyed_and_stamped():
    kafka = EmbeddedKafka().start()
    try:
        kafka_io.ensure_topics(kafka.bootstrap, {TOPIC: PARTS})
        load = RoundProducer(kafka.bootstrap, TOPIC)
        keys = [f"set-{i}".encode() for i in range(400)]
        value = b"v" * 5000  # 400 x 5 kB per round: more than one record batch per partition (MAX_BATCH_BYTES)
        assert len(keys) * len(value) / PARTS > MAX_BATCH_BYTES
        sent = []
        for r, ts in enumerate((1_700_000_000_000, 1_700_000_001_000)):
            rows = [(partition_of(k, PARTS), k, b"%d:" % r + value) for k in keys]
            assert load.send_round(rows, ts) == 0
            sent += [(k, ts) for k in keys]
        load.close()
        consumer = KafkaConsumer(bootstrap_servers=kafka.bootstrap, auto_offset_reset="earliest")
        tps = [TopicPartition(TOPIC, p) for p in range(PARTS)]
        consumer.assign(tps)
        got: list = []
        deadline = time.monotonic() + 30
        while len(got) < len(sent) and time.monotonic() < deadline:
            for tp, msgs in consumer.poll(timeout_ms=500).items():
                got += [(tp.partition, m) for m in msgs]
        consumer.close()
        assert len(got) == len(sent)
        assert all(p == partition_of(m.key, PARTS) for p, m in got)
        assert sorted((m.key, m.timestamp) for _, m in got) == sorted(sent)
        for p in range(PARTS):  # each partition holds its keys in the order sent, round after round
            mine = [m for q, m in got if q == p]
            assert [m.key for m in mine] == [k for k, _ in sent if partition_of(k, PARTS) == p]
            assert [m.offset for m in mine] == list(range(len(mine)))
            assert all(m.value.split(b":")[1] == value for m in mine)
    finally:
        kafka.stop()
