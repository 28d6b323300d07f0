"""A leader that loses its quorum answers its pending proposals at once (outcome unknown), not at their deadline,
and refuses new ones (certainly not appended: the client tries another node)."""

from __future__ import annotations

import asyncio
import time

import pytest

from electra.consensus.core import RaftConfig
from electra.consensus.errors import NoQuorum, NotLeader, ProposalDropped, QuorumLost
from electra.consensus.kv import KVStateMachine, encode_put
from electra.consensus.node import NodeConfig, RaftNode
from electra.local_ports import free_ports

pytestmark = pytest.mark.integration


def test_pending_proposals_fail_as_unknown_when_their_leader_loses_its_quorum(tmp_path):
    async def main():
        ports = free_ports(3)
        peers = {i + 1: ("127.0.0.1", p) for i, p in enumerate(ports)}
        nodes = {i: RaftNode(NodeConfig(node_id=i, peers=peers, data_dir=tmp_path / f"n{i}", tick_s=0.05,
                                        raft=RaftConfig(election_ticks=10, heartbeat_ticks=1)), KVStateMachine())
                 for i in peers}
        for n in nodes.values():
            await n.start()
        try:
            deadline = time.monotonic() + 10
            while not any(n.is_leader and n.core.committed_in_term() for n in nodes.values()):
                assert time.monotonic() < deadline, "no leader"
                await asyncio.sleep(0.02)
            leader = next(n for n in nodes.values() if n.is_leader)
            await leader.propose(encode_put("k", 1))
            for n in nodes.values():
                if n is not leader:
                    await n.stop()  # the leader can no longer commit
            read = asyncio.ensure_future(leader.read(lambda sm: sm.data.get("k"), timeout=8.0))  # ReadIndex
            with pytest.raises(QuorumLost) as caught:
                await leader.propose(encode_put("k", 2), timeout=8.0)  # else ProposalTimeout at 8 s
            with pytest.raises((NoQuorum, NotLeader)):  # else ReadTimeout at 8 s; NotLeader if it stepped down first
                await read
            assert not caught.value.outcome_known  # a later leader could still commit it
            with pytest.raises((ProposalDropped, NotLeader)):  # NotLeader once CheckQuorum stepped it down
                await leader.propose(encode_put("k", 3), timeout=8.0)
        finally:
            for n in nodes.values():
                await n.stop()

    asyncio.run(main())
