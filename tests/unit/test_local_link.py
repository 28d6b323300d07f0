"""The front-end link (api/local_link.py): frame codec, batching per loop turn, bounds, link loss."""

from __future__ import annotations

import asyncio
import struct

import msgspec
import pytest

from electra.api.local_link import (
    Answer,
    Call,
    FrameError,
    FrameReader,
    LinkClient,
    LinkDown,
    LinkLost,
    LinkServerProtocol,
    encode_frames,
)


def _call(i: int, **kw) -> Call:
    base = dict(id=i, endpoint="register_broker", name=f"s{i}", cluster=None, args=["c", "s", 1, "10.0.0.1:1"],
                scheme="https", path=f"/v1/broker-sets/s{i}/register", query="")
    return Call(**{**base, **kw})


# ------------------------------------------------------------------ codec
def test_frames_round_trip_through_any_split_of_the_byte_stream():
    calls = [_call(i) for i in range(50)] + [_call(99, args=None, cluster="c", query="cluster=c")]
    raw = b"".join(encode_frames(calls))
    for step in (1, 7, 4096, len(raw)):
        reader, got = FrameReader(Call), []
        for lo in range(0, len(raw), step):
            for frame in reader.feed(raw[lo:lo + step]):
                got.extend(frame)
        assert got == calls


def test_a_batch_over_the_frame_limit_is_split_into_frames_under_it():
    answers = [Answer(i, 200, b"x" * 1000, {"retry-after": "1"}) for i in range(100)]
    frames = encode_frames(answers, max_frame=10_000)
    assert len(frames) > 10 and all(len(f) <= 10_000 for f in frames)
    reader = FrameReader(Answer, max_frame=10_000)
    assert [a for f in frames for fr in reader.feed(f) for a in fr] == answers


def test_one_item_over_the_frame_limit_is_refused():
    with pytest.raises(FrameError):
        encode_frames([Answer(1, 200, b"x" * 2000, {})], max_frame=1000)


def test_a_frame_announcing_more_than_the_limit_is_refused_before_it_is_buffered():
    with pytest.raises(FrameError, match="exceeds"):
        FrameReader(Call, max_frame=1000).feed(struct.pack(">I", 5000) + b"\x90")


def test_an_undecodable_frame_is_refused():
    bad = msgspec.msgpack.encode([[1, "x"]])  # a Call of two fields
    with pytest.raises(FrameError, match="undecodable"):
        FrameReader(Call).feed(struct.pack(">I", len(bad)) + bad)


# ------------------------------------------------------------------ both ends over a real unix socket
async def _pair(tmp_path, execute, *, server_max: int = 4096, client_max: int = 4096):
    loop = asyncio.get_running_loop()
    links: set = set()
    path = str(tmp_path / "link.sock")
    server = await loop.create_unix_server(lambda: LinkServerProtocol(execute, links, server_max), path=path)
    _, client = await loop.create_unix_connection(lambda: LinkClient(client_max), path)
    for _ in range(100):  # bounded: until the server side has the link
        if links:
            break
        await asyncio.sleep(0.01)
    return server, client, next(iter(links))


def test_calls_of_one_loop_turn_go_as_one_frame_and_their_answers_come_back_as_one(tmp_path):
    async def main():
        def execute(c: Call):
            async def later():
                await asyncio.sleep(0)
                return Answer(c.id, 200, b'{"n":%d}' % c.id, {})
            return Answer(c.id, 201, b"{}", {}) if c.endpoint == "heartbeat" else later()

        server, client, end = await _pair(tmp_path, execute)
        futs = [client.submit(_call(0), write=True) for _ in range(30)]
        futs += [client.submit(_call(0, endpoint="heartbeat"), write=False) for _ in range(5)]
        answers = await asyncio.wait_for(asyncio.gather(*futs), 10)
        assert end.stats["frames_in"] == 1 and end.stats["calls"] == 35
        assert client.stats["frames_in"] <= 2  # the 5 immediate answers, then the 30 that took a turn
        assert [a.id for a in answers] == list(range(1, 36))
        assert [a.status for a in answers] == [200] * 30 + [201] * 5
        client.close()
        server.close()

    asyncio.run(main())


def test_a_front_end_over_its_in_flight_bound_waits_and_the_raft_side_stops_reading(tmp_path):
    async def main():
        gate = asyncio.Event()
        started = []

        def execute(c: Call):
            async def held():
                started.append(c.id)
                await gate.wait()
                return Answer(c.id, 200, b"{}", {})
            return held()

        server, client, end = await _pair(tmp_path, execute, server_max=3, client_max=4)
        most = 0
        tasks = [asyncio.ensure_future(client.call(_call(0), write=True)) for _ in range(20)]
        for _ in range(20):
            await asyncio.sleep(0.01)
            most = max(most, client.in_flight, end.in_flight)
        assert most <= 4 and client.stats["waited_for_room"] > 0
        assert end.reading_paused and end.stats["reading_paused"] == 1
        gate.set()
        answers = await asyncio.wait_for(asyncio.gather(*tasks), 10)
        assert len({a.id for a in answers}) == 20 and len(started) == 20
        assert not end.reading_paused
        client.close()
        server.close()

    asyncio.run(main())


def test_when_the_link_breaks_sent_writes_are_unknown_and_reads_or_unsent_calls_are_not(tmp_path):
    async def main():
        never = asyncio.get_running_loop().create_future()

        def execute(c: Call):
            async def hang():
                await never
            return hang()

        server, client, end = await _pair(tmp_path, execute)
        write = client.submit(_call(0), write=True)
        read = client.submit(_call(0, endpoint="replica_info", args=None), write=False)
        for _ in range(100):  # bounded: until the server holds both
            if end.in_flight == 2:
                break
            await asyncio.sleep(0.01)
        unsent = client.submit(_call(0), write=True)  # queued for this turn's frame, never sent
        end.transport.close()
        client._out.transport.abort()
        with pytest.raises(LinkLost) as lost:
            await asyncio.wait_for(write, 5)
        assert not lost.value.outcome_known
        for fut in (read, unsent):
            with pytest.raises(LinkDown) as down:
                await asyncio.wait_for(fut, 5)
            assert down.value.outcome_known
        with pytest.raises(LinkDown):
            client.submit(_call(0), write=True)
        server.close()
        never.cancel()

    asyncio.run(main())


def test_a_peer_sending_an_oversized_frame_is_cut_off(tmp_path):
    async def main():
        server, client, end = await _pair(tmp_path, lambda c: Answer(c.id, 200, b"{}", {}))
        fut = client.submit(_call(0), write=True)
        await asyncio.wait_for(fut, 5)
        client._out.transport.write(struct.pack(">I", 1 << 30))
        await asyncio.wait_for(client.closed.wait(), 5)
        server.close()

    asyncio.run(main())


def test_the_relay_answers_in_the_apis_shape_when_the_raft_process_is_gone_or_hangs_up(tmp_path):
    """A front-end's relay (api/raft_process_proxy.py): no Raft process socket is a 503 to retry; a Raft
    process that closes before answering is a 502; both in the `code`/`remark` shape every refusal uses."""
    import json

    from electra.api.raft_process_proxy import RaftProcessProxy

    async def through(proxy: RaftProcessProxy) -> tuple[int, dict, dict]:
        sent: list[dict] = []

        async def receive():
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(msg):
            sent.append(msg)

        scope = {"type": "http", "method": "GET", "raw_path": b"/healthz", "query_string": b"", "headers": [],
                 "client": ("127.0.0.1", 5), "scheme": "http"}
        await asyncio.wait_for(proxy(scope, receive, send), 10)
        return sent[0]["status"], dict(sent[0]["headers"]), json.loads(sent[1]["body"])

    async def main():
        status, headers, body = await through(RaftProcessProxy(str(tmp_path / "none.sock")))
        assert status == 503 and headers[b"retry-after"] == b"1", (status, headers)
        assert body["code"] == 1 and "not reachable" in body["remark"]  # as the lean path's LinkDown

        async def hang_up(reader, writer):
            await reader.readuntil(b"\r\n\r\n")
            writer.close()

        server = await asyncio.start_unix_server(hang_up, str(tmp_path / "raft.sock"))
        try:
            status, _, body = await through(RaftProcessProxy(str(tmp_path / "raft.sock")))
        finally:
            server.close()
        assert status == 502 and body["code"] == 1 and "closed the connection" in body["remark"]

    asyncio.run(main())


def test_a_raft_process_that_stops_answering_ends_open_calls_and_refuses_new_ones_until_it_answers(tmp_path,
                                                                                                  monkeypatch):
    """A stopped Raft process (SIGSTOP) keeps the link open and says nothing: an unanswered ping marks the link
    stalled, which ends the open calls (a sent write's outcome unknown, a read not applied) and refuses new
    ones; the first frame after it clears the mark. A live process that is merely slow is not cut: it answers
    the pings while its calls wait."""
    import electra.api.local_link as local_link

    monkeypatch.setattr(local_link, "PROBE_AFTER_S", 0.05)
    monkeypatch.setattr(local_link, "STALL_AFTER_S", 0.2)

    async def main():
        loop = asyncio.get_running_loop()
        path = str(tmp_path / "silent.sock")
        peers: list[asyncio.StreamWriter] = []

        async def silent(reader, writer):  # reads everything, answers nothing: a stopped process
            peers.append(writer)
            while await reader.read(65536):
                pass

        server = await asyncio.start_unix_server(silent, path)
        _, client = await loop.create_unix_connection(LinkClient, path)
        t0 = loop.time()
        write = client.submit(_call(0), write=True)
        read = client.submit(_call(0, endpoint="replica_info", args=None), write=False)
        with pytest.raises(LinkLost, match="stopped answering"):
            await asyncio.wait_for(write, 5)
        with pytest.raises(LinkDown):
            await asyncio.wait_for(read, 5)
        assert client.stalled and loop.time() - t0 < 2
        with pytest.raises(LinkDown, match="has not answered"):
            client.submit(_call(0), write=True)
        peers[0].write(b"".join(encode_frames([Answer(999, 200, b"", {})])))  # it resumes: any frame
        for _ in range(100):  # bounded
            if not client.stalled:
                break
            await asyncio.sleep(0.01)
        assert not client.stalled
        client.close()
        server.close()

        def slow(c: Call):
            async def later():
                await asyncio.sleep(0.6)  # three stall periods
                return Answer(c.id, 200, b"{}", {})
            return later()

        server2, client2, end = await _pair(tmp_path, slow)
        answer = await asyncio.wait_for(client2.submit(_call(0), write=True), 5)
        assert answer.status == 200 and not client2.stalled
        assert end.stats["calls"] == 1  # the pings were answered by the link, not executed
        client2.close()
        server2.close()

    asyncio.run(main())


def test_the_relay_answers_at_once_when_the_raft_process_has_stalled(tmp_path, monkeypatch):
    """Before an answer's first byte the relay checks the link's stall mark: a read is a 503 to retry elsewhere,
    anything else a 504 (it may yet take effect); while the process is not stalled, a slow answer is awaited."""
    import json

    import electra.api.raft_process_proxy as proxy_mod
    from electra.api.raft_process_proxy import RaftProcessProxy

    monkeypatch.setattr(proxy_mod, "STALL_CHECK_S", 0.05)

    async def main():
        stalled = {"now": False}
        requests: list[bytes] = []

        async def stopped(reader, writer):  # takes the request, never answers until told
            requests.append(await reader.readuntil(b"\r\n\r\n"))
            for _ in range(200):  # bounded: 2 s
                if stalled.get("answer"):
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
                    await writer.drain()
                    break
                await asyncio.sleep(0.01)
            writer.close()

        server = await asyncio.start_unix_server(stopped, str(tmp_path / "raft.sock"))
        proxy = RaftProcessProxy(str(tmp_path / "raft.sock"), lambda: stalled["now"])

        async def through(method: str) -> list[dict]:
            sent: list[dict] = []

            async def receive():
                await asyncio.sleep(5)
                return {"type": "http.disconnect"}

            async def send(msg):
                sent.append(msg)

            scope = {"type": "http", "method": method, "raw_path": b"/v1/admin/x", "query_string": b"",
                     "headers": [(b"content-length", b"0")], "client": ("127.0.0.1", 5), "scheme": "http"}
            await asyncio.wait_for(proxy(scope, receive, send), 5)
            return sent

        async def stall_soon():
            await asyncio.sleep(0.2)
            stalled["now"] = True

        for method, status in (("GET", 503), ("POST", 504)):
            stalled["now"] = False
            flip = asyncio.ensure_future(stall_soon())
            sent = await through(method)  # in flight when the process stalls
            await flip
            assert sent[0]["status"] == status, (method, sent)
            body = json.loads(sent[1]["body"])
            assert body["code"] == 1 and "answering" in body["remark"]  # SYSTEM_ERROR, as the lean path says it
            assert (b"retry-after", b"1") in sent[0]["headers"] if status == 503 else True
        n = len(requests)
        sent = await through("GET")  # stalled already: refused before any connection is made
        assert sent[0]["status"] == 503 and len(requests) == n
        stalled["now"] = False  # a live process answering after several checks is relayed

        async def answer_soon():
            await asyncio.sleep(0.3)
            stalled["answer"] = True

        soon = asyncio.ensure_future(answer_soon())
        sent = await through("GET")
        await soon
        assert sent[0]["status"] == 200
        server.close()

    asyncio.run(main())


def test_the_raft_process_sees_its_front_ends_requests_as_their_callers_made_them():
    """Behind the app socket a request reports the node's own address (the dashboard cookie's name) and the
    caller's port (the audit log), which X-Forwarded-For does not carry; a caller's own copy of the relay's
    port header never reaches the Raft process."""
    from electra.api.front_ends import ServedAs
    from electra.api.raft_process_proxy import _HOP, CLIENT_PORT

    seen = []

    async def app(scope, receive, send):
        seen.append(scope)

    served = ServedAs(app, ("0.0.0.0", 7301))
    scope = {"type": "http", "server": ("/tmp/x/app.sock", None), "client": ("10.1.2.3", 0),
             "headers": [(CLIENT_PORT, b"51646")]}
    asyncio.run(served(scope, None, None))
    assert seen[0]["server"] == ("0.0.0.0", 7301) and seen[0]["client"] == ("10.1.2.3", 51646)
    asyncio.run(served({**scope, "headers": [(CLIENT_PORT, b"99999999")]}, None, None))
    assert seen[1]["client"] == ("10.1.2.3", 0)  # not a port: left as the proxy headers gave it
    assert CLIENT_PORT in _HOP  # the relay drops a caller's own, then sets its own
