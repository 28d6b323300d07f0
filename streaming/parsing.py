"""Parse and validate raw Kafka rows before the stateful operator (pure Python; used in `mapInPandas`).

A heartbeats-topic record that is a group (`records.heartbeat_group`) is first split into the
records it holds, each with the group's topic, partition and offset. Every record becomes one
parsed row `(bucket, group, kind, topic, partition, offset, payload)`:

* a valid heartbeat: group = brokerName, kind = "hb", payload = the canonical heartbeat
  (`records.validate_heartbeat`), `ts` defaulting to the Kafka record time;
* a valid `disconnected` record (a broker's session connection ended, see
  docs/failover-signal.md): group = brokerName, kind = "dc", payload = the record;
* a valid event: group = brokerName, kind = "ev", payload = the event record;
* anything else: group = "" (reserved: broker set names are never empty), kind = "dlq",
  payload = the dead letter `{error, topic, partition, offset, raw}`.

`bucket` is the stateful operator's key: `bucket_of(group)`, a stable hash of the broker set
name modulo the number of buckets ("" for dead letters). See `processor.py` for why the
operator is keyed by bucket and not by set. The Python source hands these rows on bundled, one
row per bucket (`parse_bundles`); `mapInPandas` after Spark's own connector, one row per record.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator
from typing import Any

from electra.streaming import records
from electra.streaming.collector import collector_paused
from electra.streaming.detector import DEAD_LETTER, RUN_FIELD, parse_event, span_of

HEARTBEAT = "hb"
DISCONNECTED = "dc"
EVENT = "ev"
DLQ_GROUP = ""
BUNDLE = "bundle"     # a row of many records of one bucket (`parse_bundles`)
BUNDLE_GROUP = "*"    # a bundle's group column (not read: a bundle's records name their sets)
BUNDLE_SIZE = 4096    # records a bundle row holds at most (a row's payload stays a few hundred KiB)

PARSED_SCHEMA = "bucket string, group string, kind string, topic string, partition int, offset long, payload string"
PARSED_COLUMNS = ["bucket", "group", "kind", "topic", "partition", "offset", "payload"]
DEFAULT_BUCKETS = 64


def bucket_of(group: str, buckets: int = DEFAULT_BUCKETS) -> str:
    """The operator key of a broker set (stable across processes and restarts: CRC32, not hash())."""
    if group == DLQ_GROUP:
        return DLQ_GROUP
    return str(zlib.crc32(group.encode()) % buckets)


def _dump(d: dict) -> str:
    return records.dumps(d)


def dead_letter(error: str, topic: str, partition: int, offset: int, raw: Any) -> dict:
    return {"error": error, "topic": topic, "partition": int(partition), "offset": int(offset),
            "raw": raw if isinstance(raw, str) or raw is None else str(raw)}


def _parse(topic: str, partition: int, offset: int, value: str | None, kafka_ts_ms: int | None,
           heartbeats_topic: str, events_topic: str) -> tuple[str, str, dict]:
    """(group, kind, parsed record) for one raw record; a dead letter for anything invalid."""
    try:
        if value is None:
            raise ValueError("value: missing")
        if topic == heartbeats_topic:
            hb = records.fast_heartbeat(value)
            if hb is not None:
                if "ts" not in hb:
                    hb["ts"] = int(kafka_ts_ms) if kafka_ts_ms and kafka_ts_ms > 0 else 0
                return hb["brokerName"], HEARTBEAT, hb
        try:
            d = json.loads(value)
        except ValueError as exc:
            raise ValueError(f"invalid JSON: {exc}") from None
        if topic == heartbeats_topic and isinstance(d, dict) and records.HEARTBEAT_GROUP in d:
            raise ValueError(f"invalid {records.HEARTBEAT_GROUP!r} group: expected a list of JSON objects")
        if topic == heartbeats_topic and records.is_disconnected(d):
            dc = records.validate_disconnected(d)
            return dc["brokerName"], DISCONNECTED, dc
        if topic == heartbeats_topic:
            hb = records.validate_heartbeat(d)
            if "ts" not in hb:
                hb["ts"] = int(kafka_ts_ms) if kafka_ts_ms and kafka_ts_ms > 0 else 0
            return hb["brokerName"], HEARTBEAT, hb
        if topic == events_topic:
            ev = parse_event(d)
            return ev["brokerName"], EVENT, ev
        raise ValueError(f"unexpected topic {topic!r}")
    except ValueError as exc:  # InvalidHeartbeat is a ValueError
        return DLQ_GROUP, DEAD_LETTER, dead_letter(str(exc), topic, partition, offset, value)


def parse_row(topic: str, partition: int, offset: int, value: str | None, kafka_ts_ms: int | None,
              heartbeats_topic: str, events_topic: str) -> tuple[str, str, str]:
    """(group, kind, payload JSON) for one raw record."""
    group, kind, obj = _parse(topic, partition, offset, value, kafka_ts_ms, heartbeats_topic, events_topic)
    return group, kind, _dump(obj)


def split_groups(raw: Iterator[tuple], heartbeats_topic: str) -> Iterator[tuple]:
    """Raw records `(topic, partition, offset, value, kafka_ts_ms)` with every heartbeat group replaced by the
    records it holds (same topic, partition, offset and Kafka time), in order."""
    for rec in raw:
        items = records.heartbeat_group_items(rec[3]) if rec[0] == heartbeats_topic else None
        if items is None:
            yield rec
        else:
            topic, part, off, _, ts_ms = rec
            for item in items:
                yield topic, part, off, item, ts_ms


def _parsed(raw: Iterator[tuple], heartbeats_topic: str, events_topic: str) -> Iterator[tuple]:
    """`(group, kind, record, topic, partition, offset)` for every record of `raw`, groups split. A group of
    valid heartbeats only is decoded and checked in one call (`records.fast_heartbeat_group`); any other
    goes record by record, as `split_groups` gives them."""
    for rec in raw:
        topic, part, off, value, ts_ms = rec
        if topic == heartbeats_topic and value is not None:
            hbs = records.fast_heartbeat_group(value)
            if hbs is not None:
                for hb in hbs:
                    if "ts" not in hb:
                        hb["ts"] = int(ts_ms) if ts_ms and ts_ms > 0 else 0
                    yield hb["brokerName"], HEARTBEAT, hb, topic, part, off
                continue
        for topic, part, off, value, ts_ms in split_groups((rec,), heartbeats_topic):
            yield (*_parse(topic, part, off, value, ts_ms, heartbeats_topic, events_topic), topic, part, off)


def _fold(prev: dict, hb: dict) -> dict:
    """`hb` after `prev` of the same broker, by RocketMQ's rule (as `detector.SetWatch.apply_heartbeat`):
    epoch and max offset only move forward, the ingest time is the later one."""
    if not (hb["epoch"] > prev["epoch"] or (hb["epoch"] == prev["epoch"] and hb["maxOffset"] > prev["maxOffset"])):
        hb = {**hb, "epoch": prev["epoch"], "maxOffset": prev["maxOffset"], "confirmOffset": prev["confirmOffset"]}
    if (prev.get("ts") or 0) > (hb.get("ts") or 0):
        hb = {**hb, "ts": prev["ts"]}
    return hb


def _folded(raw: Iterator[tuple], heartbeats_topic: str, events_topic: str) -> list[tuple]:
    """The parsed records `(group, kind, record, topic, partition, offset)` of one read, in order, with each
    broker's heartbeats folded into its latest (at that one's position) and the set's silence span
    (`detector.span_of`, over every record before the fold) on each folded heartbeat in `RUN_FIELD`."""
    parsed: list[tuple[str, str, dict, str, int, int] | None] = []
    # (set, broker id, cluster) -> index in `parsed` of its latest heartbeat (the cluster too: one naming another
    # cluster than the set's is dropped by the operator, and must not take a real heartbeat's place here)
    last: dict[tuple[str, int, str], int] = {}
    stamped: dict[str, tuple[list[dict], list[dict]]] = {}  # set -> its heartbeats and disconnects, unfolded
    for group, kind, obj, topic, part, off in _parsed(raw, heartbeats_topic, events_topic):
        if kind in (HEARTBEAT, DISCONNECTED):
            runs = stamped.get(group)
            if runs is None:  # not setdefault: that builds two lists and a tuple for every record
                runs = stamped[group] = ([], [])
            runs[kind == DISCONNECTED].append(obj)
            if kind == HEARTBEAT:
                key = (group, obj["brokerId"], obj["clusterName"])
                at = last.get(key)
                if at is not None:
                    obj = _fold(parsed[at][2], obj)
                    parsed[at] = None  # superseded
                last[key] = len(parsed)
        parsed.append((group, kind, obj, topic, part, off))
    rows = [r for r in parsed if r is not None]
    spans = {g: span_of(hbs, dcs) for g, (hbs, dcs) in stamped.items() if hbs}
    for r in rows:
        span = spans.get(r[0]) if r[1] == HEARTBEAT else None
        if span is not None:
            r[2][RUN_FIELD] = [span[0], span[1]]
    return rows


def parse_records(raw: Iterator[tuple], heartbeats_topic: str, events_topic: str, buckets: int = DEFAULT_BUCKETS,
                  chunk: int = 8192) -> Iterator[Any]:
    """Raw records `(topic, partition, offset, value, kafka_ts_ms)` of one read → Arrow record batches of
    PARSED_SCHEMA, one row per record, with each broker's heartbeats folded into its latest.

    A read holds every record of its broker sets (the topic is partitioned by set), so only the
    last heartbeat of each broker (folded as the detector would, at the position of that last
    one) goes on: a batch that fell behind hands the stateful operator one row per broker
    instead of one per heartbeat, and the next batch does not fall further behind. What the fold
    drops, whether the set's records had a silence (`detector.span_of`), goes on with each folded
    heartbeat in `detector.RUN_FIELD`. The source hands on the same records in fewer rows
    (`parse_bundles`); this form is the one `mapInPandas` gives after Spark's own connector
    (`parse_frames`), against which the tests hold both.
    """
    with collector_paused():
        rows = [(bucket_of(group, buckets), group, kind, topic, part, off, _dump(obj))
                for group, kind, obj, topic, part, off in _folded(raw, heartbeats_topic, events_topic)]
        out = [_record_batch(rows[i:i + chunk]) for i in range(0, len(rows), chunk)]
    yield from out


def parse_bundles(raw: Iterator[tuple], heartbeats_topic: str, events_topic: str, buckets: int = DEFAULT_BUCKETS,
                  per_row: int = BUNDLE_SIZE) -> Iterator[Any]:
    """The records of `parse_records` as Arrow record batches of PARSED_SCHEMA with one row per bucket (a
    bundle: kind BUNDLE, payload the JSON list of its `[group, kind, partition, offset, record]`, in read
    order, at most `per_row` of them a row); dead letters stay one row each, in the "" bucket.

    What this saves is every per-row cost between the source and the operator's Python: the
    JVM's conversions (Arrow to rows, the shuffle's write and read, rows to Arrow for the
    operator's worker) and PySpark's (each Arrow batch to pandas, then row by row into a frame
    per key), paid for 3,000 rows a second at 1,000 sets and 30,000 at 10,000. The operator
    decodes one list instead (`processor.MasterWatchProcessor`).
    """
    with collector_paused():
        rows = _bundled(_folded(raw, heartbeats_topic, events_topic), heartbeats_topic, buckets, per_row)
        batch = _record_batch(rows) if rows else None
    if batch is not None:
        yield batch


def _record_batch(rows: list[tuple]) -> Any:
    """PARSED_SCHEMA rows `(bucket, group, kind, topic, partition, offset, payload)` as one Arrow record batch."""
    import pyarrow as pa

    types = (pa.string(), pa.string(), pa.string(), pa.string(), pa.int32(), pa.int64(), pa.string())
    return pa.RecordBatch.from_arrays([pa.array([r[i] for r in rows], t) for i, t in enumerate(types)],
                                      names=PARSED_COLUMNS)


def _bundled(folded: list[tuple], heartbeats_topic: str, buckets: int, per_row: int) -> list[tuple]:
    """PARSED_SCHEMA rows: dead letters one each, then each bucket's records in bundles of `per_row`."""
    by_bucket: dict[str, list] = {}
    rows: list[tuple] = []
    for group, kind, obj, topic, part, off in folded:
        if group == DLQ_GROUP:
            rows.append((DLQ_GROUP, DLQ_GROUP, kind, topic, part, off, _dump(obj)))
            continue
        b = bucket_of(group, buckets)
        entries = by_bucket.get(b)
        if entries is None:
            entries = by_bucket[b] = []
        entries.append((group, kind, part, off, obj))
    for b, entries in by_bucket.items():
        for i in range(0, len(entries), per_row):
            rows.append((b, BUNDLE_GROUP, BUNDLE, heartbeats_topic, -1, -1, _dump(entries[i:i + per_row])))
    return rows


def parse_frames(frames: Iterator[Any], heartbeats_topic: str, events_topic: str,
                 buckets: int = DEFAULT_BUCKETS) -> Iterator[Any]:
    """`mapInPandas` body: frames with topic, partition, offset, value, kafka_ts → PARSED_SCHEMA frames."""
    import pandas as pd

    def raw(df) -> Iterator[tuple]:
        for topic, part, off, value, ts in zip(df["topic"], df["partition"], df["offset"], df["value"],
                                               df["kafka_ts"]):
            ts_ms = None if ts is None or pd.isna(ts) else int(ts)
            val = None if value is None or (not isinstance(value, str) and pd.isna(value)) else value
            yield topic, int(part), int(off), val, ts_ms

    for df in frames:
        rows = []
        for topic, part, off, val, ts_ms in split_groups(raw(df), heartbeats_topic):
            group, kind, payload = parse_row(topic, part, off, val, ts_ms, heartbeats_topic, events_topic)
            rows.append((bucket_of(group, buckets), group, kind, topic, part, off, payload))
        yield pd.DataFrame(rows, columns=PARSED_COLUMNS).astype({"partition": "int32", "offset": "int64"})
