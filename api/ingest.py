"""Heartbeat ingestion: validate → produce to Kafka (the producer and the request logic).

Heartbeats are the bulk of a controller's traffic (every broker, every second), and
none of them needs Raft: they only feed the streaming job's liveness state. So they
are served by separate worker processes sharing one port (`ingest_server.py`), each
with its own Kafka producer, and scale with cores independently of the Raft process.
A request is: parse, `records.validate_heartbeat`, stamp with this node's clock, and
hand it to the producer for its broker set's partition. The producer groups what it
gets for one partition within its linger window into one Kafka record
(`records.heartbeat_group`): kafka-python costs about 100 µs per record sent, more than
the rest of a heartbeat's handling. A `disconnected` record is sent at once, with the
heartbeats of its partition before it. The node's own FastAPI `/v1/heartbeat` uses the
same `handle_heartbeat` when the pipeline is on.

Answers: 200 once the producer accepted the heartbeat into its group (delivery is
asynchronous; a lost heartbeat is replaced by the next one a second later); 422
for an invalid heartbeat, naming the field; 503 with Retry-After while Kafka is
unreachable. Unreachable means: no producer could be created yet, a
buffer is full, the topic's partitions are not known within `max_block_ms`, or
the last delivery failed. While unreachable, one request per second is still
sent as a probe and the first delivery that succeeds closes the circuit again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Annotated, Any

import msgspec
from kafka.partitioner.default import murmur2

from electra.security.kafka_settings import kafka_client_kwargs
from electra.state.limits import INT64_MAX, MAX_BROKER_ID
from electra.streaming import records

from .invalid import invalid_body_field, invalid_request

log = logging.getLogger("electra.api.ingest")


class KafkaUnavailable(RuntimeError):
    pass


LANE_QUEUE_MAX = 10_000  # session records waiting for the liveness topic (a mass disconnect fits)
GROUP_LINGER_MS = 20  # how long a partition's group waits for more heartbeats (kafka-python's linger before)


class HeartbeatProducer:
    """One kafka-python producer with a circuit breaker around delivery failures, grouping heartbeats per
    partition: what arrives for one partition within `linger_ms` goes out as one record (at most
    `group_bytes`; a `disconnected` record goes at once)."""

    def __init__(self, bootstrap: str, topic: str = records.HEARTBEATS, *, linger_ms: int = GROUP_LINGER_MS,
                 delivery_timeout_ms: int = 5000, group_bytes: int = records.HEARTBEAT_GROUP_BYTES,
                 clock: Callable[[], float] = time.time, liveness_topic: str | None = None) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        # where a `disconnected` record also goes, for the controllers' connection-loss lane (None: not sent)
        self.liveness_topic = liveness_topic
        self.linger_ms = linger_ms
        self.delivery_timeout_ms = delivery_timeout_ms
        self.group_bytes = group_bytes
        self.clock = clock
        self.stats = {"accepted": 0, "invalid": 0, "unavailable": 0, "delivered": 0, "delivery_errors": 0,
                      "records_sent": 0, "dropped": 0, "to_liveness": 0, "not_to_liveness": 0}
        self._producer = None
        self._healthy = False
        self._last_probe = 0.0
        self._partitions: dict[bytes, int] = {}
        self._partition_count = 0
        self._closed = False
        self._groups: dict[int, list[bytes]] = {}  # partition -> accepted records not yet sent, in order
        self._group_bytes: dict[int, int] = {}
        # Groups are filled under `_lock` (held only for that) and handed to the producer by one thread, the
        # flusher, under `_send_lock`: a Kafka that stalls blocks each `send()` up to `max_block_ms`, and no
        # request may wait on that. One sender keeps a partition's groups in order.
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._ready: list[tuple[int, list[bytes]]] = []  # groups to send now (full, or holding a `now` record)
        self._pending = threading.Event()  # set while a group waits for its linger window
        self._urgent = threading.Event()  # set when `_ready` holds a group: the flusher sends it without lingering
        self._connector = threading.Thread(target=self._connect_loop, name="kafka-connect", daemon=True)
        self._flusher = threading.Thread(target=self._flush_loop, name="heartbeat-groups", daemon=True)
        self._lane_out: list[tuple[bytes, bytes]] = []  # session records for the liveness topic (`to_liveness`)
        self._lane_ready = threading.Event()
        self._lane_warned = 0.0
        self._lane = threading.Thread(target=self._lane_loop, name="liveness-copies", daemon=True)

    def start(self) -> HeartbeatProducer:
        self._connector.start()
        self._flusher.start()
        if self.liveness_topic is not None:
            self._lane.start()
        return self

    def _connect_loop(self) -> None:
        from kafka import KafkaProducer

        delay = 0.2
        while not self._closed and self._producer is None:
            try:
                self._producer = KafkaProducer(  # groups waited `linger_ms` already: the producer lingers 1 ms
                    bootstrap_servers=self.bootstrap, client_id=f"electra-ingest-{os.getpid()}", acks=1,
                    enable_idempotence=False, max_request_size=2 * self.group_bytes + (64 << 10),
                    linger_ms=1, batch_size=2 * self.group_bytes, max_block_ms=50, metrics_enabled=False,
                    delivery_timeout_ms=self.delivery_timeout_ms,
                    request_timeout_ms=min(3000, self.delivery_timeout_ms - 1),
                    retries=3, **kafka_client_kwargs())
                self._healthy = True
                log.info("ingest worker %d producing heartbeats to %s on %s", os.getpid(), self.topic, self.bootstrap)
                if self.liveness_topic is not None:  # its metadata now, not at the first session record
                    with contextlib.suppress(Exception):
                        self._producer.partitions_for(self.liveness_topic)
            except Exception as exc:
                log.warning("Kafka at %s unreachable (%s); retrying in %.1fs", self.bootstrap, exc, delay)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    @property
    def healthy(self) -> bool:
        return self._producer is not None and self._healthy

    def _on_delivered(self, count: int) -> None:
        self.stats["delivered"] += count
        if not self._healthy:
            log.info("Kafka deliveries succeed again; accepting heartbeats")
        self._healthy = True

    def _on_error(self, exc) -> None:
        self.stats["delivery_errors"] += 1
        if self._healthy:
            log.warning("heartbeat delivery to Kafka failed (%s); answering 503 until a probe succeeds", exc)
        self._healthy = False

    def submit(self, hb: dict) -> None:
        """Hand one validated heartbeat (or `disconnected` record: sent at once) to the producer;
        KafkaUnavailable if Kafka is not reachable."""
        self.submit_encoded(hb["brokerName"].encode(), records.encode(hb), now=records.is_disconnected(hb))

    def to_liveness(self, record: dict) -> None:
        """A session's `connected` or `disconnected` record, to the liveness topic too: the controllers'
        connection-loss lane reads it there within milliseconds (api/connection_loss.py). Sent by a thread of
        its own, so a topic whose metadata is missing blocks no event loop. Best effort: the heartbeats
        topic's copy still reaches the job, which fails a crashed master over a micro-batch later."""
        if self.liveness_topic is None or self._closed:
            return
        with self._lock:
            if len(self._lane_out) >= LANE_QUEUE_MAX:  # Kafka stalled: the job's copy remains
                self._lane_lost("the liveness copies' queue is full")
                return
            self._lane_out.append((record["brokerName"].encode(), records.encode(record)))
        self._lane_ready.set()

    def _lane_loop(self) -> None:
        while not self._closed:
            if not self._lane_ready.wait(timeout=1.0):  # bounded: a closed producer's thread ends within 1 s
                continue
            with self._lock:
                out, self._lane_out = self._lane_out, []
                self._lane_ready.clear()
            producer = self._producer
            for key, value in out:
                if producer is None:
                    self._lane_lost("not connected to Kafka yet")
                    continue
                try:
                    fut = producer.send(self.liveness_topic, key=key, value=value)
                except Exception as exc:  # buffer full, metadata unavailable, ...
                    self._lane_lost(exc)
                    continue
                fut.add_callback(lambda _meta: self._count("to_liveness"))
                fut.add_errback(self._lane_lost)

    def _count(self, stat: str) -> None:
        self.stats[stat] += 1

    def _lane_lost(self, exc: object) -> None:
        self.stats["not_to_liveness"] += 1
        now = time.monotonic()
        if now - self._lane_warned >= 30:  # rate-limited: a missing topic fails every record
            self._lane_warned = now
            log.warning("a session record did not reach the liveness topic %s (%s): the streaming job fails "
                        "crashed masters over instead, a micro-batch later", self.liveness_topic, exc)

    def submit_encoded(self, key: bytes, value: bytes, *, now: bool = False) -> None:
        """`submit` for a record already encoded (`value`), of the broker set named `key`. `now`: send its
        partition's group at once instead of at the end of the linger window."""
        producer = self._producer
        if producer is None:
            self.stats["unavailable"] += 1
            raise KafkaUnavailable("not connected to Kafka yet")
        probe = False
        if not self._healthy:
            instant = time.monotonic()
            if instant - self._last_probe < 1.0:
                self.stats["unavailable"] += 1
                raise KafkaUnavailable("Kafka deliveries are failing")
            # Half-open: this record goes to Kafka as a probe, and its sender is still told 503. Its delivery is
            # as unknown as the ones that failed, so a 200 would promise what the circuit cannot; a broker beating
            # once a second to this node alone would have been told 200 throughout an outage.
            self._last_probe = instant
            probe = True
        self._queue(key, value, now)
        if probe:
            self.stats["unavailable"] += 1
            raise KafkaUnavailable("Kafka deliveries are failing (this record was sent as a probe)")
        self.stats["accepted"] += 1

    def _queue(self, key: bytes, value: bytes, now: bool) -> None:
        """Into its partition's group (sent at once with `now`, or when full); KafkaUnavailable if `send` fails."""
        producer = self._producer
        try:
            part = self._partition(key)
        except Exception as exc:  # the topic's partitions not known within max_block_ms (KafkaTimeoutError: a new
            # topic, auto-create off, a slow metadata round trip), the topic not authorized, ...: as a failed send.
            # Not sent without a partition: such a record would overtake its set's heartbeats waiting in a group.
            self.stats["unavailable"] += 1
            self._on_error(exc)
            raise KafkaUnavailable(f"partitions of {self.topic} unknown: {exc}") from None
        if part is None:  # no topic metadata yet: one record, and the producer says what is wrong
            try:
                fut = producer.send(self.topic, key=key, value=value)
            except Exception as exc:  # buffer full (KafkaTimeoutError), metadata unavailable, ...
                self.stats["unavailable"] += 1
                self._on_error(exc)
                raise KafkaUnavailable(str(exc)) from None
            fut.add_callback(lambda _meta: self._on_delivered(1))
            fut.add_errback(self._on_error)
            return
        with self._lock:  # held while a group is handed to the producer: a partition's groups stay in order
            group = self._groups.get(part)
            if group is None:
                group = self._groups[part] = []
                self._group_bytes[part] = 0
                self._pending.set()
            group.append(value)
            self._group_bytes[part] += len(value) + 1
            if now or self._group_bytes[part] >= self.group_bytes:
                del self._group_bytes[part]
                self._ready.append((part, self._groups.pop(part)))
                self._urgent.set()

    def flush_groups(self) -> None:
        """Send every waiting group now: the ready ones first, then the lingering ones (their successors)."""
        with self._send_lock:
            with self._lock:
                ready, self._ready = self._ready, []
                groups, self._groups, self._group_bytes = self._groups, {}, {}
                self._pending.clear()
                self._urgent.clear()
            for part, group in ready:
                self._send_group(part, group)
            for part, group in groups.items():
                self._send_group(part, group)

    def _send_ready(self) -> None:
        with self._send_lock:
            with self._lock:
                ready, self._ready = self._ready, []
                self._urgent.clear()
            for part, group in ready:
                self._send_group(part, group)

    def _flush_loop(self) -> None:
        linger = self.linger_ms / 1000
        while not self._closed:
            if not self._urgent.is_set() and not self._pending.wait(timeout=1.0):
                continue  # bounded: a closed producer's thread ends within 1 s
            # The linger window (what else arrives meanwhile joins the groups); a ready group goes at once.
            deadline = time.monotonic() + linger
            while not self._closed and (left := deadline - time.monotonic()) > 0:
                if self._urgent.wait(timeout=left):
                    self._send_ready()
            self.flush_groups()

    def _send_group(self, part: int, group: list[bytes]) -> None:
        producer, count = self._producer, len(group)
        try:
            fut = producer.send(self.topic, value=records.heartbeat_group(group), partition=part)
        except Exception as exc:  # buffer full (KafkaTimeoutError), ...: these heartbeats are lost
            self.stats["dropped"] += count
            self._on_error(exc)
            return
        self.stats["records_sent"] += 1
        fut.add_callback(lambda _meta: self._on_delivered(count))
        fut.add_errback(self._on_error)

    def _partition(self, key: bytes) -> int | None:
        """Kafka's default partition for `key` (murmur2, as the Java client), cached per broker set.

        kafka-python's partitioner costs more than the rest of `send()` together; broker set
        names repeat every second, so the answer is computed once per set.
        """
        part = self._partitions.get(key)
        if part is None:
            n = len(self._producer.partitions_for(self.topic) or ())
            if not n:
                return None  # let the producer decide (and fail clearly) while metadata is missing
            if n != self._partition_count:
                self._partitions.clear()
                self._partition_count = n
            part = self._partitions[key] = (murmur2(key) & 0x7FFFFFFF) % n
        return part

    def close(self, timeout: float = 5.0) -> None:
        self._closed = True
        self._pending.set()  # the flusher thread ends
        self._urgent.set()
        if self._producer is not None:
            self.flush_groups()
            try:
                self._producer.close(timeout=timeout)
            except Exception:
                log.exception("closing the Kafka producer failed")


_OK = json.dumps({"code": 0, "remark": "Heart beat success"}).encode()


def _body(status: int, payload: dict) -> tuple[int, bytes]:
    return status, json.dumps(payload).encode()


def _wire_heartbeat() -> type[msgspec.Struct]:
    """A msgspec Struct accepting exactly the heartbeats `records.validate_heartbeat` accepts, or fewer.

    Its fields, in the order of `validate_heartbeat`'s result, carry the same limits (names of 1-255 characters
    of the name rule, addresses of 1-255 without control characters, JSON integers (not bools, nor the decimal
    text and integral floats the slow way also reads), RocketMQ's ranges, an optional `ts` that may not be
    null). What it refuses goes the slow way (`validate_heartbeat`), which reads it or names the problem;
    tests/unit/test_ingest_fast_path.py holds the two to the same results.
    """
    def integer(lo: int, hi: int) -> Any:
        return Annotated[int, msgspec.Meta(ge=lo, le=hi)]

    fields: list[tuple] = [("clusterName", records.NameField), ("brokerName", records.NameField),
                           ("brokerAddr", records.AddrField), ("brokerId", integer(1, MAX_BROKER_ID))]
    fields += [(k, integer(lo, hi), default) for k, (default, lo, hi) in records.HEARTBEAT_INT_FIELDS.items()]
    fields.append(("ts", integer(1, INT64_MAX) | msgspec.UnsetType, msgspec.UNSET))
    return msgspec.defstruct("WireHeartbeat", fields, forbid_unknown_fields=False)


WireHeartbeat = _wire_heartbeat()
_decode_wire = msgspec.json.Decoder(WireHeartbeat).decode
_encode_wire = msgspec.json.Encoder().encode


def fast_heartbeat(raw: bytes) -> msgspec.Struct | None:
    """A valid heartbeat body decoded and checked in C (msgspec), or None: then take the slow way."""
    try:
        hb = _decode_wire(raw)
    # (msgspec recurses on nesting, and raises UnicodeDecodeError for bytes that are not UTF-8)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        return None
    return hb if records.names_ok(hb) else None


def accept_fast(producer: HeartbeatProducer, hb: msgspec.Struct, now_ms: int) -> tuple[int, bytes]:
    """`handle_heartbeat` for a `fast_heartbeat`: stamped with `ts` and produced as it was decoded."""
    hb.ts = now_ms
    try:
        producer.submit_encoded(hb.brokerName.encode(), _encode_wire(hb))
    except KafkaUnavailable as exc:
        return _body(503, {"code": 1, "remark": f"heartbeat not accepted: Kafka unavailable ({exc})"})
    return 200, _OK


def decode_body(raw: bytes) -> Any:
    """A request body's JSON; InvalidHeartbeat if it is not JSON."""
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:  # (UnicodeDecodeError is a ValueError)
        raise records.InvalidHeartbeat(f"body: invalid JSON ({exc})") from None


def parse_heartbeat(raw: bytes) -> dict:
    """A request body as a validated heartbeat (records.validate_heartbeat); InvalidHeartbeat names the problem."""
    return validate_for_kafka(decode_body(raw))


def validate_for_kafka(decoded: Any) -> dict:
    """`records.validate_heartbeat`, and text UTF-8 can carry: Python's json decodes a lone surrogate escape
    (`"\\ud800"`), which no Kafka key or record can hold (the key's encode raised inside the HTTP parser's
    callback: a 400 that dropped a broker's session). The job keeps taking such records (the rule is the
    ingest's, so records already in the topic keep their meaning); the fast path's msgspec refuses them."""
    hb = records.validate_heartbeat(decoded)
    for key in ("clusterName", "brokerName", "brokerAddr"):
        try:
            hb[key].encode()
        except UnicodeEncodeError:
            raise records.InvalidHeartbeat(f"{key}: text that UTF-8 cannot carry (a lone surrogate)") from None
    return hb


def handle_heartbeat(producer: HeartbeatProducer, raw: bytes | records.InvalidHeartbeat | Any, now_ms: int, *,
                     decoded: bool = False) -> tuple[int, bytes, dict | None]:
    """The whole request logic, free of HTTP plumbing (also used by the controller node's own endpoint).

    With `decoded`, `raw` is the body's JSON already decoded (or the InvalidHeartbeat decoding raised):
    the ingest server decodes a body once for its credential check and for this. Returns the status, the
    body and the heartbeat as validated (None if it was not valid): its integers are ints whether the body
    wrote them `2`, `"2"` or `2.0`, its defaults filled in, so a caller reads it, never the body's JSON."""
    try:
        if not decoded:
            hb = parse_heartbeat(raw)
        elif isinstance(raw, records.InvalidHeartbeat):
            raise raw
        else:
            hb = validate_for_kafka(raw)
    except records.InvalidHeartbeat as exc:
        producer.stats["invalid"] += 1
        return (*_body(422, invalid_request([invalid_body_field(str(exc))])), None)
    hb["ts"] = now_ms
    try:
        producer.submit(hb)
    except KafkaUnavailable as exc:
        return (*_body(503, {"code": 1, "remark": f"heartbeat not accepted: Kafka unavailable ({exc})"}), hb)
    return 200, _OK, hb
