"""A data dir belongs to one member and one process (consensus/data_dir_claims.py), checked by real `electra node`s."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from electra.local_ports import free_ports

pytestmark = pytest.mark.integration


def test_a_second_process_or_another_member_list_on_a_data_dir_is_refused(tmp_path):
    raft, http, other = free_ports(3)
    base = [sys.executable, "-m", "electra.cli", "node", "--id", "1", "--insecure", "--data-dir", str(tmp_path / "n1")]
    one = ["--peers", f"1=127.0.0.1:{raft}", "--http-addr", f"127.0.0.1:{http}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ELECTRA_")}
    first = subprocess.Popen([*base, *one], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = ""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "controller node 1" not in line:  # bounded: 60 s
            line = first.stdout.readline()
            if not line and first.poll() is not None:
                break
        assert "controller node 1" in line, first.stderr.read() if first.poll() is not None else line
        p = subprocess.run([*base, "--peers", f"1=127.0.0.1:{other}", "--http-addr", f"127.0.0.1:{free_ports(1)[0]}"],
                           capture_output=True, text=True, timeout=60, env=env)
        assert p.returncode == 1 and "is in use by another process" in p.stderr, (p.stdout, p.stderr)
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=30)
    # The same node restarted as a member of another group (here: a peer added without the others stopped).
    p = subprocess.run([*base, "--peers", f"1=127.0.0.1:{raft},2=127.0.0.1:{other}", "--http-addr",
                        f"127.0.0.1:{http}"], capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 1 and "started with members [1]" in p.stderr and "--accept-new-peers" in p.stderr, p.stderr
    p = subprocess.run([*base, "--id", "2", "--peers", f"1=127.0.0.1:{other},2=127.0.0.1:{raft}", "--http-addr",
                        f"127.0.0.1:{http}"], capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 1 and "belongs to node 1, not node 2" in p.stderr, p.stderr
