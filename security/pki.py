"""A small certificate authority for one Electra cluster (what `electra cert` and `electra up` run).

A certs directory holds, like `cockroach cert`'s:

    ca.crt          the CA bundle every node and client trusts (several CAs during a CA rollover)
    ca.key          the CA's private key (keep it off the nodes in production)
    cluster-id      the cluster id, generated with the CA; every node certificate names it
    node-<id>.crt   node certificate: Raft peer identity (mutual TLS) and the node's HTTPS server cert
    node-<id>.key

Node certificates carry the node's identity as the URI `electra://<cluster-id>/node/<id>` (see
electra.consensus.peer_identity) and the host names or addresses clients dial as DNS/IP names.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import re
import uuid
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from electra.atomic_file import replace_file
from electra.consensus.peer_identity import check_cluster_id, node_uri

CA_CERT, CA_KEY, CLUSTER_ID = "ca.crt", "ca.key", "cluster-id"


def node_cert_paths(certs_dir: Path | str, node_id: int) -> tuple[Path, Path]:
    d = Path(certs_dir)
    return d / f"node-{node_id}.crt", d / f"node-{node_id}.key"


def read_cluster_id(certs_dir: Path | str) -> str:
    try:
        return (Path(certs_dir) / CLUSTER_ID).read_text().strip()
    except OSError as exc:
        raise ValueError(f"no cluster id in {certs_dir} (create the CA first: electra cert create-ca): {exc}") from None


def _write_private(path: Path, data: bytes) -> None:
    """Write a secret readable by its owner only, atomically."""
    replace_file(path, data, mode=0o600)


def _write_public(path: Path, data: bytes) -> None:
    replace_file(path, data, mode=0o644)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def create_ca(certs_dir: Path | str, *, cluster_id: str | None = None, days: int = 3650,
              overwrite: bool = False) -> str:
    """Create the CA key, certificate and cluster id; returns the cluster id.

    An existing `ca.crt` is kept as a trusted CA in the new bundle (the CA rollover: nodes that
    load the bundle accept certificates of both CAs until the old one is removed).
    """
    d = Path(certs_dir)
    d.mkdir(mode=0o755, parents=True, exist_ok=True)  # never writable by others, whatever the umask
    if (d / CA_KEY).exists() and not overwrite:
        raise FileExistsError(f"{d / CA_KEY} exists (use --overwrite to start a CA rollover)")
    existing = read_cluster_id(d) if (d / CLUSTER_ID).exists() else None
    if cluster_id is not None and existing is not None and cluster_id != existing and (d / CA_KEY).exists():
        raise ValueError(f"{d} belongs to cluster id {existing!r}: a CA rollover keeps it (omit --cluster-id); "
                         "every node's certificate and data dir name it")
    if cluster_id is None:
        cluster_id = existing or uuid.uuid4().hex
    check_cluster_id(cluster_id)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Electra"),
                      x509.NameAttribute(NameOID.COMMON_NAME, f"Electra CA {cluster_id}")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    previous = _previous_ca(d / CA_CERT, now)
    _write_private(d / CA_KEY, _key_pem(key))
    _write_public(d / CA_CERT, cert.public_bytes(serialization.Encoding.PEM) + previous)
    _write_public(d / CLUSTER_ID, (cluster_id + "\n").encode())
    return cluster_id


def _previous_ca(bundle: Path, now: dt.datetime) -> bytes:
    """What a rollover keeps of the old bundle: the CA that signed until now (its first certificate), unless
    it expired. Only that one: every older CA leaves the bundle, so a retired CA stops being trusted at
    the next rollover (before, each rollover appended, and every CA ever used stayed trusted)."""
    if not bundle.exists():  # a new CA (a certs dir without one, or `electra up` starting afresh)
        return b""
    try:
        certs = x509.load_pem_x509_certificates(bundle.read_bytes())
    except (OSError, ValueError) as exc:  # dropped, it would leave every node certificate it signed untrusted
        raise ValueError(f"{bundle} cannot be read as a CA bundle ({str(exc).splitlines()[0] if str(exc) else exc!r}):"
                         " a rollover keeps the CA in it trusted, so repair it first (or remove it to start over "
                         "with a CA that nothing trusted before)") from None
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs[:1] if c.not_valid_after_utc > now)


def check_host(host: str) -> None:
    """ValueError unless `host` is an IP address or a DNS name a certificate can carry (`*.` allowed first)."""
    try:
        ipaddress.ip_address(host)
        return
    except ValueError:
        pass
    labels = host.removeprefix("*.").rstrip(".").split(".")
    if len(host) > 253 or not all(re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?", lb) for lb in labels):
        raise ValueError(f"--host {host!r} is neither an IP address nor a DNS name (letters, digits, hyphens, dots)")


def _load_ca(d: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    try:
        key = serialization.load_pem_private_key((d / CA_KEY).read_bytes(), password=None)
        certs = x509.load_pem_x509_certificates((d / CA_CERT).read_bytes())
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot load the CA from {d}: {exc}") from None
    pub = key.public_key().public_numbers()
    for cert in certs:  # the bundle's certificate that matches the key (the newest CA)
        if cert.public_key().public_numbers() == pub:
            return cert, key
    raise ValueError(f"{d / CA_KEY} matches no certificate in {d / CA_CERT}")


def _host_names(hosts: list[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for h in hosts:
        check_host(h)
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    return names


def create_node_cert(certs_dir: Path | str, node_id: int, hosts: list[str], *, days: int = 365,
                     out_dir: Path | str | None = None) -> tuple[Path, Path]:
    """Issue node `node_id`'s certificate and key (into `out_dir`, default the certs dir)."""
    d = Path(certs_dir)
    ca_cert, ca_key = _load_ca(d)
    cluster_id = read_cluster_id(d)
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Electra"),
                                     x509.NameAttribute(NameOID.COMMON_NAME, f"node-{node_id}")]))
            .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(min(now + dt.timedelta(days=days), ca_cert.not_valid_after_utc))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.SubjectAlternativeName(
                [x509.UniformResourceIdentifier(node_uri(cluster_id, node_id)), *_host_names(hosts)]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    out = Path(out_dir) if out_dir is not None else d
    out.mkdir(mode=0o755, parents=True, exist_ok=True)
    crt_path, key_path = node_cert_paths(out, node_id)
    _write_private(key_path, _key_pem(key))
    _write_public(crt_path, cert.public_bytes(serialization.Encoding.PEM))
    return crt_path, key_path


def cert_node_identity(cert_path: Path | str) -> tuple[str, int]:
    """(cluster id, node id) a node certificate file names."""
    from electra.consensus.peer_identity import identity_from_peercert

    try:
        cert = x509.load_pem_x509_certificate(Path(cert_path).read_bytes())
        uris = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
            x509.UniformResourceIdentifier)
    except (OSError, ValueError, x509.ExtensionNotFound) as exc:
        raise ValueError(f"cannot read node certificate {cert_path}: {exc}") from None
    return identity_from_peercert({"subjectAltName": [("URI", u) for u in uris]})
