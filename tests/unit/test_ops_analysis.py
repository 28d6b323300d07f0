"""Failover analysis over event rows (tiering/analysis.py) and the benchmark results file (bench/results.py)."""

from __future__ import annotations

import io
import json

import pandas as pd

from electra.bench import results
from electra.tiering import analysis


def _events(rows: list[tuple[int, int, str, dict]]) -> pd.DataFrame:
    return pd.DataFrame([{"index": i, "seq": 0, "ts_ms": ts, "type": "ElectMaster", "broker_set": name,
                          "payload": json.dumps(p)} for i, ts, name, p in rows]
                        + [{"index": 0, "seq": 0, "ts_ms": 0, "type": "ApplyBrokerId", "broker_set": "a",
                            "payload": "{}"}])


def _elect(master: int | None, epoch: int) -> dict:
    return {"type": "ElectMaster", "newMasterElected": master is not None, "newMasterBrokerId": master,
            "masterEpoch": epoch}


def test_failovers_tenure_and_masterless_time():
    ev = _events([
        (1, 1_000, "a", _elect(1, 1)),
        (2, 4_000, "a", _elect(2, 2)),     # direct handover: 1 held the set 3 s
        (3, 5_000, "b", _elect(1, 1)),
        (4, 9_000, "a", _elect(None, 3)),  # nobody could take over
        (5, 9_500, "a", _elect(None, 4)),
        (6, 11_000, "a", _elect(3, 5)),    # 2 held it 5 s, then 2 s without a master
        (7, 12_000, "b", _elect(None, 2)),
        (8, 13_000, "b", _elect(1, 3)),    # the same master came back: no failover
    ])
    el = analysis.elections(ev)
    assert len(el) == 8 and el["elected"].sum() == 5
    assert pd.isna(el.loc[el["index"] == 6, "previous_master"].item())
    assert el.loc[el["index"] == 2, "previous_master"].item() == 1
    assert pd.isna(el.loc[el["index"] == 8, "previous_master"].item())  # b had no master after index 7
    fo = analysis.failovers(el)
    assert fo[["broker_set", "from_master", "to_master", "tenure_s", "masterless_s"]].values.tolist() == [
        ["a", 1, 2, 3.0, 0.0], ["a", 2, 3, 5.0, 2.0]]
    assert analysis.failovers_per_window(fo, "10s").tolist() == [1, 1]
    assert analysis.failovers_per_window(fo.iloc[:0]).empty


def test_results_file_lines_and_recorder(tmp_path):
    path = tmp_path / "r.txt"
    out = io.StringIO()
    rec = results.Recorder(out, "raft", path)
    rec.write("warming up\nRESULT commits_per_s=100 ")
    rec.write("p99_ms=1.5 fsync=True\ndone\n")
    assert out.getvalue() == "warming up\nRESULT commits_per_s=100 p99_ms=1.5 fsync=True\ndone\n"
    path.write_text(path.read_text() + "# a comment with RESULT x=1\nRESULT hb_per_s=7\n")
    runs = results.read(path)
    assert [(r.bench, r.values) for r in runs] == [
        ("raft", {"commits_per_s": 100.0, "p99_ms": 1.5, "fsync": "True"}), (None, {"hb_per_s": 7.0})]
    assert runs[0].at.endswith("Z") and runs[1].at is None


def test_bench_failover_shares_a_short_supply_of_settled_sets_between_crash_and_hang():
    from electra.bench.failover import _victims

    sets = [f"s{i}" for i in range(9)]
    crash, hang = _victims(sets, 20, 20)
    assert len(crash) == 4 and len(hang) == 5 and not set(crash) & set(hang)  # was 9 crashes and no hang
    assert _victims(sets, 3, 2) == (sets[:3], sets[3:5])


def test_bench_failover_sustains_a_size_only_when_its_sets_settled_and_every_master_was_replaced():
    from electra.bench.failover import _verdict

    full = {"hb_per_s": 2990.0, "offered_hb_per_s": 3000, "settled": 1000, "crash_n": 20, "crash_replaced": 20,
            "hang_n": 20, "hang_replaced": 20}
    assert _verdict(full, 1000, 40) == (True, "")
    ok, why = _verdict(full | {"settled": 8, "crash_n": 4, "crash_replaced": 4, "hang_n": 4, "hang_replaced": 4},
                       1000, 40)
    assert not ok and "only 8 sets settled" in why  # 4 + 4 failovers measured of 20 + 20 asked
    assert _verdict(full | {"settled": 9, "crash_n": 4, "crash_replaced": 4, "hang_n": 5, "hang_replaced": 5},
                    9, 40) == (True, "")  # a size below --crash + --hang: every set
    assert not _verdict(full | {"hb_per_s": 2800.0}, 1000, 40)[0]
    assert not _verdict(full | {"hang_replaced": 19}, 1000, 40)[0]
    assert not _verdict(full | {"settled": 0, "crash_n": 0, "crash_replaced": 0, "hang_n": 0, "hang_replaced": 0},
                        1000, 40)[0]  # nothing settled: nothing measured


def test_a_results_file_that_cannot_be_written_is_refused_before_the_benchmark_runs(tmp_path, monkeypatch, capsys):
    """ELECTRA_BENCH_RESULTS naming a directory (or a path under a file) failed with a traceback once the whole
    benchmark had run; now the benchmark does not start."""
    import importlib

    import pytest

    from electra.cli import main

    ran = []
    module = importlib.import_module("electra.bench.raft")
    monkeypatch.setattr(module, "main", lambda argv: ran.append(argv) or 0)
    a_file = tmp_path / "f"
    a_file.write_text("x")
    for bad, why in ((tmp_path, "is a directory: name the results file"),
                     (a_file / "results.txt", f"{a_file} is not a directory"),
                     ("/proc/electra/results.txt", "cannot create its directory /proc/electra")):
        monkeypatch.setenv(results.ENV, str(bad))
        with pytest.raises(SystemExit) as exc:
            main(["bench", "raft"])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and err.startswith(f"error: {results.ENV}={bad}: {why}"), err
        assert err.count("\n") == 1 and not ran, err
    good = tmp_path / "new" / "results.txt"
    monkeypatch.setenv(results.ENV, str(good))
    assert main(["bench", "raft"]) == 0 and ran == [[]]
    assert not good.exists()  # checked, not left behind empty: the benchmark wrote no RESULT line
