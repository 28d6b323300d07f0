"""The history of one chaos episode: every operation, observation and fault, one JSON object per line.

Record types (`type`):
- `invoke` / `ok` / `fail` / `unknown`: a client operation (Jepsen's vocabulary). `fail` means
  it certainly did not take effect (refused before reaching the log); `unknown` means it may have.
  Fields: `id`, `proc` (client), `set`, `op`, `args`, `node` (the endpoint that answered),
  `out` (the response's code and the fields the checkers use), `wall`, `mono`, and for reads
  `leader_read` (the node was leader in the same term before and after: a linearizable read).
- `watch`: a `role-change` event seen on a node's SSE watch stream (`conn` is the connection).
- `leader`: a node said it leads (`node`, `term`), from the observer's metadata polls.
- `fault-start` / `fault-end`: the nemesis (`fault`, `kind`, `target`, `detail`); a start is
  recorded before the fault is injected (`injected`: when that finished).
- `error`: the harness itself failed (the episode then cannot pass).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class HistoryLog:
    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.mono0 = time.monotonic()

    def add(self, type_: str, **fields: Any) -> dict[str, Any]:
        rec = {"type": type_, "wall": time.time(), "mono": time.monotonic() - self.mono0, **fields}
        self.records.append(rec)
        return rec

    def now(self) -> float:
        return time.monotonic() - self.mono0

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w") as f:
            for rec in self.records:
                f.write(json.dumps(rec, separators=(",", ":"), default=str) + "\n")

    def of_type(self, *types: str) -> Iterator[dict[str, Any]]:
        return (r for r in self.records if r["type"] in types)


def read_history(path: Path) -> HistoryLog:
    log = HistoryLog()
    with open(path) as f:
        log.records = [json.loads(line) for line in f if line.strip()]
    return log


def operations(log: HistoryLog) -> list[dict[str, Any]]:
    """Invocations joined with their completions: one dict per operation, `status` ok/fail/unknown.

    An invocation without a completion (the episode ended first) is `unknown`.
    """
    open_: dict[Any, dict[str, Any]] = {}
    done: list[dict[str, Any]] = []
    for r in log.records:
        if r["type"] == "invoke":
            open_[r["id"]] = {**r, "call": r["mono"], "ret": None, "status": None}
        elif r["type"] in ("ok", "fail", "unknown"):
            op = open_.pop(r["id"], None)
            if op is None:
                continue
            op.update(status=r["type"], ret=r["mono"] if r["type"] != "unknown" else None, out=r.get("out"),
                      node=r.get("node"), leader_read=r.get("leader_read", False))
            done.append(op)
    done += [{**op, "status": "unknown"} for op in open_.values()]
    return done
