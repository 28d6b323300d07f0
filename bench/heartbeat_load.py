"""Heartbeat load for `bench stream`: a fleet's heartbeats produced as whole Kafka record batches.

kafka-python's `KafkaProducer.send()` costs ~50 us of Python per record (accumulator, batch
builder, futures, partitioner), so one producer offers ~10,000 heartbeats a second with most of a
core, and `bench stream --sets 10000` needs 30,000 beside the job on 2 cores. Here each round's
records are laid out by partition once, each partition's record batch is built directly with
kafka-python's `DefaultRecordBatchBuilder` (~3 us a record) and sent in Produce requests (v3,
acks=1) pipelined on one connection. The bench's broker is the embedded tansu, a single node, so
every partition's leader is the bootstrap address; this is a load generator for that setup, not a
general producer.
"""

from __future__ import annotations

import socket
import struct

from kafka.partitioner.default import murmur2
from kafka.record.default_records import DefaultRecordBatchBuilder

PRODUCE_KEY, PRODUCE_VERSION = 0, 3
MAX_BATCH_BYTES = 512 << 10  # below Kafka's default max.message.bytes (1 MiB) per record batch


def ingest_group_size(heartbeats_per_s: float, partitions: int, nodes: int = 3) -> int:
    """Heartbeats per Kafka record that `nodes` nodes' ingest workers (`electra up`'s default count each)
    write at this rate: each groups what it gets for a partition within its linger window."""
    from electra.api.ingest import GROUP_LINGER_MS
    from electra.local_stack import StackConfig

    workers = nodes * StackConfig.ingest_workers
    return max(1, round(heartbeats_per_s / (workers * partitions * 1000 / GROUP_LINGER_MS)))


def phase_slices(brokers: list, phases: int, per_set: int) -> list[list]:
    """`brokers` (each set's `per_set` brokers in a row) dealt over `phases` instants of a heartbeat interval: the
    j-th broker of the i-th set at instant (i + j) % phases. Each once, in order within an instant; the sets'
    first brokers (the masters) over every instant, whatever `per_set` is; a set's brokers at different instants
    (as many as there are), as a fleet started at different times beats."""
    slices: list[list] = [[] for _ in range(phases)]
    for k, b in enumerate(brokers):
        slices[(k // per_set + k % per_set) % phases].append(b)
    return slices


def partition_of(key: bytes, partitions: int) -> int:
    """Kafka's default partitioner (murmur2 of the key), as the ingest workers' producers use."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def _str(s: bytes) -> bytes:
    return struct.pack(">h", len(s)) + s


class RoundProducer:
    """Sends rounds of records `(partition, key, value)` to one topic on a single-node Kafka."""

    def __init__(self, bootstrap: str, topic: str, timeout_s: float = 10.0, client_id: bytes = b"bench-load") -> None:
        host, _, port = bootstrap.split(",")[0].rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.topic, self.client_id = topic.encode(), client_id
        self._correlation = 0
        self.errors = 0  # partitions answered with an error code, over all rounds

    def _request(self, parts: dict[int, bytes]) -> int:
        self._correlation += 1
        body = [struct.pack(">hhi", PRODUCE_KEY, PRODUCE_VERSION, self._correlation), _str(self.client_id),
                struct.pack(">hhi", -1, 1, 10_000),  # transactional id null, acks=1, timeout 10 s
                struct.pack(">i", 1), _str(self.topic), struct.pack(">i", len(parts))]
        for p, batch in parts.items():
            body += [struct.pack(">ii", p, len(batch)), batch]
        raw = b"".join(body)
        self.sock.sendall(struct.pack(">i", len(raw)) + raw)
        return self._correlation

    def _recv_exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("Kafka closed the connection")
            buf += chunk
        return bytes(buf)

    def _response_errors(self) -> int:
        (size,) = struct.unpack(">i", self._recv_exact(4))
        data = self._recv_exact(size)
        pos = 4  # correlation id
        errors = 0
        (topics,) = struct.unpack_from(">i", data, pos)
        pos += 4
        for _ in range(topics):
            (n,) = struct.unpack_from(">h", data, pos)
            pos += 2 + n
            (parts,) = struct.unpack_from(">i", data, pos)
            pos += 4
            for _ in range(parts):
                _, code = struct.unpack_from(">ih", data, pos)
                pos += 4 + 2 + 8 + 8  # partition, error code, base offset, log append time
                errors += code != 0
        return errors

    def send_round(self, records: list[tuple[int, bytes | None, bytes]], ts_ms: int) -> int:
        """Produce `records` (in order per partition), all stamped `ts_ms`; returns partitions that failed."""
        batches: list[dict[int, bytes]] = []
        builders: dict[int, tuple[DefaultRecordBatchBuilder, list[int]]] = {}

        def close(p: int) -> None:
            b, _ = builders.pop(p)
            for req in batches:  # one batch per partition per request (Produce v3+ rule)
                if p not in req:
                    req[p] = bytes(b.build())
                    return
            batches.append({p: bytes(b.build())})

        for p, key, value in records:
            entry = builders.get(p)
            if entry is None:
                entry = builders[p] = (DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 30), [0, 0])
            b, count = entry
            b.append(count[0], ts_ms, key, value, [])
            count[0] += 1
            count[1] += len(key or b"") + len(value) + 24
            if count[1] >= MAX_BATCH_BYTES:
                close(p)
        for p in list(builders):
            close(p)
        for req in batches:
            self._request(req)
        failed = sum(self._response_errors() for _ in batches)
        self.errors += failed
        return failed

    def close(self) -> None:
        self.sock.close()
