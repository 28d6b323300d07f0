"""`electra chaos` end to end: real secure controller processes, every fault kind this machine supports.

The first test is CI's chaos run (30 short episodes, round robin over the fault kinds); the
mutation tests show that the checkers catch a deliberately broken build (acknowledging before
fsync, votes granted twice, a lease without its drift margin: consensus/mutations.py)
and that the same faults pass on a correct one. The soak is
`electra chaos --long` (1,000 mixed episodes), run by hand, not here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

RESULT = re.compile(r"^RESULT (.*)$", re.M)
# Every fsync takes 0.8 s, so acknowledged-but-unsynced entries live long enough for a power cut to
# find them; a 200 ms tick (elections after 2-4 s) lets a correct build's votes, each behind an
# fsync, arrive in time.
SLOW_DISK_POWER_CUTS = ("--faults", "power-loss:all", "--fsync-delay-ms", "800", "--tick-ms", "200")


def _chaos(tmp_path, *args: str, mutation: str | None = None, timeout: float = 600) -> tuple[int, str, dict]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("ELECTRA_TEST_MUTATION", None)
    if mutation:
        env["ELECTRA_TEST_MUTATION"] = mutation
    proc = subprocess.run([sys.executable, "-m", "electra.cli", "chaos", "--out", str(tmp_path / "chaos"), *args],
                          capture_output=True, text=True, timeout=timeout, env=env)
    out = proc.stdout + proc.stderr
    m = RESULT.findall(proc.stdout)
    assert m, f"no RESULT line:\n{out[-4000:]}"
    assert proc.stdout.rstrip().splitlines()[-1].startswith("RESULT "), "RESULT is not the last line"
    fields = dict(kv.split("=", 1) for kv in m[-1].split())
    return proc.returncode, out, fields


def test_thirty_episodes_of_every_supported_fault_kind_find_no_violation(tmp_path):
    code, out, r = _chaos(tmp_path, "--episodes", "30", "--seed", "11", timeout=900)
    assert code == 0, out[-6000:]
    assert int(r["episodes"]) == 30
    # Every kind is injected here (root, libfaketime and a C compiler are all there); elsewhere the
    # run names the kinds it skips and why.
    assert "skipped fault kind" not in out, out[:2000]
    assert int(r["fault_kinds"]) == 11, out[-3000:]
    assert r["lin_violations"] == r["invariant_violations"] == r["lost_acked"] == "0"
    assert int(r["ops"]) > 30 * 20
    assert (tmp_path / "chaos").glob("*/report.html")
    histories = list((tmp_path / "chaos").glob("*/episode-*.jsonl"))
    assert len(histories) == 30


def test_the_slow_disk_shim_delays_fsync_only_while_asked(tmp_path):
    from electra.chaos.cluster import build_disk_shim

    so = build_disk_shim(tmp_path)
    assert so is not None, "no C compiler: the slow-disk fault would be skipped"
    delay = tmp_path / "delay-ms"
    delay.write_text("1500\n")
    code = ("import os, time\n"
            f"fd = os.open({str(tmp_path / 'f')!r}, os.O_WRONLY | os.O_CREAT)\n"
            "t = time.monotonic(); os.fdatasync(fd); slow = time.monotonic() - t\n"
            f"open({str(delay)!r}, 'w').write('0')\n"
            "t = time.monotonic(); os.fsync(fd); fast = time.monotonic() - t\n"
            "print(slow >= 1.5, fast < 1.5)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "LD_PRELOAD": str(so), "ELECTRA_SLOW_DISK_FILE": str(delay)})
    assert out.stdout.split() == ["True", "True"], out


def test_a_build_that_acknowledges_before_fsync_loses_writes_to_a_power_cut_and_is_caught(tmp_path):
    """ack_before_fsync: followers acknowledge entries (and votes) before making them durable.

    With every fsync slowed to 0.8 s and the whole group's power cut right after an acknowledged
    change (every file cut back to its last fsync, chaos/diskshim.c), an entry committed on early
    acknowledgements is gone from every node. The run stops at the first failing episode and must
    name the lost write (or the non-linearizable history or double leader it causes) and print the
    replay command. Per episode the bug shows in about a third of the runs here (the cut must land
    before any copy was synced), so the run allows up to 12 episodes.
    """
    code, out, r = _chaos(tmp_path, *SLOW_DISK_POWER_CUTS, "--episodes", "12", "--stop-on-failure",
                          mutation="ack_before_fsync", timeout=900)
    assert code == 1, out[-4000:]
    assert int(r["lin_violations"]) + int(r["invariant_violations"]) + int(r["lost_acked"]) > 0
    assert "ELECTRA_TEST_MUTATION=ack_before_fsync electra chaos --seed 1 --episode" in out
    assert "TEST BUILD" in out


def test_the_same_power_cuts_lose_nothing_on_a_correct_build(tmp_path):
    code, out, r = _chaos(tmp_path, *SLOW_DISK_POWER_CUTS, "--episodes", "4", timeout=900)
    assert code == 0, out[-4000:]
    assert "unsynced bytes lost" in (next((tmp_path / "chaos").glob("*/episode-0000.jsonl"))).read_text()
    assert r["lin_violations"] == r["invariant_violations"] == r["lost_acked"] == "0"


def test_a_build_that_grants_two_votes_in_a_term_elects_two_leaders_under_split_votes_and_is_caught(tmp_path):
    """double_vote: a voter forgets whom it voted for in the current term.

    It only matters when two candidates ask in the same term, which the PreVote tie-break and random
    election timeouts make rare in ordinary elections (caught in one run of two before, when five nodes
    started together). The `split-vote` fault sets that up on purpose: the leader killed, the two lowest
    ids cut from each other, the three others stopped for 1.2 s, so that both candidates reach them in
    the same term once they stop refusing. Measured here: caught in 3 of the first 7 episodes (two
    leaders in one term, then lost acknowledged writes and non-linearizable sets); the run stops at the
    first failure and allows 10 episodes (about 10 s each).
    """
    code, out, r = _chaos(tmp_path, "--nodes", "5", "--faults", "split-vote", "--episodes", "10", "--seed", "8",
                          "--sets", "2", "--stop-on-failure", "--insecure", mutation="double_vote", timeout=600)
    assert code == 1, out[-4000:]
    assert int(r["invariant_violations"]) > 0, out[-4000:]  # one leader per term, at the least
    assert "one-leader-per-term: term" in out
    assert "ELECTRA_TEST_MUTATION=double_vote electra chaos --seed 8 --episode" in out


def test_split_votes_elect_one_leader_per_term_on_a_correct_build(tmp_path):
    code, out, r = _chaos(tmp_path, "--nodes", "5", "--faults", "split-vote", "--episodes", "2", "--seed", "8",
                          "--sets", "2", "--insecure", timeout=600)
    assert code == 0, out[-4000:]
    assert r["lin_violations"] == r["invariant_violations"] == r["lost_acked"] == "0"


def test_a_lease_without_its_drift_margin_serves_stale_reads_at_a_stalled_leader_and_is_caught(tmp_path):
    """lease_without_margin: the leader's lease lasts the longest election timeout (2.0 s at 100 ms ticks)
    instead of 0.81 s. `partition:stalled-leader` cuts the leader off and stops it for 1.2 s: the others
    elect a new leader and take writes, and it wakes still leading (its CheckQuorum window had heard its
    followers before the stop) with a lease that, without the margin, still holds for most of a second.
    The workload's pinned readers keep reading with `consistency=lease` at it: stale replica info, not
    linearizable. Measured: caught in 6 of 6 episodes of seed 4 (first in the first); the run stops at
    the first failure and allows 6."""
    code, out, r = _chaos(tmp_path, "--faults", "partition:stalled-leader", "--episodes", "6", "--seed", "4",
                          "--stop-on-failure", "--insecure", mutation="lease_without_margin", timeout=600)
    assert code == 1, out[-4000:]
    assert int(r["lin_violations"]) > 0, out[-4000:]
    assert "'pinned': True" in out, "the failure is not a pinned lease read"


def test_stalled_leaders_serve_no_stale_lease_reads_on_a_correct_build(tmp_path):
    code, out, r = _chaos(tmp_path, "--faults", "partition:stalled-leader", "--episodes", "3", "--seed", "4",
                          "--insecure", timeout=600)
    assert code == 0, out[-4000:]
    assert r["lin_violations"] == r["invariant_violations"] == r["lost_acked"] == "0"
