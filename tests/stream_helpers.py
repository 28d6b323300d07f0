"""Test helpers for the streaming job: a recording stand-in for a controller's HTTP API (aiohttp, own thread),
brokers heartbeating straight into the heartbeats topic, a topic reader and a bounded wait."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable

from aiohttp import web
from kafka import KafkaConsumer, KafkaProducer

from electra.local_ports import free_port
from electra.streaming import kafka_io, records


def now_ms() -> int:
    return int(time.time() * 1000)


def wait_for(pred, timeout_s: float, step: float = 0.2):
    """Poll `pred()` until it is truthy or `timeout_s` passes; return its last value."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(step)
    return pred()


class HeartbeatWorld:
    """Brokers 1-3 of each set heartbeating every 0.3 s into the heartbeats topic (own thread), and the
    controller's events topic as the job reads it. Add (set, broker) to `stopped` to silence a broker."""

    def __init__(self, bootstrap: str, sets: list[str], timeout_ms: int) -> None:
        self.sets, self.timeout_ms = sets, timeout_ms
        self.producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
        self.lock = threading.Lock()
        self.index = 0
        self.stopped: set[tuple[str, int]] = set()
        self.last_hb: dict[tuple[str, int], int] = {}
        self.quit = threading.Event()
        self.thread = threading.Thread(target=self._beat, daemon=True)

    def event(self, name: str, master: int, epoch: int) -> None:
        """Publish an ElectMaster event making `master` the master of `name` at `epoch`."""
        with self.lock:
            self.index += 1
            state = {"clusterName": "c1", "masterBrokerId": master, "masterEpoch": epoch, "syncStateSet": [master],
                     "syncStateSetEpoch": epoch, "brokers": {str(b): f"10.0.0.{b}:10911" for b in (1, 2, 3)}}
            ev = records.event_record(self.index, 1, now_ms(), {"type": "ElectMaster", "brokerName": name},
                                      state, "c1")
            self.producer.send(records.EVENTS, key=name.encode(), value=records.encode(ev))
            self.producer.flush()

    def _beat(self) -> None:
        while not self.quit.is_set():
            ts = now_ms()
            for name in self.sets:
                for b in (1, 2, 3):
                    if (name, b) in self.stopped:
                        continue
                    hb = {"clusterName": "c1", "brokerName": name, "brokerAddr": f"10.0.0.{b}:10911",
                          "brokerId": b, "epoch": 1, "maxOffset": 1000, "confirmOffset": 1000,
                          "heartbeatTimeoutMillis": self.timeout_ms, "electionPriority": b, "ts": ts}
                    self.producer.send(records.HEARTBEATS, key=name.encode(), value=records.encode(hb))
                    self.last_hb[(name, b)] = ts
            self.producer.flush()
            self.quit.wait(0.3)

    def close(self) -> None:
        self.quit.set()
        if self.thread.is_alive():
            self.thread.join(timeout=5)
        self.producer.close(timeout=5)


class TopicReader:
    """Every JSON record of one topic from the beginning, polled on demand; `split` turns one record into the
    values it holds (`records.liveness_sets` for the liveness topic, whose records hold many sets)."""

    def __init__(self, bootstrap: str, topic: str, split=None) -> None:
        self.split = split
        self.c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest")
        self.tps = kafka_io.topic_partitions(self.c, topic)
        self.c.assign(self.tps)
        self.c.seek_to_beginning(*self.tps)
        self.values: list[dict] = []

    def __enter__(self) -> TopicReader:
        return self

    def __exit__(self, *exc) -> None:
        self.c.close()  # else its IO thread polls a stopped broker for the rest of the test run

    def poll(self) -> list[dict]:
        for msgs in self.c.poll(timeout_ms=200).values():
            for m in msgs:
                v = json.loads(m.value)
                self.values += self.split(v) if self.split else [v]
        return self.values


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
