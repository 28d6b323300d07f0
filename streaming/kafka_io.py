"""Small Kafka helpers shared by the ingest nodes, the controllers and the streaming job.

`end_offsets()` works around tansu's ListOffsets answer, which reports the base
offset of the last record batch + 1 instead of the high watermark: it seeks to
that offset - 1 and reads the last batch to find the real end. On real Kafka
(`hwm_fix=False`) it is a plain ListOffsets call.
"""

from __future__ import annotations

import contextlib
import logging
import time

from kafka import KafkaConsumer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import TopicAlreadyExistsError

from electra.security.kafka_settings import kafka_client_kwargs

log = logging.getLogger("electra.streaming.kafka_io")


def ensure_topics(bootstrap: str, partitions: dict[str, int], timeout_s: float = 20.0) -> None:
    """Create the topics that do not exist yet (replication 1 on the embedded broker)."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="electra-admin",
                                     request_timeout_ms=5000, **kafka_client_kwargs())
        except Exception as exc:  # broker not up yet
            last = exc
            time.sleep(0.2)
            continue
        try:
            existing = set(admin.list_topics())
            new = [NewTopic(t, n, 1) for t, n in partitions.items() if t not in existing]
            if new:
                with contextlib.suppress(TopicAlreadyExistsError):
                    admin.create_topics(new)
            return
        except Exception as exc:
            last = exc
            time.sleep(0.2)
        finally:
            admin.close()
    raise RuntimeError(f"could not create Kafka topics on {bootstrap}: {last!r}")


def topic_partitions(consumer: KafkaConsumer, topic: str, timeout_s: float = 10.0) -> list[TopicPartition]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        parts = consumer.partitions_for_topic(topic)
        if parts:
            return [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.topics()  # refresh metadata
        time.sleep(0.1)
    raise RuntimeError(f"Kafka topic {topic!r} has no partitions (does it exist?)")


def end_offsets(consumer: KafkaConsumer, tps: list[TopicPartition], hwm_fix: bool = True,
                poll_ms: int = 1000) -> dict[TopicPartition, int]:
    """The real next offset of each partition.

    `consumer` must be a dedicated probe consumer (this assigns and seeks it).
    """
    reported = consumer.end_offsets(tps)
    if not hwm_fix:
        return reported
    begin = consumer.beginning_offsets(tps)
    probe = {tp: max(reported[tp] - 1, begin[tp]) for tp in tps if reported[tp] > begin[tp]}
    out = dict(reported)
    if not probe:
        return out
    consumer.assign(list(probe))
    for tp, off in probe.items():
        consumer.seek(tp, off)
    pending = set(probe)
    deadline = time.monotonic() + poll_ms / 1000
    while pending and time.monotonic() < deadline:
        got = consumer.poll(timeout_ms=100, max_records=100_000)
        for tp, msgs in got.items():
            if msgs:
                out[tp] = max(out[tp], msgs[-1].offset + 1)
                # A fetch from the last batch's base offset returns at least that whole batch, so its last
                # record is at or past the end ListOffsets meant. (Waiting for a fetch that brings nothing
                # more cost the fetch wait, ~100 ms a round, on every micro-batch's latestOffset; records
                # appended since are left for the next batch.)
                pending.discard(tp)
        # A partition whose position passed the probe point without records (compacted or control
        # records only) is done too.
        for tp in list(pending):
            if tp not in got and consumer.position(tp) > probe[tp]:
                pending.discard(tp)
    return out


def last_record(consumer: KafkaConsumer, tp: TopicPartition, hwm_fix: bool = True, poll_ms: int = 2000):
    """The newest record of one partition, or None if it is empty (assigns and seeks `consumer`)."""
    end = end_offsets(consumer, [tp], hwm_fix=hwm_fix)[tp]
    begin = consumer.beginning_offsets([tp])[tp]
    if end <= begin:
        return None
    consumer.assign([tp])
    consumer.seek(tp, end - 1)
    deadline = time.monotonic() + poll_ms / 1000
    last = None
    while time.monotonic() < deadline:
        msgs = consumer.poll(timeout_ms=100, max_records=100_000).get(tp, [])
        if msgs:
            last = msgs[-1]
            if last.offset >= end - 1:
                return last
    if last is None:
        raise RuntimeError(f"could not read the last record of {tp.topic}[{tp.partition}] at offset {end - 1}")
    return last
