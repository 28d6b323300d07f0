"""Engine errors to HTTP: a write whose outcome is unknown is never answered as safe to retry."""

import pytest

from electra.api.replies import RequestMetrics, refused
from electra.consensus.errors import DiskFailure, NodeStopped, NoQuorum, ProposalDropped, ProposalTimeout, QuorumLost


@pytest.mark.parametrize(("exc", "status"), [
    (ProposalTimeout("no result"), 504),
    (NodeStopped("stopping"), 504),  # the entry may have reached the others before this node stopped
    (DiskFailure("fsync failed"), 504),
    (QuorumLost("stepped down first"), 504),  # a later leader may still commit it
    (ProposalDropped("not proposed"), 503),  # known not applied: retry
])
def test_unknown_outcomes_are_504_and_known_refusals_503(exc, status):
    reply = refused(RequestMetrics(), "register", exc, None, lambda addr: addr)
    assert reply.status == status
    assert ("outcome unknown" in reply.body["remark"]) == (status == 504)


def test_a_leader_without_quorum_refuses_like_a_node_that_is_not_the_leader():
    """Never appended, and the others may be electing: clients move to another node, not to this one."""
    reply = refused(RequestMetrics(), "register", NoQuorum("no quorum"), "127.0.0.1:1", lambda addr: addr)
    assert reply.status == 503 and reply.body["code"] == 2007 and reply.body["leaderAddress"] is None
