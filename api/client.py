"""A small client for brokers and tools: leader discovery, redirects, retries on 503.

Writes follow the 307 a follower answers with; reads are served by whichever node
is asked. A 503 (no leader yet, follower too stale) is retried on the next node
until the deadline. The RocketMQ response (`code`, `remark`, `header`, `body`)
is returned as a dict whatever its code; transport failures raise.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import httpx


class ControllerClient:
    def __init__(self, endpoints: list[str], *, timeout: float = 5.0, deadline_s: float = 15.0) -> None:
        if not endpoints:
            raise ValueError("at least one controller endpoint (host:port) is required")
        self.endpoints = list(endpoints)
        self.deadline_s = deadline_s
        self._rr = itertools.cycle(range(len(self.endpoints)))
        self.preferred: str | None = None
        self.http = httpx.AsyncClient(timeout=timeout, follow_redirects=True)

    async def close(self) -> None:
        await self.http.aclose()

    async def request(self, method: str, path: str, json: Any = None, params: dict | None = None) -> dict:
        end = time.monotonic() + self.deadline_s
        last: Exception | None = None
        while time.monotonic() < end:
            ep = self.preferred or self.endpoints[next(self._rr)]
            try:
                r = await self.http.request(method, f"http://{ep}{path}", json=json, params=params)
            except httpx.TransportError as exc:
                last, self.preferred = exc, None
                await asyncio.sleep(0.05)
                continue
            if r.status_code == 503:
                self.preferred = None
                await asyncio.sleep(0.1)
                continue
            if r.history:  # redirected: remember the leader
                self.preferred = r.url.netloc.decode()
            return r.json() | {"httpStatus": r.status_code}
        raise TimeoutError(f"no controller answered {method} {path} within {self.deadline_s}s: {last!r}")

    # RocketMQ-shaped helpers
    async def heartbeat(self, cluster, name, broker_id, addr, **extra) -> dict:
        """Sent to every controller, as RocketMQ brokers do: each node keeps its own liveness table,
        so whichever node leads next already knows who is alive."""
        body = {"clusterName": cluster, "brokerName": name, "brokerId": broker_id, "brokerAddr": addr, **extra}

        async def one(ep: str):
            try:
                r = await self.http.post(f"http://{ep}/v1/heartbeat", json=body)
                return r.json() | {"httpStatus": r.status_code}
            except httpx.TransportError as exc:
                return exc

        targets = dict.fromkeys(self.endpoints + ([self.preferred] if self.preferred else []))
        replies = await asyncio.gather(*(one(ep) for ep in targets))
        ok = [r for r in replies if isinstance(r, dict)]
        if not ok:
            raise TimeoutError(f"no controller accepted the heartbeat: {replies[0]!r}")
        return ok[0]

    async def next_broker_id(self, cluster, name) -> dict:
        return await self.request("GET", f"/v1/broker-sets/{name}/next-broker-id", params={"cluster": cluster})

    async def apply_broker_id(self, cluster, name, broker_id, check_code) -> dict:
        return await self.request("POST", f"/v1/broker-sets/{name}/apply-broker-id",
                                  json={"clusterName": cluster, "brokerId": broker_id,
                                        "registerCheckCode": check_code})

    async def register(self, cluster, name, broker_id, addr) -> dict:
        return await self.request("POST", f"/v1/broker-sets/{name}/register",
                                  json={"clusterName": cluster, "brokerId": broker_id, "brokerAddress": addr})

    async def elect_master(self, cluster, name, broker_id, *, admin: bool = False) -> dict:
        prefix = "/v1/admin" if admin else "/v1"
        return await self.request("POST", f"{prefix}/broker-sets/{name}/elect-master",
                                  json={"clusterName": cluster, "brokerId": broker_id})

    async def alter_sync_state_set(self, name, master_id, master_epoch, new_set, sync_state_set_epoch) -> dict:
        return await self.request("POST", f"/v1/broker-sets/{name}/sync-state-set",
                                  json={"masterBrokerId": master_id, "masterEpoch": master_epoch,
                                        "syncStateSet": sorted(new_set), "syncStateSetEpoch": sync_state_set_epoch})

    async def replica_info(self, name) -> dict:
        return await self.request("GET", f"/v1/broker-sets/{name}/replica-info")

    async def sync_state_data(self, names) -> dict:
        return await self.request("POST", "/v1/admin/sync-state-data", json={"brokerNames": list(names)})

    async def clean_broker_data(self, name, *, cluster=None, ids=None, clean_living=False) -> dict:
        return await self.request("POST", f"/v1/admin/broker-sets/{name}/clean",
                                  json={"clusterName": cluster, "brokerIds": ids, "cleanLivingBroker": clean_living})

    async def metadata(self, endpoint: str | None = None) -> dict:
        ep = endpoint or self.endpoints[0]
        r = await self.http.get(f"http://{ep}/v1/admin/metadata")
        return r.json()
