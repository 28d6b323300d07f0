"""`electra bench stream`: the streaming job alone: batch times and detection latency with many broker sets.

    electra bench stream [--sets 100] [--brokers 3] [--hb-interval-ms 1000] [--timeout-ms 3000]
                         [--kill 10] [--trigger-ms 1000] [--shuffle-partitions 1] [--buckets 2] [--read-tasks N]
                         [--group N] [--phases 10] [--job-arg=--conf=KEY=VALUE ...] [--out DIR]

Starts tansu, a recording controller stand-in (stdlib HTTP server; answers 200 and publishes the
ElectMaster event), and the real job in local mode; all brokers heartbeat (produced straight to
Kafka, no HTTP; each broker's record is encoded once and only its `ts` is filled in per beat, and the
heartbeats of each of `--phases` instants of the interval go out as whole record batches (`heartbeat_load.py`,
~2 us a record), so one thread offers the 30,000 a second of 10,000 sets), then the masters of `--kill` sets
stop, each at its own phase (so the detection percentiles are over that many phases of the job's batches,
not one). The job reads with `--read-tasks` tasks, by default the job's sizing rule for this load
(`streaming.job.read_tasks_for`). Heartbeats go into Kafka records
as ingest workers write them (`records.heartbeat_group`): `--group N` heartbeats of one partition per
record, by default what three nodes' ingest workers grouping for `api.ingest.GROUP_LINGER_MS` give at
this rate (`heartbeat_load.ingest_group_size`); `--group 1` is one heartbeat per record, as ingest
wrote them before. Prints a
JSON summary (time to the first batch, batch_ms percentiles after warm-up, detection latency = master's
last heartbeat -> proposal received, duplicate proposals), then `RESULT sets=<n> batch_ms_p50=<n>
detect_p50_s=<x> detect_p99_s=<x> ... job_cpu_us_per_hb=<x>` (the job's whole process tree, from /proc,
per heartbeat produced after warm-up, and `read_tasks=<n>`).
`electra bench failover` measures the same through the whole pipeline (HTTP ingest, controllers).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from kafka import KafkaProducer

from electra.cli_args import Parser, make_dir
from electra.interrupts import die_with_parent
from electra.local_ports import free_port
from electra.security.credentials import without_credentials
from electra.streaming import kafka_io, records
from electra.streaming.embedded_kafka import EmbeddedKafka
from electra.streaming.job import LOCAL_CORES, check_extra_args, read_tasks_for

from .common import _stat_fields, process_children, process_tree_cpu_s, result_line
from .heartbeat_load import RoundProducer, ingest_group_size, partition_of, phase_slices


def _role(pid: int, root: int) -> str:
    """Which part of the job a process is: the driver, the JVM, or a kind of Python worker."""
    if pid == root:
        return "driver"
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "gone"
    if "java" in cmd.split(" ", 1)[0]:
        return "jvm"
    m = re.search(r"pyspark\.([\w.]+)", cmd)
    return f"py:{m.group(1)}" if m else "py:other"


def cpu_by_role(root: int) -> dict[str, float]:
    """CPU seconds of the job's process tree by role (as `process_tree_cpu_s`, split by `_role`)."""
    children = process_children()
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    todo = [root]
    while todo:
        pid = todo.pop()
        f = _stat_fields(pid)
        if f is None:
            continue
        role = _role(pid, root)
        out[role] = out.get(role, 0.0) + sum(int(x) for x in f[11:15]) / tick
        todo += children.get(pid, [])
    return out


def phase_medians(lines: list[str]) -> dict[str, float]:
    """The median of each batch phase (`phases=` in the job's per-batch log line), in ms."""
    seen: dict[str, list[int]] = {}
    for line in lines:
        m = re.search(r" phases=(\S+)", line)
        for kv in (m.group(1).split(",") if m else []):
            k, _, v = kv.partition(":")
            if v.isdigit():
                seen.setdefault(k, []).append(int(v))
        for k in ("collect_ms", "sink_ms"):
            m = re.search(rf" {k}=([\d.]+)", line)
            if m:
                seen.setdefault(k, []).append(round(float(m.group(1))))
    return {k: statistics.median(v) for k, v in sorted(seen.items())}


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="electra bench stream", description=__doc__.splitlines()[0])
    ap.add_argument("--sets", type=int, minimum=1, maximum=100_000, default=100, help="broker sets (default 100)")
    ap.add_argument("--brokers", type=int, minimum=1, maximum=64, default=3, help="brokers per set (default 3)")
    ap.add_argument("--hb-interval-ms", type=int, minimum=1, default=1000,
                    help="each broker's heartbeat interval (default 1000, RocketMQ's)")
    ap.add_argument("--timeout-ms", type=int, minimum=1, default=3000,
                    help="heartbeatTimeoutMillis the brokers send (default 3000)")
    ap.add_argument("--kill", type=int, minimum=0, default=None,
                    help="sets whose master stops heartbeating after the warm-up (default 10, or every set if fewer)")
    ap.add_argument("--trigger-ms", type=int, minimum=0, default=1000,
                    help="the job's micro-batch trigger interval (default 1000)")
    ap.add_argument("--shuffle-partitions", type=int, minimum=1, default=1,
                    help="the job's spark.sql.shuffle.partitions (default 1)")
    ap.add_argument("--read-tasks", type=int, minimum=0, default=None,
                    help="source read tasks per batch (default: the job's sizing rule for this load on its "
                         "local[2] master, `streaming.job.read_tasks_for`; 0: one per Kafka partition)")
    ap.add_argument("--job-arg", action="append", default=[], help="extra argument for the job (repeatable)")
    ap.add_argument("--buckets", type=int, minimum=1, default=2,
                    help="operator keys; a value >= --sets is one key per set (the layout before buckets)")
    ap.add_argument("--group", type=int, minimum=0, default=0,
                    help="heartbeats per Kafka record (default 0: what the ingest workers would group at this rate; "
                         "1: one per record)")
    ap.add_argument("--phases", type=int, minimum=1, maximum=1000, default=10,
                    help="instants of the heartbeat interval the brokers' heartbeats are spread over (default 10; "
                         "1: every broker at once, the generator before 2026-11-28)")
    ap.add_argument("--warmup-s", type=float, minimum=0, default=10.0,
                    help="seconds of heartbeats before measuring and killing (default 10)")
    ap.add_argument("--out", default=None,
                    help="directory for the job log and checkpoint, kept (default: a temp dir, removed after a "
                         "good run and kept after a failed one)")
    a = ap.parse_args(argv)
    if a.kill is None:
        a.kill = min(10, a.sets)
    elif a.kill > a.sets:
        ap.error(f"--kill {a.kill}: there are only {a.sets} sets (--sets)")
    check_extra_args(a.job_arg)  # the job's own parser: a bad --job-arg is refused before Kafka starts
    hb_per_s = a.sets * a.brokers * 1000 / a.hb_interval_ms
    if a.read_tasks is None:
        a.read_tasks = read_tasks_for(hb_per_s, LOCAL_CORES)
    out = make_dir(a.out, "--out") if a.out else Path(tempfile.mkdtemp(prefix="electra-stream-bench-"))

    kafka = EmbeddedKafka(log_file=out / "tansu.log").start()
    kafka_io.ensure_topics(kafka.bootstrap, records.Topics().partitions())
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap, linger_ms=20, batch_size=256 << 10)
    lock = threading.Lock()
    index = [0]
    posts: list[tuple[float, str, dict]] = []

    def event(name: str, master: int, epoch: int, flush: bool = True) -> None:
        with lock:
            index[0] += 1
            state = {"clusterName": "c", "masterBrokerId": master, "masterEpoch": epoch, "syncStateSet": [master],
                     "syncStateSetEpoch": epoch, "brokers": {}}
            ev = records.event_record(index[0], 1, int(time.time() * 1000), {"type": "ElectMaster",
                                                                             "brokerName": name}, state, "c")
            producer.send(records.EVENTS, key=name.encode(), value=records.encode(ev))
            if flush:
                producer.flush()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def _reply(self, status: int, body: dict) -> None:
            raw = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self) -> None:
            self._reply(200, {"is_leader": True, "leader_address": None})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            posts.append((time.time(), body["brokerName"], body))
            event(body["brokerName"], 2, body["expectedMasterEpoch"] + 1)
            self._reply(200, {"code": 0})

    port = free_port()
    httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()

    names = [f"set-{i:04d}" for i in range(a.sets)]
    for n in names:
        event(n, 1, 1, flush=False)
    producer.flush()
    summary_load = {"rounds": 0, "late_rounds": 0}
    stopped: set[str] = set()
    last_master_hb: dict[str, int] = {}
    quit_ = threading.Event()

    # Every broker's heartbeat encoded once, up to its "ts" value (the last field), with its partition.
    parts = records.DEFAULT_PARTITIONS[records.HEARTBEATS]
    templates = [(n, b, partition_of(n.encode(), parts), n.encode(), records.encode({
        "clusterName": "c", "brokerName": n, "brokerAddr": f"{n}-{b}:10911", "brokerId": b, "epoch": 1, "maxOffset": 1,
        "confirmOffset": 1, "heartbeatTimeoutMillis": a.timeout_ms, "electionPriority": b, "ts": 0})[:-2])
        for n in names for b in range(1, a.brokers + 1)]
    produced = [0]
    load = RoundProducer(kafka.bootstrap, records.HEARTBEATS)
    group = a.group or ingest_group_size(len(templates) * 1000 / a.hb_interval_ms, parts)

    def grouped(round_: list[tuple[int, bytes, bytes]]) -> list[tuple[int, bytes | None, bytes]]:
        """A round's records as ingest workers write them: `group` heartbeats of a partition per record."""
        if group <= 1:
            return round_
        by_part: dict[int, list[bytes]] = {}
        for p, _key, value in round_:
            by_part.setdefault(p, []).append(value)
        return [(p, None, records.heartbeat_group(values[i:i + group]))
                for p, values in by_part.items() for i in range(0, len(values), group)]

    # Each broker heartbeats at one of `--phases` instants of the interval, spread evenly (a fleet's brokers
    # start at different times, so their heartbeats are spread over the interval): the data horizon then moves
    # every interval / phases, not once an interval (with one phase, a deadline that falls just after a round
    # waited a whole interval for the next, later heartbeat to pass it).
    slices = phase_slices(templates, a.phases, a.brokers)
    step_s = a.hb_interval_ms / 1000 / a.phases

    def beat() -> None:
        """Every `step_s`, one phase's live brokers' heartbeats, as whole record batches."""
        k = 0
        while not quit_.is_set():
            t0 = time.monotonic()
            ts = int(time.time() * 1000)
            tail = b"%d}" % ts
            gone = set(stopped)
            beats = [(p, key, head + tail) for n, b, p, key, head in slices[k] if not (b == 1 and n in gone)]
            load.send_round(grouped(beats), ts)
            for n, b, _p, _key, _head in slices[k]:
                if b == 1 and n not in gone:
                    last_master_hb[n] = ts
            produced[0] += len(beats)
            k = (k + 1) % a.phases
            late = time.monotonic() - t0
            summary_load["rounds"] += 1
            summary_load["late_rounds"] += late > step_s
            quit_.wait(max(0.0, step_s - late))

    threading.Thread(target=beat, daemon=True).start()
    log_path = out / "job.log"
    t_start = time.monotonic()
    job = subprocess.Popen(die_with_parent([
                               sys.executable, "-m", "electra.streaming.job", "--bootstrap", kafka.bootstrap,
                               "--controllers", f"127.0.0.1:{port}", "--checkpoint", str(out / "checkpoint"),
                               "--trigger-ms", str(a.trigger_ms), "--shuffle-partitions", str(a.shuffle_partitions),
                               "--buckets", str(a.buckets), "--read-tasks", str(a.read_tasks), *a.job_arg]),
                           stdout=open(log_path, "ab"), stderr=subprocess.STDOUT,  # noqa: SIM115
                           start_new_session=True,
                           # its controller here is this benchmark's plaintext stand-in: a shell's exported
                           # cluster credential (`electra up` prints one) made every proposal fail on TLS
                           env=without_credentials(dict(os.environ)))
    summary: dict = {"sets": a.sets, "brokers": a.brokers, "heartbeats_per_record": group,
                     "hb_per_s": hb_per_s, "phases": a.phases, "read_tasks": a.read_tasks,
                     "shuffle_partitions": a.shuffle_partitions,
                     "timeout_ms": a.timeout_ms, "trigger_ms": a.trigger_ms, "out": str(out)}
    try:
        deadline = time.monotonic() + 300
        while "batch=0 " not in log_path.read_text() and time.monotonic() < deadline and job.poll() is None:
            time.sleep(0.5)
        summary["first_batch_s"] = round(time.monotonic() - t_start, 1)
        time.sleep(a.warmup_s)
        n_lines = len(log_path.read_text().splitlines())
        cpu0, t_cpu0, produced0 = process_tree_cpu_s(job.pid), time.monotonic(), produced[0]
        roles0 = cpu_by_role(job.pid)
        victims = names[: a.kill]
        stopped.update(victims)
        time.sleep(a.hb_interval_ms / 1000 + 0.1)
        # a master whose phase had not come round before the kill (a warm-up shorter than the interval) never beat
        killed_at = {n: last_master_hb[n] for n in victims if n in last_master_hb}
        deadline = time.monotonic() + 60
        while len({p[1] for p in posts}) < len(victims) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(2 * a.timeout_ms / 1000 + 1)
        # CPU of the job's whole process tree (driver, JVM, Python workers) per heartbeat produced meanwhile.
        hbs = max(1, produced[0] - produced0)
        summary["produced_hb_per_s"] = round(hbs / (time.monotonic() - t_cpu0))
        summary.update(load_rounds=summary_load["rounds"], load_rounds_late=summary_load["late_rounds"],
                       load_partition_errors=load.errors)
        summary["job_cpu_us_per_hb"] = round((process_tree_cpu_s(job.pid) - cpu0) / hbs * 1e6, 1)
        roles1 = cpu_by_role(job.pid)  # a worker that exited in between is counted in its parent's cutime
        summary["cpu_us_per_hb_by_role"] = {r: round((roles1[r] - roles0.get(r, 0.0)) / hbs * 1e6, 1)
                                            for r in sorted(roles1) if roles1[r] - roles0.get(r, 0.0) > 0}
        summary["measured_s"] = round(time.monotonic() - t_cpu0, 1)
        lines = log_path.read_text().splitlines()[n_lines:]
        batch_ms = [int(m.group(1)) for m in (re.search(r" batch_ms=(\d+)", x) for x in lines) if m]
        rows = [int(m.group(1)) for m in (re.search(r" rows=(\d+)", x) for x in lines) if m]
        summary["phase_ms_p50"] = phase_medians(lines)
        if batch_ms:  # what a batch costs, whatever it holds: the lever when batches run back to back
            cpu_s = sum(summary["cpu_us_per_hb_by_role"].values()) * hbs / 1e6
            summary["cpu_core_s_per_batch"] = round(cpu_s / len(batch_ms), 3)
        first = {}
        for t, n, _ in posts:
            first.setdefault(n, t)
        lat = [first[n] * 1000 - killed_at[n] for n in victims if n in first]
        summary.update({
            "batches": len(batch_ms), "rows_per_batch_median": statistics.median(rows) if rows else None,
            "batch_ms_p50": _pct(batch_ms, 0.5), "batch_ms_p90": _pct(batch_ms, 0.9), "batch_ms_max": max(batch_ms,
                                                                                                         default=None),
            "killed": len(victims), "proposed": len(first), "proposals_total": len(posts),
            "wrong_sets": sorted({n for _, n, _ in posts} - set(victims)),
            "detect_ms_p50": _pct(lat, 0.5), "detect_ms_p99": _pct(lat, 0.99),
            "detect_ms_max": max(lat, default=None)})
    finally:
        quit_.set()
        job.send_signal(signal.SIGTERM)
        try:
            summary["job_exit"] = job.wait(timeout=60)
        except subprocess.TimeoutExpired:
            job.kill()
            summary["job_exit"] = "killed"
        httpd.shutdown()
        load.close()
        producer.close(timeout=5)  # before tansu stops: its client would log lost connections after the RESULT
        kafka.stop()
    print(json.dumps(summary))
    detect = [summary.get("detect_ms_p50"), summary.get("detect_ms_max"), summary.get("detect_ms_p99")]
    print(result_line(sets=a.sets, buckets=a.buckets, batch_ms_p50=summary.get("batch_ms_p50"),
                      batch_ms_p90=summary.get("batch_ms_p90"),
                      detect_p50_s=None if detect[0] is None else round(detect[0] / 1000, 2),
                      detect_p99_s=None if detect[2] is None else round(detect[2] / 1000, 2),
                      detect_max_s=None if detect[1] is None else round(detect[1] / 1000, 2),
                      job_cpu_us_per_hb=summary.get("job_cpu_us_per_hb"),
                      proposed=summary.get("proposed"), killed=summary.get("killed"),
                      duplicates=summary.get("proposals_total", 0) - summary.get("proposed", 0),
                      timeout_s=a.timeout_ms / 1000, read_tasks=a.read_tasks))
    if summary.get("killed") and not summary.get("proposed"):
        print(f"error: {summary['killed']} masters were killed and no proposal reached the benchmark's controller: "
              f"see {log_path} (kept)", file=sys.stderr)
        return 1
    if a.out is None:  # a temp dir of its own: gone after a good run (kept, and named, after a failed one)
        shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
