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

_NODE_URI = re.compile(r"^electra://([A-Za-z0-9._-]{1,128})/node/([1-9][0-9]{0,8})$")


def node_uri(cluster_id: str, node_id: int) -> str:
    uri = f"electra://{cluster_id}/node/{node_id}"
    if not _NODE_URI.match(uri):
        if not re.fullmatch(r"[A-Za-z0-9._-]{1,128}", cluster_id):
            raise ValueError(f"cluster id {cluster_id!r} cannot be named in a certificate: 1-128 characters from "
                             "A-Z a-z 0-9 . _ -")
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
