"""The fleet's replica-info reader against small HTTP/1.1 servers on 127.0.0.1: spread, reuse, move on."""

from __future__ import annotations

import asyncio
import json

import pytest

from electra.replica_info_reader import ReplicaInfoReader, ReplicaInfoUnavailable
from electra.security.credentials import ClientCredentials


class Node:
    """A stand-in controller node: answers replica-info GETs with `status`, counts connections and requests."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.connections = 0
        self.paths: list[str] = []
        self.heads: list[bytes] = []
        self.close_after_answer = False  # as a node closing an idle kept-alive connection
        self.server: asyncio.base_events.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.heads.append(head)
                path = head.split(b" ")[1].decode()
                self.paths.append(path)
                name = path.split("/")[3]
                body = json.dumps({"code": 0, "header": {"masterBrokerId": 1, "masterEpoch": 2},
                                   "body": {"syncStateSet": [1, 2]}, "name": name}).encode()
                if self.status != 200:
                    body = b'{"code":1,"remark":"no leader"}'
                writer.write(b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
                             % (self.status, len(body)) + body)
                await writer.drain()
                if self.close_after_answer:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def close(self) -> None:
        self.server.close()


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_reads_are_spread_over_every_node_on_kept_alive_connections_with_the_credential():
    async def main():
        nodes = [Node(), Node(), Node()]
        eps = [await n.start() for n in nodes]
        reader = ReplicaInfoReader(eps, credentials=ClientCredentials(token="tok"), connections_per_node=2)
        for i in range(30):
            res = await reader.replica_info(f"set-{i}")
            assert res["httpStatus"] == 200 and res["code"] == 0 and res["name"] == f"set-{i}"
            assert res["header"]["masterEpoch"] == 2 and res["body"]["syncStateSet"] == [1, 2]
        assert [len(n.paths) for n in nodes] == [10, 10, 10]
        assert [n.connections for n in nodes] == [1, 1, 1]  # one after another: one connection each, kept alive
        assert all(b"\r\nauthorization: bearer tok\r\n" in h.lower() for n in nodes for h in n.heads)
        many = await asyncio.gather(*(reader.replica_info(f"set-{i}") for i in range(60)))
        assert all(r["httpStatus"] == 200 for r in many)
        assert all(n.connections <= 2 for n in nodes)  # at most `connections_per_node` in flight per node
        reader.close()
        for n in nodes:
            n.close()

    run(main())


def test_a_refusing_or_unreachable_node_is_skipped_and_none_answering_raises():
    async def main():
        ok, refusing = Node(), Node(status=503)
        eps = [await ok.start(), await refusing.start(), "127.0.0.1:1"]  # port 1: connection refused
        reader = ReplicaInfoReader(eps)
        results = [await reader.replica_info(f"s{i}") for i in range(9)]
        assert all(r["httpStatus"] == 200 for r in results) and len(ok.paths) == 9
        assert reader.stats["moved_on"] >= 6
        ok.close()
        reader.close()
        with pytest.raises(ReplicaInfoUnavailable, match="no controller answered replica info of s9"):
            await ReplicaInfoReader(eps[1:]).replica_info("s9")
        refusing.close()

    run(main())


def test_a_connection_the_node_closed_while_idle_is_replaced_without_an_error():
    async def main():
        node = Node()
        node.close_after_answer = True
        reader = ReplicaInfoReader([await node.start()])
        for i in range(5):
            assert (await reader.replica_info(f"s{i}"))["httpStatus"] == 200
            await asyncio.sleep(0.05)  # the close reaches the client before the next request
        assert node.connections == 5 and reader.stats["moved_on"] == 0
        reader.close()
        node.close()

    run(main())
