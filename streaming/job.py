"""The streaming job: heartbeats + controller events from Kafka → per-set liveness state → ElectMaster proposals.

    python -m electra.streaming.job --bootstrap HOST:PORT --controllers h:p,h:p,h:p --checkpoint DIR \
        [--trigger-ms 1000] [--spark-master local[2]] [--topic-prefix ''] [--shuffle-partitions 1] [--read-tasks 1] \
        [--source auto|kafka|python] [--no-hwm-fix] [--starting-offsets earliest|latest] \
        [--buckets 2] [--proposal-retries 3] [--http-deadline-s 10] [--proposals-at-batch-end] \
        [--disconnect-grace-ms 0] [--log-level INFO]

Query: Kafka source (`kafka_source`) → parse + validate (`parsing`, mapInPandas; bad records
become dead letters) → `groupBy(bucket).transformWithStateInPandas(MasterWatchProcessor)`
(RocksDB state store, processing-time timers, Update mode) → `foreachBatch` sink (`sink`):
liveness records and dead letters to Kafka, proposals to the controller leader. One log
line per batch: input rows, proposals, dead letters, liveness records, batch and sink ms.

State (the last heartbeat per broker, the master, the last event index and the epoch
already proposed) lives in the checkpoint, so a restart does not propose an epoch again.
SIGTERM/SIGINT stop the query and Spark cleanly (exit code 0).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from electra.cli_args import Parser, server_list, topic_prefix
from electra.malloc_thresholds import keep_read_buffers_off_mmap
from electra.streaming import records

log = logging.getLogger("electra.streaming.job")

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
OPERATOR_PROPOSAL_DEADLINE_S = 2.0  # the operator's own attempt; the driver retries what it did not settle
BUCKETS_FILE = "electra-buckets"   # in the checkpoint directory: the bucket count its state was made with
LEGACY_BUCKETS = 64                # checkpoints written before that file existed used 64


def pinned_buckets(checkpoint: str, requested: int) -> int:
    """The bucket count to run with: the one the checkpoint's state was made with, else `requested`.

    Sets are hashed into buckets, so another count would look for every set's state under
    another key (masters, proposed epochs and disconnects would be forgotten). A new local
    checkpoint records `requested`; a remote one (a Hadoop URI) runs with `requested` as given.
    """
    if "://" in checkpoint and not checkpoint.startswith("file://"):
        return requested
    path = Path(checkpoint.removeprefix("file://"))
    pin = path / BUCKETS_FILE
    if pin.exists():
        pinned = int(pin.read_text().strip())
    elif (path / "offsets").exists():
        pinned = LEGACY_BUCKETS
    else:
        pinned = requested
    if pinned != requested:
        log.warning("--buckets %d ignored: checkpoint %s holds state in %d buckets", requested, checkpoint, pinned)
    path.mkdir(parents=True, exist_ok=True)
    pin.write_text(f"{pinned}\n")
    return pinned


# The sizing rule for `--read-tasks` (docs/heartbeat-pipeline.md, "Sizing the read"): one Python worker reads,
# decodes and folds a heartbeat in ~25 µs, and every further read task costs a Python worker round trip and its
# reader's fixed work per batch (measured at 1,000 sets: 203 → 300 µs of job CPU a heartbeat, batches no shorter;
# at 10,000 sets: batches 1.65 → 1.2-1.3 s, detection timeout + 2.4 → + 1.7 s).
HEARTBEATS_PER_READ_TASK = 10_000
LOCAL_CORES = 2  # the job's Spark master when run with plain python (not under spark-submit): local[2]


def read_tasks_for(heartbeats_per_s: float, cores: int) -> int:
    """Read tasks for a fleet sending `heartbeats_per_s`, on a job with `cores` cores of its own: one per
    HEARTBEATS_PER_READ_TASK a second, at least one, at most one per core."""
    return max(1, min(max(1, cores), math.ceil(heartbeats_per_s / HEARTBEATS_PER_READ_TASK)))


@dataclass
class JobConfig:
    bootstrap: str
    controllers: list[str]
    checkpoint: str
    trigger_ms: int = 1000
    spark_master: str | None = None     # None: spark-submit's master, or local[2] when run with plain python
    topic_prefix: str = ""
    shuffle_partitions: int = 1          # state store partitions: one task each per batch (docs/heartbeat-pipeline.md)
    buckets: int = 2                     # operator keys (sets are hashed into them); pinned per checkpoint
    read_tasks: int = 1                  # Spark tasks reading one batch from Kafka (0: one per Kafka partition)
    source: str = "auto"                 # auto | kafka | python
    hwm_fix: bool = True
    starting_offsets: str = "earliest"
    proposal_retries: int = 3
    retry_factor: int = 2
    disconnect_grace_ms: int = 0         # a lost session counts after this long (docs/failover-signal.md)
    http_deadline_s: float = 10.0
    proposals_in_operator: bool = True    # the operator sends a proposal as it decides it (sink.OperatorProposer)
    app_name: str = "electra-streaming"
    extra_conf: dict[str, str] = field(default_factory=dict)

    @property
    def topics(self) -> records.Topics:
        return records.Topics.prefixed(self.topic_prefix)


# ---------------------------------------------------------------------- Spark session
def _under_spark_submit() -> bool:
    return "PYSPARK_GATEWAY_PORT" in os.environ


# The JVM this process starts (local master): the serial collector. The job's heap is small and short-lived
# (state lives in RocksDB, off the heap); G1's concurrent threads and barriers took CPU from a machine the
# stack shares (bench stream, 1,000 sets: the JVM's CPU per heartbeat 219 -> 185 µs, docs/heartbeat-pipeline.md
# round 6). `--conf spark.driver.extraJavaOptions=...` replaces it.
LOCAL_JVM_OPTIONS = "-XX:+UseSerialGC"


def build_spark(cfg: JobConfig):
    from pyspark.sql import SparkSession

    master = cfg.spark_master or (None if _under_spark_submit() else f"local[{LOCAL_CORES}]")
    local = master is not None and master.startswith("local")
    if local:  # the workers must import electra: the same interpreter as the driver
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # loopback only; no hostname lookup warning
    b = SparkSession.builder.appName(cfg.app_name)
    if master:
        b = b.master(master)
    conf = {
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
        # Commit a changelog per batch instead of uploading RocksDB files (measured: commit ~70 vs ~150 ms).
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        # State checkpoint format v2: the commit log carries each state store's checkpoint id, so a batch's
        # commit does not list or look up RocksDB's files by version (applies to new checkpoints).
        "spark.sql.streaming.stateStore.checkpointFormatVersion": "2",
        "spark.sql.shuffle.partitions": str(cfg.shuffle_partitions),
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.session.timeZone": "UTC",
    }
    if local:
        conf.update({"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
                     "spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
                     "spark.driver.extraJavaOptions": LOCAL_JVM_OPTIONS})
        # This process starts the JVM, so the class path is still ours to set: checkpoint files without a
        # chmod process each (streaming/local_fs_jar.py). `--conf spark.hadoop.fs.file.impl=...` overrides it.
        from electra.streaming.local_fs_jar import build_jar, spark_conf

        jar = build_jar()
        if jar is not None:
            conf.update(spark_conf(jar))
    conf.update(cfg.extra_conf)
    for k, v in conf.items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    _quiet_spark_loggers(spark)
    return spark


# Warnings that repeat on every micro-batch or worker and say nothing actionable here.
_NOISY_LOGGERS = (
    "org.apache.spark.sql.execution.streaming.runtime.ProcessingTimeExecutor",  # "batch is falling behind"
    "org.apache.spark.sql.execution.python.streaming.TransformWithStateInPySparkStateServer",  # socket closed
    "org.apache.spark.sql.execution.streaming.runtime.ResolveWriteToStream",  # AQE disabled in streaming
    "org.apache.spark.sql.execution.streaming.runtime.MicroBatchExecution",  # AQE disabled for stateful
)


def _quiet_spark_loggers(spark) -> None:
    try:
        jvm = spark._jvm  # noqa: SLF001
        level = jvm.org.apache.logging.log4j.Level.ERROR
        for name in _NOISY_LOGGERS:
            jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(name, level)
    except Exception:  # noqa: BLE001 - logging only
        log.debug("could not lower Spark log levels", exc_info=True)


# ---------------------------------------------------------------------- sink
class BatchSink:
    """`foreachBatch`: liveness + dead letters to Kafka, proposals to the controller leader."""

    def __init__(self, cfg: JobConfig, client=None, output=None) -> None:
        from electra.streaming.sink import ControllerClient, KafkaOutput

        t = cfg.topics
        self.client = client or ControllerClient(cfg.controllers, deadline_s=cfg.http_deadline_s)
        self.output = output or KafkaOutput(cfg.bootstrap, t.liveness, t.dead_letters, cfg.disconnect_grace_ms)
        self.stats: dict[int, dict] = {}
        self.dead_letters_total = 0
        self.proposals_total = 0
        self._lock = threading.Lock()

    def __call__(self, df, batch_id: int) -> None:
        t0 = time.perf_counter()
        table = df.toArrow()  # Arrow columns to the driver, not one pickled Row per output row
        rows = list(zip(*(table.column(c).to_pylist() for c in ("kind", "brokerName", "payload")), strict=True))
        self.handle_rows(rows, batch_id, (time.perf_counter() - t0) * 1000)

    def handle_rows(self, rows: list[tuple[str, str, str]], batch_id: int, collect_ms: float = 0.0) -> dict:
        from electra.streaming.detector import DEAD_LETTER, LIVENESS, PROPOSAL
        from electra.streaming.sink import SENT_FIELD, settled_outcome

        t0 = time.perf_counter()
        liveness = [(name, payload) for kind, name, payload in rows if kind == LIVENESS]
        dead = [payload for kind, _, payload in rows if kind == DEAD_LETTER]
        proposals = [json.loads(payload) for kind, _, payload in rows if kind == PROPOSAL]
        # What the operator's attempt settled (sink.OperatorProposer) is not sent again; the rest are, with the
        # full retries, and before the liveness records' flush: a failover does not wait for it.
        settled = [settled_outcome(p) for p in proposals]
        resent = iter(self.client.propose_all([{k: v for k, v in p.items() if k != SENT_FIELD}
                                               for p, early in zip(proposals, settled, strict=True) if early is None]))
        answered = int(time.time() * 1000)
        failed = self.output.send(liveness, dead)
        outcomes = []
        for p, early in zip(proposals, settled, strict=True):
            o = early or next(resent)
            at = p[SENT_FIELD]["atMs"] if early else answered
            outcomes.append(o)
            last = p.get("masterLastHeartbeatMs")
            log.info("proposal %s expectedMasterEpoch=%s retry=%s -> %s (HTTP %s code %s, %d attempts via %s%s) "
                     "detect_ms=%s sent_ms=%s answered_at_ms=%d", p["brokerName"], p["expectedMasterEpoch"],
                     p.get("retry", 0), o.result, o.status, o.code, o.attempts, o.endpoint,
                     ", by the operator" if early else "", p["proposedAtMs"] - last if last else None,
                     at - last if last else None, at)
        sink_ms = (time.perf_counter() - t0) * 1000
        st = {"proposals": len(proposals), "dead_letters": len(dead), "liveness": len(liveness),
              "produce_failed": failed, "sink_ms": round(sink_ms, 1), "collect_ms": round(collect_ms, 1),
              "outcomes": [o.result for o in outcomes]}
        with self._lock:
            self.dead_letters_total += len(dead)
            self.proposals_total += len(proposals)
            self.stats[batch_id] = st
            for old in [b for b in self.stats if b < batch_id - 100]:
                del self.stats[old]
        return st

    def take(self, batch_id: int) -> dict | None:
        with self._lock:
            return self.stats.pop(batch_id, None)

    def close(self) -> None:
        self.output.close()


class ProgressLog:
    """One log line and one job-stats record per finished micro-batch, read by the driver's own loop.

    Not a `StreamingQueryListener`: PySpark calls a Python listener back over py4j and builds each event
    with dozens of py4j calls, several of them class look-ups that search every jar on the classpath (a
    JFR profile of the job here put about a quarter of the JVM's sampled CPU in that path at 1,000 sets).
    `query.lastProgress` is one call and one JSON document; `recentProgress` fills in batches that
    finished between two polls.
    """

    def __init__(self, sink: BatchSink, stats_topic: str | None = None) -> None:
        self.sink, self.stats_topic = sink, stats_topic
        self.last: tuple[int, str] = (-1, "")  # (batchId, timestamp) of the last progress reported

    @staticmethod
    def _key(p) -> tuple[int, str]:
        # A trigger that found no new records reports the id of the batch still to run (0 rows); that batch
        # then reports under the same id: the timestamp tells them apart.
        return p["batchId"], str(p.get("timestamp") or "")

    def poll(self, query) -> None:
        p = query.lastProgress
        if not p or self._key(p) <= self.last:
            return
        done = [p]
        if self.last[0] >= 0 and p["batchId"] > self.last[0] + 1:  # batches finished between two polls
            done = sorted((r for r in query.recentProgress if self._key(r) > self.last), key=self._key)
        for r in done:
            if self._key(r) > self.last:
                self.report(r)
                self.last = self._key(r)

    def report(self, p: dict) -> None:
        from electra.streaming.job_stats import batch_record

        sink = self.sink
        st = sink.take(p["batchId"]) or {"proposals": 0, "dead_letters": 0, "liveness": 0, "sink_ms": 0.0,
                                         "collect_ms": 0.0}
        phases = ",".join(f"{k}:{v}" for k, v in sorted((p.get("durationMs") or {}).items()) if v)
        for op in p.get("stateOperators") or []:
            phases += (f",state_update:{op.get('allUpdatesTimeMs')},state_commit:{op.get('commitTimeMs')},"
                       f"state_rows:{op.get('numRowsTotal')}")
        log.info("batch=%d rows=%d proposals=%d dead_letters=%d liveness=%d batch_ms=%d collect_ms=%.1f "
                 "sink_ms=%.1f dead_letters_total=%d proposals_total=%d phases=%s", p["batchId"],
                 p.get("numInputRows", 0), st["proposals"], st["dead_letters"], st["liveness"],
                 p.get("batchDuration", 0), st["collect_ms"], st["sink_ms"], sink.dead_letters_total,
                 sink.proposals_total, phases)
        if self.stats_topic and hasattr(sink.output, "send_stats"):  # for the controllers' dashboards
            sink.output.send_stats(self.stats_topic, batch_record(p, st, sink.dead_letters_total,
                                                                  sink.proposals_total, int(time.time() * 1000)))


# ---------------------------------------------------------------------- query
def build_query(spark, cfg: JobConfig, sink: BatchSink):
    from electra.streaming.kafka_source import load_kafka_stream
    from electra.streaming.parsing import PARSED_SCHEMA, parse_frames
    from electra.streaming.processor import OUTPUT_SCHEMA, MasterWatchProcessor

    t = cfg.topics
    buckets = pinned_buckets(cfg.checkpoint, cfg.buckets)
    hb_topic, ev_topic = t.heartbeats, t.events
    raw, used = load_kafka_stream(spark, cfg.bootstrap, [t.heartbeats, t.events], cfg.source, cfg.hwm_fix,
                                  cfg.starting_offsets, parse=(hb_topic, ev_topic, buckets), read_tasks=cfg.read_tasks)
    log.info("Kafka source: %s (%s, %s) on %s", used, t.heartbeats, t.events, cfg.bootstrap)

    def parse(frames):
        return parse_frames(frames, hb_topic, ev_topic, buckets)

    if used == "python+parse":  # the reader parsed already: no mapInPandas stage
        parsed = raw
    else:
        parsed = (raw.selectExpr("topic", "partition", "offset", "value", "unix_millis(timestamp) AS kafka_ts")
                  .mapInPandas(parse, PARSED_SCHEMA))
    proposer = None
    if cfg.proposals_in_operator:
        from electra.security.credentials import ClientCredentials
        from electra.streaming.sink import OperatorProposer

        creds = ClientCredentials.from_env()
        proposer = OperatorProposer(cfg.controllers, deadline_s=min(OPERATOR_PROPOSAL_DEADLINE_S, cfg.http_deadline_s),
                                    driver_has=(creds.token is not None, creds.ca_file is not None))
    processor = MasterWatchProcessor(cfg.proposal_retries, cfg.retry_factor, cfg.disconnect_grace_ms, proposer)
    out = parsed.groupBy("bucket").transformWithStateInPandas(processor, OUTPUT_SCHEMA, "Update", "ProcessingTime")
    return (out.writeStream.queryName(cfg.app_name).outputMode("update")
            .option("checkpointLocation", cfg.checkpoint)
            .trigger(processingTime=f"{cfg.trigger_ms} milliseconds")
            .foreachBatch(sink).start())


def _wait_batch_done(query, timeout_s: float) -> None:
    """Let the micro-batch in flight finish (query.stop() would interrupt it; Spark re-runs it on restart)."""
    def last_batch() -> int:
        p = query.lastProgress
        return p["batchId"] if p else -1

    try:
        if not query.status.get("isTriggerActive"):
            return
        seen = last_batch()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and query.status.get("isTriggerActive") and last_batch() == seen:
            time.sleep(0.05)
    except Exception:  # noqa: BLE001 - query already gone
        return


def run_job(cfg: JobConfig, stop: threading.Event | None = None) -> int:
    """Run until `stop` is set or the query fails; returns a process exit code."""
    stop = stop or threading.Event()
    t0 = time.monotonic()
    spark = build_spark(cfg)
    log.info("Spark %s up in %.1fs (master %s)", spark.version, time.monotonic() - t0, spark.sparkContext.master)
    sink = BatchSink(cfg)
    progress = ProgressLog(sink, cfg.topics.job_stats)
    query = None
    code = 0
    try:
        if stop.is_set():  # a SIGTERM while Spark started: do not build the source and the query (10 s and more)
            log.info("stopped before the query started")
            return code
        query = build_query(spark, cfg, sink)
        log.info("query started: id=%s run=%s", query.id, query.runId)
        while not stop.is_set():
            if query.awaitTermination(0.2):
                break
            progress.poll(query)
        progress.poll(query)
        if query.exception() is not None:
            log.error("streaming query failed: %s", query.exception())
            code = 1
    except Exception:
        log.exception("streaming job failed")
        code = 1
    finally:
        if query is not None and query.isActive:
            log.info("stopping the streaming query")
            _wait_batch_done(query, timeout_s=10.0)
            with contextlib.suppress(Exception):  # the batch that finished while stopping
                progress.poll(query)
            try:
                query.stop()
            except Exception:  # noqa: BLE001
                log.exception("query.stop() failed")
        sink.close()
        spark.stop()
        log.info("stopped")
    return code


def _parser() -> Parser:
    ap = Parser(prog="python -m electra.streaming.job", description=__doc__.split("\n")[0])
    ap.add_argument("--bootstrap", type=server_list, required=True,
                    help="Kafka bootstrap servers host:port[,host:port]")
    ap.add_argument("--controllers", type=server_list, required=True, help="controller HTTP endpoints h:p,h:p,h:p")
    ap.add_argument("--checkpoint", required=True, help="checkpoint directory (local path or a Hadoop URI)")
    ap.add_argument("--trigger-ms", type=int, minimum=0, default=1000)
    ap.add_argument("--spark-master", default=None, help="default: spark-submit's master, else local[2]")
    ap.add_argument("--topic-prefix", type=topic_prefix, default="")
    ap.add_argument("--shuffle-partitions", type=int, minimum=1, default=1,
                    help="state store partitions, one task each per batch (size it to the executors' cores)")
    ap.add_argument("--read-tasks", type=int, minimum=0, default=1,
                    help="tasks reading a batch from Kafka with the Python source (0: one per Kafka partition); "
                         f"one per {HEARTBEATS_PER_READ_TASK:,} heartbeats a second, at most the job's cores")
    ap.add_argument("--buckets", type=int, minimum=1, default=2,
                    help="stateful operator keys; broker sets are hashed into them (pinned once a checkpoint exists: "
                         "every key costs state round trips to the JVM per batch, so few is fast)")
    ap.add_argument("--source", choices=("auto", "kafka", "python"), default="auto")
    ap.add_argument("--no-hwm-fix", action="store_true", help="real Kafka: trust ListOffsets (tansu needs the fix)")
    ap.add_argument("--starting-offsets", choices=("earliest", "latest"), default="earliest")
    ap.add_argument("--proposal-retries", type=int, minimum=0, default=3)
    ap.add_argument("--http-deadline-s", type=float, default=10.0)
    ap.add_argument("--proposals-at-batch-end", action="store_true",
                    help="send proposals from foreachBatch only, not from the operator as it decides them")
    ap.add_argument("--disconnect-grace-ms", type=int, minimum=0, maximum=3_600_000, default=0,
                    help="a master whose session connection was lost counts as inactive this long after the loss "
                         "(0: at once, RocketMQ's rule; a goodbye always counts at once)")
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark config")
    ap.add_argument("--log-level", default="INFO", type=str.upper,
                    choices=("NOTSET", "DEBUG", "INFO", "WARNING", "WARN", "ERROR", "CRITICAL", "FATAL"))
    return ap


def _parse(argv: list[str] | None) -> tuple[Parser, argparse.Namespace]:
    """The job's arguments, with the checks argparse cannot state on one option."""
    ap = _parser()
    a = ap.parse_args(argv)
    if not a.checkpoint.strip():
        ap.error("--checkpoint must not be empty")
    bad = [kv for kv in a.conf if "=" not in kv or not kv.split("=", 1)[0].strip()]
    if bad:
        ap.error(f"--conf: KEY=VALUE expected, got {bad[0]!r}")
    return ap, a


def check_extra_args(extra: list[str]) -> None:
    """Arguments a benchmark passes through to the job (`--job-arg`), checked by the job's own parser before the
    benchmark starts Kafka and the controllers (SystemExit 2 with the job's message, as the job would end)."""
    _parse(["--bootstrap", "127.0.0.1:1", "--controllers", "127.0.0.1:1", "--checkpoint", ".", *extra])


def parse_args(argv: list[str] | None = None) -> JobConfig:
    _, a = _parse(argv)
    logging.basicConfig(level=a.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("py4j", "kafka"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    extra = dict(kv.split("=", 1) for kv in a.conf)
    return JobConfig(bootstrap=a.bootstrap, controllers=[c for c in a.controllers.split(",") if c.strip()],
                     checkpoint=a.checkpoint, trigger_ms=a.trigger_ms, spark_master=a.spark_master,
                     topic_prefix=a.topic_prefix, shuffle_partitions=a.shuffle_partitions, buckets=a.buckets,
                     read_tasks=a.read_tasks,
                     source=a.source,
                     hwm_fix=not a.no_hwm_fix, starting_offsets=a.starting_offsets,
                     proposal_retries=a.proposal_retries, http_deadline_s=a.http_deadline_s,
                     proposals_in_operator=not a.proposals_at_batch_end,
                     disconnect_grace_ms=a.disconnect_grace_ms, extra_conf=extra)


def main(argv: list[str] | None = None) -> int:
    keep_read_buffers_off_mmap()  # proposals over HTTPS (electra/malloc_thresholds.py)
    cfg = parse_args(argv)
    stop = threading.Event()

    def on_signal(signum, _frame):
        log.info("signal %d: stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    code = run_job(cfg, stop)
    log.info("exit %d", code)
    return code


def exit_now(code: int) -> None:
    """End the process once the job has stopped: the query, the sink and Spark are closed by then.

    Interpreter shutdown would still join whatever non-daemon threads py4j, the JVM gateway and
    kafka-python left behind, and a supervisor waiting for the exit code would wait with it.
    """
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
