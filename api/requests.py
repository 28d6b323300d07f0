"""The broker request interface: what the HTTP layer (FastAPI and the lean path) asks of a controller.

One `BrokerRequests` implementation answers RocketMQ's controller requests for one node.
Today there are two: `api.service.ControllerService` (concurrent requests on the Raft
engine) and the legacy architecture mode (one event queue, one scheduler thread), which
exist side by side so that a benchmark isolates the architecture. Both HTTP front ends
(`api/app.py`, `api/lean_http.py`) only ever call these methods.

Contract for every method:

* the answer is RocketMQ's response shape, a dict `{"code", "remark", "header", "body"}`
  (`code` an `electra.state.codes.Code`; `header`/`body` as the state machine returns them),
  ready to be sent as JSON;
* a request this node cannot serve raises an `electra.consensus.errors.RaftError`:
  `NotLeader` (writes on a follower; carries the leader's id and API address when known),
  `FollowerBehind` / `ReadTimeout` (a read cannot be confirmed here now), `ProposalTimeout`
  (outcome unknown), any other `RaftError` (not ready); `api/replies.py` maps them to HTTP;
* arguments are already validated (names, id and epoch ranges: `api/app.py`'s models);
* a method returns the answer, or anything awaitable for it; the reads and writes may return an
  `asyncio.Future` (callers await it; the lean path answers from its done-callback, no Task).
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Protocol, runtime_checkable

from electra.state.liveness import BrokerLiveInfo


@runtime_checkable
class BrokerRequests(Protocol):
    """RocketMQ controller requests (request codes in the comments) as one node answers them."""

    def now_ms(self) -> int:
        """This node's clock in ms (the instant requests are stamped with)."""
        ...

    def leader_address(self) -> str | None:
        """The HTTP API address (host:port) of the leader this node knows, for redirects."""
        ...

    def heartbeat(self, cluster: str, name: str, broker_id: int, addr: str, *, epoch: int = -1,
                  max_offset: int = -1, confirm_offset: int = -1, timeout_ms: int = 10_000,
                  priority: int = 2**31 - 1) -> dict:
        """BROKER_HEARTBEAT (904): node-local liveness, no log write."""
        ...

    def get_next_broker_id(self, cluster: str, name: str) -> Awaitable[dict]:
        """GET_NEXT_BROKER_ID (1012): a consistent read."""
        ...

    def apply_broker_id(self, cluster: str, name: str, broker_id: int, check_code: str) -> Awaitable[dict]:
        """APPLY_BROKER_ID (1013): a write."""
        ...

    def register_broker(self, cluster: str, name: str, broker_id: int, addr: str) -> Awaitable[dict]:
        """REGISTER_BROKER (1003): a write when the address changes."""
        ...

    async def elect_master(self, cluster: str, name: str, broker_id: int, designate: bool = False,
                           unclean: bool = False) -> dict:
        """ELECT_MASTER (1002): broker-triggered, or admin-designated with `designate`; `unclean` (an admin's
        choice for this one election) lets it pick a live replica outside the sync-state set, as the node's
        `--unclean-election` (RocketMQ's enableElectUncleanMaster) does for every election it proposes."""
        ...

    async def propose_election(self, cluster: str, name: str, expected_master_epoch: int,
                               live: list[BrokerLiveInfo], judged_at_ms: int | None = None) -> dict:
        """The streaming job's ElectMaster, fenced by the master epoch it saw."""
        ...

    def alter_sync_state_set(self, name: str, master_id: int, master_epoch: int, new_set: list[int],
                             sync_state_set_epoch: int) -> Awaitable[dict]:
        """ALTER_SYNC_STATE_SET (1001): a write."""
        ...

    def get_replica_info(self, name: str, lease: bool = False) -> Awaitable[dict]:
        """GET_REPLICA_INFO (1004): a consistent read (`lease`: the leader may answer from its lease)."""
        ...

    def get_sync_state_data(self, names: list[str]) -> dict:
        """GET_SYNC_STATE_DATA (1006): the admin's local view."""
        ...

    async def clean_broker_data(self, cluster: str | None, name: str, ids: list[int] | None,
                                clean_living: bool) -> dict:
        """CLEAN_BROKER_DATA (1011): a write."""
        ...
