"""Heartbeat ingestion: validate → produce to Kafka (the producer and the request logic).

Heartbeats are the bulk of a controller's traffic (every broker, every second), and
none of them needs Raft: they only feed the streaming job's liveness state. So they
are served by separate worker processes sharing one port (`ingest_server.py`), each
with its own Kafka producer, and scale with cores independently of the Raft process.
A request is: parse, `records.validate_heartbeat`, stamp with this node's clock,
`producer.send` keyed by broker set. The node's own FastAPI `/v1/heartbeat` uses the
same `handle_heartbeat` when the pipeline is on.

Answers: 200 once the producer accepted the record into its buffer (delivery is
asynchronous; a lost heartbeat is replaced by the next one a second later); 422
for an invalid heartbeat, naming the field; 503 with Retry-After while Kafka is
unreachable. Unreachable means: no producer could be created yet, no
buffer is full, or the last delivery failed. While unreachable, one request per
second is still sent as a probe and the first delivery that succeeds closes the
circuit again.
"""

from __future__ import annotations

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

log = logging.getLogger("electra.api.ingest")


class KafkaUnavailable(RuntimeError):
    pass


class HeartbeatProducer:
    """One kafka-python producer with a circuit breaker around delivery failures."""

    def __init__(self, bootstrap: str, topic: str = records.HEARTBEATS, *, linger_ms: int = 20,
                 delivery_timeout_ms: int = 5000,
                 clock: Callable[[], float] = time.time) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.linger_ms = linger_ms
        self.delivery_timeout_ms = delivery_timeout_ms
        self.clock = clock
        self.stats = {"accepted": 0, "invalid": 0, "unavailable": 0, "delivered": 0, "delivery_errors": 0}
        self._producer = None
        self._healthy = False
        self._last_probe = 0.0
        self._partitions: dict[bytes, int] = {}
        self._partition_count = 0
        self._closed = False
        self._connector = threading.Thread(target=self._connect_loop, name="kafka-connect", daemon=True)

    def start(self) -> HeartbeatProducer:
        self._connector.start()
        return self

    def _connect_loop(self) -> None:
        from kafka import KafkaProducer

        delay = 0.2
        while not self._closed and self._producer is None:
            try:
                self._producer = KafkaProducer(
                    bootstrap_servers=self.bootstrap, client_id=f"electra-ingest-{os.getpid()}", acks=1,
                    enable_idempotence=False,
                    linger_ms=self.linger_ms, batch_size=256 << 10, max_block_ms=50, metrics_enabled=False,
                    delivery_timeout_ms=self.delivery_timeout_ms,
                    request_timeout_ms=min(3000, self.delivery_timeout_ms - 1),
                    retries=3, **kafka_client_kwargs())
                self._healthy = True
                log.info("ingest worker %d producing heartbeats to %s on %s", os.getpid(), self.topic, self.bootstrap)
            except Exception as exc:
                log.warning("Kafka at %s unreachable (%s); retrying in %.1fs", self.bootstrap, exc, delay)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    @property
    def healthy(self) -> bool:
        return self._producer is not None and self._healthy

    def _on_delivered(self, _meta) -> None:
        self.stats["delivered"] += 1
        if not self._healthy:
            log.info("Kafka deliveries succeed again; accepting heartbeats")
        self._healthy = True

    def _on_error(self, exc) -> None:
        self.stats["delivery_errors"] += 1
        if self._healthy:
            log.warning("heartbeat delivery to Kafka failed (%s); answering 503 until a probe succeeds", exc)
        self._healthy = False

    def submit(self, hb: dict) -> None:
        """Hand one validated heartbeat to the producer; KafkaUnavailable if Kafka is not reachable."""
        self.submit_encoded(hb["brokerName"].encode(), records.encode(hb))

    def submit_encoded(self, key: bytes, value: bytes) -> None:
        """`submit` for a record already encoded (`value`), keyed by its broker set's name (`key`)."""
        producer = self._producer
        if producer is None:
            self.stats["unavailable"] += 1
            raise KafkaUnavailable("not connected to Kafka yet")
        if not self._healthy:
            now = time.monotonic()
            if now - self._last_probe < 1.0:
                self.stats["unavailable"] += 1
                raise KafkaUnavailable("Kafka deliveries are failing")
            self._last_probe = now  # half-open: this one goes through as a probe
        try:
            fut = producer.send(self.topic, key=key, value=value, partition=self._partition(key))
        except Exception as exc:  # buffer full (KafkaTimeoutError), metadata unavailable, ...
            self.stats["unavailable"] += 1
            self._on_error(exc)
            raise KafkaUnavailable(str(exc)) from None
        fut.add_callback(self._on_delivered)
        fut.add_errback(self._on_error)
        self.stats["accepted"] += 1

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
        if self._producer is not None:
            try:
                self._producer.close(timeout=timeout)
            except Exception:
                log.exception("closing the Kafka producer failed")


_OK = json.dumps({"code": 0, "remark": "Heart beat success"}).encode()


def _body(status: int, payload: dict) -> tuple[int, bytes]:
    return status, json.dumps(payload).encode()


def _wire_heartbeat() -> type[msgspec.Struct]:
    """A msgspec Struct accepting exactly the heartbeats `records.validate_heartbeat` accepts, or fewer.

    Its fields, in the order of `validate_heartbeat`'s result, carry the same limits (names and
    addresses of 1-255 characters, integers that are not bools nor floats, RocketMQ's ranges, an
    optional `ts` that may not be null). What it refuses goes the slow way (`validate_heartbeat`),
    which names the problem; tests/unit/test_ingest_fast_path.py holds the two to the same results.
    """
    def text(most: int) -> Any:
        return Annotated[str, msgspec.Meta(min_length=1, max_length=most)]

    def integer(lo: int, hi: int) -> Any:
        return Annotated[int, msgspec.Meta(ge=lo, le=hi)]

    fields: list[tuple] = [("clusterName", text(records.MAX_NAME)), ("brokerName", text(records.MAX_NAME)),
                           ("brokerAddr", text(records.MAX_ADDR)), ("brokerId", integer(1, MAX_BROKER_ID))]
    fields += [(k, integer(lo, hi), default) for k, (default, lo, hi) in records.HEARTBEAT_INT_FIELDS.items()]
    fields.append(("ts", integer(1, INT64_MAX) | msgspec.UnsetType, msgspec.UNSET))
    return msgspec.defstruct("WireHeartbeat", fields, forbid_unknown_fields=False)


WireHeartbeat = _wire_heartbeat()
_decode_wire = msgspec.json.Decoder(WireHeartbeat).decode
_encode_wire = msgspec.json.Encoder().encode


def fast_heartbeat(raw: bytes) -> msgspec.Struct | None:
    """A valid heartbeat body decoded and checked in C (msgspec), or None: then take the slow way."""
    try:
        return _decode_wire(raw)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None


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
    except (ValueError, UnicodeDecodeError) as exc:
        raise records.InvalidHeartbeat(f"body: invalid JSON ({exc})") from None


def parse_heartbeat(raw: bytes) -> dict:
    """A request body as a validated heartbeat (records.validate_heartbeat); InvalidHeartbeat names the problem."""
    return records.validate_heartbeat(decode_body(raw))


def handle_heartbeat(producer: HeartbeatProducer, raw: bytes | records.InvalidHeartbeat | Any, now_ms: int, *,
                     decoded: bool = False) -> tuple[int, bytes]:
    """The whole request logic, free of HTTP plumbing (also used by the controller node's own endpoint).

    With `decoded`, `raw` is the body's JSON already decoded (or the InvalidHeartbeat decoding raised):
    the ingest server decodes a body once for its credential check and for this."""
    try:
        if not decoded:
            hb = parse_heartbeat(raw)
        elif isinstance(raw, records.InvalidHeartbeat):
            raise raw
        else:
            hb = records.validate_heartbeat(raw)
    except records.InvalidHeartbeat as exc:
        producer.stats["invalid"] += 1
        return _body(422, {"code": 2005, "remark": "invalid heartbeat", "detail": str(exc)})
    hb["ts"] = now_ms
    try:
        producer.submit(hb)
    except KafkaUnavailable as exc:
        return _body(503, {"code": 1, "remark": f"heartbeat not accepted: Kafka unavailable ({exc})"})
    return 200, _OK
