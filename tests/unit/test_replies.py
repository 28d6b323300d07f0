"""Engine errors to HTTP: a write whose outcome is unknown is never answered as safe to retry."""

import pytest

from electra.api.replies import RequestMetrics, refused
from electra.consensus.errors import DiskFailure, NodeStopped, ProposalDropped, ProposalTimeout


@pytest.mark.parametrize(("exc", "status"), [
    (ProposalTimeout("no result"), 504),
    (NodeStopped("stopping"), 504),  # the entry may have reached the others before this node stopped
    (DiskFailure("fsync failed"), 504),
    (ProposalDropped("not proposed"), 503),  # known not applied: retry
])
def test_unknown_outcomes_are_504_and_known_refusals_503(exc, status):
    reply = refused(RequestMetrics(), "register", exc, None, lambda addr: addr)
    assert reply.status == status
    assert ("outcome unknown" in reply.body["remark"]) == (status == 504)
