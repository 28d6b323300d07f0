"""Deliberate bugs, switched on only by tests, to prove the checkers can fail.

A checker that never fails proves nothing. The simulator (`electra sim`) and the
chaos runner (`electra chaos`) each run against a build with one of these bugs
switched on and must report a violation. The switch is the environment variable
`ELECTRA_TEST_MUTATION` (comma-separated names), read once at import so that every
process of a test cluster inherits it; tests in one process use `enabled()`'s
override, `forced()`. Production never sets it: a node with a mutation on says so
loudly at start (see `banner()`), and an unknown name is an error, not a no-op.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

ENV = "ELECTRA_TEST_MUTATION"

# name -> the bug it plants (and what should catch it)
KNOWN: dict[str, str] = {
    "ack_before_fsync": "send acknowledgements and votes without fsyncing the log first "
                        "(lost acknowledged writes after a crash that drops unsynced data)",
    "skip_torn_tail_truncation": "keep a torn log tail on recovery instead of truncating it "
                                 "(garbage replayed as entries, or a refusal to start)",
    "snapshot_apply_unverified": "install a received snapshot without checking its checksum "
                                 "(replicas that applied the same index disagree)",
    "lease_without_margin": "lease reads for the full election timeout, ignoring clock drift "
                            "(stale reads under clock skew)",
    "double_vote": "grant a vote to a second candidate in the same term (two leaders in one term)",
    "rejoin_without_floor": "start a node whose data dir was emptied without the rejoin vote floor (it votes at "
                            "once with an empty log: a candidate missing acknowledged writes can win)",
    "elect_keeps_epoch": "elect a new broker master without a new master epoch (two masters under one "
                         "epoch: electra chaos --pipeline's one-acting-master checker)",
}


def _parse(raw: str) -> frozenset[str]:
    names = frozenset(n.strip() for n in raw.split(",") if n.strip())
    unknown = names - KNOWN.keys()
    if unknown:
        raise ValueError(f"{ENV}: unknown mutation(s) {sorted(unknown)}; known: {sorted(KNOWN)}")
    return names


_active: frozenset[str] = _parse(os.environ.get(ENV, ""))


def enabled(name: str) -> bool:
    """Is the deliberate bug `name` switched on? (Cheap: a set lookup.)"""
    if name not in KNOWN:
        raise ValueError(f"unknown mutation {name!r}")
    return name in _active


def active() -> frozenset[str]:
    return _active


def banner() -> str | None:
    """A line to log at start when any mutation is on; None in every real deployment."""
    if not _active:
        return None
    names = ", ".join(sorted(_active))
    return f"TEST BUILD: deliberate bugs switched on via {ENV}: {names}. NEVER run this in production."


@contextmanager
def forced(*names: str) -> Iterator[None]:
    """Switch mutations on inside one test process (the simulator's mutation runs)."""
    global _active
    before = _active
    _active = before | _parse(",".join(names))
    try:
        yield
    finally:
        _active = before
