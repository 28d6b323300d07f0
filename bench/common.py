"""Helpers shared by benchmarks: free ports, percentiles, worker and controller processes, RESULT lines."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

from electra.interrupts import die_with_parent
from electra.local_ports import free_ports


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[k]


def result_line(**kv: object) -> str:
    parts = []
    for k, v in kv.items():
        parts.append(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}")
    return "RESULT " + " ".join(parts)


def run_workers(cmds: list[list[str]], timeout: float, env: dict | None = None) -> list[dict]:
    """Start worker processes; collect the JSON object each prints after `RESULT_JSON `.

    Every worker prints exactly one such line (followers report their role at
    once and keep serving). The run ends when all reported or at `timeout`; every
    process is stopped afterwards. Other output lines are echoed, indented.
    """
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, text=True, env=env) for c in cmds]
    lines: queue.Queue[tuple[int, str]] = queue.Queue()

    def pump(i: int, p: subprocess.Popen) -> None:
        for line in p.stdout:
            lines.put((i, line))
        lines.put((i, ""))

    for i, p in enumerate(procs):
        threading.Thread(target=pump, args=(i, p), daemon=True).start()
    results: list[dict] = []
    reported: set[int] = set()
    ended: set[int] = set()
    deadline = time.monotonic() + timeout
    try:
        while len(reported | ended) < len(procs):
            left = deadline - time.monotonic()
            if left <= 0:
                print(f"    timeout after {timeout:.0f}s waiting for workers", flush=True)
                break
            try:
                i, line = lines.get(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            if not line:
                ended.add(i)
            elif line.startswith("RESULT_JSON "):
                results.append(json.loads(line[len("RESULT_JSON "):]))
                reported.add(i)
            else:
                sys.stdout.write("    " + line)
                sys.stdout.flush()
        return results
    finally:
        stop_processes(procs)


def stop_processes(procs: list[subprocess.Popen], grace_s: float = 10.0) -> None:
    """SIGTERM every process, give them `grace_s` together, SIGKILL what is left."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def bench_credentials(data_dir: Path, ids=(1, 2, 3)):
    """The role credentials of the controllers `start_controller_processes(data_dir)` starts."""
    from electra.security.local import ensure_local_credentials

    return ensure_local_credentials(Path(data_dir) / "certs", ids)


def start_controller_processes(data_dir: Path, extra_args: tuple[str, ...] = (), nodes: int = 3, *,
                               secure: bool = True) -> tuple[list[subprocess.Popen], list[str]]:
    """`nodes` secure `electra node` controller processes on free loopback ports; returns them and their HTTP
    endpoints. Their CA, certificates and role tokens are in `bench_credentials(data_dir)`.
    `secure=False`: plaintext and no tokens (`--insecure`), for comparisons that must not measure TLS."""
    ports = free_ports(2 * nodes)
    ids = range(1, nodes + 1)
    security = ["--certs-dir", str(bench_credentials(data_dir, ids).certs_dir)] if secure else ["--insecure"]
    peers = ",".join(f"{i}=127.0.0.1:{ports[i - 1]}" for i in ids)
    endpoints = [f"127.0.0.1:{ports[nodes + i - 1]}" for i in ids]
    http_peers = ",".join(f"{i}={ep}" for i, ep in zip(ids, endpoints, strict=True))
    procs = [subprocess.Popen(die_with_parent([sys.executable, "-m", "electra.cli", "--log-level", "WARNING", "node",
                                               "--id", str(i), "--peers", peers, "--http-addr", endpoints[i - 1],
                                               "--http-peers", http_peers, "--data-dir", str(Path(data_dir) / f"n{i}"),
                                               *security, *extra_args]),
                              stdout=subprocess.DEVNULL) for i in ids]
    return procs, endpoints


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rindex(")") + 2:].split()  # after "pid (comm) ": state is field 0


def process_children() -> dict[int, list[int]]:
    """Every process's children, from /proc (parent pid -> child pids)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            f = _stat_fields(int(entry.name))
            if f is not None:
                children.setdefault(int(f[1]), []).append(int(entry.name))
    return children


def process_tree_runqueue_wait_s(root: int, descendants: bool = True) -> float:
    """Seconds the threads of `root` and its descendants spent runnable but not running (waiting for a core).

    From /proc/<pid>/task/<tid>/schedstat (its second field). On a shared machine this is what other
    processes took from the measured ones: a server at 0.3 cores with 0.6 cores of run-queue wait was
    starved, not idle. Threads that exited are not counted. `descendants=False`: `root`'s own threads only
    (a load generator that started the servers it measures).
    """
    children = process_children() if descendants else {}
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            tids = []
        for tid in tids:
            with contextlib.suppress(OSError, IndexError, ValueError):
                total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[1])
        todo += children.get(pid, [])
    return total / 1e9


def process_tree_cpu_s(root: int) -> float:
    """CPU seconds (user + system, the tree's own and its reaped children's) of `root` and its descendants.

    From the kernel's accounting in /proc/<pid>/stat, so a JVM's threads and short-lived
    Python workers are all counted; a difference of two readings is the tree's CPU in between.
    """
    children = process_children()
    tick = os.sysconf("SC_CLK_TCK")
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        f = _stat_fields(pid)
        if f is None:
            continue
        total += sum(int(x) for x in f[11:15])  # utime, stime, cutime, cstime
        todo += children.get(pid, [])
    return total / tick
