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


@dataclass(frozen=True)
class ClientCredentials:
    token: str | None = None
    ca_file: str | None = None

    @classmethod
    def from_env(cls, env: dict | None = None) -> ClientCredentials:
        env = os.environ if env is None else env
        token = env.get("ELECTRA_TOKEN") or None
        token_file = env.get("ELECTRA_TOKEN_FILE")
        if token is None and token_file:
            try:
                token = Path(token_file).read_text().strip() or None
            except OSError as exc:
                raise ValueError(f"cannot read ELECTRA_TOKEN_FILE {token_file}: {exc}") from None
        return cls(token, env.get("ELECTRA_CA_FILE") or None)

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
        return client_context(self.ca_file) if self.ca_file else None

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
