"""The job's output side: liveness and dead letters to Kafka, ElectMaster proposals to the controller
leader over HTTP. Run in `foreachBatch` on the driver; proposals are first tried by the stateful
operator itself, as it decides them (`OperatorProposer`), and the driver sends what that did not settle.

`ControllerClient.propose()` finds the leader with `GET /v1/admin/metadata`
(`is_leader`, `leader_address`), follows 307 redirects, retries 503/504, other
5xx and connection errors with bounded exponential backoff until a deadline, and
treats 200 (code 0), 409 (code 2000 fenced: the epoch moved on, 2011 master still
alive, 2004 no candidate, or any other conflict), 404 and the other 4xx answers
as final. Proposals are idempotent on the controller (fenced by master epoch), so
retrying after an unknown outcome is safe.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import quote, urlsplit

from electra.security.credentials import ClientCredentials
from electra.security.kafka_settings import kafka_client_kwargs
from electra.streaming.records import liveness_records

log = logging.getLogger("electra.streaming.sink")

FINAL_CONFLICT_CODES = {2000: "fenced", 2011: "master_still_alive", 2004: "no_candidate"}


@dataclass
class Outcome:
    broker_name: str
    result: str             # ok | fenced | master_still_alive | no_candidate | not_found | rejected | gave_up
    status: int | None = None
    code: int | None = None
    attempts: int = 0
    endpoint: str | None = None
    body: dict = field(default_factory=dict)

    @property
    def final(self) -> bool:
        return self.result != "gave_up"


class _Retry(Exception):
    """Transient failure: back off and try again (maybe elsewhere)."""


def _hostport(ep: str) -> tuple[str, int]:
    ep = ep.strip()
    if "://" in ep:
        ep = urlsplit(ep).netloc
    host, _, port = ep.rpartition(":")
    return host.strip("[]"), int(port)


class ControllerClient:
    """Sends proposals to the leader among `endpoints` ("host:port")."""

    def __init__(self, endpoints: list[str], deadline_s: float = 10.0, request_timeout_s: float = 3.0,
                 backoff_s: float = 0.1, max_backoff_s: float = 1.0, max_redirects: int = 5,
                 credentials: ClientCredentials | None = None) -> None:
        if not endpoints:
            raise ValueError("at least one controller endpoint is required")
        self.endpoints = [e.strip() for e in endpoints if e.strip()]
        # The job's `pipeline` credential and the cluster CA (ELECTRA_TOKEN_FILE / ELECTRA_CA_FILE by default).
        self.credentials = credentials if credentials is not None else ClientCredentials.from_env()
        self._ssl = self.credentials.ssl_context()
        self.deadline_s = deadline_s
        self.request_timeout_s = request_timeout_s
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.max_redirects = max_redirects
        self.leader: str | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ HTTP
    def _request(self, ep: str, method: str, path: str, body: bytes | None = None, timeout: float | None = None
                 ) -> tuple[int, dict, dict]:
        host, port = _hostport(ep)
        if self._ssl is not None:
            conn = http.client.HTTPSConnection(host, port, timeout=timeout or self.request_timeout_s,
                                               context=self._ssl)
        else:
            conn = http.client.HTTPConnection(host, port, timeout=timeout or self.request_timeout_s)
        try:
            headers = {"Content-Type": "application/json"} if body is not None else {}
            headers |= self.credentials.headers()
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
            try:
                data = json.loads(raw) if raw else {}
            except ValueError:
                data = {"raw": raw[:200].decode("utf-8", "replace")}
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data if isinstance(data, dict) else {}
        finally:
            conn.close()

    def discover_leader(self, deadline: float | None = None) -> str | None:
        """Ask each endpoint's metadata; returns the leader's "host:port" or None."""
        for ep in self.endpoints:
            if deadline is not None and time.monotonic() >= deadline:
                break
            try:
                status, _, meta = self._request(ep, "GET", "/v1/admin/metadata")
            except OSError:
                continue
            if status != 200:
                continue
            if meta.get("is_leader"):
                return ep
            if meta.get("leader_address"):
                return str(meta["leader_address"])
        return None

    # ------------------------------------------------------------------ proposals
    def propose(self, proposal: dict) -> Outcome:
        name = proposal["brokerName"]
        path = f"/v1/internal/broker-sets/{quote(name, safe='')}/elect-master"
        body = json.dumps(proposal, separators=(",", ":")).encode()
        deadline = time.monotonic() + self.deadline_s
        delay = self.backoff_s
        attempts = 0
        rotate = 0
        while True:
            with self._lock:
                target = self.leader
            if target is None:
                target = self.discover_leader(deadline)
                if target is None:  # nobody answered: try the endpoints in turn
                    target = self.endpoints[rotate % len(self.endpoints)]
                    rotate += 1
            try:
                out = self._post_following(target, path, body, name)
                out.attempts += attempts
                return out
            except _Retry as exc:
                attempts += 1
                with self._lock:
                    self.leader = None
                if time.monotonic() + delay >= deadline:
                    log.warning("proposal for %s gave up after %d attempts: %s", name, attempts, exc)
                    return Outcome(name, "gave_up", attempts=attempts, endpoint=target)
                time.sleep(delay * (0.5 + random.random() / 2))
                delay = min(delay * 2, self.max_backoff_s)

    def _post_following(self, target: str, path: str, body: bytes, name: str) -> Outcome:
        attempts = 0
        for _ in range(self.max_redirects + 1):
            attempts += 1
            try:
                status, headers, data = self._request(target, "POST", path, body)
            except OSError as exc:
                raise _Retry(f"{target}: {exc!r}") from None
            if status == 307 or status == 308:
                loc = headers.get("location")
                if not loc:
                    raise _Retry(f"{target}: redirect without Location")
                parts = urlsplit(loc)
                target = parts.netloc or target
                path = parts.path + (f"?{parts.query}" if parts.query else "")
                with self._lock:
                    self.leader = target
                continue
            code = data.get("code")
            if status == 200:
                with self._lock:
                    self.leader = target
                return Outcome(name, "ok" if code in (0, None) else f"code_{code}", status, code, attempts,
                               target, data)
            if status == 404:
                return Outcome(name, "not_found", status, code, attempts, target, data)
            if status == 409:
                return Outcome(name, FINAL_CONFLICT_CODES.get(code, "rejected"), status, code, attempts, target,
                               data)
            if status >= 500:  # 503 not leader / no leader yet, 504 outcome unknown, 500
                raise _Retry(f"{target}: HTTP {status} code {code}")
            return Outcome(name, "rejected", status, code, attempts, target, data)  # 400, 422, ...
        raise _Retry(f"too many redirects from {target}")

    def propose_all(self, proposals: list[dict], workers: int = 8) -> list[Outcome]:
        if not proposals:
            return []
        if len(proposals) == 1:
            return [self.propose(proposals[0])]
        with ThreadPoolExecutor(max_workers=min(workers, len(proposals))) as pool:
            return list(pool.map(self.propose, proposals))


class KafkaOutput:
    """Produces liveness records and dead letters (driver side, one producer per job)."""

    def __init__(self, bootstrap: str, liveness_topic: str, dlq_topic: str, grace_ms: int | None = None) -> None:
        self.bootstrap = bootstrap
        self.liveness_topic = liveness_topic
        self.dlq_topic = dlq_topic
        self.grace_ms = grace_ms  # the job's disconnect grace, stated in every liveness record
        self._producer = None

    def _get(self):
        if self._producer is None:
            from kafka import KafkaProducer

            # Not idempotent: kafka-python 3's default idempotent producer fails for good once the broker
            # forgets its producer id (tansu restarted: InitProducerId UnknownError on every batch).
            # Liveness records and dead letters tolerate duplicates.
            self._producer = KafkaProducer(bootstrap_servers=self.bootstrap.split(","), linger_ms=5,
                                           max_block_ms=5000, request_timeout_ms=5000, retries=3, acks=1,
                                           enable_idempotence=False, metrics_enabled=False,
                                           client_id="electra-streaming-job", **kafka_client_kwargs())
        return self._producer

    def send_stats(self, topic: str, record: dict) -> None:
        """One job-stats record (streaming/job_stats.py), fire and forget: a lost one is replaced next batch."""
        try:
            self._get().send(topic, value=json.dumps(record, separators=(",", ":")).encode())
        except Exception as exc:  # noqa: BLE001 - statistics never fail a batch
            log.warning("job stats not sent: %r", exc)

    def send(self, liveness: list[tuple[str, str]], dead_letters: list[str], timeout_s: float = 10.0) -> int:
        """Produce and flush; returns how many records failed (logged, not raised).

        `liveness`: (set name, liveness JSON) per set, produced grouped (`records.liveness_records`)."""
        if not liveness and not dead_letters:
            return 0
        try:
            p = self._get()
            futs = [p.send(self.liveness_topic, value=r)
                    for r in liveness_records([v for _, v in liveness], grace_ms=self.grace_ms)]
            futs += [p.send(self.dlq_topic, value=v.encode()) for v in dead_letters]
            p.flush(timeout=timeout_s)
        except Exception as exc:  # noqa: BLE001 - Kafka down: liveness is refreshed next batch anyway
            log.warning("producing %d liveness records and %d dead letters failed: %r", len(liveness),
                        len(dead_letters), exc)
            self.close()
            return len(liveness) + len(dead_letters)
        failed = sum(1 for f in futs if not f.is_done or f.failed())
        if failed:
            log.warning("%d of %d produced records failed; reconnecting next batch", failed, len(futs))
            self.close()
        return failed

    def close(self) -> None:
        if self._producer is not None:
            with contextlib.suppress(Exception):
                self._producer.close(timeout=5)
            self._producer = None


SENT_FIELD = "sent"  # on a proposal row: what the operator's own attempt got (OperatorProposer)
SETTLED = {"ok", "fenced", "master_still_alive", "no_candidate"}  # the leader's answer on the proposal itself


class OperatorProposer:
    """Sends proposals from the stateful operator (a Spark Python worker) the moment it decides them.

    A proposal sent at the end of `foreachBatch` waits for the rest of its batch: the state commit,
    the output's way to the driver, the liveness records' flush (docs/failover-signal.md). Sent here
    it waits for none of that, and loses no guarantee: it is fenced by `expectedMasterEpoch` (a batch
    Spark runs again proposes the same epoch, a no-op once the election happened); the attempt is
    short (`deadline_s`), and whatever it did not settle (an answer in SETTLED) the driver sends again
    with the full retries, so a worker that dies, a leader that is away or a missing credential only
    cost the early attempt. Each proposal is marked with its outcome in SENT_FIELD, for the driver.

    Picklable (Spark ships it to the workers; no secret in it); the HTTP client is made in each
    worker on first use, with the worker's credential (`ClientCredentials.from_env`). `driver_has`:
    whether the driver has a token and a CA; a worker that lacks one of them (executors not given
    ELECTRA_TOKEN_FILE / ELECTRA_CA_FILE) leaves every proposal to the driver.
    """

    def __init__(self, endpoints: list[str], deadline_s: float = 2.0,
                 driver_has: tuple[bool, bool] = (False, False)) -> None:
        self.endpoints = list(endpoints)
        self.deadline_s = deadline_s
        self.driver_has = tuple(driver_has)

    def _client(self) -> ControllerClient | None:
        key = (tuple(self.endpoints), self.deadline_s, self.driver_has)
        if key not in _WORKER_CLIENTS:
            creds = ClientCredentials.from_env()
            has = (creds.token is not None, creds.ca_file is not None)
            usable = all(h or not need for h, need in zip(has, self.driver_has, strict=True))
            _WORKER_CLIENTS[key] = (ControllerClient(self.endpoints, deadline_s=self.deadline_s, credentials=creds)
                                    if usable else None)
        return _WORKER_CLIENTS[key]

    def send(self, proposals: list[dict]) -> None:
        client = self._client() if proposals else None
        if client is None:
            return
        try:
            outcomes = client.propose_all(proposals)
        except Exception as exc:  # noqa: BLE001 - the driver sends them again
            log.warning("operator-side proposals failed: %r", exc)
            return
        now = int(time.time() * 1000)
        for p, o in zip(proposals, outcomes, strict=True):
            p[SENT_FIELD] = {"result": o.result, "status": o.status, "code": o.code, "attempts": o.attempts,
                             "endpoint": o.endpoint, "atMs": now}


# Per Python worker: the proposer's HTTP client (its leader found once, not per batch).
_WORKER_CLIENTS: dict[tuple, ControllerClient | None] = {}


def settled_outcome(proposal: dict) -> Outcome | None:
    """The operator's attempt (SENT_FIELD) when it settled the proposal, else None: send it again."""
    sent = proposal.get(SENT_FIELD)
    if not isinstance(sent, dict) or sent.get("result") not in SETTLED:
        return None
    return Outcome(proposal["brokerName"], sent["result"], sent.get("status"), sent.get("code"),
                   sent.get("attempts") or 0, sent.get("endpoint"))
