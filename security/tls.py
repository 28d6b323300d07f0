"""TLS contexts built from a node's certificate files, and their reload for rotation without downtime.

The host (electra.cli / electra.api.server) builds the contexts and injects them: the Raft
transport gets a mutual-TLS pair (both sides present node certificates signed by the cluster CA),
the HTTP listeners a server context (clients authenticate with bearer tokens, see
electra.security.auth). `reload()` loads rotated files into the *same* context objects, so new
connections use the new certificate and trust every CA in the new bundle while open connections
carry on.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("electra.security.tls")


@dataclass
class NodeTLS:
    cert: Path
    key: Path
    ca: Path
    _contexts: list[tuple[ssl.SSLContext, bool]] = field(default_factory=list, repr=False)
    _stamp: tuple = field(default=(), repr=False)

    def __post_init__(self) -> None:
        self.cert, self.key, self.ca = Path(self.cert), Path(self.key), Path(self.ca)
        missing = [str(p) for p in (self.cert, self.key, self.ca) if not p.is_file()]
        if missing:
            raise ValueError(f"TLS file(s) not found: {', '.join(missing)}")
        self._stamp = self._mtimes()

    def _load(self, ctx: ssl.SSLContext, trust: bool) -> None:
        _load_files(ctx, self.cert, self.key, self.ca if trust else None)

    def _new(self, purpose: int, *, verify: bool) -> ssl.SSLContext:
        ctx = _context(purpose)
        if purpose == ssl.PROTOCOL_TLS_CLIENT:
            ctx.check_hostname = False  # peers are identified by the node URI in their certificate
        ctx.verify_mode = ssl.CERT_REQUIRED if verify else ssl.CERT_NONE
        self._load(ctx, verify)
        self._contexts.append((ctx, verify))
        return ctx

    def check(self) -> None:
        """Load the files once into a throwaway context: ValueError naming them if the key is unreadable,
        does not match the certificate, or the CA file is not a certificate (at startup, not at first use)."""
        self._load(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), True)

    def peer_server_context(self) -> ssl.SSLContext:
        """Raft listener: requires a client certificate signed by a trusted CA."""
        return self._new(ssl.PROTOCOL_TLS_SERVER, verify=True)

    def peer_client_context(self) -> ssl.SSLContext:
        """Raft dialer: presents this node's certificate and verifies the peer's."""
        return self._new(ssl.PROTOCOL_TLS_CLIENT, verify=True)

    def http_server_context(self) -> ssl.SSLContext:
        """HTTPS listeners (node API, ingest): server certificate only; clients send tokens."""
        return self._new(ssl.PROTOCOL_TLS_SERVER, verify=False)

    def _mtimes(self) -> tuple:
        """The files' modification times, 0 for one that is missing: one stat each, no `exists()` first (a
        rotation that replaces a file between the two raised, and ended the watch and with it every reload)."""
        out = []
        for path in (self.cert, self.key, self.ca):
            try:
                out.append(os.stat(path).st_mtime_ns)
            except OSError:
                out.append(0)
        return tuple(out)

    def reload_if_changed(self) -> bool:
        """Load the files again into every context made here if any of them changed; True if reloaded."""
        stamp = self._mtimes()
        if stamp == self._stamp:
            return False
        try:
            for ctx, trust in self._contexts:
                self._load(ctx, trust)
        except ValueError as exc:  # half-written rotation: keep serving with what is loaded, retry later
            log.error("TLS reload failed, keeping the loaded certificates: %s", exc)
            return False
        self._stamp = stamp
        log.warning("TLS certificate files changed: reloaded %s and CA bundle %s", self.cert, self.ca)
        return True

    async def watch(self, interval_s: float = 5.0) -> None:
        """Reload on change until cancelled (one task per node process)."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                self.reload_if_changed()
            except Exception:  # keep watching: a task that ended here would never reload again
                log.exception("TLS reload check failed; checking again in %.0fs", interval_s)


def server_context(cert: str | Path, key: str | Path) -> ssl.SSLContext:
    """A TLS server context presenting `cert` and `key`, asking for no client certificate (the ingest's HTTPS:
    callers send tokens); ValueError naming the files if they cannot be loaded (unreadable, not PEM, the key not
    the certificate's)."""
    ctx = _context(ssl.PROTOCOL_TLS_SERVER)
    _load_files(ctx, cert, key)
    return ctx


def _context(purpose: int) -> ssl.SSLContext:
    """Every Electra TLS endpoint's context: TLS 1.2 or newer, said here rather than left to the build's default."""
    ctx = ssl.SSLContext(purpose)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def _load_files(ctx: ssl.SSLContext, cert: str | Path, key: str | Path, ca: str | Path | None = None) -> None:
    """Load a certificate, its key and (with `ca`) the CA to trust; ValueError naming the files if one cannot be
    (unreadable, not PEM, the key not the certificate's)."""
    try:
        ctx.load_cert_chain(cert, key)
        if ca is not None:
            ctx.load_verify_locations(cafile=ca)
    except (ssl.SSLError, OSError) as exc:
        files = ", ".join(str(f) for f in (cert, key, ca) if f is not None)
        raise ValueError(f"cannot load TLS files {files}: {exc}") from None


def client_context(ca_file: str | Path | None) -> ssl.SSLContext:
    """HTTPS client context trusting the cluster CA bundle (hostname checked against the node certificate)."""
    ctx = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx
