"""The peer transport over real loopback sockets."""

from __future__ import annotations

import asyncio
import struct

import msgpack

from electra.consensus.messages import Append, Heartbeat
from electra.consensus.transport import PROTO, PeerTransport
from electra.local_ports import free_ports


async def _until(cond, timeout=5.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def _cluster(n=3):
    ports = free_ports(n)
    peers = {i + 1: ("127.0.0.1", p) for i, p in enumerate(ports)}
    inbox = {i: [] for i in peers}
    ts = {i: PeerTransport(i, peers, inbox[i].append) for i in peers}
    return peers, inbox, ts


def test_messages_flow_in_order_over_one_connection_per_pair():
    async def main():
        peers, inbox, ts = _cluster()
        for t in ts.values():
            await t.start()
        try:
            await _until(lambda: all(t.connected(p) for i, t in ts.items() for p in peers if p != i))
            for k in range(1000):
                for src in peers:
                    for dst in peers:
                        if src != dst:
                            m = Append(src, dst, 1, prev_index=k, ent_terms=[1], ent_data=[b"%d" % k])
                            ts[src].send(m)
            await _until(lambda: all(len(v) == 2000 for v in inbox.values()))
            for dst, msgs in inbox.items():
                for src in peers:
                    got = [m.prev_index for m in msgs if m.src == src]
                    assert got == ([] if src == dst else list(range(1000)))
            # one TCP connection per pair: the lower id dialed, the higher accepted
            assert sum(t.stats["reconnects"] for t in ts.values()) == 3
        finally:
            for t in ts.values():
                await t.stop()

    asyncio.run(asyncio.wait_for(main(), 20))


def test_unknown_node_and_garbage_are_rejected_and_the_node_keeps_working():
    async def main():
        peers, inbox, ts = _cluster()
        for t in ts.values():
            await t.start()
        try:
            await _until(lambda: ts[1].connected(3) and ts[2].connected(3))
            host, port = peers[3]
            # a stranger claiming to be node 99
            r, w = await asyncio.open_connection(host, port)
            hello = msgpack.packb({"proto": PROTO, "cluster": "electra", "from": 99, "to": 3})
            w.write(struct.pack(">I", len(hello)) + hello)
            assert await asyncio.wait_for(r.read(), 5) == b""  # closed on us
            assert ts[3].stats["rejected_handshakes"] == 1
            # msgpack's true is no node id, although true == 1 in a dict lookup
            r, w = await asyncio.open_connection(host, port)
            hello = msgpack.packb({"proto": PROTO, "cluster": "electra", "from": True, "to": 3})
            w.write(struct.pack(">I", len(hello)) + hello)
            assert await asyncio.wait_for(r.read(), 5) == b""
            assert ts[3].stats["rejected_handshakes"] == 2
            # a valid handshake as node 1 followed by garbage: that connection closes ...
            r, w = await asyncio.open_connection(host, port)
            hello = msgpack.packb({"proto": PROTO, "cluster": "electra", "from": 1, "to": 3})
            w.write(struct.pack(">I", len(hello)) + hello + struct.pack(">I", 5) + b"\xc1\xc1\xc1\xc1\xc1")
            await _until(lambda: ts[3].stats["malformed"] == 1)
            w.close()
            # ... an oversized frame too ...
            r, w = await asyncio.open_connection(host, port)
            w.write(struct.pack(">I", len(hello)) + hello + struct.pack(">I", 1 << 31))
            await _until(lambda: ts[3].stats["malformed"] == 2)
            w.close()
            # ... and the real node 1 reconnects and is heard again.
            await _until(lambda: ts[1].connected(3) and ts[3].connected(1), timeout=10)
            n = len(inbox[3])
            await _until(lambda: (ts[1].send(Heartbeat(1, 3, 1)) or len(inbox[3]) > n), 10)
        finally:
            for t in ts.values():
                await t.stop()

    asyncio.run(asyncio.wait_for(main(), 30))


def test_restarted_peer_is_reconnected_and_sends_to_absent_peers_are_dropped():
    async def main():
        peers, inbox, ts = _cluster()
        for t in ts.values():
            await t.start()
        try:
            await _until(lambda: ts[1].connected(2))
            await ts[2].stop()
            await _until(lambda: not ts[1].connected(2))
            ts[1].send(Heartbeat(1, 2, 1))  # must not raise
            assert ts[1].stats["dropped"] >= 1
            ts[2] = PeerTransport(2, peers, inbox[2].append)
            await ts[2].start()
            await _until(lambda: ts[1].connected(2), timeout=10)
            await _until(lambda: (ts[1].send(Heartbeat(1, 2, 1)) or bool(inbox[2])), 10)
        finally:
            for t in ts.values():
                await t.stop()

    asyncio.run(asyncio.wait_for(main(), 60))  # above the sum of the waits' own bounds (30 s): they name the step
