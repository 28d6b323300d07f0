"""`electra up | tee` then Ctrl-C, or the terminal closing: every process the stack started stops,
though stdout is a closed pipe (children lead their own process groups, so only `electra up` hears
the signal and must stop them). And when `electra up` is SIGKILLed, its children stop anyway."""

from __future__ import annotations

import os
import pty
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from process_cluster import hangup_by_default

from electra.local_ports import free_port_run

pytestmark = pytest.mark.integration


def _processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line mentions `text` (zombies excluded)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            found.append(int(pid))
    return found


def _describe(pids: list[int], data: Path) -> str:
    """What a failed check shows: each process still running, and the end of every log in the stack's
    data directory (a stop that hung prints each thread's stack there: electra/interrupts.py)."""
    out = []
    for pid in pids:
        try:
            out.append(f"still running: {pid} " + Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                       .decode(errors="replace"))
        except OSError:
            out.append(f"{pid} (gone)")
    for log in sorted(data.rglob("*.log")):
        out.append(f"--- {log} (last 40 lines)")
        out.extend(log.read_text(errors="replace").splitlines()[-40:])
    return "\n".join(out)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize("output,sig", [("pipe", signal.SIGINT), ("pipe", signal.SIGHUP), ("terminal", signal.SIGHUP),
                                        ("pipe", signal.SIGKILL)],
                         ids=["ctrl-c-pipe-closed", "hangup-pipe-closed", "terminal-closed", "killed"])
def test_a_signal_when_the_output_is_gone_stops_every_process(tmp_path, output, sig):
    data = tmp_path / "stack"
    kafka_port = free_port_run(10)  # one run for all, so the ranges cannot overlap (`up` refuses that)
    raft, http, ingest = kafka_port + 1, kafka_port + 4, kafka_port + 7
    cmd = [sys.executable, "-m", "electra.cli", "up", "--no-streaming", "--no-tier", "--data-dir", str(data),
           "--kafka-port", str(kafka_port), "--raft-port", str(raft), "--http-port", str(http),
           "--ingest-port", str(ingest)]
    if output == "pipe":
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                preexec_fn=hangup_by_default)
        reader = proc.stdout
    else:  # a terminal (pty) that is closed under it: writes then fail with EIO
        master, slave = pty.openpty()
        proc = subprocess.Popen(cmd, stdout=slave, stderr=slave, stdin=subprocess.DEVNULL,
                                preexec_fn=hangup_by_default)
        os.close(slave)
        reader = os.fdopen(master, "rb", buffering=0)
    try:
        lines = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = reader.readline().decode(errors="replace")
            if not line:
                break
            lines.append(line)
            if "the stack is up" in line:
                break
        assert any("the stack is up" in x for x in lines), "".join(lines)
        assert _processes_mentioning(str(data)), "the stack's processes should be running"
        assert _listening(kafka_port)
        reader.close()  # the reader is gone (`tee` after Ctrl-C, a closed terminal): every write now fails
        proc.send_signal(sig)
        proc.wait(timeout=120)
        # (SIGKILL runs none of `electra up`'s cleanup: the kernel's parent-death signal stops the children)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (_processes_mentioning(str(data)) or _listening(kafka_port)):
            time.sleep(0.2)
        err = proc.stderr.read().decode() if proc.stderr else ""
        left = _processes_mentioning(str(data))
        assert left == [], err + _describe(left, data)
        assert not _listening(kafka_port), "the embedded Kafka (tansu) is still running"
        assert "Traceback" not in err
    finally:
        if proc.poll() is None:
            proc.kill()
        # never leave strays on the machine: the stack's processes and its tansu
        for pid in _processes_mentioning(str(data)) + _processes_mentioning(f"tcp://127.0.0.1:{kafka_port}"):
            os.kill(pid, signal.SIGKILL)


def test_a_killed_controller_node_is_restarted_and_the_stack_goes_on(tmp_path):
    """One controller SIGKILLed in `electra up` (a failure the group tolerates): it is started again, as a
    supervisor would, instead of the whole stack stopping."""
    data = tmp_path / "stack"
    kafka_port = free_port_run(10)  # one run for all, so the ranges cannot overlap (`up` refuses that)
    raft, http, ingest = kafka_port + 1, kafka_port + 4, kafka_port + 7
    cmd = [sys.executable, "-m", "electra.cli", "up", "--insecure", "--no-streaming", "--no-tier", "--data-dir",
           str(data), "--kafka-port", str(kafka_port), "--raft-port", str(raft), "--http-port", str(http),
           "--ingest-port", str(ingest)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            preexec_fn=hangup_by_default)
    lines: list[str] = []

    def read_until(text: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = proc.stdout.readline().decode(errors="replace")
            if not line:
                return False
            lines.append(line)
            if text in line:
                return True
        return False

    try:
        assert read_until("the stack is up", 120), "".join(lines)
        node2 = [pid for pid in _processes_mentioning(str(data / "node2")) if pid != proc.pid]
        assert node2, "node 2 should be running"
        for pid in node2:
            os.kill(pid, signal.SIGKILL)
        assert read_until("node2 exited", 20), "".join(lines)
        assert "restarted it" in lines[-1], "".join(lines)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not _listening(http + 1):
            time.sleep(0.2)
        assert _listening(http + 1), "node 2's API should be back"
        assert proc.poll() is None, "the stack should still be running"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
        for pid in _processes_mentioning(str(data)) + _processes_mentioning(f"tcp://127.0.0.1:{kafka_port}"):
            os.kill(pid, signal.SIGKILL)
