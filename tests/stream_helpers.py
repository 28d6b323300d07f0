"""Test helpers for the streaming job: a recording stand-in for a controller's HTTP API (aiohttp, own thread)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

from aiohttp import web

from electra.streaming.embedded_kafka import free_port


class FakeController:
    """Answers `GET /v1/admin/metadata` and `POST /v1/internal/broker-sets/{name}/elect-master` like a controller.

    `leader_address` None means this node is the leader. `script[name]` is a list of
    (status, body) answers popped per POST (default 200 code 0); a follower answers
    POSTs with 307 to the leader unless scripted. `on_proposal(name, body)` runs on
    every POST that gets a 200.
    """

    def __init__(self, leader_address: str | None = None,
                 on_proposal: Callable[[str, dict], None] | None = None) -> None:
        self.port = free_port()
        self.leader_address = leader_address
        self.on_proposal = on_proposal
        self.script: dict[str, list[tuple[int, dict]]] = {}
        self.posts: list[tuple[float, str, dict]] = []
        self.metadata_calls = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def _metadata(self, request: web.Request) -> web.Response:
        self.metadata_calls += 1
        return web.json_response({"is_leader": self.leader_address is None,
                                  "leader_address": self.leader_address or self.address})

    async def _elect(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        body = await request.json()
        self.posts.append((time.time(), name, body))
        answers = self.script.get(name)
        if answers:
            status, res = answers.pop(0)
        elif self.leader_address is not None:
            return web.json_response({"code": 2007, "leaderAddress": self.leader_address}, status=307,
                                     headers={"Location": f"http://{self.leader_address}{request.path}"})
        else:
            status, res = 200, {"code": 0, "remark": "ok"}
        if status == 200 and self.on_proposal is not None:
            self.on_proposal(name, body)
        headers = {"Retry-After": "1"} if status == 503 else None
        return web.json_response(res, status=status, headers=headers)

    def start(self) -> FakeController:
        ready = threading.Event()

        async def serve() -> None:
            app = web.Application()
            app.router.add_get("/v1/admin/metadata", self._metadata)
            app.router.add_post("/v1/internal/broker-sets/{name}/elect-master", self._elect)
            self._runner = web.AppRunner(app, access_log=None)
            await self._runner.setup()
            await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
            ready.set()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            self._loop.run_until_complete(serve())
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name=f"fake-controller-{self.port}", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("fake controller did not start")
        return self

    def stop(self) -> None:
        if self._loop is None:
            return
        fut = asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop)
        fut.result(timeout=5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop = None
