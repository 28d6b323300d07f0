"""Role credentials for every HTTP caller, and the one table that says which role may call what.

Callers send `Authorization: Bearer <token>`. Nodes keep only SHA-256 hashes of the tokens, in a
JSON tokens file (`electra cert create-token` appends to it) that is re-read when it changes, so a
credential is added, rotated (two tokens for one principal during the rollover) or revoked without
a restart.

Roles:
  broker    its own broker sets' requests: the credential is scoped to broker-set name patterns and
            cluster names, checked on every broker route (path, query and body names). RocketMQ binds
            a broker to its id with the register check code at APPLY_BROKER_ID; here a broker can
            only apply for, register, heartbeat, elect in or alter the sets its credential names.
  pipeline  the streaming job: internal elect proposals and the reads it needs (leader discovery)
  admin     admin routes (elect, clean, ...) and every read
  observer  metrics, dashboard and reads (metadata, sync-state data, replica info, history)

Browsers: the dashboard's data routes (GET /v1/dashboard/*) also take the token from the sign-in
cookie that POST /v1/dashboard/login sets (electra.security.dashboard_login); no other route does.

Answers: 401 when the credential is missing or unknown, 403 when the role or scope does not
allow the call; both in the API's error body shape with code 16 (RocketMQ NO_PERMISSION).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from electra.atomic_file import replace_file
from electra.state.codes import Code

log = logging.getLogger("electra.security.auth")

ROLES = ("broker", "pipeline", "admin", "observer")
READERS = frozenset({"observer", "admin", "pipeline"})


@dataclass(frozen=True)
class Principal:
    name: str
    role: str
    broker_sets: tuple[str, ...] = ()  # fnmatch patterns (broker role)
    clusters: tuple[str, ...] = ()  # fnmatch patterns (broker role)

    def in_scope(self, cluster: str | None, broker_set: str | None) -> bool:
        if broker_set is not None and not any(fnmatch.fnmatchcase(broker_set, p) for p in self.broker_sets):
            return False
        return cluster is None or any(fnmatch.fnmatchcase(cluster, p) for p in self.clusters)


ANONYMOUS = Principal("anonymous (insecure mode)", "admin", ("*",), ("*",))


class AuthError(Exception):
    """401 (who are you?) or 403 (you may not); `body()` is the API's error body."""

    def __init__(self, status: int, remark: str) -> None:
        super().__init__(remark)
        self.status = status
        self.remark = remark

    def body(self) -> dict:
        return {"code": int(Code.NO_PERMISSION), "remark": self.remark}

    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": 'Bearer realm="electra"'} if self.status == 401 else {}


# ------------------------------------------------------------------------------ who may call what
@dataclass(frozen=True)
class Rule:
    """Roles allowed on a route; `broker_set` is the set a broker credential must cover (None: no set)."""

    roles: frozenset[str]
    broker_set: str | None = None
    action: str = ""
    audited: bool = False  # admin actions go to the audit log
    audit_refusals: bool = False  # only refused attempts go to the audit log
    cookie_ok: bool = False  # the dashboard's sign-in cookie may stand for the bearer token (GET reads only)

    @property
    def public(self) -> bool:
        return not self.roles


PUBLIC = frozenset()
_SET_ROUTE = re.compile(r"^/v1/broker-sets/([^/]+)/([a-z-]+)$")
_INTERNAL = re.compile(r"^/v1/internal/broker-sets/([^/]+)/([a-z-]+)$")
_ADMIN_SET = re.compile(r"^/v1/admin/broker-sets/([^/]+)/([a-z-]+)$")
_BROKER_READS = {"replica-info", "watch"}


def rule_for(method: str, path: str) -> Rule:
    """The one table of route permissions (node API and ingest server).

    `path` is percent-decoded once, as the routes match it (the ASGI scope's `path`): decoding it
    again here would check a credential against a set other than the one the route acts on. `HEAD` is
    checked as the GET it is answered as (`api.app.HeadAsGet`)."""
    if method == "HEAD":
        method = "GET"
    if path in ("/healthz", "/docs", "/openapi.json"):
        return Rule(PUBLIC)
    if method == "GET" and path.startswith("/docs/static/"):
        return Rule(PUBLIC)  # Swagger UI's files (api/api_docs.py): no data in them
    if method == "GET" and (path == "/dashboard" or path.startswith("/dashboard/static/")):
        return Rule(PUBLIC)  # the page shell and its scripts: no data in them
    if method == "POST" and path in ("/v1/dashboard/login", "/v1/dashboard/logout"):
        return Rule(PUBLIC)  # they check the token themselves (electra.security.dashboard_login)
    if method == "GET" and path.startswith("/v1/dashboard/"):
        return Rule(READERS, cookie_ok=True)
    if path in ("/v1/heartbeat", "/v1/session", "/v1/session/goodbye"):
        return Rule(frozenset({"broker"}))  # the set is in the body (a goodbye ends this connection's session)
    m = _SET_ROUTE.match(path)
    if m:
        name, verb = m.group(1), m.group(2)
        if verb in _BROKER_READS and method == "GET":
            return Rule(READERS | {"broker"}, name)
        return Rule(frozenset({"broker"}), name)
    m = _INTERNAL.match(path)
    if m:
        # another role's attempt at the job's elections is worth a record (the job's own, one per failover,
        # would put an fsync per proposal on the node's loop in a failover storm: they are in the event journal)
        return Rule(frozenset({"pipeline"}), action=f"internal {m.group(2)} {m.group(1)}", audit_refusals=True)
    if path in ("/v1/admin/metadata", "/v1/admin/sync-state-data", "/v1/admin/history") or (
            method == "GET" and path == "/metrics"):
        return Rule(READERS)
    m = _ADMIN_SET.match(path)
    if m:
        return Rule(frozenset({"admin"}), action=f"{m.group(2)} {m.group(1)}", audited=True)
    return Rule(frozenset({"admin"}), action=f"{method} {path}", audited=path.startswith("/v1/admin/"))


def authorize(principal: Principal, rule: Rule, *, cluster: str | None = None,
              broker_set: str | None = None) -> None:
    """Raise AuthError(403) unless `principal` may make this call (401 is the token store's)."""
    if principal.role not in rule.roles:
        raise AuthError(403, f"role {principal.role!r} ({principal.name}) may not call this endpoint "
                             f"(allowed: {', '.join(sorted(rule.roles))})")
    if principal.role == "broker":
        target = broker_set if broker_set is not None else rule.broker_set
        if not principal.in_scope(cluster, target):
            what = " ".join(x for x in (f"cluster {cluster!r}" if cluster is not None else "",
                                        f"broker set {target!r}" if target is not None else "") if x)
            raise AuthError(403, f"credential {principal.name!r} is not scoped to {what}")


def limited_to_clusters(principal: Principal) -> bool:
    """A broker credential whose cluster patterns do not cover every cluster (`authorize_set_clusters` applies)."""
    return principal.role == "broker" and "*" not in principal.clusters


def authorize_set_clusters(principal: Principal, names: Iterable[str | None],
                           cluster_of: Callable[[str], str | None] | None) -> None:
    """A cluster-limited broker credential against the cluster each named broker set is in (`cluster_of`: the
    serving node's applied state, `ControllerStateMachine.cluster_of`; None where there is no state).

    The request's own cluster is not enough: RocketMQ's AlterSyncStateSet and GetReplicaInfo, and the
    watch, name none, and a route may ignore a `cluster` the request adds. A set not in the state yet
    (being created) is checked against the cluster its request names, elsewhere."""
    if cluster_of is None or not limited_to_clusters(principal):
        return
    for name in names:
        set_cluster = cluster_of(name) if name is not None else None
        if set_cluster is not None and not principal.in_scope(set_cluster, None):
            raise AuthError(403, f"credential {principal.name!r} is not scoped to cluster {set_cluster!r}, "
                                 f"which broker set {name!r} is in")


# ------------------------------------------------------------------------------ tokens
def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class TokenStore:
    """Hashed tokens from a JSON file: {"tokens": [{"name", "role", "sha256", "broker_sets", "clusters"}]}."""

    def __init__(self, path: Path | str, *, check_interval_s: float = 1.0) -> None:
        self.path = Path(path)
        self.check_interval_s = check_interval_s
        self._lock = threading.Lock()
        self._by_hash: dict[str, Principal] = {}
        self._mtime = -1
        self._checked = 0.0
        self._load(first=True)

    def _load(self, first: bool = False) -> None:
        try:
            mtime = os.stat(self.path).st_mtime_ns
            if mtime == self._mtime:
                return
            data = json.loads(self.path.read_text())
            table = {}
            for t in data.get("tokens", []):
                if t["role"] not in ROLES:
                    raise ValueError(f"unknown role {t['role']!r} for {t['name']!r}")
                table[t["sha256"]] = Principal(t["name"], t["role"], tuple(t.get("broker_sets", ())),
                                               tuple(t.get("clusters", ())))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            if first:
                raise ValueError(f"cannot read tokens file {self.path}: {exc}") from None
            log.error("tokens file %s unreadable, keeping the loaded tokens: %s", self.path, exc)
            return
        with self._lock:
            self._by_hash, self._mtime = table, mtime
        if not first:
            log.warning("tokens file %s changed: %d credentials loaded", self.path, len(table))

    def _reload_if_due(self) -> None:
        now = time.monotonic()
        if now - self._checked >= self.check_interval_s:
            self._checked = now
            self._load()

    def generation(self) -> int:
        """Changes whenever the loaded credentials change (checks the file when due, like `authenticate`):
        a caller may keep a verified token's outcome while this stays the same (a revoked token is refused
        within `check_interval_s`, as everywhere else)."""
        self._reload_if_due()
        return self._mtime

    def principal_for_digest(self, digest: str) -> Principal | None:
        """The current holder of a token known by its SHA-256 (a dashboard session): None once revoked."""
        self._reload_if_due()
        with self._lock:
            return self._by_hash.get(digest)

    def authenticate(self, authorization: str | None) -> Principal:
        """The principal of an `Authorization` header value; AuthError(401) if missing or unknown."""
        self._reload_if_due()
        if not authorization:
            raise AuthError(401, "authentication required: send 'Authorization: Bearer <token>'")
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise AuthError(401, "unsupported authorization scheme: send 'Authorization: Bearer <token>'")
        # A lookup by SHA-256 digest: its timing tells nothing about a token (one cannot steer a digest).
        with self._lock:
            principal = self._by_hash.get(_hash(token.strip()))
        if principal is None:
            raise AuthError(401, "invalid or revoked token")
        return principal


def _read_tokens_file(path: Path) -> dict:
    """The tokens file's JSON ({"tokens": [...]}), or ValueError naming the file."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read tokens file {path}: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("tokens"), list):
        raise ValueError(f"{path} is not a tokens file: expected {{\"tokens\": [...]}}")
    return data


def create_token(tokens_file: Path | str, role: str, name: str, *, broker_sets: list[str] | None = None,
                 clusters: list[str] | None = None) -> str:
    """Add a credential to the tokens file (created if absent); returns the token, which is stored nowhere."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, not {role!r}")
    if role == "broker" and not broker_sets:
        raise ValueError("a broker credential needs its broker set(s) (patterns such as 'broker-a' or 'sim-set-*')")
    if role != "broker" and (broker_sets or clusters):  # else the holder would get an unscoped credential
        raise ValueError(f"broker sets and clusters scope broker credentials only: {role} credentials are not scoped")
    blank = [p for p in [*(broker_sets or []), *(clusters or [])] if not p.strip()]
    if blank:
        raise ValueError("an empty broker set or cluster pattern matches nothing")
    path = Path(tokens_file)
    data = _read_tokens_file(path) if path.exists() else {"tokens": []}
    token = secrets.token_urlsafe(32)
    entry = {"name": name, "role": role, "sha256": _hash(token), "created": int(time.time())}
    if role == "broker":
        entry |= {"broker_sets": list(broker_sets or []), "clusters": list(clusters or ["*"])}
    data["tokens"].append(entry)
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    _rewrite_tokens_file(path, data)
    return token


def revoke_tokens(tokens_file: Path | str, name: str, *, keep_newest: bool = False) -> int:
    """Remove the credentials of `name` (all, or all but the newest: the end of a rotation); returns how many."""
    path = Path(tokens_file)
    data = _read_tokens_file(path)
    mine = [t for t in data["tokens"] if t["name"] == name]
    drop = mine[:-1] if keep_newest else mine
    data["tokens"] = [t for t in data["tokens"] if t not in drop]
    _rewrite_tokens_file(path, data)
    return len(drop)


def _rewrite_tokens_file(path: Path, data: dict) -> None:
    """Replace the tokens file atomically, keeping its mode and owner (0644 for a new one: it holds hashes only).

    Under an operator's umask 077 a rewrite made the file 0600 root's: the nodes (running as their own user)
    could no longer re-read it and kept their old tokens, so a revocation did not take effect. A symlink is
    followed: the file it names is rewritten (the link itself was replaced, and the nodes kept reading the old
    target)."""
    path = path.resolve()
    try:
        st: os.stat_result | None = path.stat()
    except FileNotFoundError:
        st = None
    replace_file(path, (json.dumps(data, indent=1) + "\n").encode(),
                 mode=(st.st_mode & 0o7777) if st is not None else 0o644,
                 owner=(st.st_uid, st.st_gid) if st is not None else None)
