"""Argument parsing for every `electra` command and benchmark: numbers are checked where they are parsed.

A negative count, duration or size is never meaningful to Electra's commands, and left unchecked it
reached the code as a zero-episode run with a RESULT line, or a benchmark with a negative duration.
`Parser` refuses such values with argparse's usual message (exit 2) before anything starts.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any


def at_least(kind: type, minimum: float) -> Callable[[str], Any]:
    """An argparse `type` converting with `kind` (int or float) and refusing values below `minimum`."""

    def convert(text: str) -> Any:
        value = kind(text)  # ValueError here: argparse says "invalid int value"
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum:g}, got {text}")
        return value

    convert.__name__ = kind.__name__
    return convert


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose int and float options are at least `minimum` (default 0).

    `add_argument(..., minimum=1)` for counts that must be positive; `minimum=None` for a number that
    may be negative. Sub-commands made with `add_subparsers()` are `Parser`s too.
    """

    def add_argument(self, *args: Any, minimum: float | None = 0, **kwargs: Any) -> argparse.Action:
        kind = kwargs.get("type")
        if kind in (int, float) and minimum is not None:
            kwargs["type"] = at_least(kind, minimum)
        return super().add_argument(*args, **kwargs)
