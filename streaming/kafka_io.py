"""Small Kafka helpers shared by the ingest nodes, the controllers and the streaming job.

`end_offsets()` works around tansu's ListOffsets answer, which reports the base
offset of the last record batch + 1 instead of the high watermark: it seeks to
that offset - 1 and reads the last batch to find the real end. On real Kafka
(`hwm_fix=False`) it is a plain ListOffsets call.

tansu's Fetch answers do carry the real high watermark, so a caller that asks
again and again (the streaming source, every micro-batch) passes the ends it
found last time as `known`: one Fetch request per broker at those offsets
(`fetch_high_watermarks`) then replaces the four round trips above, and any
surprise (an error code, a partition it does not know yet, a client without the
internals it uses) falls back to them.
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

FETCH_WAIT_MS = 10  # the one-fetch probe's wait: what it costs when no partition has anything new


class KafkaUnreachable(RuntimeError):
    """No Kafka broker at the bootstrap address answered within the deadline."""


def ensure_topics(bootstrap: str, partitions: dict[str, int], timeout_s: float = 20.0) -> None:
    """Create the topics that do not exist yet (replication 1 on the embedded broker); KafkaUnreachable when
    no broker answered within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            # Each attempt within the deadline: the client's own bootstrap wait is 30 s, and a node stopping
            # while Kafka is gone waited for it (its thread holds the process's exit).
            wait_ms = int(max(0.5, min(5.0, deadline - time.monotonic())) * 1000)
            admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="electra-admin",
                                     request_timeout_ms=5000, bootstrap_timeout_ms=wait_ms, **kafka_client_kwargs())
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
    raise KafkaUnreachable(f"could not create Kafka topics on {bootstrap} within {timeout_s:g} s: {last!r}")


def topic_partitions(consumer: KafkaConsumer, topic: str, timeout_s: float = 10.0) -> list[TopicPartition]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        parts = consumer.partitions_for_topic(topic)
        if parts:
            return [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.topics()  # refresh metadata
        time.sleep(0.1)
    raise RuntimeError(f"Kafka topic {topic!r} has no partitions (does it exist?)")


def fetch_high_watermarks(consumer: KafkaConsumer, at: dict[TopicPartition, int],
                          timeout_ms: int = 2000) -> dict[TopicPartition, int] | None:
    """Each partition's high watermark from one Fetch request per leader, or None when not all of them came back.

    Fetches at `at` (offsets at or below the end: a fetch past the end is an error, not an answer) with the
    smallest byte limits, so the answer carries at most a batch per partition. tansu answers a fetch with
    no wait with nothing at all, and one where no partition has new records only when its wait is over
    (whatever `min_bytes`), hence the short `FETCH_WAIT_MS`.
    Uses kafka-python 3's client internals (the consumer's connection manager); None on anything
    unexpected, so the caller can take the long way.
    """
    try:
        from kafka.protocol.consumer import FetchRequest

        manager = consumer._fetcher._manager
        by_node: dict[int, list[TopicPartition]] = {}
        for tp in at:
            node = manager.cluster.leader_for_partition(tp)
            if node is None or node < 0:
                return None
            by_node.setdefault(node, []).append(tp)

        async def ask() -> dict[TopicPartition, int]:
            found: dict[TopicPartition, int] = {}
            for node, tps in by_node.items():
                topics: dict[str, list] = {}
                for tp in tps:
                    topics.setdefault(tp.topic, []).append(FetchRequest.FetchTopic.FetchPartition(
                        partition=tp.partition, fetch_offset=at[tp], partition_max_bytes=1))
                request = FetchRequest(max_wait_ms=FETCH_WAIT_MS, min_bytes=0, max_bytes=1, isolation_level=0,
                                       topics=[FetchRequest.FetchTopic(topic=t, partitions=p)
                                               for t, p in topics.items()],
                                       max_version=12)
                response = await manager.wait_for(manager.send(request, node_id=node), timeout_ms)
                for topic in response.responses:
                    for part in topic.partitions:
                        if part.error_code == 0 and part.high_watermark >= 0:
                            found[TopicPartition(topic.topic, part.partition_index)] = part.high_watermark
            return found

        found = manager.run(ask)
    except Exception as exc:  # noqa: BLE001 - internals moved, broker refused: the long way still works
        log.debug("one-fetch high watermarks unavailable: %r", exc, exc_info=True)
        return None
    return found if all(tp in found for tp in at) else None


def end_offsets(consumer: KafkaConsumer, tps: list[TopicPartition], hwm_fix: bool = True,
                poll_ms: int = 1000, known: dict[TopicPartition, int] | None = None) -> dict[TopicPartition, int]:
    """The real next offset of each partition.

    `consumer` must be a dedicated probe consumer (this assigns and seeks it). `known`: ends an earlier
    call returned, for the one-request path (tansu only; partitions missing from it take the long way).
    """
    if hwm_fix and known and all(tp in known for tp in tps):
        fast = fetch_high_watermarks(consumer, {tp: known[tp] for tp in tps})
        if fast is not None and all(fast[tp] >= known[tp] for tp in tps):
            return fast
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
