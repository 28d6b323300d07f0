"""From a request's outcome to its HTTP answer, in one place for both front ends (FastAPI and the lean path).

An outcome is either RocketMQ's response dict (status from its code) or an engine error:
`NotLeader` becomes a 307 to the leader's API (or a 503 when no leader is known),
`FollowerBehind`/`ReadTimeout`/`NoQuorum` a 503 with the not-leader code, any error whose outcome is
unknown (`ProposalTimeout`, `NodeStopped`, `DiskFailure`, `QuorumLost`) a 504, any other `RaftError` a 503
(not applied: safe to retry). Every answer is counted in the same Prometheus metrics.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import accumulate
from urllib.parse import quote

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from electra.consensus.errors import FollowerBehind, NoQuorum, NotLeader, RaftError, ReadTimeout
from electra.state.codes import Code

_STATUS = {Code.SUCCESS: 200, Code.CONTROLLER_BROKER_METADATA_NOT_EXIST: 404,
           Code.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED: 404, Code.CONTROLLER_INVALID_REQUEST: 400,
           Code.SYSTEM_ERROR: 500}
_NOT_LEADER = int(Code.CONTROLLER_NOT_LEADER)


def status_of(code: int) -> int:
    """The HTTP status that says what a RocketMQ response code says."""
    return _STATUS.get(code, 409 if code >= 2000 else 500)


@dataclass
class Reply:
    status: int
    body: dict | bytes  # bytes: already JSON
    headers: dict[str, str] = field(default_factory=dict)


class RequestMetrics:
    """Requests by endpoint and RocketMQ code, and latency by endpoint (`/metrics`).

    Counted in plain ints and exported on scrape (`_RequestCollector`): a prometheus_client
    child's `inc()`/`observe()` takes a lock and a value object each (about 10 µs per request,
    the lean path's largest fixed cost after HTTP). The exported families, names, labels and
    buckets are those `Counter`/`Histogram` wrote: `electra_requests_total{endpoint,code}`,
    `electra_request_seconds_{bucket,count,sum}{endpoint}`.
    """

    BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5)

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.counts: dict[tuple[str, str], int] = {}  # (endpoint, code) -> requests
        self.created: dict[tuple[str, str] | str, float] = {}  # when each series first counted (unix s)
        # endpoint -> [count per bucket (the last one +Inf; not cumulative), ..., sum of seconds]
        self.latencies: dict[str, list[float]] = {}
        self.registry.register(_RequestCollector(self))

    def count(self, endpoint: str, code: int | str, n: int = 1) -> None:
        key = (endpoint, str(code))
        had = self.counts.get(key)
        if had is None:
            self.created[key] = time.time()
            had = 0
        self.counts[key] = had + n

    def observe_latency(self, endpoint: str, seconds: float) -> None:
        row = self.latencies.get(endpoint)
        if row is None:
            self.created[endpoint] = time.time()
            row = self.latencies[endpoint] = [0] * (len(self.BUCKETS) + 2)
        row[bisect_left(self.BUCKETS, seconds)] += 1
        row[-1] += seconds


class _RequestCollector(Collector):
    """`RequestMetrics`' plain counts as the Prometheus counter and histogram families."""

    def __init__(self, metrics: RequestMetrics) -> None:
        self.metrics = metrics
        self.bounds = [floatToGoString(b) for b in RequestMetrics.BUCKETS] + ["+Inf"]

    def describe(self) -> list[Metric]:
        return [CounterMetricFamily("electra_requests", "requests by endpoint and RocketMQ code",
                                    labels=["endpoint", "code"]),
                HistogramMetricFamily("electra_request_seconds", "request latency by endpoint", labels=["endpoint"])]

    def collect(self) -> list[Metric]:
        m = self.metrics
        created = dict(m.created)
        requests, latency = self.describe()
        for key, n in list(m.counts.items()):
            requests.add_metric(list(key), n, created=created.get(key))
        for endpoint, row in list(m.latencies.items()):
            row = list(row)
            cumulative = list(accumulate(row[:-1]))
            latency.add_metric([endpoint], list(zip(self.bounds, cumulative, strict=True)), row[-1])
            if endpoint in created:
                latency.samples.append(Sample("electra_request_seconds_created", {"endpoint": endpoint},
                                              created[endpoint]))
        return [requests, latency]


def count_auth_refusal(metrics: RequestMetrics | None, status: int) -> None:
    """A request refused for its credential, counted where an operator can alert on it (token guessing: 401; a
    client with the wrong role or scope: 403), as `electra_requests_total{endpoint="unauthenticated"|"forbidden"}`."""
    if metrics is not None:
        metrics.count("unauthenticated" if status == 401 else "forbidden", int(Code.NO_PERMISSION))


def answered(metrics: RequestMetrics, endpoint: str, res: dict, t0: float) -> Reply:
    """A request the controller answered (any RocketMQ code)."""
    code = res["code"]
    metrics.count(endpoint, code)
    metrics.observe_latency(endpoint, time.perf_counter() - t0)
    return Reply(status_of(code), res)


def refused(metrics: RequestMetrics, endpoint: str, exc: RaftError, leader_address: str | None,
            url_on: Callable[[str], str]) -> Reply:
    """A request this node could not serve; `url_on(addr)` is this request's URL on another node (redirects)."""
    if isinstance(exc, NotLeader):
        addr = exc.leader_addr or leader_address
        body = {"code": _NOT_LEADER, "remark": "The controller is not in leader state",
                "leader": exc.leader_id or None, "leaderAddress": addr}
        metrics.count(endpoint, _NOT_LEADER)
        if addr:
            return Reply(307, body, {"location": url_on(addr)})
        return Reply(503, body, {"retry-after": "1"})
    if isinstance(exc, NoQuorum):  # a leader cut off from its quorum: as good as no leader here, try another node
        metrics.count(endpoint, _NOT_LEADER)
        return Reply(503, {"code": _NOT_LEADER, "remark": str(exc), "leader": None, "leaderAddress": None},
                     {"retry-after": "1"})
    if isinstance(exc, FollowerBehind | ReadTimeout):
        metrics.count(endpoint, _NOT_LEADER)
        return Reply(503, {"code": _NOT_LEADER, "remark": str(exc),
                           "leader": getattr(exc, "leader_id", None) or None, "leaderAddress": leader_address},
                     {"retry-after": "1"})
    metrics.count(endpoint, int(Code.SYSTEM_ERROR))
    if not exc.outcome_known:  # ProposalTimeout, NodeStopped, DiskFailure: the write may yet commit
        return Reply(504, {"code": int(Code.SYSTEM_ERROR), "remark": f"outcome unknown: {exc}"})
    return Reply(503, {"code": int(Code.SYSTEM_ERROR), "remark": f"{type(exc).__name__}: {exc}"},
                 {"retry-after": "1"})


def request_url_on(scheme: str, path: str, query: str) -> Callable[[str], str]:
    """This request's URL on the node at `addr` (https stays https). `path` is the decoded path the route
    matched: it is escaped again, so that a set named `a%41` is not redirected to the set `aA`."""
    tail = quote(path, safe="/:") + (f"?{query}" if query else "")
    return lambda addr: f"{scheme}://{addr}{tail}"


def pipeline_heartbeat(metrics: RequestMetrics, producer, heartbeat_json: bytes, now_ms: int) -> Reply:
    """A validated heartbeat sent on to Kafka (the heartbeat pipeline): 200, or 503 while Kafka is unreachable."""
    from .ingest import handle_heartbeat

    status, body, _ = handle_heartbeat(producer, heartbeat_json, now_ms)
    metrics.count("heartbeat", "0" if status == 200 else str(status))
    return Reply(status, body, {"retry-after": "1"} if status == 503 else {})
