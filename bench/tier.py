"""`electra bench tier`: tier upload lag under the controller benchmark's write load.

Starts 3 `electra node` controller processes (fsync on) with `--tier-uri` on a
local directory, runs `electra bench controller`'s closed-loop broker load over
HTTP (each register changes the broker's address: a log entry, so an event to
upload; the same address would be answered by a read and upload nothing), and
samples the leader's `/metrics` every 100 ms: upload lag in entries
(applied index minus the index the events table covers) and in seconds (age of
the state the table reflects while it lags). After the load it waits for the
tier to catch up and checks that the events table covers the applied index.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

from electra.cli_args import Parser
from electra.interrupts import run_async
from electra.tiering.options import is_local, tier_uri

from .common import bench_credentials, percentile, result_line, start_controller_processes, stop_processes
from .controller import _load


def _tier_uri(text: str) -> str:
    """`--tier-uri`, checked before any node starts: the scheme as `electra node` checks it, and a local path must
    be a directory this process can write (the nodes run as it). An unusable one made every node log a traceback
    per upload retry, and the run ended on the reader's TableNotFoundError; an empty one fell back silently."""
    uri = tier_uri(text)
    if not uri:
        raise argparse.ArgumentTypeError("empty: omit --tier-uri for a directory in the benchmark's temporary "
                                         "directory")
    if is_local(uri):
        path = Path(uri[len("file://"):] if uri.startswith("file://") else uri)
        try:
            path.mkdir(parents=True, exist_ok=True)
            probe = path / f".bench-tier-probe-{os.getpid()}"
            probe.write_text("")
            probe.unlink()
        except OSError as exc:
            raise argparse.ArgumentTypeError(f"{uri}: cannot write the tier there ({exc.strerror or exc})") from None
    return uri


def _metric(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


SAMPLE_PERIOD_S = 0.1
MIN_LAG_SAMPLES = 10  # fewer and a p99 is one of a handful of readings: no lag figure


def _sample(endpoints: list[str], stop: threading.Event, samples: list[tuple[float, float]], creds) -> None:
    """The leader's upload lag every 100 ms, on a thread of its own: on the load generator's event loop
    (busy with the writes) a 2 s run took 2 samples, and a p99 of two samples says nothing.

    One kept-alive connection per node, the leader asked first: a new HTTPS connection per request (a TLS
    handshake on a loaded machine) and a walk over the followers before the leader took about 200 ms a sample,
    15 samples in 3 s. A sample counts only from a node that reports `electra_tier_uploading 1` (the leader,
    once its uploader runs)."""
    import http.client

    obs = creds.credentials("observer")
    ctx = obs.ssl_context()
    conns: dict[str, http.client.HTTPConnection] = {}
    order = list(endpoints)

    def metrics(ep: str) -> str | None:
        conn = conns.get(ep)
        if conn is None:
            host, port = ep.rsplit(":", 1)
            conn = conns[ep] = (http.client.HTTPSConnection(host, int(port), timeout=2, context=ctx)
                                if obs.scheme == "https" else http.client.HTTPConnection(host, int(port), timeout=2))
        try:
            conn.request("GET", "/metrics", headers=obs.headers())
            with conn.getresponse() as r:
                body = r.read()
                return body.decode() if r.status == 200 else None
        except (OSError, http.client.HTTPException):
            conn.close()  # reconnects next time
            del conns[ep]
            return None

    next_at = time.monotonic()
    try:
        while not stop.is_set():
            for ep in list(order):
                text = metrics(ep)
                if text is not None and _metric(text, "electra_tier_uploading") == 1.0:
                    samples.append((_metric(text, "electra_tier_upload_lag_entries") or 0.0,
                                    _metric(text, "electra_tier_upload_lag_seconds") or 0.0))
                    order.remove(ep)
                    order.insert(0, ep)  # the leader first next time
                    break
            next_at = max(next_at + SAMPLE_PERIOD_S, time.monotonic())  # late: the next one now, no burst
            stop.wait(next_at - time.monotonic())
    finally:
        for conn in conns.values():
            conn.close()


def lag_figures(samples: list[tuple[float, float]], duration: float) -> tuple[int | float, float]:
    """The upload lag's p99 in entries and in seconds; nan for both, with the reason on stderr, from fewer than
    MIN_LAG_SAMPLES samples (a short run: the leader's uploader starts after its first round). The RESULT line
    said `None` then, unexplained."""
    if len(samples) < MIN_LAG_SAMPLES:
        print(f"upload lag not measured: {len(samples)} lag sample{'s' if len(samples) != 1 else ''} in a "
              f"{duration:g} s run, a p99 needs at least {MIN_LAG_SAMPLES} (one every {SAMPLE_PERIOD_S:g} s while "
              "the leader reports its uploader running): run longer (--duration)", file=sys.stderr)
        return float("nan"), float("nan")
    entries, seconds = sorted(x[0] for x in samples), sorted(x[1] for x in samples)
    return round(percentile(entries, 0.99)), round(percentile(seconds, 0.99), 3)


async def _run(endpoints: list[str], brokers: int, duration: float, creds) -> tuple[dict, list]:
    samples: list[tuple[float, float]] = []
    stop = threading.Event()
    sampler = threading.Thread(target=_sample, args=(endpoints, stop, samples, creds), name="lag-sampler",
                               daemon=True)
    sampler.start()
    try:
        out = await _load(endpoints, brokers, duration, creds)
    finally:
        stop.set()
        sampler.join(timeout=10)
    return out, samples


async def _final(endpoints: list[str], creds, timeout: float = 30.0) -> tuple[float, float]:
    import aiohttp

    deadline = time.monotonic() + timeout
    obs = creds.credentials("observer")
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2), headers=obs.headers(),
                                     connector=aiohttp.TCPConnector(ssl=obs.ssl_context() or True)) as http:
        while time.monotonic() < deadline:
            for ep in endpoints:
                try:
                    async with http.get(f"{obs.scheme}://{ep}/metrics") as r:
                        text = await r.text()
                except (aiohttp.ClientError, TimeoutError):
                    continue  # a node that stopped answering: ask the others
                if _metric(text, "electra_tier_uploading") == 1.0:
                    up = _metric(text, "electra_tier_uploaded_index")
                    applied = _metric(text, "electra_raft_applied_index")
                    if up is not None and applied is not None and up >= applied:
                        return up, applied
            await asyncio.sleep(0.2)
    return -1.0, -1.0


def _events_table(uri: str) -> tuple[int | None, int | None]:
    """The events table's rows and version; (None, None) with one `error:` line on stderr if it cannot be read
    (nothing was uploaded there, the storage failed): the load's figures are still printed."""
    from deltalake.exceptions import DeltaError

    from electra.tiering.reader import TierReader

    try:
        reader = TierReader(uri)
        return reader.table("events").num_rows, reader.store.table("events").version()
    except (DeltaError, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"error: cannot read the events table under {uri}: {first}", file=sys.stderr)
        return None, None


def main(argv: list[str]) -> int:
    p = Parser(prog="electra bench tier", description=__doc__)
    p.add_argument("--brokers", type=int, minimum=1, maximum=200_000, default=300,
                   help="simulated brokers writing (default 300; each register changes its address: a log entry)")
    p.add_argument("--duration", type=float, minimum=1, default=10.0, help="seconds measured (default 10)")
    p.add_argument("--tier-uri", type=_tier_uri,
                   help="where the nodes upload (a local directory, checked writable, or an object-store URI "
                        "delta-rs opens); default: a directory in the benchmark's temporary directory")
    args = p.parse_args(argv)
    print(f"bench tier: 3 controller processes (fsync on) uploading to Delta, {args.brokers} simulated brokers, "
          f"{args.duration:.0f}s closed loop of writes (a new address per register); lag sampled from the "
          "leader's /metrics every 100 ms", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-tier-") as tmp:
        uri = args.tier_uri or str(Path(tmp) / "tier")
        procs, endpoints = start_controller_processes(Path(tmp), ("--tier-uri", uri))
        try:
            time.sleep(3.0)
            creds = bench_credentials(Path(tmp))
            out, samples = run_async(_run(endpoints, args.brokers, args.duration, creds))
            uploaded, applied = run_async(_final(endpoints, creds))
        finally:
            stop_processes(procs)
        events, commits = _events_table(uri)
    writes = len(out["lat"]["register"])
    lag_entries = sorted(s[0] for s in samples)
    lag_s = sorted(s[1] for s in samples)
    print(f"  writes {writes / args.duration:,.0f}/s (errors {out['errors']['register']}); {len(samples)} lag samples: "
          f"entries p50 {percentile(lag_entries, 0.5):.0f} p99 {percentile(lag_entries, 0.99):.0f} "
          f"max {lag_entries[-1] if lag_entries else float('nan'):.0f}; seconds p50 {percentile(lag_s, 0.5):.3f} "
          f"p99 {percentile(lag_s, 0.99):.3f}", flush=True)
    if uploaded < 0:
        print("error: no leader reported an events table covering its applied index within 30 s after the load",
              file=sys.stderr)
    print(f"  after the load: uploaded index {uploaded:.0f} / applied {applied:.0f}; events table: "
          + (f"{events} rows, {commits} Delta versions" if events is not None else "not read"), flush=True)
    p99_entries, p99_s = lag_figures(samples, args.duration)
    print(result_line(write_per_s=round(writes / args.duration),  # too few samples (a short run): nan
                      upload_lag_p99_entries=p99_entries, upload_lag_p99_s=p99_s, lag_samples=len(samples)))
    return 0 if uploaded >= applied >= 0 and events is not None else 1
