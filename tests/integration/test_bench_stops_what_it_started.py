"""A benchmark stopped by SIGTERM or SIGHUP (`timeout`, a CI cancel, a closed terminal) stops the
processes it started, as Ctrl-C does, and ends with 130 instead of leaving a cluster running."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from process_cluster import hangup_by_default

pytestmark = pytest.mark.integration


def _children(pid: int) -> list[int]:
    """Live (not zombie) processes whose parent is `pid`."""
    found = []
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(p))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.parametrize(("bench", "sig"), [
    (["raft", "--clients", "10", "--duration", "120", "--skip-pysyncobj"], signal.SIGTERM),  # threads and Popen
    (["controller", "--brokers", "30", "--duration", "120"], signal.SIGHUP),  # an asyncio load loop
], ids=["raft-sigterm", "controller-sighup"])
def test_a_signalled_benchmark_stops_its_processes(bench, sig):
    proc = subprocess.Popen([sys.executable, "-m", "electra.cli", "bench", *bench],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            preexec_fn=hangup_by_default)
    started: list[int] = []

    def output() -> str:
        if proc.poll() is None:
            return "(still running)"
        return proc.stderr.read().decode(errors="replace")[-3000:]

    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and len(started) < 3 and proc.poll() is None:  # its three servers
            started = _children(proc.pid)
            time.sleep(0.2)
        assert len(started) >= 3, f"the benchmark started {started}: {output()}"
        time.sleep(4)  # into the run (the controller bench waits 3 s, then loads)
        assert proc.poll() is None, f"the benchmark ended before the signal: {output()}"
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=90)
        assert proc.returncode == 130, f"exit {proc.returncode}: {err.decode(errors='replace')[-3000:]}"
        assert "interrupted" in err.decode(errors="replace")
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(_alive(p) for p in started):
            time.sleep(0.2)
        assert not [p for p in started if _alive(p)], "processes the benchmark started outlived it"
    finally:
        for p in [proc.pid, *started]:
            if _alive(p):  # left over by a failure above
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, signal.SIGKILL)
        proc.wait(timeout=10)
