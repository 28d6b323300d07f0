"""Command-line and config parsing for tiering options (kept free of heavy imports)."""

from __future__ import annotations

import argparse
import json


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
