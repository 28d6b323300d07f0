"""Benchmarks, run as `electra bench <name>`; each ends with one `RESULT key=value ...` line
(also appended to the file ELECTRA_BENCH_RESULTS names, see `results.py`)."""

from __future__ import annotations

import contextlib
import importlib
import os
import sys

from . import results

BENCHMARKS = {
    "raft": "electra.bench.raft",
    "reads": "electra.bench.reads",
    "controller": "electra.bench.controller",
    "ingest": "electra.bench.ingest",
    "failover": "electra.bench.failover",
    "stream": "electra.bench.stream",
    "tier": "electra.bench.tier",
    "flood": "electra.bench.flood",
    "dashboard": "electra.bench.dashboard",
    "api": "electra.bench.api",
}


def run_benchmark(name: str, argv: list[str]) -> int:
    if name not in BENCHMARKS:
        print(f"unknown benchmark {name!r}; available: {', '.join(sorted(BENCHMARKS))}")
        return 2
    path = os.environ.get(results.ENV)
    if path:
        try:
            results.check_writable(path)
        except ValueError as exc:
            from electra.cli_args import refuse

            refuse(f"{results.ENV}={path}: {exc}")
    module = importlib.import_module(BENCHMARKS[name])
    if not path:
        return module.main(argv)
    with contextlib.redirect_stdout(results.Recorder(sys.stdout, name, path)):
        return module.main(argv)
