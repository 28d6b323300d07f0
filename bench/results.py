"""A benchmark results file: one line per run, `<UTC time> <bench> RESULT key=value ...`.

`electra bench NAME` appends its RESULT line to the file named by ELECTRA_BENCH_RESULTS (if set), so
runs accumulate where the capacity notebook (notebooks/capacity.ipynb) reads them. Plain
`electra bench NAME | tee -a FILE` output works too: lines without a time and bench name are read as
runs of an unknown bench.
"""

from __future__ import annotations

import io
import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

ENV = "ELECTRA_BENCH_RESULTS"
_LINE = re.compile(r"^(?:(?P<at>\S+)\s+(?P<bench>[\w-]+)\s+)?RESULT\s+(?P<kv>.*)$")


@dataclass
class Run:
    at: str | None  # ISO-8601 UTC time the run ended (None if the line carried none)
    bench: str | None
    values: dict[str, float | str]


def _value(text: str) -> float | str:
    try:
        return float(text)
    except ValueError:
        return text


def parse_line(line: str) -> Run | None:
    line = line.strip()
    m = None if line.startswith("#") else _LINE.match(line)
    if not m:
        return None
    values = {}
    for part in m.group("kv").split():
        key, sep, val = part.partition("=")
        if sep:
            values[key] = _value(val)
    return Run(m.group("at"), m.group("bench"), values)


def read(path: str | os.PathLike) -> list[Run]:
    """Every RESULT line of a results file (or of saved benchmark output), in file order."""
    runs = []
    for line in Path(path).read_text().splitlines():
        run = parse_line(line)
        if run is not None:
            runs.append(run)
    return runs


def format_line(bench: str, result: str, at: datetime | None = None) -> str:
    stamp = (at or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"{stamp} {bench} {result.strip()}"


def check_writable(path: str | os.PathLike) -> None:
    """ValueError (why, in a few words) unless a RESULT line can be appended to `path`, as `Recorder` appends it:
    checked before a benchmark runs, not found out once it has. Opens the file as `Recorder` would (its
    directories are made, as there) and removes it again if it did not exist."""
    p = Path(path)
    if p.is_dir():
        raise ValueError("is a directory: name the results file")
    existed = p.exists()
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ValueError(f"{p.parent} is not a directory") from None
    except OSError as exc:
        raise ValueError(f"cannot create its directory {p.parent}: {exc.strerror or exc}") from None
    try:
        with p.open("a"):
            pass
    except OSError as exc:
        raise ValueError(f"cannot append to it: {exc.strerror or exc}") from None
    if not existed:
        p.unlink(missing_ok=True)


class Recorder(io.TextIOBase):
    """Passes output through and appends each RESULT line, stamped with time and bench, to `path`."""

    def __init__(self, out, bench: str, path: str | os.PathLike) -> None:
        self.out, self.bench, self.path = out, bench, Path(path)
        self._partial = ""

    def write(self, s: str) -> int:
        self.out.write(s)
        self._partial += s
        *lines, self._partial = self._partial.split("\n")
        for line in lines:
            if line.startswith("RESULT "):
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with self.path.open("a") as f:
                    f.write(format_line(self.bench, line) + "\n")
        return len(s)

    def flush(self) -> None:
        self.out.flush()
