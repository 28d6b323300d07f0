"""What `electra node` needs to run securely, resolved from its settings in one place.

Secure mode (the default) needs a certs directory (see electra.security.pki) with the CA bundle,
this node's certificate and key, and the tokens file: peers then talk mutual TLS, the HTTP API
serves HTTPS and asks every caller for a token. `--insecure` is the explicit opt-out: plaintext,
no authentication (admin actions are still audited, as "anonymous").
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .auth import TokenStore
from .pki import CA_CERT, cert_node_identity, node_cert_paths
from .tls import NodeTLS

TOKENS_FILE = "tokens.json"
INSECURE_BANNER = ("*** INSECURE MODE: Raft peers and HTTP clients are neither encrypted nor authenticated; "
                   "anyone who can reach this node's ports owns the cluster. Do not use outside a test. ***")


@dataclass
class NodeSecurity:
    cluster_id: str | None
    tls: NodeTLS | None = None
    tokens: TokenStore | None = None

    @property
    def insecure(self) -> bool:
        return self.tls is None


def resolve_node_security(node_id: int, certs_dir: str | Path | None, *, insecure: bool,
                          cluster_id: str | None = None, tokens_file: str | Path | None = None) -> NodeSecurity:
    """Raise ValueError with the fix when a secure node lacks its files."""
    if insecure:
        if certs_dir:
            raise ValueError("--insecure and --certs-dir exclude each other")
        return NodeSecurity(cluster_id)
    if not certs_dir:
        raise ValueError("refusing to serve without TLS and authentication: give --certs-dir DIR (create it with "
                         "`electra cert create-ca` / `create-node` / `create-token`, or use `electra up`), "
                         "or start with --insecure for a throwaway test cluster")
    d = Path(certs_dir)
    cert, key = node_cert_paths(d, node_id)
    tls = NodeTLS(cert, key, d / CA_CERT)
    tls.check()
    cert_cluster, cert_node = cert_node_identity(cert)
    if cert_node != node_id:
        raise ValueError(f"{cert} is the certificate of node {cert_node}, not of node {node_id}")
    if cluster_id is not None and cluster_id != cert_cluster:
        raise ValueError(f"--cluster-id {cluster_id!r} differs from the cluster id {cert_cluster!r} in {cert}")
    tokens = TokenStore(Path(tokens_file) if tokens_file else d / TOKENS_FILE)
    return NodeSecurity(cert_cluster, tls, tokens)
