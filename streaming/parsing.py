"""Parse and validate raw Kafka rows before the stateful operator (pure Python; used in `mapInPandas`).

Every input row becomes one parsed row `(bucket, group, kind, topic, partition, offset, payload)`:

* a valid heartbeat: group = brokerName, kind = "hb", payload = the canonical heartbeat
  (`records.validate_heartbeat`), `ts` defaulting to the Kafka record time;
* a valid `disconnected` record (a broker's session connection ended, see
  docs/failover-signal.md): group = brokerName, kind = "dc", payload = the record;
* a valid event: group = brokerName, kind = "ev", payload = the event record;
* anything else: group = "" (reserved: broker set names are never empty), kind = "dlq",
  payload = the dead letter `{error, topic, partition, offset, raw}`.

`bucket` is the stateful operator's key: `bucket_of(group)`, a stable hash of the broker set
name modulo the number of buckets ("" for dead letters). See `processor.py` for why the
operator is keyed by bucket and not by set.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator
from typing import Any

from electra.streaming import records
from electra.streaming.detector import DEAD_LETTER, parse_event

HEARTBEAT = "hb"
DISCONNECTED = "dc"
EVENT = "ev"
DLQ_GROUP = ""

PARSED_SCHEMA = "bucket string, group string, kind string, topic string, partition int, offset long, payload string"
PARSED_COLUMNS = ["bucket", "group", "kind", "topic", "partition", "offset", "payload"]
DEFAULT_BUCKETS = 64


def bucket_of(group: str, buckets: int = DEFAULT_BUCKETS) -> str:
    """The operator key of a broker set (stable across processes and restarts: CRC32, not hash())."""
    if group == DLQ_GROUP:
        return DLQ_GROUP
    return str(zlib.crc32(group.encode()) % buckets)


def _dump(d: dict) -> str:
    return json.dumps(d, separators=(",", ":"))


def dead_letter(error: str, topic: str, partition: int, offset: int, raw: Any) -> dict:
    return {"error": error, "topic": topic, "partition": int(partition), "offset": int(offset),
            "raw": raw if isinstance(raw, str) or raw is None else str(raw)}


def parse_row(topic: str, partition: int, offset: int, value: str | None, kafka_ts_ms: int | None,
              heartbeats_topic: str, events_topic: str) -> tuple[str, str, str]:
    """(group, kind, payload JSON) for one raw record."""
    try:
        if value is None:
            raise ValueError("value: missing")
        try:
            d = json.loads(value)
        except ValueError as exc:
            raise ValueError(f"invalid JSON: {exc}") from None
        if topic == heartbeats_topic and records.is_disconnected(d):
            dc = records.validate_disconnected(d)
            return dc["brokerName"], DISCONNECTED, _dump(dc)
        if topic == heartbeats_topic:
            hb = records.validate_heartbeat(d)
            if "ts" not in hb:
                hb["ts"] = int(kafka_ts_ms) if kafka_ts_ms and kafka_ts_ms > 0 else 0
            return hb["brokerName"], HEARTBEAT, _dump(hb)
        if topic == events_topic:
            ev = parse_event(d)
            return ev["brokerName"], EVENT, _dump(ev)
        raise ValueError(f"unexpected topic {topic!r}")
    except ValueError as exc:  # InvalidHeartbeat is a ValueError
        return DLQ_GROUP, DEAD_LETTER, _dump(dead_letter(str(exc), topic, partition, offset, value))


def parse_records(raw: Iterator[tuple], heartbeats_topic: str, events_topic: str, buckets: int = DEFAULT_BUCKETS,
                  chunk: int = 8192) -> Iterator[Any]:
    """Raw records `(topic, partition, offset, value, kafka_ts_ms)` → Arrow record batches of PARSED_SCHEMA.

    The Python Kafka source parses in its reader with this (`kafka_source`, option `parse`): the
    query then has no `mapInPandas` stage, and rows reach the JVM as Arrow columns instead of
    pickled tuples. Each crossing between the JVM and a Python worker costs per row, and this
    removes two of them.
    """
    import pyarrow as pa

    cols: list[list] = [[] for _ in PARSED_COLUMNS]

    def batch():
        arrays = [pa.array(cols[0], pa.string()), pa.array(cols[1], pa.string()), pa.array(cols[2], pa.string()),
                  pa.array(cols[3], pa.string()), pa.array(cols[4], pa.int32()), pa.array(cols[5], pa.int64()),
                  pa.array(cols[6], pa.string())]
        return pa.RecordBatch.from_arrays(arrays, names=PARSED_COLUMNS)

    for topic, part, off, value, ts_ms in raw:
        group, kind, payload = parse_row(topic, part, off, value, ts_ms, heartbeats_topic, events_topic)
        for col, v in zip(cols, (bucket_of(group, buckets), group, kind, topic, part, off, payload)):
            col.append(v)
        if len(cols[0]) >= chunk:
            yield batch()
            cols = [[] for _ in PARSED_COLUMNS]
    if cols[0]:
        yield batch()


def parse_frames(frames: Iterator[Any], heartbeats_topic: str, events_topic: str,
                 buckets: int = DEFAULT_BUCKETS) -> Iterator[Any]:
    """`mapInPandas` body: frames with topic, partition, offset, value, kafka_ts → PARSED_SCHEMA frames."""
    import pandas as pd

    for df in frames:
        rows = []
        for topic, part, off, value, ts in zip(df["topic"], df["partition"], df["offset"], df["value"],
                                               df["kafka_ts"]):
            ts_ms = None if ts is None or pd.isna(ts) else int(ts)
            val = None if value is None or (not isinstance(value, str) and pd.isna(value)) else value
            group, kind, payload = parse_row(topic, int(part), int(off), val, ts_ms, heartbeats_topic,
                                             events_topic)
            rows.append((bucket_of(group, buckets), group, kind, topic, int(part), int(off), payload))
        yield pd.DataFrame(rows, columns=PARSED_COLUMNS).astype({"partition": "int32", "offset": "int64"})
