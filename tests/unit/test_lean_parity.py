"""The lean broker path and the FastAPI application answer every request alike (api/lean_path.py).

Two real uvicorn servers on loopback serve the same FastAPI application (auth middleware and
body limit included) in front of the same request handler: one with the node's protocol
(lean path first, `api/lean_http.py`), one with the plain guarded protocol (FastAPI only).
Each row of one table is sent to both as raw HTTP bytes; status, body, the headers that matter
and the handler calls made must be identical, and the row says which path must have served it
on the lean server (valid requests: the lean path; anything FastAPI would refuse or coerce: the
application). The request handler is a stand-in whose answers are picked by the broker set
name, so that every engine error (not leader, follower behind, timeouts) is reachable.
"""

from __future__ import annotations

import asyncio
import json
import socket
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
import uvicorn

from electra.api.app import create_app
from electra.api.dashboard import DashboardFeed
from electra.api.http_limits import guarded_protocol
from electra.api.lean_http import lean_protocol
from electra.api.lean_path import LeanPath
from electra.consensus.errors import FollowerBehind, NodeStopped, NotLeader, ProposalTimeout, ReadTimeout
from electra.security.auth import TokenStore, create_token
from electra.security.http_auth import AuthMiddleware

HEADERS_THAT_MATTER = ("content-type", "location", "retry-after", "www-authenticate", "connection")
ODD = "ü\u2028\"\\\x01\x7f</script>😀"  # echoed back: both JSON encoders must write it alike


class StandIn:
    """A BrokerRequests whose outcome is chosen by the set name; records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.node = SimpleNamespace(leader_id=0, core=None, on_role_change=lambda fn: None)
        self.sm = SimpleNamespace(sets={}, on_event=lambda fn: None, on_restore=lambda fn: None)
        self.events_publisher = self.heartbeat_producer = self.liveness_consumer = None

    def now_ms(self) -> int:
        return 1_700_000_000_000

    def leader_address(self) -> str | None:
        return "127.0.0.1:7002"

    def _outcome(self, call: str, name: str, *args, **kw) -> dict:
        self.calls.append((call, name, args, tuple(sorted(kw.items()))))
        if name == "follower":
            raise NotLeader(2, "127.0.0.1:7002")
        if name == "no-leader":
            raise NotLeader(0, None)
        if name == "behind":
            raise FollowerBehind("follower 40 entries behind", 2)
        if name == "slow":
            raise ReadTimeout("read index not confirmed in 2s")
        if name == "lost":
            raise ProposalTimeout("no result in 5s")
        if name == "stopped":
            raise NodeStopped("node stopped")
        code = {"missing": 2008, "fenced": 2000, "invalid": 2005}.get(name, 0)
        return {"code": code, "remark": f"{call} {ODD}", "header": {"args": [name, *args], "odd": ODD},
                "body": {"n": 1, "nested": {"x": [1, 2.5, None, True]}} if call == "replica_info" else None}

    def heartbeat(self, cluster, name, broker_id, addr, *, epoch=-1, max_offset=-1, confirm_offset=-1,
                  timeout_ms=10_000, priority=2**31 - 1) -> dict:
        return self._outcome("heartbeat", name, cluster, broker_id, addr, epoch=epoch, max_offset=max_offset,
                             confirm_offset=confirm_offset, timeout_ms=timeout_ms, priority=priority)

    async def get_next_broker_id(self, cluster, name):
        return self._outcome("next_id", name, cluster)

    def _future(self, *call) -> asyncio.Future:
        """The outcome as the real service's writes give it: a future (api/futures.py), errors inside it."""
        fut = asyncio.get_running_loop().create_future()
        try:
            fut.set_result(self._outcome(*call))
        except Exception as exc:
            fut.set_exception(exc)
        return fut

    def apply_broker_id(self, cluster, name, broker_id, check_code):
        return self._future("apply", name, cluster, broker_id, check_code)

    async def register_broker(self, cluster, name, broker_id, addr):
        if name == "b-slow":
            await asyncio.sleep(0.05)  # answered after the requests pipelined behind it arrived
        return self._outcome("register", name, cluster, broker_id, addr)

    async def elect_master(self, cluster, name, broker_id, designate=False):
        return self._outcome("elect", name, cluster, broker_id, designate=designate)

    def alter_sync_state_set(self, name, master_id, master_epoch, new_set, sync_state_set_epoch):
        return self._future("alter", name, master_id, master_epoch, new_set, sync_state_set_epoch)

    async def get_replica_info(self, name):
        return self._outcome("replica_info", name)


@dataclass
class Row:
    what: str
    method: str
    path: str
    body: bytes | dict | None = None
    token: str | None = "broker"
    lean: bool = True  # served by the lean path on the lean server (False: handed to FastAPI)
    headers: dict[str, str | None] = field(default_factory=dict)
    secure_only: bool = False  # about tokens
    no_call: bool = False  # must reach no handler on either server (a refused forgery)
    status: int | None = None  # the status both must answer, where the row pins it
    also: list[str] = field(default_factory=list)  # raw header lines sent after the others (a header twice)
    second_token: str | None = None  # a second Authorization header with this token (secure runs)


def _post(what, path, body, **kw) -> Row:
    return Row(what, "POST", path, body, **kw)


HB = {"clusterName": "c", "brokerName": "b1", "brokerAddr": "10.0.0.1:10911", "brokerId": 1}
REG = {"clusterName": "c", "brokerId": 2, "brokerAddress": "10.0.0.2:10911"}
ALTER = {"masterBrokerId": 1, "masterEpoch": 3, "syncStateSet": [1, 2, 3], "syncStateSetEpoch": 4}
S = "/v1/broker-sets"

ROWS = [
    # ---- valid requests: the lean path answers them
    _post("heartbeat, defaults", "/v1/heartbeat", HB),
    _post("heartbeat, every field", "/v1/heartbeat", {**HB, "epoch": 7, "maxOffset": 2**63 - 1, "confirmOffset": -5,
                                                      "heartbeatTimeoutMillis": 100, "electionPriority": -2**31}),
    Row("next id", "GET", f"{S}/b1/next-broker-id?cluster=c"),
    _post("apply id", f"{S}/b1/apply-broker-id", {"clusterName": "c", "brokerId": 3, "registerCheckCode": "x;3"}),
    _post("register", f"{S}/b1/register", REG),
    _post("register, odd address echoed", f"{S}/b1/register", {**REG, "brokerAddress": ODD.replace("\x01\x7f", "")}),
    _post("register, a control character in the address", f"{S}/b1/register", {**REG, "brokerAddress": "a\x00b:1"},
          lean=False, no_call=True, status=422),
    _post("apply id, a newline in the check code", f"{S}/b1/apply-broker-id",
          {"clusterName": "c", "brokerId": 3, "registerCheckCode": "x\n;3"}, lean=False, no_call=True, status=422),
    _post("register, a C1 control character (U+0085) in the address", f"{S}/b1/register",
          {**REG, "brokerAddress": "a\x85b:1"}, lean=False, no_call=True, status=422),
    _post("apply id, the check code's address empty", f"{S}/b1/apply-broker-id",
          {"clusterName": "c", "brokerId": 3, "registerCheckCode": ";3"}, lean=False, no_call=True, status=422),
    _post("apply id, the check code's address longer than an address", f"{S}/b1/apply-broker-id",
          {"clusterName": "c", "brokerId": 3, "registerCheckCode": "a" * 256}, lean=False, no_call=True, status=422),
    _post("apply id, the longest address and a timestamp", f"{S}/b1/apply-broker-id",
          {"clusterName": "c", "brokerId": 3, "registerCheckCode": "a" * 255 + ";1700000000000"}),
    _post("register, id at the top of its range", f"{S}/b1/register", {**REG, "brokerId": 2**62}),
    _post("elect", f"{S}/b1/elect-master", {"clusterName": "c", "brokerId": 1}),
    _post("alter sync state set", f"{S}/b1/sync-state-set", ALTER),
    Row("replica info", "GET", f"{S}/b1/replica-info"),
    Row("replica info, observer", "GET", f"{S}/b1/replica-info", token="observer"),
    Row("replica info, name with : . % chars", "GET", f"{S}/b1.x:y_z-w/replica-info"),
    # ---- outcomes: codes and engine errors
    Row("unknown set (404)", "GET", f"{S}/missing/replica-info"),
    _post("fenced (409)", f"{S}/fenced/register", REG),
    _post("invalid (400)", f"{S}/invalid/register", REG),
    _post("not leader: 307 to the leader", f"{S}/follower/register", REG),
    Row("not leader on a read with a query: 307 keeps it", "GET", f"{S}/follower/next-broker-id?cluster=c"),
    _post("no leader known: 503", f"{S}/no-leader/elect-master", {"clusterName": "c", "brokerId": 1}),
    Row("follower behind: 503", "GET", f"{S}/behind/replica-info"),
    Row("read timeout: 503", "GET", f"{S}/slow/replica-info"),
    _post("proposal timeout: 504", f"{S}/lost/sync-state-set", ALTER),
    _post("not leader, in a write's future: 307", f"{S}/follower/sync-state-set", ALTER),
    _post("node stopped (outcome unknown): 504", f"{S}/stopped/apply-broker-id", {"clusterName": "c", "brokerId": 3,
                                                                  "registerCheckCode": "x"}),
    _post("heartbeat to a follower is served (node-local)", "/v1/heartbeat", {**HB, "brokerName": "fenced"}),
    # ---- authentication and scope: the lean path refuses alike
    _post("no token: 401", f"{S}/b1/register", REG, token=None),
    _post("unknown token: 401", f"{S}/b1/register", REG, token="bogus"),
    _post("not a bearer token: 401", f"{S}/b1/register", REG, token="basic"),
    _post("observer may not register: 403", f"{S}/b1/register", REG, token="observer"),
    _post("admin may not register (broker route): 403", f"{S}/b1/register", REG, token="admin"),
    _post("broker out of its sets (path): 403", f"{S}/other/register", REG),
    _post("broker out of its clusters (body): 403", f"{S}/b1/register", {**REG, "clusterName": "d"}),
    _post("broker body names another set: 403", f"{S}/b1/register", {**REG, "brokerName": "other"}, lean=False),
    Row("broker out of its clusters (query): 403", "GET", f"{S}/b1/next-broker-id?cluster=d"),
    _post("heartbeat of a set out of scope: 403", "/v1/heartbeat", {**HB, "brokerName": "other"}),
    _post("no token and a bad body: 401 first", f"{S}/b1/register", b"{nope", token=None),
    # a set in cluster d (SET_CLUSTERS) that the broker token's set pattern b* covers, its clusters (c) do not
    Row("replica info of a set in another cluster: 403", "GET", f"{S}/b-far/replica-info", secure_only=True,
        no_call=True, status=403),
    Row("... with a cluster the route ignores in the query: 403", "GET", f"{S}/b-far/replica-info?cluster=c",
        secure_only=True, no_call=True, status=403, lean=False),
    _post("alter sync state set of a set in another cluster: 403", f"{S}/b-far/sync-state-set", ALTER,
          secure_only=True, no_call=True, status=403),
    _post("register naming its own cluster for a set in another: 403", f"{S}/b-far/register", REG,
          secure_only=True, no_call=True, status=403),
    _post("heartbeat for a set in another cluster: 403", "/v1/heartbeat", {**HB, "brokerName": "b-far"},
          secure_only=True, no_call=True, status=403),
    Row("replica info of a set in another cluster, token for every cluster", "GET", f"{S}/b-far/replica-info",
        token="wide", status=200),
    # ---- bad input: FastAPI answers (422 naming the field, 405, 413, ...)
    _post("bad JSON", f"{S}/b1/register", b"{nope", lean=False),
    _post("empty body", f"{S}/b1/register", b"", lean=False),
    _post("JSON that is not an object", f"{S}/b1/register", b"[1,2]", lean=False),
    _post("missing field", f"{S}/b1/register", {"clusterName": "c", "brokerId": 2}, lean=False),
    _post("id out of range (0)", f"{S}/b1/register", {**REG, "brokerId": 0}, lean=False),
    _post("id out of range (2^62+1)", f"{S}/b1/register", {**REG, "brokerId": 2**62 + 1}, lean=False),
    _post("id beyond int64", f"{S}/b1/register", {**REG, "brokerId": 2**70}, lean=False),
    _post("epoch over int32", "/v1/heartbeat", {**HB, "epoch": 2**31}, lean=False),
    _post("timeout under its floor", "/v1/heartbeat", {**HB, "heartbeatTimeoutMillis": 99}, lean=False),
    _post("id as a string (pydantic coerces)", f"{S}/b1/register", {**REG, "brokerId": "2"}, lean=False),
    _post("id as a float (pydantic coerces 2.0)", f"{S}/b1/register", {**REG, "brokerId": 2.0}, lean=False),
    # past 2**53 a double is not the integer sent: pydantic took 4611686018427387903.5 for 2**62
    _post("id as a float with a fraction past 2**53: 422", f"{S}/b1/register",
          b'{"clusterName":"c","brokerId":4611686018427387903.5,"brokerAddress":"10.0.0.2:10911"}', lean=False,
          status=422, no_call=True),
    _post("heartbeat offset as a float past 2**53: 422", "/v1/heartbeat",
          b'{"clusterName":"c","brokerName":"b1","brokerAddr":"10.0.0.1:10911","brokerId":1,'
          b'"maxOffset":123456789012345678.0}', lean=False, status=422, no_call=True),
    _post("id as a fraction", f"{S}/b1/register", {**REG, "brokerId": 2.5}, lean=False),
    _post("id as a bool", f"{S}/b1/register", {**REG, "brokerId": True}, lean=False),
    _post("address null", f"{S}/b1/register", {**REG, "brokerAddress": None}, lean=False),
    _post("address empty", f"{S}/b1/register", {**REG, "brokerAddress": ""}, lean=False),
    _post("address too long", f"{S}/b1/register", {**REG, "brokerAddress": "a" * 256}, lean=False),
    _post("cluster with a space", f"{S}/b1/register", {**REG, "clusterName": "c d"}, lean=False, token="wide"),
    _post("cluster ending in a newline", "/v1/heartbeat", {**HB, "clusterName": "c\n"}, lean=False, token="wide"),
    _post("NaN in a number field", f"{S}/b1/register", b'{"clusterName":"c","brokerId":NaN,"brokerAddress":"a"}',
          lean=False),
    _post("empty sync state set", f"{S}/b1/sync-state-set", {**ALTER, "syncStateSet": []}, lean=False),
    _post("sync state set of 65", f"{S}/b1/sync-state-set", {**ALTER, "syncStateSet": list(range(1, 66))},
          lean=False),
    _post("a member id 0", f"{S}/b1/sync-state-set", {**ALTER, "syncStateSet": [1, 0]}, lean=False),
    _post("negative epoch", f"{S}/b1/sync-state-set", {**ALTER, "masterEpoch": -1}, lean=False),
    _post("duplicate keys (the last wins in both)", f"{S}/b1/register",
          b'{"clusterName":"c","brokerId":1,"brokerId":2,"brokerAddress":"a"}'),
    _post("text/plain body", f"{S}/b1/register", REG, lean=False, headers={"Content-Type": "text/plain"}, status=415,
          no_call=True),
    _post("a form (curl -d without -H)", f"{S}/b1/register", REG, lean=False, no_call=True, status=415,
          headers={"Content-Type": "application/x-www-form-urlencoded"}),
    _post("no Content-Type (a browser's body sent cross-site without asking)", f"{S}/b1/register", REG, lean=False,
          no_call=True, status=415, headers={"Content-Type": None}),
    _post("no Content-Type on a heartbeat", "/v1/heartbeat", HB, lean=False, no_call=True, status=415,
          headers={"Content-Type": None}),
    _post("no body at all: the body is missing", f"{S}/b1/register", None, lean=False, no_call=True, status=422),
    _post("a JSON subtype (+json) is JSON", f"{S}/b1/register", REG, lean=False,
          headers={"Content-Type": "application/problem+json"}),
    _post("JSON with a charset", f"{S}/b1/register", REG, lean=False,
          headers={"Content-Type": "application/json; charset=utf-8"}),
    _post("register, extra field (ignored by FastAPI)", f"{S}/b1/register", {**REG, "whatever": [1, {"a": None}]},
          lean=False),
    # ---- bytes Python's json refuses and msgspec would skip in an unknown field: the application answers
    #      both alike (422), and a broker's scope cannot be dodged by them (the heartbeat is never acted on)
    _post("extra field holding a 4,301-digit number", "/v1/heartbeat",
          b'{"clusterName":"c","brokerName":"b1","brokerAddr":"a:1","brokerId":1,"x":' + b"9" * 4301 + b"}",
          lean=False),
    _post("out-of-scope heartbeat with a 4,301-digit number: never served", "/v1/heartbeat",
          b'{"clusterName":"d","brokerName":"other","brokerAddr":"a:1","brokerId":1,"x":' + b"9" * 4400 + b"}",
          lean=False, no_call=True),
    _post("out-of-scope heartbeat with invalid UTF-8 in an extra field: never served", "/v1/heartbeat",
          b'{"clusterName":"d","brokerName":"other","brokerAddr":"a:1","brokerId":1,"x":"\xff"}',
          lean=False, no_call=True),
    _post("invalid UTF-8 in the address", f"{S}/b1/register",
          b'{"clusterName":"c","brokerId":2,"brokerAddress":"h\xff:1"}', lean=False),
    _post("nested 50,000 deep", "/v1/heartbeat",
          b'{"clusterName":"c","brokerName":"b1","brokerAddr":"a:1","brokerId":1,"x":' + b"[" * 50_000
          + b"]" * 50_000 + b"}", lean=False),
    _post("lone surrogate in a string", f"{S}/b1/register",
          b'{"clusterName":"c","brokerId":2,"brokerAddress":"\\ud800"}', lean=False),
    Row("name with a space (escaped)", "GET", f"{S}/a%20b/replica-info", lean=False),
    Row("name escaped but valid", "GET", f"{S}/b%31/replica-info", lean=False),
    Row("name too long", "GET", f"{S}/{'b' * 256}/replica-info", lean=False, token="wide"),
    Row("history on a node without a tier: said so", "GET", "/v1/admin/history?at=now", lean=False, token="admin",
        status=404),
    _post("name '..' (a dot segment)", f"{S}/../apply-broker-id", {"clusterName": "c", "brokerId": 1,
          "registerCheckCode": "a:1;1"}, lean=False, token="wide", no_call=True, status=422),
    Row("name '.' (a dot segment)", "GET", f"{S}/./replica-info", lean=False, token="wide", no_call=True, status=422),
    Row("name '...' (not a dot segment)", "GET", f"{S}/.../replica-info", token="wide"),
    Row("next id without cluster", "GET", f"{S}/b1/next-broker-id", lean=False),
    Row("next id, empty cluster", "GET", f"{S}/b1/next-broker-id?cluster=", lean=False),
    Row("next id, cluster twice (the last one is checked and used)", "GET",
        f"{S}/b1/next-broker-id?cluster=x&cluster=c", lean=False),
    Row("next id, cluster twice, the last out of scope", "GET", f"{S}/b1/next-broker-id?cluster=c&cluster=d",
        lean=False, status=403, secure_only=True),
    Row("next id, cluster not a name", "GET", f"{S}/b1/next-broker-id?cluster=<x>", lean=False, token="wide"),
    Row("next id, cluster with a slash", "GET", f"{S}/b1/next-broker-id?cluster=a%2Fb", lean=False, token="wide"),
    Row("replica info with a query", "GET", f"{S}/b1/replica-info?x=1", lean=False),
    _post("POST to a read: 405", f"{S}/b1/replica-info", REG, lean=False),
    Row("GET to a write: 405", "GET", f"{S}/b1/register", lean=False),
    Row("unknown verb: 404", "GET", f"{S}/b1/nothing", lean=False, token="admin"),
    Row("trailing slash: 404, no redirect built from Host", "GET", f"{S}/b1/replica-info/", lean=False,
        token="admin"),
    Row("HEAD replica info: the GET's head", "HEAD", f"{S}/b1/replica-info", lean=False),
    Row("HEAD replica info, observer (checked as the GET)", "HEAD", f"{S}/b1/replica-info", lean=False,
        token="observer"),
    Row("HEAD on a watch with a newline the route's `$` takes: 405", "HEAD", f"{S}/b1/watch%0A", lean=False),
    Row("HEAD on a watch stream: 405", "HEAD", f"{S}/b1/watch", lean=False),
    _post("body over 1 MiB: 413 before reading it", f"{S}/b1/register", b"", lean=False, token="admin",
          headers={"Content-Length": str((1 << 20) + 1)}),
    # announced over the limit: 413 at once, for a broker too (it waited for the body to check its scope, 408)
    _post("body over 1 MiB, broker: 413 before reading it", f"{S}/b1/register", b"", lean=False, secure_only=True,
          headers={"Content-Length": str((1 << 20) + 1)}, status=413),
    # Content-Length with thousands of leading zeros (the parser takes them; int() of over 4,300 digits raised
    # ValueError: a 500 before the token check): the length it names; past 19 significant digits, over any limit
    # (a broker: the body limit without tokens, the scope check's bound with them)
    _post("heartbeat, Content-Length with 5,000 leading zeros", "/v1/heartbeat", HB, status=200,
          headers={"Content-Length": "0" * 5000 + str(len(json.dumps(HB)))}),
    _post("register, Content-Length with 5,000 leading zeros", f"{S}/b1/register", REG, status=200,
          headers={"Content-Length": "0" * 5000 + str(len(json.dumps(REG)))}),
    _post("body over 1 MiB after 5,000 leading zeros, broker: 413", f"{S}/b1/register", b"", lean=False,
          headers={"Content-Length": "0" * 5000 + str((1 << 20) + 1)}, status=413),
    _post("Content-Length of 20 digits, broker: 413", f"{S}/b1/register", b"", lean=False,
          headers={"Content-Length": "1" + "0" * 19}, status=413),
    # chunked (no length to refuse at once): 413 once the body read to check the broker's scope passes the bound
    _post("chunked body over 1 MiB, broker: 413", f"{S}/b1/register",
          b"%x\r\n%b\r\n0\r\n\r\n" % ((1 << 20) + 10, b" " * ((1 << 20) + 10)), lean=False, secure_only=True,
          headers={"Content-Length": None, "Transfer-Encoding": "chunked"}, status=413, no_call=True),
    # a header twice: the lean path leaves the request to the application, which reads the first one
    _post("Authorization twice, observer first: 403", f"{S}/b1/register", REG, lean=False, secure_only=True,
          token="observer", second_token="broker", status=403, no_call=True),
    _post("Authorization twice, broker first", f"{S}/b1/register", REG, lean=False, secure_only=True,
          second_token="observer"),
    _post("Content-Type twice, text first: 415", f"{S}/b1/register", REG, lean=False,
          headers={"Content-Type": "text/plain"}, also=["Content-Type: application/json"], status=415, no_call=True),
    # a route's `$` matches before a final newline: not the heartbeat route under the admin rule
    _post("heartbeat path with a newline, admin: 404", "/v1/heartbeat%0A", HB, lean=False, token="admin",
          status=404, no_call=True),
    _post("heartbeat path with a newline, broker: 404", "/v1/heartbeat%0A", HB, lean=False, status=404,
          no_call=True),
    Row("absolute-form target without a path: 400", "GET", "http://x", lean=False, status=400, no_call=True),
    Row("absolute-form target, a query and no path: 400", "GET", "http://x?a=1", lean=False, status=400,
        no_call=True),
    Row("a target that is no URL: 400", "GET", "x", lean=False, status=400, no_call=True),
    Row("absolute-form target with a path", "GET", f"http://x{S}/b1/replica-info", lean=False),
]


def _tokens(tmp_path) -> tuple[TokenStore, dict[str, str]]:
    f = tmp_path / "tokens.json"
    tok = {"broker": create_token(f, "broker", "broker-b", broker_sets=["b*", "follower", "no-leader", "behind",
                                                                          "slow", "lost", "stopped", "missing",
                                                                          "fenced", "invalid", "a b"],
                                  clusters=["c"]),
           "wide": create_token(f, "broker", "broker-any", broker_sets=["*"], clusters=["*"]),
           "observer": create_token(f, "observer", "obs"), "admin": create_token(f, "admin", "adm")}
    return TokenStore(f), tok


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _serve(app, protocol, proxy_headers: bool = True) -> tuple[uvicorn.Server, asyncio.Task, int]:
    port = _port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off",
                                           access_log=False, http=protocol, proxy_headers=proxy_headers))
    server.install_signal_handlers = lambda: None
    task = asyncio.create_task(server.serve())
    for _ in range(200):
        if server.started:
            break
        await asyncio.sleep(0.01)
    assert server.started
    return server, task, port


def _raw(row: Row, token: str | None, second: str | None = None) -> bytes:
    body = row.body if isinstance(row.body, bytes) or row.body is None else json.dumps(row.body).encode()
    head = [f"{row.method} {row.path} HTTP/1.1", "Host: 127.0.0.1", "Connection: close"]
    if body is not None:
        if "Content-Length" not in row.headers:
            head.append(f"Content-Length: {len(body)}")
        if "Content-Type" not in row.headers:
            head.append("Content-Type: application/json")
    head += [f"{k}: {v}" for k, v in row.headers.items() if v is not None]  # None: the header left out
    if token is not None:
        head.append(f"Authorization: {token}")
    if second is not None:
        head.append(f"Authorization: {second}")
    head += row.also
    return ("\r\n".join(head) + "\r\n\r\n").encode() + (body or b"")


async def _exchange(port: int, request: bytes) -> tuple[int, dict[str, str], bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    raw = await asyncio.wait_for(reader.read(-1), 10)
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    return int(lines[0].split()[1]), headers, body


SET_CLUSTERS = {"b-far": "d"}  # the cluster of each set that is not in cluster c (the state's, as cluster_of reads it)


def _cluster_of(name: str) -> str | None:
    return SET_CLUSTERS.get(name, "c")


def _build(tokens: TokenStore | None):
    svc = StandIn()
    controller = SimpleNamespace(requests=svc, node=svc.node, tier=None, heartbeat_producer=None,
                                 dashboard=DashboardFeed(svc), watchers=None, elections={})
    app = create_app(controller)
    app.add_middleware(AuthMiddleware, tokens=tokens, audit=None, cluster_of=_cluster_of)
    return svc, app


@pytest.mark.parametrize("secure", [True, False], ids=["tokens", "insecure"])
def test_lean_path_and_fastapi_answer_every_request_alike(tmp_path, secure):
    async def main():
        tokens, tok = _tokens(tmp_path) if secure else (None, {})
        lean_svc, lean_app = _build(tokens)
        lean = LeanPath(lean_svc, lean_app.state.request_metrics, tokens, cluster_of=_cluster_of)
        fast_svc, fast_app = _build(tokens)
        servers = [await _serve(lean_app, lean_protocol(lean)), await _serve(fast_app, guarded_protocol())]
        lean_port, fast_port = servers[0][2], servers[1][2]
        try:
            for row in ROWS:
                if not secure and (row.secure_only or row.token not in ("broker", "wide")):
                    continue  # auth rows mean nothing without tokens
                value = ({"bogus": "Bearer not-a-token", "basic": "Basic dXNlcjpwYXNz", None: None}.get(row.token)
                         or f"Bearer {tok[row.token]}") if secure and row.token else None
                before = dict(lean.stats)
                lean_calls, fast_calls = len(lean_svc.calls), len(fast_svc.calls)
                second = f"Bearer {tok[row.second_token]}" if secure and row.second_token else None
                got = await _exchange(lean_port, _raw(row, value, second))
                want = await _exchange(fast_port, _raw(row, value, second))
                assert got[0] == want[0], (row.what, got, want)
                assert got[2] == want[2], (row.what, got[2], want[2])
                for h in HEADERS_THAT_MATTER:
                    assert got[1].get(h) == want[1].get(h), (row.what, h, got[1], want[1])
                assert lean_svc.calls[lean_calls:] == fast_svc.calls[fast_calls:], row.what
                assert not (row.no_call and lean_svc.calls[lean_calls:]), (row.what, got)
                assert row.status in (None, got[0]), (row.what, got)
                lean_served = lean.stats["served"] - before["served"]
                assert lean_served == (1 if row.lean else 0), (row.what, got)
        finally:
            for server, task, _ in servers:
                server.should_exit = True
                await asyncio.wait_for(task, 10)

    asyncio.run(main())


def _split(raw: bytes) -> list[tuple[int, bytes]]:
    out = []
    while raw:
        head, _, rest = raw.partition(b"\r\n\r\n")
        length = int(next(h.split(b":")[1] for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")))
        out.append((int(head.split()[1]), rest[:length]))
        raw = rest[length:]
    return out


def _pipelined(slow_first: bool, then: bytes, answers: int | None) -> tuple[list[tuple[int, bytes]], int]:
    """A slow lean write and a lean heartbeat (in that order or the other), then `then`, written at once on one
    connection to a lean server; the answers once `answers` are in (None: once the node closes the connection),
    and the requests the lean path served."""
    async def main():
        svc, app = _build(None)
        lean = LeanPath(svc, app.state.request_metrics, None)
        server, task, port = await _serve(app, lean_protocol(lean))
        try:
            slow, hb = _post("slow", f"{S}/b-slow/register", REG), _post("hb", "/v1/heartbeat", HB)
            rows = [slow, hb] if slow_first else [hb, slow]
            raw = b"".join(_raw(r, None).replace(b"Connection: close\r\n", b"") for r in rows)
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(raw + then)
            got = b""
            for _ in range(100):  # bounded: until the answers are in, or the node closes the connection
                chunk = await asyncio.wait_for(reader.read(65536), 10)
                got += chunk
                if not chunk or (answers is not None and got.count(b"HTTP/1.1 ") >= answers
                                 and len(_split(got)) == answers):
                    break
            writer.close()
            return _split(got), lean.stats["served"]
        finally:
            server.should_exit = True
            await asyncio.wait_for(task, 10)

    return asyncio.run(main())


@pytest.mark.parametrize("slow_first", [True, False])
def test_pipelined_requests_are_answered_in_order_across_both_paths(slow_first):
    """A slow lean write, a lean heartbeat, a FastAPI answer (422) and a read, pipelined on one connection.

    A request pipelined behind one still in flight waits in uvicorn's queue and is served by FastAPI.
    """
    then = b"".join(_raw(r, None).replace(b"Connection: close\r\n", b"")
                    for r in (_post("bad", f"{S}/b1/register", {"x": 1}), Row("read", "GET", f"{S}/b1/replica-info")))
    answers, served = _pipelined(slow_first, then, 4)
    assert [a[0] for a in answers] == [200, 200, 422, 200]
    remarks = [json.loads(a[1])["remark"].split()[0] for a in (answers[0], answers[1], answers[3])]
    first = ["register", "heartbeat"] if slow_first else ["heartbeat", "register"]
    assert remarks == first + ["replica_info"]
    assert served >= 1


@pytest.mark.parametrize("slow_first", [True, False])
def test_a_malformed_request_is_refused_only_after_the_requests_before_it_are_answered(slow_first):
    """A write the node took before a malformed request on the same connection is answered, then the 400: the
    client must not read "malformed" for a write that was applied."""
    answers, _ = _pipelined(slow_first, b"BOGUS / HTTP/1.1\r\n\r\n", None)
    assert [a[0] for a in answers] == [200, 200, 400]
    assert json.loads(answers[2][1])["remark"] == "malformed HTTP request"


async def _front_end(tmp_path, app, lean_backend: LeanPath, tokens: TokenStore | None):
    """The front-end arrangement in one process: a front-end server on TCP, the node's link and app on unix sockets.

    The front-end server is configured as api/front_end.py configures it (no trust in callers'
    X-Forwarded-* headers).

    The same classes as `electra node --front-ends N` (api/front_ends.py, api/front_end.py), minus the
    process boundary: the front-end's lean path forwards over a real link to the backend's `execute`,
    and everything else is relayed to the backend's FastAPI app on its unix socket.
    """
    from electra.api.front_end import FrontEndLink
    from electra.api.front_ends import link_executor
    from electra.api.local_link import LinkServerProtocol
    from electra.api.raft_process_proxy import RaftProcessProxy
    from electra.api.replies import RequestMetrics

    loop = asyncio.get_running_loop()
    links: set = set()
    link_path, app_path = str(tmp_path / "link.sock"), str(tmp_path / "app.sock")
    link_server = await loop.create_unix_server(lambda: LinkServerProtocol(link_executor(lean_backend), links),
                                                path=link_path)
    backend = uvicorn.Server(uvicorn.Config(app, uds=app_path, log_level="warning", lifespan="off", access_log=False,
                                            http=lean_protocol(lean_backend), proxy_headers=True,
                                            forwarded_allow_ips="*"))
    backend.install_signal_handlers = lambda: None
    backend_task = asyncio.create_task(backend.serve())
    link = FrontEndLink(link_path, RequestMetrics())
    stop = asyncio.Event()
    linked = asyncio.create_task(link.keep_linked(stop))
    front_lean = LeanPath(None, RequestMetrics(), tokens, forward=link.forward)
    front = await _serve(RaftProcessProxy(app_path), lean_protocol(front_lean), proxy_headers=False)
    for _ in range(200):  # bounded: until the link is up and the backend listens
        if links and backend.started:
            break
        await asyncio.sleep(0.01)
    assert links and backend.started

    async def close() -> None:
        stop.set()
        for server, task in ((front[0], front[1]), (backend, backend_task)):
            server.should_exit = True
            await asyncio.wait_for(task, 10)
        await asyncio.wait_for(linked, 10)
        link_server.close()

    return front_lean, front[2], close


@pytest.mark.parametrize("secure", [True, False], ids=["tokens", "insecure"])
def test_front_end_processes_answer_every_request_like_fastapi(tmp_path, secure):
    """`electra node --front-ends N`: a front-end's lean path, its link and its relay answer as FastAPI does."""
    async def main():
        tokens, tok = _tokens(tmp_path) if secure else (None, {})
        node_svc, node_app = _build(tokens)
        node_lean = LeanPath(node_svc, node_app.state.request_metrics, tokens, cluster_of=_cluster_of)
        fast_svc, fast_app = _build(tokens)
        front_lean, front_port, close = await _front_end(tmp_path, node_app, node_lean, tokens)
        fast = await _serve(fast_app, guarded_protocol())
        try:
            for row in ROWS:
                if not secure and (row.secure_only or row.token not in ("broker", "wide")):
                    continue
                value = ({"bogus": "Bearer not-a-token", "basic": "Basic dXNlcjpwYXNz", None: None}.get(row.token)
                         or f"Bearer {tok[row.token]}") if secure and row.token else None
                second = f"Bearer {tok[row.second_token]}" if secure and row.second_token else None
                before = dict(front_lean.stats)
                node_calls, fast_calls = len(node_svc.calls), len(fast_svc.calls)
                got = await _exchange(front_port, _raw(row, value, second))
                want = await _exchange(fast[2], _raw(row, value, second))
                assert got[0] == want[0], (row.what, got, want)
                assert got[2] == want[2], (row.what, got[2], want[2])
                for h in HEADERS_THAT_MATTER:
                    assert got[1].get(h) == want[1].get(h), (row.what, h, got[1], want[1])
                assert node_svc.calls[node_calls:] == fast_svc.calls[fast_calls:], row.what
                assert front_lean.stats["served"] - before["served"] == (1 if row.lean else 0), (row.what, got)
        finally:
            fast[0].should_exit = True
            await asyncio.wait_for(fast[1], 10)
            await close()

    asyncio.run(main())


def test_a_front_end_relays_its_own_scheme_not_the_callers_forwarded_headers(tmp_path):
    """X-Forwarded-* are trusted on the Raft process's socket: the relay must replace what a caller sent."""
    async def main():
        svc, app = _build(None)
        node_lean = LeanPath(svc, app.state.request_metrics, None)
        front_lean, port, close = await _front_end(tmp_path, app, node_lean, None)
        try:
            row = _post("not leader, through the relay", f"{S}/follower/register", REG,
                        headers={"Content-Type": "application/json; charset=utf-8", "X-Forwarded-Proto": "https",
                                 "X-Forwarded-For": "203.0.113.9"})
            status, headers, _ = await _exchange(port, _raw(row, None))
            assert front_lean.stats["served"] == 0  # the relay answered, not the lean path
            assert status == 307 and headers["location"].startswith("http://127.0.0.1:7002/"), headers
        finally:
            await close()

    asyncio.run(main())


def test_the_frameworks_own_refusals_speak_the_api_shape():
    """No route, a wrong method, a body `json` cannot read: RocketMQ's `code`/`remark`, never `{"detail": ...}`;
    HEAD on a GET route is its GET's head; a trailing slash is not redirected (the redirect trusted `Host`)."""
    async def main():
        _, app = _build(None)
        counts = app.state.request_metrics.counts
        server, task, port = await _serve(app, guarded_protocol())

        async def ask(method: str, path: str, body: bytes | None = None, **headers: str):
            row = Row("", method, path, body, headers={k.replace("_", "-"): v for k, v in headers.items()})
            return await _exchange(port, _raw(row, None))

        try:
            status, _, body = await ask("GET", "/v1/nothing")
            assert status == 404 and json.loads(body) == {"code": 3, "remark": "no such endpoint"}
            status, _, body = await ask("GET", "/dashboard/static/%3Cnope%3E.js")  # the same answer, nothing echoed
            assert status == 404 and json.loads(body) == {"code": 3, "remark": "no such endpoint"}
            status, headers, body = await ask("PUT", f"{S}/b1/register", json.dumps(REG).encode())
            assert status == 405 and json.loads(body)["code"] == 3 and headers["allow"] == "POST"
            status, _, body = await ask("POST", f"{S}/b1/register",
                                        b'{"clusterName":"c","brokerId":' + b"9" * 5000 + b"}")
            assert status == 422 and json.loads(body)["code"] == 2005
            assert json.loads(body)["errors"][0]["field"] == "body"
            assert counts[("register_broker", "2005")] == 1  # an invalid request is counted like any answer
            status, headers, _ = await ask("GET", f"{S}/b1/replica-info/", Host="evil.example")
            assert status == 404 and "location" not in headers
            get, head = await ask("GET", f"{S}/b1/replica-info"), await ask("HEAD", f"{S}/b1/replica-info")
            assert head[0] == get[0] == 200 and head[2] == b"" and get[2]
            assert head[1]["content-length"] == get[1]["content-length"]
            assert (await ask("HEAD", f"{S}/b1/watch"))[0] == 405
            for flag in (b'"yes"', b"1"):  # the destructive flag takes a JSON boolean only
                status, _, body = await ask("POST", "/v1/admin/broker-sets/b1/clean",
                                            b'{"brokerIds":null,"cleanLivingBroker":' + flag + b"}")
                assert status == 422 and "cleanLivingBroker" in json.loads(body)["remark"]
            # A boolean is never a number: pydantic's lax mode read `[true]` as broker 1 and cleaned it.
            for path, raw in (("/v1/admin/broker-sets/b1/clean", b'{"brokerIds":[true]}'),
                              (f"{S}/b1/register", b'{"clusterName":"c","brokerId":true,"brokerAddress":"a:1"}'),
                              (f"{S}/b1/sync-state-set", b'{"masterBrokerId":1,"masterEpoch":true,'
                                                         b'"syncStateSet":[1],"syncStateSetEpoch":1}'),
                              ("/v1/admin/broker-sets/b1/elect-master",
                               b'{"clusterName":"c","brokerId":1,"unclean":"yes"}'),
                              # text Java's Long.parseLong refuses: pydantic read "1_0" as 10, " 1" as 1
                              (f"{S}/b1/register", b'{"clusterName":"c","brokerId":"1_0","brokerAddress":"a:1"}'),
                              (f"{S}/b1/register", b'{"clusterName":"c","brokerId":" 1","brokerAddress":"a:1"}'),
                              (f"{S}/b1/register", b'{"clusterName":"c","brokerId":"2.0","brokerAddress":"a:1"}')):
                status, _, body = await ask("POST", path, raw)
                assert status == 422 and json.loads(body)["code"] == 2005, (path, body)
        finally:
            server.should_exit = True
            await asyncio.wait_for(task, 10)

    asyncio.run(main())


def test_a_body_that_is_not_json_is_named_as_the_body_with_where_it_breaks():
    """FastAPI puts the failing character's position in the error's location: `body.1` read as a field."""
    async def main():
        svc, app = _build(None)
        lean = LeanPath(svc, app.state.request_metrics, None)
        server, task, port = await _serve(app, lean_protocol(lean))
        try:
            return await _exchange(port, _raw(_post("broken JSON", f"{S}/b1/register", b'{"clusterName": '), None))
        finally:
            server.should_exit = True
            await asyncio.wait_for(task, 10)

    status, _, body = asyncio.run(main())
    answer = json.loads(body)
    assert status == 422 and answer["errors"] == [{"field": "body", "problem": "not JSON at character 16: "
                                                   "Expecting value"}], answer
    assert answer["remark"] == "invalid request: body: not JSON at character 16: Expecting value"


def test_the_watch_route_counts_its_refusals_and_reads_a_resume_index_strictly():
    """A resume index is ASCII digits: " 5" is refused as "+5" is (it was stripped and read as 5). The header
    wins over the query, so a bad `after` beside a good Last-Event-ID is not looked at. Every refusal is counted
    under `watch`, as every other route's answers are (the route returned its own responses uncounted)."""
    from electra.api.watchers import NotApplied

    async def behind(name, after, cluster_ok):
        raise NotApplied(f"this node has applied up to index 4, not {after}")

    async def main():
        unsubscribed = []
        svc = StandIn()
        app = create_app(SimpleNamespace(
            requests=svc, node=svc.node, tier=None, heartbeat_producer=None, dashboard=DashboardFeed(svc),
            elections={}, watchers=SimpleNamespace(subscribe=lambda name: name, resume=behind,
                                                   unsubscribe=lambda name, q: unsubscribed.append(name))))
        counts = app.state.request_metrics.counts
        server, task, port = await _serve(app, guarded_protocol())

        async def ask(path: str, **headers: str):
            row = Row("", "GET", path, None, headers={k.replace("_", "-"): v for k, v in headers.items()})
            return await _exchange(port, _raw(row, None))

        try:
            for path, headers, field in ((f"{S}/b1/watch?after=%205", {}, "query.after"),
                                         (f"{S}/b1/watch?after=%2B5", {}, "query.after"),
                                         (f"{S}/b1/watch", {"Last_Event_ID": "abc"}, "header.Last-Event-ID"),
                                         (f"{S}/b1/watch?after=5", {"Last_Event_ID": "5x"}, "header.Last-Event-ID")):
                status, _, body = await ask(path, **headers)
                assert status == 422 and json.loads(body)["errors"][0]["field"] == field, (path, headers, body)
            assert counts[("watch", "2005")] == 4
            status, _, body = await ask(f"{S}/b1/watch?after=abc", Last_Event_ID="5")  # the header wins
            assert status == 503 and "not 5" in json.loads(body)["remark"], body
            assert counts[("watch", "2")] == 1 and unsubscribed == ["b1"]
        finally:
            server.should_exit = True
            await asyncio.wait_for(task, 10)

    asyncio.run(main())
