"""In-process controller clusters for integration tests: real Raft nodes and HTTP servers on loopback.

Insecure by explicit choice (no `security=`: plaintext Raft and HTTP, no tokens): these tests are about
the controller's semantics; identity is proven by tests/integration/test_security_processes.py.
"""

from __future__ import annotations

import asyncio
import time

from electra.api.server import ControllerNode, start_controller_node
from electra.consensus.core import RaftConfig
from electra.consensus.node import NodeConfig
from electra.local_ports import free_ports


async def start_cluster(tmp_path, n: int = 3, election_ticks: int = 10,
                        **node_kwargs) -> tuple[dict[int, ControllerNode], dict[int, str]]:
    """`n` controller nodes (50 ms ticks) and their HTTP endpoints, once one of them leads.

    `election_ticks`: the election timeout in ticks (and the leader's check-quorum window); the nodes
    share this process's event loop, so a stall of the loop longer than that costs the leader its quorum.
    `node_kwargs` go to `start_controller_node` (scan_interval_s, kafka_bootstrap, tier, ...).
    """
    ports = free_ports(2 * n)
    peers = {i + 1: ("127.0.0.1", ports[i]) for i in range(n)}
    http = {i + 1: f"127.0.0.1:{ports[n + i]}" for i in range(n)}
    nodes: dict[int, ControllerNode] = {}
    try:
        for i in peers:
            cfg = NodeConfig(node_id=i, peers=peers, data_dir=tmp_path / f"n{i}", tick_s=0.05,
                             raft=RaftConfig(election_ticks=election_ticks, heartbeat_ticks=1))
            nodes[i] = await start_controller_node(cfg, "127.0.0.1", ports[n + i - 1], http, **node_kwargs)
        await wait_leader(nodes)
    except BaseException:
        for node in nodes.values():
            await node.stop()
        raise
    return nodes, http


async def wait_leader(nodes: dict[int, ControllerNode], timeout: float = 10.0) -> int:
    """The id of the node that leads and has committed in its term (bounded wait)."""
    deadline = time.monotonic() + timeout
    while True:
        for i, node in nodes.items():
            if node.node.is_leader and node.node.core.committed_in_term():
                return i
        assert time.monotonic() < deadline, "no leader"
        await asyncio.sleep(0.02)
