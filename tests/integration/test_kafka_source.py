"""The `electra_kafka` stream reader against a real tansu broker (driven directly, without a Spark session).

Covers offsets per topic-partition, the tansu high-watermark fix, one input partition
per Kafka partition, reading exact ranges, and a broker restart (memory storage: the
log restarts at offset 0): the reader must notice end < start and continue from the
new beginning with a warning instead of stalling or failing.
"""

from __future__ import annotations

import logging
import time

import pytest
from kafka import KafkaProducer

from electra.streaming import kafka_io, kafka_source
from electra.streaming.embedded_kafka import EmbeddedKafka
from electra.streaming.kafka_source import KafkaPartition, KafkaStreamReader, group_partitions, plan_partitions

pytestmark = pytest.mark.integration

TOPICS = {"t.hb": 2, "t.ev": 1}


@pytest.fixture(autouse=True)
def _close_cached_consumers():
    """`read()` keeps one consumer per bootstrap per process (Spark reuses its workers); here that process
    is pytest's, so close them after each test, or they retry a stopped broker for the rest of the run."""
    yield
    for bootstrap in list(kafka_source._READERS):
        kafka_source._drop_reader(bootstrap)


def produce(bootstrap: str, topic: str, n: int, start: int = 0) -> None:
    p = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    for i in range(start, start + n):
        p.send(topic, key=f"k{i % 5}".encode(), value=f'{{"i":{i}}}'.encode())
    p.flush()
    p.close()


def read_all(reader: KafkaStreamReader, start: dict, end: dict) -> list[tuple]:
    rows = []
    for part in reader.partitions(start, end):
        rows += list(reader.read(part))
    return rows


def test_reader_offsets_ranges_and_restart(caplog):
    kafka = EmbeddedKafka().start()
    try:
        kafka_io.ensure_topics(kafka.bootstrap, TOPICS)
        reader = KafkaStreamReader({"bootstrap": kafka.bootstrap, "topics": "t.hb,t.ev"})
        start = reader.initialOffset()
        assert start == {"t.hb:0": 0, "t.hb:1": 0, "t.ev:0": 0}

        produce(kafka.bootstrap, "t.hb", 200)
        produce(kafka.bootstrap, "t.ev", 7)
        end = reader.latestOffset(start, None)
        assert end["t.ev:0"] == 7 and end["t.hb:0"] + end["t.hb:1"] == 200  # the real ends (HWM fix)
        parts = reader.partitions(start, end)
        assert sorted(p.value for p in parts) == ["t.ev:0", "t.hb:0", "t.hb:1"]
        rows = read_all(reader, start, end)
        assert len(rows) == 207
        one_task = KafkaStreamReader({"bootstrap": kafka.bootstrap, "topics": "t.hb,t.ev", "readTasks": "1"})
        [task] = one_task.partitions(start, end)
        assert sorted(r[:3] for r in one_task.read(task)) == sorted(r[:3] for r in rows)
        topic, part, off, key, value, ts = rows[0]
        assert isinstance(key, str) and value.startswith('{"i":') and ts is not None
        assert sorted(r[2] for r in rows if r[0] == "t.ev") == list(range(7))

        # A second batch reads only the new records.
        produce(kafka.bootstrap, "t.ev", 3, start=7)
        end2 = reader.latestOffset(end, None)
        assert end2["t.ev:0"] == 10 and reader.partitions(end, end2)[0].value == "t.ev:0"
        assert [r[2] for r in read_all(reader, end, end2)] == [7, 8, 9]
        assert reader.latestOffset(end2, None) == end2  # nothing new: same offsets, no partitions
        assert reader.partitions(end2, end2) == []

        # Broker down: no new data, no exception.
        kafka.stop()
        assert reader.latestOffset(end2, None) == end2

        # Restart (memory storage: everything is gone, offsets restart at 0).
        kafka.start()
        kafka_io.ensure_topics(kafka.bootstrap, TOPICS)
        produce(kafka.bootstrap, "t.ev", 2, start=100)
        with caplog.at_level(logging.WARNING, logger="electra.streaming.kafka_source"):
            end3 = reader.latestOffset(end2, None)
            assert end3["t.ev:0"] == 2
            rows = read_all(reader, end2, end3)
        assert [r[4] for r in rows] == ['{"i":100}', '{"i":101}']
        assert any("went back" in r.message or "below the committed" in r.message for r in caplog.records)
        # A range planned before the restart no longer exists: the read ends early, not at readTimeoutMs.
        t0 = time.monotonic()
        assert list(reader.read(KafkaPartition("t.hb", 0, end2["t.hb:0"], end2["t.hb:0"] + 10, kafka.bootstrap,
                                               30_000))) == []
        assert time.monotonic() - t0 < 10
        # And it goes on normally from there.
        produce(kafka.bootstrap, "t.ev", 1, start=102)
        end4 = reader.latestOffset(end3, None)
        assert [r[4] for r in read_all(reader, end3, end4)] == ['{"i":102}']
        reader.stop()
    finally:
        kafka.stop()


def test_plan_partitions_reset_and_new_partitions():
    parts = plan_partitions({"a:0": 10, "a:1": 5}, {"a:0": 3, "a:1": 5, "b:0": 4}, "x:1", 1000)
    got = {p.value: (p.start, p.end) for p in parts}
    assert got == {"a:0": (0, 3), "b:0": (0, 4)}


def test_fewer_read_tasks_than_partitions_read_every_range():
    parts = plan_partitions({}, {"a:0": 3, "a:1": 5, "b:0": 4}, "x:1", 1000)
    groups = group_partitions(parts, 2)
    assert len(groups) == 2 and sorted(p.value for g in groups for p in g.parts) == ["a:0", "a:1", "b:0"]
    assert group_partitions(parts, 0) == parts and group_partitions(parts, 3) == parts
