"""A client's credential and trust: what every Electra HTTP client sends and checks.

One object, built in one place (`ClientCredentials.from_env()` unless the caller passes one):

    ELECTRA_TOKEN        the bearer token itself, or
    ELECTRA_TOKEN_FILE   a file holding it (what `electra cert create-token --out` writes)
    ELECTRA_CA_FILE      the cluster CA bundle; when set, clients speak HTTPS and verify the node certificate

The Python client (electra.api.client), the CLI, the broker simulator, the Spark job's sink and
the benchmarks all take their credential from here.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from pathlib import Path

from .tls import client_context

CREDENTIAL_ENV = ("ELECTRA_TOKEN", "ELECTRA_TOKEN_FILE", "ELECTRA_CA_FILE")  # what `from_env` reads


def without_credentials(env: dict[str, str]) -> dict[str, str]:
    """`env` without the client credential: for a child that talks to a plaintext test server of its parent's
    (a benchmark's), whatever the operator's shell exported for a real cluster."""
    return {k: v for k, v in env.items() if k not in CREDENTIAL_ENV}


class CredentialsError(ValueError):
    """The client's credential or CA cannot be used as configured (a command says so in one line)."""


def _one_token(text: str, where: str) -> str | None:
    """The token in `text`: one line of printable ASCII without spaces, or CredentialsError naming `where`."""
    token = text.strip()
    if not token:
        return None
    if "\n" in token or "\r" in token:
        raise CredentialsError(f"{where} holds more than one line: it must hold one token")
    if not token.isascii() or not token.isprintable() or " " in token or "\t" in token:
        raise CredentialsError(f"{where} does not hold a token (printable ASCII without spaces)")
    return token


@dataclass(frozen=True)
class ClientCredentials:
    token: str | None = None
    ca_file: str | None = None

    @classmethod
    def from_env(cls, env: dict | None = None) -> ClientCredentials:
        env = os.environ if env is None else env
        token = _one_token(env.get("ELECTRA_TOKEN") or "", "ELECTRA_TOKEN")
        token_file = env.get("ELECTRA_TOKEN_FILE")
        if token is None and token_file:
            try:
                text = Path(token_file).read_text()
            except (OSError, UnicodeDecodeError) as exc:
                raise CredentialsError(f"cannot read ELECTRA_TOKEN_FILE {token_file}: "
                                       f"{getattr(exc, 'strerror', None) or exc}") from None
            token = _one_token(text, f"ELECTRA_TOKEN_FILE {token_file}")
        ca_file = env.get("ELECTRA_CA_FILE") or None
        if ca_file is not None and not os.path.isfile(ca_file):
            raise CredentialsError(f"ELECTRA_CA_FILE {ca_file} is not a readable file")
        return cls(token, ca_file)

    @classmethod
    def from_files(cls, token_file: str | Path | None, ca_file: str | Path | None) -> ClientCredentials:
        token = Path(token_file).read_text().strip() if token_file else None
        return cls(token or None, str(ca_file) if ca_file else None)

    @property
    def scheme(self) -> str:
        return "https" if self.ca_file else "http"

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def ssl_context(self) -> ssl.SSLContext | None:
        if not self.ca_file:
            return None
        try:
            return client_context(self.ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise CredentialsError(f"ELECTRA_CA_FILE {self.ca_file} does not hold a CA certificate: {exc}") from None

    def env(self, token_file: str | Path | None = None) -> dict[str, str]:
        """Environment for a child process (the token travels as a file path when one is given)."""
        out: dict[str, str] = {}
        if token_file:
            out["ELECTRA_TOKEN_FILE"] = str(token_file)
        elif self.token:
            out["ELECTRA_TOKEN"] = self.token
        if self.ca_file:
            out["ELECTRA_CA_FILE"] = self.ca_file
        return out
