"""Command-line and config parsing for tiering options, and the tier URI's checks (kept free of heavy imports:
`electra node` and `electra up` check `--tier-uri` before loading delta-rs)."""

from __future__ import annotations

import argparse
import json
from urllib.parse import urlparse


def parse_storage_options(text: str) -> dict[str, str]:
    """delta-rs `storage_options` from `KEY=VALUE,KEY=VALUE` or a JSON object.

    A refusal never repeats the text: these options hold object-store credentials."""
    text = text.strip()
    if text.startswith("{"):
        try:
            return {str(k): str(v) for k, v in json.loads(text).items()}
        except (ValueError, AttributeError):
            raise argparse.ArgumentTypeError("bad storage options: not a JSON object of KEY: VALUE") from None
    out = {}
    for n, part in enumerate(filter(None, (p.strip() for p in text.split(","))), 1):
        if "=" not in part:
            raise argparse.ArgumentTypeError(f"bad storage option #{n}: expected KEY=VALUE")
        k, v = part.split("=", 1)
        out[k.strip()] = v.strip()
    return out


# The URI schemes delta-rs 1.6 opens (its "Unknown scheme" error lists them); a path without one is local.
SCHEMES = frozenset((
    "file", "abfs", "abfss", "adl", "az", "azblob", "azdls", "azure", "b2", "cos", "dbfs", "fs", "gcs", "gs", "hdfs",
    "hf", "lakefs", "memory", "obs", "oss", "s3", "s3a", "sftp", "swift", "tos", "uc", "viewfs", "webdav", "webhdfs",
    "opendal+azblob", "opendal+azdls", "opendal+b2", "opendal+cos", "opendal+fs", "opendal+ftp", "opendal+gcs",
    "opendal+hf", "opendal+memory", "opendal+obs", "opendal+oss", "opendal+s3", "opendal+sftp", "opendal+swift",
    "opendal+tos", "opendal+webdav", "opendal+webhdfs",
))


def check_uri(uri: str) -> None:
    """ValueError naming what works, for a scheme delta-rs cannot open: it fails as if no table were there,
    which reads as an empty tier."""
    scheme = urlparse(uri).scheme.lower()
    if len(scheme) > 1 and scheme not in SCHEMES:  # one letter: a Windows drive
        raise ValueError(f"unsupported scheme {scheme}:// (give a local path, file://, s3://, gs://, az://, "
                         "abfss://, hdfs:// or another object store delta-rs opens, see docs/tiering.md)")


def is_local(uri: str) -> bool:
    scheme = urlparse(uri).scheme
    return scheme in ("", "file") or len(scheme) == 1  # a Windows drive letter counts as local


def tier_uri(text: str) -> str:
    """`--tier-uri` from any source, checked where it is read: a scheme delta-rs cannot open reads later as an
    empty tier. Empty means none (a ConfigMap's or unit file's way to say so), as for `--kafka-bootstrap`."""
    text = text.strip()
    try:
        check_uri(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text
