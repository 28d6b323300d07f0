"""The records that cross Kafka between the ingest nodes, the streaming job and the controllers.

One place defines every topic's key and value, so producers and consumers cannot
drift apart. Values are JSON objects (UTF-8); keys are the broker set's name, so
every record of one broker set lands in one partition of its topic (except
liveness records, which hold many sets and have no key).

* heartbeats (`electra.heartbeats`, several partitions): broker heartbeats as
  accepted by an ingest node, stamped with the ingest clock `ts`, and a
  `disconnected` record (`"type": "disconnected"`) when a broker's session
  connection ends (docs/failover-signal.md). An ingest node groups what it accepts
  for one partition within its linger window into one record (`heartbeat_group`:
  `{"heartbeats": [...]}`, no key, the partition of the sets' keys): kafka-python
  costs about 100 µs per record sent and 13-16 µs per record read, so one record
  per heartbeat was most of an ingest worker's CPU and of the job's read task.
  Readers also accept one heartbeat per record (`heartbeat_group_items` is None),
  the form of earlier versions and of hand-made records.
* events (`electra.events`, one partition, so one global order): one record per
  applied state-machine event, with its Raft index and term and the broker
  set's resulting state; `Resync` records carry a set's state when the publisher
  could not replay the events in between (see docs/heartbeat-pipeline.md).
* liveness (`electra.liveness`): the streaming job's view of each set's brokers,
  the latest heartbeat of each, which controller nodes consume for broker- and
  admin-triggered requests. One record holds many sets (`liveness_records`:
  `{"sets": [...]}`, no key): the job refreshes every set with heartbeats every
  micro-batch, and one Kafka record per set cost the job's driver ~100 µs each
  in kafka-python (and every node a consumer record each). Consumers also
  accept the one-set form of earlier versions (`liveness_sets`). Each record also
  states the job's disconnect grace (`"disconnectGraceMs"`), and an ingest node
  writes each session's opening heartbeat (`"type": "connected"`) and end (the
  `disconnected` record) here too, keyed by its set: the controllers' connection-loss
  lane (api/connection_loss.py) acts on them without waiting for a micro-batch.
* dead letters (`electra.heartbeats.dlq`): records the job could not parse.
* job stats (`electra.job-stats`, one partition): one record per micro-batch of the
  streaming job (`streaming/job_stats.py`), read by the controllers' dashboards.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec

from electra.state.limits import (
    ADDRESS_PATTERN,
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    MAX_BROKER_ID,
    as_java_integer,
    check_int,
    is_name,
    printable,
)

HEARTBEATS = "electra.heartbeats"
EVENTS = "electra.events"
LIVENESS = "electra.liveness"
DEAD_LETTERS = "electra.heartbeats.dlq"
JOB_STATS = "electra.job-stats"
DEFAULT_PARTITIONS = {HEARTBEATS: 4, EVENTS: 1, LIVENESS: 4, DEAD_LETTERS: 1, JOB_STATS: 1}

MAX_NAME = 255
MAX_ADDR = 255
MIN_TIMEOUT_MS, MAX_TIMEOUT_MS = 100, 3_600_000
LOWEST_PRIORITY = 2**31 - 1


def is_topic_name(name: str) -> bool:
    """Kafka's rule for a topic name: 1-249 of A-Z a-z 0-9 . _ -"""
    return 0 < len(name) < 250 and all(c.isascii() and (c.isalnum() or c in "._-") for c in name)


@dataclass(frozen=True)
class Topics:
    """Topic names; a deployment may prefix them (several Electra clusters on one Kafka)."""

    heartbeats: str = HEARTBEATS
    events: str = EVENTS
    liveness: str = LIVENESS
    dead_letters: str = DEAD_LETTERS
    job_stats: str = JOB_STATS

    @staticmethod
    def prefixed(prefix: str) -> Topics:
        return Topics(*(prefix + t for t in (HEARTBEATS, EVENTS, LIVENESS, DEAD_LETTERS, JOB_STATS)))

    def partitions(self) -> dict[str, int]:
        return {self.heartbeats: DEFAULT_PARTITIONS[HEARTBEATS], self.events: 1,
                self.liveness: DEFAULT_PARTITIONS[LIVENESS], self.dead_letters: 1, self.job_stats: 1}


class InvalidHeartbeat(ValueError):
    """A heartbeat that must not enter the pipeline; the message names the field."""


# field -> (default, lowest, highest): RocketMQ's Java types (epoch and priority int, offsets long).
_HB_INT_FIELDS = {"epoch": (-1, INT32_MIN, INT32_MAX), "maxOffset": (-1, INT64_MIN, INT64_MAX),
                  "confirmOffset": (-1, INT64_MIN, INT64_MAX),
                  "heartbeatTimeoutMillis": (10_000, MIN_TIMEOUT_MS, MAX_TIMEOUT_MS),
                  "electionPriority": (LOWEST_PRIORITY, INT32_MIN, INT32_MAX)}


HEARTBEAT_INT_FIELDS = _HB_INT_FIELDS  # public: the ingest server's C fast path has the same limits


def _name(d: dict, key: str) -> str:
    v = d.get(key)
    if not isinstance(v, str) or not (1 <= len(v) <= MAX_NAME) or not is_name(v):
        raise InvalidHeartbeat(f"{key}: a name of 1-{MAX_NAME} letters, digits and `_.:%-` is required (not . or ..)")
    return v


def _addr(d: dict) -> str:
    v = d.get("brokerAddr")
    if not isinstance(v, str) or not (1 <= len(v) <= MAX_ADDR) or not printable(v):
        raise InvalidHeartbeat(f"brokerAddr: a string of 1-{MAX_ADDR} printable characters is required")
    return v


def validate_heartbeat(d: Any) -> dict:
    """The canonical heartbeat dict (defaults filled in, ints checked), or InvalidHeartbeat.

    Used by the ingest endpoint (422 on failure) and by the streaming job (dead letter
    on failure), so both accept exactly the same records.
    """
    if not isinstance(d, dict):
        raise InvalidHeartbeat("body: a JSON object is required")
    out: dict[str, Any] = {"clusterName": _name(d, "clusterName"), "brokerName": _name(d, "brokerName")}
    out["brokerAddr"] = _addr(d)
    try:  # integers read as the node's API reads them ("2" and 2.0 are 2), so a broker gets one verdict from both
        out["brokerId"] = check_int("brokerId", as_java_integer(d.get("brokerId")), 1, MAX_BROKER_ID)
        for key, (default, lo, hi) in _HB_INT_FIELDS.items():
            out[key] = check_int(key, as_java_integer(d.get(key, default)), lo, hi)
        if "ts" in d:
            out["ts"] = check_int("ts", d["ts"], 1, INT64_MAX)
    except ValueError as exc:
        raise InvalidHeartbeat(str(exc)) from None
    return out


# A name's length; its rule (NAME_PATTERN) is checked after decoding, by `names_ok` (a cached `is_name`): as a
# msgspec pattern it ran Python's regex for every name of every heartbeat, ~1.4 µs each.
NameField = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_NAME)]


def names_ok(hb: Any) -> bool:
    """Whether a decoded heartbeat's cluster and broker-set names follow the name rule."""
    return is_name(hb.clusterName) and is_name(hb.brokerName)


# (msgspec searches with Python's re, where `$` also matches before a final newline: `\Z` is the end)
AddrField = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ADDR, pattern=ADDRESS_PATTERN[:-1] + r"\Z")]
_I32 = Annotated[int, msgspec.Meta(ge=INT32_MIN, le=INT32_MAX)]
_I64 = Annotated[int, msgspec.Meta(ge=INT64_MIN, le=INT64_MAX)]


class _WireHeartbeat(msgspec.Struct):
    """`validate_heartbeat`'s rule as a type, so msgspec checks it while it decodes (no dict, no Python loop)."""

    clusterName: NameField
    brokerName: NameField
    brokerAddr: AddrField
    brokerId: Annotated[int, msgspec.Meta(ge=1, le=MAX_BROKER_ID)]
    epoch: _I32 = -1
    maxOffset: _I64 = -1
    confirmOffset: _I64 = -1
    heartbeatTimeoutMillis: Annotated[int, msgspec.Meta(ge=MIN_TIMEOUT_MS, le=MAX_TIMEOUT_MS)] = 10_000
    electionPriority: _I32 = LOWEST_PRIORITY
    ts: Annotated[int, msgspec.Meta(ge=1, le=INT64_MAX)] | msgspec.UnsetType = msgspec.UNSET


_HEARTBEAT_DECODER = msgspec.json.Decoder(_WireHeartbeat)


def fast_heartbeat(raw: bytes | str) -> dict | None:
    """The canonical heartbeat of one raw JSON value, exactly as `validate_heartbeat(json.loads(raw))`,
    or None: take that exact path (for its error message, or for a record with a `type` member).

    The streaming job's reader decodes every record on the heartbeats topic, so the common case is
    checked by msgspec while it decodes (measured: ~3 us a record instead of ~20 with json + the
    Python checks). Whatever msgspec rejects goes the exact way, so both accept the same records
    and produce the same dicts.
    """
    if (b'"type"' if isinstance(raw, bytes) else '"type"') in raw:
        return None
    try:
        hb = _HEARTBEAT_DECODER.decode(raw)
    except (msgspec.DecodeError, UnicodeDecodeError):
        return None
    if not names_ok(hb):
        return None
    out = msgspec.structs.asdict(hb)  # in C: a third of the Python dict comprehension's cost
    if hb.ts is msgspec.UNSET:
        del out["ts"]
    return out


DISCONNECTED = "disconnected"
CONNECTION_LOST = "connection_lost"   # the session connection ended without a goodbye (a crash)
SHUTDOWN = "shutdown"                 # the broker said goodbye before closing (a clean shutdown)
DISCONNECT_REASONS = (CONNECTION_LOST, SHUTDOWN)
SESSION_OPENED = "sessionOpenedMs"  # a disconnected record's session opening (the controllers' lane reads it)


def disconnected_record(hb: dict, reason: str, ts_ms: int) -> dict:
    """The heartbeats-topic value saying a broker's session ended at `ts_ms` (ingest clock).

    `hb` is the canonical heartbeat the session was opened with: the record names the same
    broker (cluster, set, id, address) and goes to the same broker set's partition, after that
    broker's heartbeats (`HeartbeatProducer` sends it at once, with its partition's group).
    """
    out = {"type": DISCONNECTED, "clusterName": hb["clusterName"], "brokerName": hb["brokerName"],
           "brokerId": hb["brokerId"], "brokerAddr": hb["brokerAddr"], "reason": reason, "ts": ts_ms}
    if "ts" in hb:  # when the session opened: a newer session of the broker elsewhere supersedes this one
        out[SESSION_OPENED] = hb["ts"]
    return out


def is_disconnected(d: Any) -> bool:
    return isinstance(d, dict) and d.get("type") == DISCONNECTED


CONNECTED = "connected"  # liveness topic only: a session's opening heartbeat, for the controllers' lane


def connected_record(hb: dict) -> dict:
    """The liveness-topic value saying a broker opened a session at `hb["ts"]` (its canonical heartbeat): a
    broker that reconnects after a lost connection is seen by the controllers as quickly as the loss."""
    return {"type": CONNECTED, **hb}


def is_connected(d: Any) -> bool:
    return isinstance(d, dict) and d.get("type") == CONNECTED


def validate_connected(d: dict) -> dict:
    """The canonical heartbeat a `connected` record carries (with its `ts`), or InvalidHeartbeat."""
    hb = validate_heartbeat({k: v for k, v in d.items() if k != "type"})
    if "ts" not in hb:
        raise InvalidHeartbeat("ts: a positive integer (ms) is required")
    return hb


SILENT = "silent"  # liveness topic only: a session whose broker stopped heartbeating (a hang), for the lane
LAST_HEARD = "lastHeartbeatMs"  # a silent record's last heartbeat on that session


def silent_record(hb: dict, last_heard_ms: int, timeout_ms: int, ts_ms: int) -> dict:
    """The liveness-topic value saying that a broker's session, opened with the canonical heartbeat `hb`, has
    carried no heartbeat since `last_heard_ms`, for its whole `timeout_ms`, as judged at `ts_ms` (the ingest
    worker's clock). The controllers' lane elects from it once the job has given the nodes a view
    (api/connection_loss.py)."""
    return {"type": SILENT, "clusterName": hb["clusterName"], "brokerName": hb["brokerName"],
            "brokerId": hb["brokerId"], "brokerAddr": hb["brokerAddr"], "ts": ts_ms, LAST_HEARD: last_heard_ms,
            "heartbeatTimeoutMillis": timeout_ms, SESSION_OPENED: hb["ts"]}


def is_silent(d: Any) -> bool:
    return isinstance(d, dict) and d.get("type") == SILENT


def validate_silent(d: dict) -> dict:
    """The canonical `silent` record, or InvalidHeartbeat naming the field."""
    out = _broker_ref(d, SILENT)
    for key, (_, lo, hi) in (("heartbeatTimeoutMillis", HEARTBEAT_INT_FIELDS["heartbeatTimeoutMillis"]),
                             (LAST_HEARD, (None, 1, out["ts"])), (SESSION_OPENED, (None, 1, out["ts"]))):
        v = d.get(key)
        if type(v) is not int or not (lo <= v <= hi):
            raise InvalidHeartbeat(f"{key}: an integer in [{lo}, {hi}] is required")
        out[key] = v
    if out[SESSION_OPENED] > out[LAST_HEARD]:
        raise InvalidHeartbeat(f"{LAST_HEARD}: not before {SESSION_OPENED} (the session's first heartbeat)")
    if out["ts"] - out[LAST_HEARD] < out["heartbeatTimeoutMillis"]:
        raise InvalidHeartbeat(f"ts: at least heartbeatTimeoutMillis after {LAST_HEARD} (a whole timeout of silence)")
    return out


UNVOUCHED = "unvouched"  # liveness topic only: a session its worker no longer speaks for (no failover meant)
SILENCE_UNREPORTED = "silence_unreported"  # a silence the worker did not report: its other sessions fell quiet too
CLOSED_BY_WORKER = "closed_by_worker"  # the worker closed the connection itself (idle past its limit, a refusal)
UNVOUCHED_REASONS = (SILENCE_UNREPORTED, CLOSED_BY_WORKER)


def unvouched_record(hb: dict, reason: str, ts_ms: int) -> dict:
    """The liveness-topic value saying that the worker holding a broker's session (opened with the canonical
    heartbeat `hb`) no longer speaks for the broker through it, from `ts_ms` (its clock), though it says nothing of
    the broker itself: a silence it did not report, a connection it closed. The nodes stop counting that session
    as the broker's word (`LivenessTable.session_vouches`); nothing is failed over on it."""
    return {"type": UNVOUCHED, "clusterName": hb["clusterName"], "brokerName": hb["brokerName"],
            "brokerId": hb["brokerId"], "brokerAddr": hb["brokerAddr"], "reason": reason, "ts": ts_ms,
            SESSION_OPENED: hb["ts"]}


def is_unvouched(d: Any) -> bool:
    return isinstance(d, dict) and d.get("type") == UNVOUCHED


def validate_unvouched(d: dict) -> dict:
    """The canonical `unvouched` record, or InvalidHeartbeat naming the field."""
    out = _broker_ref(d, UNVOUCHED)
    if d.get("reason") not in UNVOUCHED_REASONS:
        raise InvalidHeartbeat(f"reason: one of {', '.join(UNVOUCHED_REASONS)} is required")
    out["reason"] = d["reason"]
    opened = d.get(SESSION_OPENED)
    if type(opened) is not int or not (1 <= opened <= out["ts"]):
        raise InvalidHeartbeat(f"{SESSION_OPENED}: an integer in [1, {out['ts']}] is required")
    out[SESSION_OPENED] = opened
    return out


def validate_disconnected(d: dict) -> dict:
    """The canonical `disconnected` record, or InvalidHeartbeat naming the field."""
    out = _broker_ref(d, DISCONNECTED)
    if d.get("reason") not in DISCONNECT_REASONS:
        raise InvalidHeartbeat(f"reason: one of {', '.join(DISCONNECT_REASONS)} is required")
    out["reason"] = d["reason"]
    return out


def _broker_ref(d: dict, kind: str) -> dict[str, Any]:
    """The fields a session record names its broker and instant with, checked (InvalidHeartbeat names the field)."""
    out: dict[str, Any] = {"type": kind, "clusterName": _name(d, "clusterName"),
                           "brokerName": _name(d, "brokerName")}
    out["brokerAddr"] = _addr(d)
    bid = d.get("brokerId")
    if type(bid) is not int or not (1 <= bid <= 2**62):
        raise InvalidHeartbeat("brokerId: an integer of at least 1 is required")
    out["brokerId"] = bid
    if type(d.get("ts")) is not int or d["ts"] <= 0 or d["ts"] >= 2**63:
        raise InvalidHeartbeat("ts: a positive integer (ms) is required")
    out["ts"] = d["ts"]
    return out


def encode(value: dict) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def loads(raw: bytes | str) -> Any:
    """JSON text to Python, with msgspec (several times faster than `json.loads`, and the streaming job
    decodes every record it handles); text msgspec refuses but `json` reads (a lone surrogate escape,
    NaN, a number past float range) is read by `json`, so nothing readable before becomes a failure."""
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return json.loads(raw)


def dumps(value: Any) -> str:
    """Compact JSON text, with msgspec (structs included); what msgspec cannot encode (a lone surrogate)
    goes through `json`."""
    try:
        return msgspec.json.encode(value).decode()
    except (UnicodeEncodeError, TypeError):
        return json.dumps(msgspec.to_builtins(value), separators=(",", ":"))


def decode(raw: bytes | str) -> Any:
    return json.loads(raw)


def event_record(index: int, term: int, ts: int, event: dict, state: dict | None, cluster: str | None) -> dict:
    """One events-topic value: the event and the broker set's state right after it (None: set removed)."""
    return {"index": index, "term": term, "ts": ts, "type": event.get("type"), "brokerName": event.get("brokerName"),
            "clusterName": cluster, "event": event, "state": state}


# ---------------------------------------------------------------------- liveness
HEARTBEAT_GROUP = "heartbeats"  # the member of a grouped heartbeats-topic record
HEARTBEAT_GROUP_BYTES = 256 * 1024  # a group's size bound (Kafka's default record limit is 1 MiB)
_GROUP_START = '{"' + HEARTBEAT_GROUP + '":['


def heartbeat_group(values: list[bytes]) -> bytes:
    """Heartbeats-topic records (each a heartbeat or a `disconnected` record, JSON), in order, as the value of
    one record. Every one belongs to a set whose key maps to the partition the group is written to."""
    return _GROUP_START.encode() + b",".join(values) + b"]}"


class _HeartbeatGroup(msgspec.Struct):
    heartbeats: list[msgspec.Raw]


_GROUP_DECODER = msgspec.json.Decoder(_HeartbeatGroup)


def is_heartbeat_group(value: bytes | str | None) -> bool:
    """The value starts as `heartbeat_group` writes one (whether it decodes is another matter)."""
    if value is None:
        return False
    return value.startswith(_GROUP_START) if isinstance(value, str) else value.startswith(_GROUP_START.encode())


def heartbeat_group_items(value: bytes | str | None) -> list[str] | None:
    """The records a heartbeats-topic value holds when it is a group (`heartbeat_group`), each as JSON text;
    None when it is one record (or not a group that decodes: the caller's parsing then says what is wrong)."""
    if not is_heartbeat_group(value):
        return None
    try:
        group = _GROUP_DECODER.decode(value)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):
        return None
    return [bytes(item).decode("utf-8", "replace") for item in group.heartbeats]


class _WireHeartbeatGroup(msgspec.Struct):
    heartbeats: list[_WireHeartbeat]


_HEARTBEAT_GROUP_DECODER = msgspec.json.Decoder(_WireHeartbeatGroup)


def fast_heartbeat_group(value: bytes | str) -> list[dict] | None:
    """Every heartbeat of a group that holds valid heartbeats only, each exactly as `fast_heartbeat` gives
    it, decoded and checked in one msgspec call; None: take the way of one record at a time (a group with
    a `disconnected` record or anything msgspec refuses, or not a group)."""
    if not is_heartbeat_group(value) or (b'"type"' if isinstance(value, bytes) else '"type"') in value:
        return None
    try:
        group = _HEARTBEAT_GROUP_DECODER.decode(value)
    except (msgspec.DecodeError, UnicodeDecodeError):  # ValidationError is a DecodeError
        return None
    out = []
    for hb in group.heartbeats:
        if not names_ok(hb):
            return None
        d = msgspec.structs.asdict(hb)
        if hb.ts is msgspec.UNSET:
            del d["ts"]
        out.append(d)
    return out


def heartbeat_records(value: bytes | str) -> list[Any]:
    """Every record one heartbeats-topic value holds, decoded (a group's items, or the one record)."""
    items = heartbeat_group_items(value)
    return [json.loads(v) for v in items] if items is not None else [json.loads(value)]


LIVENESS_SETS = "sets"
LIVENESS_RECORD_BYTES = 256 * 1024  # a liveness record's size bound (Kafka's default limit is 1 MiB)


LIVENESS_GRACE = "disconnectGraceMs"  # the job's grace for a lost session, so controller nodes follow its rule


def liveness_records(payloads: list[str], max_bytes: int = LIVENESS_RECORD_BYTES,
                     grace_ms: int | None = None) -> list[bytes]:
    """Sets' liveness objects (JSON text each, as `SetWatch.liveness` encoded) grouped into as few records
    as fit `max_bytes` (a set bigger than that alone gets a record of its own). With `grace_ms`, each record
    also says the job's `--disconnect-grace-ms` (`liveness_grace_ms`: the nodes' connection-loss lane)."""
    tail = b"]}" if grace_ms is None else b'],"' + LIVENESS_GRACE.encode() + b'":%d}' % grace_ms

    def record(chunk: list[bytes]) -> bytes:
        return b'{"' + LIVENESS_SETS.encode() + b'":[' + b",".join(chunk) + tail

    out: list[bytes] = []
    chunk: list[bytes] = []
    size = 0
    for text in payloads:
        raw = text.encode()
        if chunk and size + len(raw) + 1 > max_bytes:
            out.append(record(chunk))
            chunk, size = [], 0
        chunk.append(raw)
        size += len(raw) + 1
    if chunk:
        out.append(record(chunk))
    return out


def liveness_grace_ms(value: Any) -> int | None:
    """The job's disconnect grace a decoded liveness record states (None: it states none, or not a valid one)."""
    g = value.get(LIVENESS_GRACE) if isinstance(value, dict) else None
    return g if type(g) is int and 0 <= g <= MAX_TIMEOUT_MS else None


def liveness_sets(value: Any) -> list[dict]:
    """The sets' liveness objects in one decoded liveness record: many (`{"sets": [...]}`) or, as written
    before records were grouped, one (`{"clusterName", "brokerName", "ts", "brokers"}`)."""
    if isinstance(value, dict) and isinstance(value.get(LIVENESS_SETS), list):
        return [v for v in value[LIVENESS_SETS] if isinstance(v, dict)]
    return [value] if isinstance(value, dict) else []
