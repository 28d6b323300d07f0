"""Command-line and config parsing for tiering options (kept free of heavy imports)."""

from __future__ import annotations

import argparse
import json


def parse_storage_options(text: str) -> dict[str, str]:
    """delta-rs `storage_options` from `KEY=VALUE,KEY=VALUE` or a JSON object."""
    text = text.strip()
    if text.startswith("{"):
        try:
            return {str(k): str(v) for k, v in json.loads(text).items()}
        except (ValueError, AttributeError):
            raise argparse.ArgumentTypeError(f"bad storage options {text!r}: not a JSON object") from None
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        if "=" not in part:
            raise argparse.ArgumentTypeError(f"bad storage option {part!r}: expected KEY=VALUE")
        k, v = part.split("=", 1)
        out[k.strip()] = v.strip()
    return out
