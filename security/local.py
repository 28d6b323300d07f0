"""Certificates and role tokens for a cluster on one machine: `electra up`, the benchmarks and the tests.

`ensure_local_credentials(dir, node_ids)` creates (or reuses, so a restarted stack keeps its
cluster id) a CA, one certificate per node for 127.0.0.1/localhost, and one token file per role:
admin, observer, pipeline and broker (scoped to every broker set). `env(role)` is what a child
process needs to act as that role (ELECTRA_TOKEN_FILE, ELECTRA_CA_FILE).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .auth import create_token
from .credentials import ClientCredentials
from .node_security import TOKENS_FILE
from .pki import CA_CERT, CA_KEY, CLUSTER_ID, create_ca, create_node_cert, node_cert_paths, read_cluster_id

LOCAL_ROLES = ("admin", "observer", "pipeline", "broker")


class LocalCredentialsError(ValueError):
    """The certs directory cannot serve the local stack (a half-written CA, a full disk): what to do, in one line."""


@dataclass
class LocalCredentials:
    certs_dir: Path
    cluster_id: str

    @property
    def ca_file(self) -> Path:
        return self.certs_dir / CA_CERT

    @property
    def tokens_file(self) -> Path:
        return self.certs_dir / TOKENS_FILE

    def token_file(self, role: str) -> Path:
        return self.certs_dir / f"{role}.token"

    def node_files(self, node_id: int) -> tuple[Path, Path]:
        return node_cert_paths(self.certs_dir, node_id)

    def credentials(self, role: str) -> ClientCredentials:
        return ClientCredentials.from_files(self.token_file(role), self.ca_file)

    def env(self, role: str) -> dict[str, str]:
        return self.credentials(role).env(self.token_file(role))


def ensure_local_credentials(certs_dir: Path | str, node_ids, *, hosts=("127.0.0.1", "localhost")
                             ) -> LocalCredentials:
    """The CA, node certificates and role tokens in `certs_dir`, created where missing; LocalCredentialsError
    when the directory holds a CA that cannot be completed or a file cannot be written."""
    d = Path(certs_dir)
    try:
        return _ensure_local_credentials(d, node_ids, hosts)
    except LocalCredentialsError:
        raise
    except OSError as exc:  # a full disk, no permission
        where = f" ({exc.filename})" if exc.filename else ""
        raise LocalCredentialsError(f"cannot write the local credentials in {d}{where}: {exc.strerror or exc}") \
            from None
    except ValueError as exc:  # a file of the directory that cannot be read (pki, auth say which)
        raise LocalCredentialsError(f"cannot use the local credentials in {d}: {exc}") from None


def _ensure_local_credentials(d: Path, node_ids, hosts) -> LocalCredentials:
    missing = [name for name in (CA_KEY, CA_CERT, CLUSTER_ID) if not (d / name).exists()]
    if missing:
        issued = sorted(p.name for p in d.glob("node-*.crt"))
        if issued:  # a new CA would not have signed them: the nodes could not talk to each other
            raise LocalCredentialsError(
                f"{d} lacks {' and '.join(missing)} of the CA that issued {', '.join(issued)}: restore it, or remove "
                f"{d} to start over (a new cluster id: remove the nodes' data dirs too)")
        # create_ca writes ca.key, then ca.crt, then cluster-id, and nothing was issued from this CA: a first start
        # cut short (a full disk, a kill) left part of it. Start the CA over (keeping a cluster id it wrote).
        (d / CA_CERT).unlink(missing_ok=True)  # else create_ca would keep it trusted, as a CA rollover does
        create_ca(d, overwrite=True)
    creds = LocalCredentials(d, read_cluster_id(d))
    for i in node_ids:
        if not creds.node_files(i)[0].exists():
            create_node_cert(d, i, list(hosts))
    for role in LOCAL_ROLES:
        path = creds.token_file(role)
        if not path.exists():
            token = create_token(creds.tokens_file, role, f"local-{role}",
                                 broker_sets=["*"] if role == "broker" else None)
            tmp = path.with_name(path.name + ".tmp")
            tmp.touch(mode=0o600)
            tmp.write_text(token + "\n")
            tmp.replace(path)
    return creds
