"""Kafka as a PySpark Python Data Source (`electra_kafka`), over kafka-python; plus source selection.

Spark 4.3 ships no Kafka connector jars here, so the job reads Kafka through the
Python Data Source API: one `InputPartition` per Kafka topic-partition, offsets
`{"topic:partition": next_offset}` kept in Spark's checkpoint.

Options of `spark.readStream.format("electra_kafka")`:

* `bootstrap`        Kafka bootstrap servers (`host:port[,host:port]`), required
* `topics`           comma-separated topics, required
* `hwmFix`           `true` (default): find the real end offsets with `kafka_io.end_offsets`
                     (tansu under-reports the high watermark); `false` on real Kafka
* `startingOffsets`  `earliest` (default) or `latest`, for a query without a checkpoint
* `readTimeoutMs`    how long one partition read may wait for missing records (default 30000)
* `readTasks`        how many Spark tasks read one micro-batch (default 0: one per Kafka partition); fewer
                     tasks than partitions read several partitions each, one after another. Each task
                     costs a Python worker round trip and a pickled reader per batch, which on a small
                     machine is worth more than parallel reads of a second's heartbeats
* `parse`            `true`: the reader parses and validates the records itself and yields Arrow batches
                     of `parsing.PARSED_SCHEMA`, a bundle row per operator key (`parsing.parse_bundles`);
                     needs `heartbeatsTopic`, `eventsTopic` and `buckets`

Rows: `topic string, partition int, offset long, key string, value string, timestamp timestamp`
(with `parse`: the parsed rows, bundled).

A Kafka log that went backwards (tansu is memory-only: after a restart every topic
is empty again and offsets restart at 0) is detected as end < start; the source
logs a warning and continues from the new beginning. A broker that is down or a
topic that is missing yields no new data (the previous offsets) instead of failing.

`load_kafka_stream()` picks the source: `kafka` (Spark's built-in connector, needs the
spark-sql-kafka jars), `python` (this one) or `auto` (built-in if loadable, else this).
"""

from __future__ import annotations

import contextlib
import logging
import time
from datetime import UTC, datetime
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from electra.security.kafka_settings import KafkaSecurity, kafka_client_kwargs

log = logging.getLogger("electra.streaming.kafka_source")

NAME = "electra_kafka"
SCHEMA = "topic string, partition int, offset long, key string, value string, timestamp timestamp"
BUILTIN_KAFKA_CLASS = "org.apache.spark.sql.kafka010.KafkaSourceProvider"
METADATA_REFRESH_S = 5.0  # the end-offset probe refreshes its topic metadata at most this often
IDLE_CHECK_S = 2.0  # a partition read that gets nothing for this long checks whether its range still exists


def _bool(v: Any, default: bool) -> bool:
    if v is None:
        return default
    return str(v).strip().lower() in ("1", "true", "yes", "on")


def offset_key(topic: str, partition: int) -> str:
    return f"{topic}:{partition}"


def split_key(key: str) -> tuple[str, int]:
    topic, _, part = key.rpartition(":")
    return topic, int(part)


class KafkaPartition(InputPartition):
    """One Kafka topic-partition's offset range [start, end) of one micro-batch."""

    def __init__(self, topic: str, partition: int, start: int, end: int, bootstrap: str,
                 read_timeout_ms: int) -> None:
        super().__init__(offset_key(topic, partition))
        self.topic, self.partition, self.start, self.end = topic, partition, start, end
        self.bootstrap, self.read_timeout_ms = bootstrap, read_timeout_ms


class KafkaReadGroup(InputPartition):
    """Several offset ranges read by one task, one after another (option `readTasks`)."""

    def __init__(self, parts: list[KafkaPartition]) -> None:
        super().__init__(",".join(p.value for p in parts))
        self.parts = parts


def group_partitions(parts: list[KafkaPartition], tasks: int) -> list[InputPartition]:
    """At most `tasks` read tasks (0: one per range); ranges are dealt round-robin, in plan order."""
    if tasks <= 0 or len(parts) <= tasks:
        return list(parts)
    return [KafkaReadGroup(parts[i::tasks]) for i in range(tasks)]


def plan_partitions(start: dict, end: dict, bootstrap: str, read_timeout_ms: int) -> list[KafkaPartition]:
    """Offset ranges to read; a partition whose end is below its start was reset (read from 0)."""
    parts = []
    for key, e in sorted(end.items()):
        s = start.get(key, 0)
        if e < s:
            log.warning("Kafka %s went back from offset %d to %d (broker restarted or topic recreated): "
                        "reading from the new beginning", key, s, e)
            s = 0
        if e > s:
            topic, p = split_key(key)
            parts.append(KafkaPartition(topic, p, s, e, bootstrap, read_timeout_ms))
    return parts


# One consumer per bootstrap per Python worker process, kept across micro-batches: PySpark reuses its
# workers, and a new KafkaConsumer per partition per batch paid a connection, a metadata round trip
# and kafka-python's API version probe every time (each task of every batch).
_READERS: dict[str, Any] = {}


def _reader(bootstrap: str):
    consumer = _READERS.get(bootstrap)
    if consumer is None:
        from kafka import KafkaConsumer

        consumer = _READERS[bootstrap] = KafkaConsumer(
            bootstrap_servers=bootstrap.split(","), enable_auto_commit=False, auto_offset_reset="earliest",
            client_id="electra-spark-reader", fetch_max_wait_ms=100, request_timeout_ms=10_000,
            **kafka_client_kwargs())
    return consumer


def _drop_reader(bootstrap: str) -> None:
    consumer = _READERS.pop(bootstrap, None)
    if consumer is not None:
        with contextlib.suppress(Exception):
            consumer.close()


def read_partition(part: KafkaPartition, ts_ms: bool = False):
    """Yield the rows of one offset range (runs on an executor); `ts_ms`: the timestamp as epoch ms."""
    from kafka import TopicPartition

    consumer = _reader(part.bootstrap)
    ok = False
    try:
        tp = TopicPartition(part.topic, part.partition)
        consumer.assign([tp])
        consumer.seek(tp, part.start)
        pos = part.start
        deadline = time.monotonic() + part.read_timeout_ms / 1000
        idle_since = time.monotonic()
        while pos < part.end and time.monotonic() < deadline:
            got = consumer.poll(timeout_ms=200, max_records=10_000).get(tp, [])
            if got:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > IDLE_CHECK_S:
                # Nothing arrives: has the log lost this range (broker restarted mid-batch)? A broker end
                # at or below our position means the records are gone (tansu's end is never too high).
                idle_since = time.monotonic()
                try:
                    reported = consumer.end_offsets([tp])[tp]
                except Exception:  # noqa: BLE001 - broker down: keep trying until the deadline
                    reported = None
                if reported is not None and reported <= pos:
                    log.warning("Kafka %s:%d: offsets [%d, %d) are gone (the log ends at %d; broker restarted?); "
                                "ending this read early", part.topic, part.partition, pos, part.end, reported)
                    break
            for m in got:
                if m.offset >= part.end:
                    pos = part.end
                    break
                if m.offset < pos:
                    continue
                key = m.key.decode("utf-8", "replace") if m.key is not None else None
                value = m.value.decode("utf-8", "replace") if m.value is not None else None
                if not m.timestamp or m.timestamp <= 0:
                    ts = None
                else:
                    ts = m.timestamp if ts_ms else datetime.fromtimestamp(m.timestamp / 1000, tz=UTC)
                yield (part.topic, part.partition, m.offset, key, value, ts)
                pos = m.offset + 1
            if not got:
                pos = max(pos, consumer.position(tp) or pos)  # skip gaps (compaction, control records)
        if pos < part.end:
            log.warning("Kafka %s:%d: read stopped at offset %d of [%d, %d) after %d ms", part.topic,
                        part.partition, pos, part.start, part.end, part.read_timeout_ms)
        ok = True
    finally:
        if ok:
            consumer.assign([])  # idle until the next batch's task on this worker
        else:  # an error, or the task was interrupted mid-read: start the next read from a fresh consumer
            _drop_reader(part.bootstrap)


class KafkaStreamReader(DataSourceStreamReader):
    def __init__(self, options: dict) -> None:
        # Spark hands option names lower-cased (its option maps are case-insensitive).
        options = {str(k).lower(): v for k, v in options.items()}
        self.bootstrap = options.get("bootstrap") or options.get("kafka.bootstrap.servers")
        topics = options.get("topics") or options.get("subscribe") or ""
        self.topics = [t.strip() for t in topics.split(",") if t.strip()]
        if not self.bootstrap or not self.topics:
            raise ValueError(f"{NAME}: options 'bootstrap' and 'topics' are required")
        self.hwm_fix = _bool(options.get("hwmfix"), True)
        self.starting = (options.get("startingoffsets") or "earliest").lower()
        self.read_timeout_ms = int(options.get("readtimeoutms") or 30_000)
        self.read_tasks = int(options.get("readtasks") or 0)
        self.parse = _bool(options.get("parse"), False)
        if self.parse:
            self.heartbeats_topic, self.events_topic = options.get("heartbeatstopic"), options.get("eventstopic")
            self.buckets = int(options.get("buckets") or 0)
            if not self.heartbeats_topic or not self.events_topic or self.buckets < 1:
                raise ValueError(f"{NAME}: option 'parse' needs 'heartbeatsTopic', 'eventsTopic' and 'buckets'")
        self._consumer = None
        self._metadata_at = float("-inf")  # when the probe last refreshed its topic metadata
        self._ends: dict = {}  # the end offsets found last time: the next probe fetches there (kafka_io.end_offsets)

    # ------------------------------------------------------------------ driver side
    def _probe(self):
        if self._consumer is None:
            from kafka import KafkaConsumer

            self._consumer = KafkaConsumer(bootstrap_servers=self.bootstrap.split(","), enable_auto_commit=False,
                                           client_id="electra-spark-offsets", request_timeout_ms=5000,
                                           fetch_max_wait_ms=100, **kafka_client_kwargs())
        return self._consumer

    def _drop_probe(self) -> None:
        if self._consumer is not None:
            with contextlib.suppress(Exception):
                self._consumer.close()
            self._consumer = None
            self._metadata_at = float("-inf")
            self._ends = {}

    def _offsets(self, which: str) -> dict[str, int]:
        from kafka import TopicPartition

        from electra.streaming import kafka_io

        c = self._probe()
        now = time.monotonic()
        if which != "end" or now - self._metadata_at >= METADATA_REFRESH_S:
            c.topics()  # refresh metadata: partitions added to a topic show within METADATA_REFRESH_S
            self._metadata_at = now
        tps = []
        for t in self.topics:
            parts = c.partitions_for_topic(t)
            if not parts:
                log.warning("Kafka topic %s has no partitions yet (missing?); no data from it", t)
                continue
            tps += [TopicPartition(t, p) for p in sorted(parts)]
        if not tps:
            return {}
        if which == "begin":
            got = c.beginning_offsets(tps)
        else:
            got = kafka_io.end_offsets(c, tps, self.hwm_fix, known=self._ends)
            self._ends = dict(got)
        return {offset_key(tp.topic, tp.partition): int(o) for tp, o in got.items()}

    def initialOffset(self) -> dict:
        for attempt in range(3):
            try:
                return self._offsets("end" if self.starting == "latest" else "begin")
            except Exception as exc:  # noqa: BLE001 - Kafka down: start from the beginning later
                log.warning("%s: initial offsets unavailable (attempt %d): %r", NAME, attempt + 1, exc)
                self._drop_probe()
                time.sleep(0.5)
        return {}

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        start = dict(start or {})
        try:
            ends = self._offsets("end")
        except Exception as exc:  # noqa: BLE001 - Kafka down or restarting: no new data this time
            log.warning("%s: end offsets unavailable, no new data this batch: %r", NAME, exc)
            self._drop_probe()
            return start
        out = dict(start)  # partitions not visible now keep their offset
        for key, e in ends.items():
            s = start.get(key)
            if s is not None and e < s:
                log.warning("Kafka %s: end offset %d is below the committed %d (broker restarted?); "
                            "continuing from the new beginning", key, e, s)
            out[key] = e
        return out

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        return group_partitions(plan_partitions(start or {}, end or {}, self.bootstrap, self.read_timeout_ms),
                                self.read_tasks)

    def read(self, partition: InputPartition):
        ranges = partition.parts if isinstance(partition, KafkaReadGroup) else [partition]
        if not self.parse:
            return (row for part in ranges for row in read_partition(part))
        from electra.streaming.parsing import parse_bundles

        raw = ((t, p, o, v, ts) for part in ranges for t, p, o, _key, v, ts in read_partition(part, ts_ms=True))
        return parse_bundles(raw, self.heartbeats_topic, self.events_topic, self.buckets)

    def commit(self, end: dict) -> None:
        pass

    def stop(self) -> None:
        self._drop_probe()


class KafkaDataSource(DataSource):
    """`spark.readStream.format("electra_kafka").option("bootstrap", ...).option("topics", ...)`."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        if _bool(self.options.get("parse"), False):
            from electra.streaming.parsing import PARSED_SCHEMA

            return PARSED_SCHEMA
        return SCHEMA

    def streamReader(self, schema) -> KafkaStreamReader:
        return KafkaStreamReader(dict(self.options))


# ---------------------------------------------------------------------- source selection
def builtin_kafka_available(spark) -> bool:
    """True if Spark's own Kafka connector (spark-sql-kafka jars) can be loaded by this session."""
    try:
        jvm = spark._jvm  # noqa: SLF001 - classic (non-Connect) sessions only
        loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
        jvm.java.lang.Class.forName(BUILTIN_KAFKA_CLASS, False, loader)
        return True
    except Exception:  # noqa: BLE001 - class missing, or no JVM access (Spark Connect)
        return False


def load_kafka_stream(spark, bootstrap: str, topics: list[str], source: str = "auto", hwm_fix: bool = True,
                      starting: str = "earliest", parse: tuple[str, str, int] | None = None, read_tasks: int = 0):
    """A streaming DataFrame of the raw records; returns (df, source actually used).

    `parse` = (heartbeats topic, events topic, buckets): the Python source then yields parsed rows
    (`parsing.PARSED_SCHEMA`) and the source used is reported as "python+parse"; Spark's own
    connector always yields raw records.
    """
    if source not in ("auto", "kafka", "python"):
        raise ValueError(f"source must be auto, kafka or python, not {source!r}")
    use = source
    if source == "auto":
        use = "kafka" if builtin_kafka_available(spark) else "python"
        if use == "python":
            log.info("Spark's Kafka connector is not on the classpath; using the Python data source %s", NAME)
    if use == "kafka":
        df = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", ",".join(topics)).option("startingOffsets", starting)
              .option("failOnDataLoss", "false").options(**KafkaSecurity.from_env().spark_options()).load()
              .selectExpr("topic", "partition", "offset", "CAST(key AS STRING) AS key",
                          "CAST(value AS STRING) AS value", "timestamp"))
        return df, use
    spark.dataSource.register(KafkaDataSource)
    reader = (spark.readStream.format(NAME).option("bootstrap", bootstrap).option("topics", ",".join(topics))
              .option("hwmFix", str(hwm_fix).lower()).option("startingOffsets", starting)
              .option("readTasks", str(read_tasks)))
    if parse is not None:
        reader = (reader.option("parse", "true").option("heartbeatsTopic", parse[0]).option("eventsTopic", parse[1])
                  .option("buckets", str(parse[2])))
        use = "python+parse"
    return reader.load(), use
