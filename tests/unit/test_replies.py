"""Engine errors to HTTP: a write whose outcome is unknown is never answered as safe to retry."""

import pytest

from electra.api.replies import RequestMetrics, refused, request_url_on
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


def test_request_metrics_export_what_prometheus_clients_counter_and_histogram_did():
    """Plain-int counting, exported on scrape: same families, names, labels, buckets and values."""
    import re

    from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

    ours = RequestMetrics()
    registry = CollectorRegistry()
    counter = Counter("electra_requests", "requests by endpoint and RocketMQ code", ["endpoint", "code"],
                      registry=registry)
    histogram = Histogram("electra_request_seconds", "request latency by endpoint", ["endpoint"],
                          registry=registry, buckets=RequestMetrics.BUCKETS)
    seen = [("register_broker", 0, 0.0003), ("register_broker", 0, 0.001), ("register_broker", 2012, 0.004),
            ("elect_master", "2011", 0.25), ("elect_master", "2011", 7.5), ("heartbeat", "0", 0.0005)]
    for endpoint, code, seconds in seen:
        ours.count(endpoint, code)
        ours.observe_latency(endpoint, seconds)
        counter.labels(endpoint, str(code)).inc()
        histogram.labels(endpoint).observe(seconds)

    def lines(text: bytes) -> list[str]:  # creation times differ: compare that they are there
        return sorted(re.sub(r"(_created(\{[^}]*\})?) \S+$", r"\1 T", line) for line in text.decode().splitlines())

    assert lines(generate_latest(ours.registry)) == lines(generate_latest(registry))
    assert 'electra_requests_total{code="2011",endpoint="elect_master"} 2.0' in generate_latest(ours.registry).decode()


def test_a_redirect_escapes_the_decoded_path_again():
    """The route matched `/v1/broker-sets/pr%41/...` (sent as `pr%2541`): the leader must get that set, not `prA`."""
    url = request_url_on("https", "/v1/broker-sets/pr%41/apply-broker-id", "")("10.0.0.2:8080")
    assert url == "https://10.0.0.2:8080/v1/broker-sets/pr%2541/apply-broker-id"
    assert request_url_on("http", "/v1/broker-sets/a.b:c_d-e/next-broker-id", "cluster=c")("h:1") == \
        "http://h:1/v1/broker-sets/a.b:c_d-e/next-broker-id?cluster=c"
