"""Benchmarks, run as `electra bench <name>`; each ends with one `RESULT key=value ...` line."""

from __future__ import annotations

import importlib

BENCHMARKS = {
    "raft": "electra.bench.raft",
    "reads": "electra.bench.reads",
    "controller": "electra.bench.controller",
    "ingest": "electra.bench.ingest",
    "failover": "electra.bench.failover",
    "stream": "electra.bench.stream",
    "tier": "electra.bench.tier",
    "dashboard": "electra.bench.dashboard",
}


def run_benchmark(name: str, argv: list[str]) -> int:
    if name not in BENCHMARKS:
        print(f"unknown benchmark {name!r}; available: {', '.join(sorted(BENCHMARKS))}")
        return 2
    return importlib.import_module(BENCHMARKS[name]).main(argv)
