"""Who a Raft peer is, read from its TLS certificate rather than from its handshake's claim.

A node certificate carries one URI subject-alternative name, `electra://<cluster-id>/node/<id>`:
the cluster it was issued for and the member id it may speak as. The transport compares both with
the handshake and with every message's `src`, so a process can only ever be the node its
certificate names. The format lives here, next to the transport that checks it; `electra cert`
(electra.security.pki) writes it.
"""

from __future__ import annotations

import re
from typing import Any

_CLUSTER_ID = r"[A-Za-z0-9._-]{1,128}"  # what a cluster id may hold: it is part of every node certificate's URI
_NODE_URI = re.compile(rf"^electra://({_CLUSTER_ID})/node/([1-9][0-9]{{0,8}})$")


def check_cluster_id(cluster_id: str) -> None:
    """ValueError unless `cluster_id` can be named in a node certificate's URI."""
    if not re.fullmatch(_CLUSTER_ID, cluster_id):
        raise ValueError(f"cluster id {cluster_id!r} cannot be named in a certificate: 1-128 characters from "
                         "A-Z a-z 0-9 . _ -")


def node_uri(cluster_id: str, node_id: int) -> str:
    uri = f"electra://{cluster_id}/node/{node_id}"
    if not _NODE_URI.match(uri):
        check_cluster_id(cluster_id)
        raise ValueError(f"node id {node_id!r} cannot be named in a certificate: 1 to 999999999")
    return uri


def identity_from_peercert(cert: dict[str, Any] | None) -> tuple[str, int]:
    """(cluster id, node id) from `SSLObject.getpeercert()`; ValueError if the certificate names no node."""
    if not cert:
        raise ValueError("the peer presented no certificate")
    found = [m for kind, value in cert.get("subjectAltName", ()) if kind == "URI"
             for m in [_NODE_URI.match(value)] if m]
    if len(found) != 1:
        raise ValueError("the peer certificate names no Electra node (expected one electra://<cluster>/node/<id> URI)")
    return found[0].group(1), int(found[0].group(2))
