"""`kafka_io.end_offsets` against tansu, whose ListOffsets reports the last record batch's base offset + 1:
the probe must give each partition's real end whatever the shape of its last batch (one record, many
records, several batches since the last probe, an empty partition), every time it is asked, because the
streaming job plans each micro-batch's offset ranges from it. The probe stops at the first fetch that
returns the last batch; stopping earlier (at that batch's first record) would cut every range short.
Given the ends it found last time (`known`), it asks with one Fetch request instead, whose high
watermark tansu does report right; that path must give the same ends, and must be the one taken."""

from __future__ import annotations

import contextlib

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from electra.streaming import kafka_io
from electra.streaming.embedded_kafka import EmbeddedKafka
from electra.streaming.kafka_io import end_offsets, ensure_topics

pytestmark = pytest.mark.integration

TOPIC = "probe"


def _produce(producer: KafkaProducer, partition: int, count: int, linger: bool) -> None:
    """`count` records to one partition; with `linger` they travel as one record batch."""
    futures = [producer.send(TOPIC, value=b"x" * 40, partition=partition) for _ in range(count)]
    if not linger:
        for f in futures:
            f.get(timeout=10)
    producer.flush(timeout=10)


ROUNDS = [[(0, 1, False)], [(0, 500, True), (1, 3, False)], [(1, 250, True), (1, 250, True)],
          [(0, 1, False), (1, 1, False)], [(0, 2_000, True), (2, 7, True)]]


@contextlib.contextmanager
def _three_partitions():
    """tansu with a 3-partition topic; yields a probe consumer, the partitions, the ends expected so far and
    `write(round)`, which produces a round of ROUNDS and moves the expected ends."""
    with EmbeddedKafka() as kafka:
        ensure_topics(kafka.bootstrap, {TOPIC: 3})
        batched = KafkaProducer(bootstrap_servers=kafka.bootstrap, linger_ms=50, batch_size=1 << 20)
        single = KafkaProducer(bootstrap_servers=kafka.bootstrap, linger_ms=0)
        probe = KafkaConsumer(bootstrap_servers=kafka.bootstrap, enable_auto_commit=False, fetch_max_wait_ms=100)
        tps = [TopicPartition(TOPIC, p) for p in range(3)]
        expected = {tp: 0 for tp in tps}

        def write(writes: list[tuple[int, int, bool]]) -> None:
            for partition, count, linger in writes:
                _produce(batched if linger else single, partition, count, linger)
                expected[tps[partition]] += count

        try:
            yield probe, tps, expected, write
        finally:
            probe.close()
            batched.close()
            single.close()


def test_the_probe_finds_the_real_end_of_every_partition_after_each_round_of_writes():
    with _three_partitions() as (probe, tps, expected, write):
        # (partition, records, one batch?) per round; partition 2 stays empty until the last round.
        for writes in ROUNDS:
            write(writes)
            for _ in range(2):  # asked twice: the probe's consumer is reused, as by the streaming source
                assert end_offsets(probe, tps) == expected


def test_given_the_last_ends_one_fetch_finds_the_new_ends_and_the_long_way_is_not_taken(monkeypatch):
    with _three_partitions() as (probe, tps, expected, write):
        known = end_offsets(probe, tps)  # the long way: nothing known yet
        assert known == expected
        fast: list[dict] = []
        real = kafka_io.fetch_high_watermarks
        monkeypatch.setattr(kafka_io, "fetch_high_watermarks",
                            lambda *a, **k: fast.append(out := real(*a, **k)) or out)
        monkeypatch.setattr(probe, "end_offsets", lambda *_a, **_k: pytest.fail("took the long way"))
        for writes in ROUNDS:
            write(writes)
            for _ in range(2):
                known = end_offsets(probe, tps, known=known)
                assert known == expected
        assert len(fast) == 2 * len(ROUNDS)


def test_a_known_end_past_the_log_takes_the_long_way():
    """After a tansu restart (memory only) every log starts again at 0: the known ends are past them."""
    with EmbeddedKafka() as kafka:
        ensure_topics(kafka.bootstrap, {TOPIC: 1})
        single = KafkaProducer(bootstrap_servers=kafka.bootstrap, linger_ms=0)
        probe = KafkaConsumer(bootstrap_servers=kafka.bootstrap, enable_auto_commit=False, fetch_max_wait_ms=100)
        tp = TopicPartition(TOPIC, 0)
        try:
            _produce(single, 0, 5, False)
            assert end_offsets(probe, [tp], known={tp: 1_000}) == {tp: 5}
        finally:
            probe.close()
            single.close()
