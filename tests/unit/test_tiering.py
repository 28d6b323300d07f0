"""Tiering against real Delta tables (delta-rs) in tmp dirs: fencing, crash between write and commit,
folding and time travel checked against a replayed state machine, retention, bootstrap files."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
import uuid
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from electra.consensus.snapshots import SnapshotStore
from electra.state import commands as C
from electra.state.journal import JournalEntry, entry_for
from electra.state.liveness import BrokerLiveInfo
from electra.state.machine import ControllerStateMachine
from electra.tiering.bootstrap import bootstrap_from_tier
from electra.tiering.options import check_uri
from electra.tiering.reader import TierReader, event_window, iso, parse_time
from electra.tiering.schema import event_rows, events_table, snapshot_rows, snapshots_table
from electra.tiering.store import Conflict, Fenced, Moved, TierStore

T0 = 1_790_000_000_000  # epoch ms of the first command


def _workload(n: int, seed: int = 7) -> list[bytes]:
    """A deterministic command mix, proposed against the current state, touching every event type."""
    rnd = random.Random(seed)
    sm = ControllerStateMachine()
    cmds, now = [], T0
    for k in range(n):
        now += rnd.randint(1, 50)
        name = f"bs{rnd.randint(0, 3)}"
        bs = sm.sets.get(name)
        ids = sorted(bs.brokers) if bs else []
        live = [BrokerLiveInfo(i, f"10.0.0.{i}:1", now, 10_000) for i in ids if rnd.random() < 0.8]
        r = rnd.random()
        if bs is None or r < 0.2:
            nxt = bs.next_broker_id if bs else 1
            cmd = C.apply_broker_id("c", name, nxt, f"10.0.0.{nxt}:1;{nxt}", now)
        elif r < 0.35:
            cmd = C.register_broker("c", name, rnd.choice(ids), f"10.0.{k % 3}.{rnd.choice(ids)}:1", now, live)
        elif r < 0.55:
            cmd = C.elect_master("c", name, rnd.choice(ids) if rnd.random() < 0.5 else C.CONTROLLER_TRIGGER, now,
                                 live, designate=rnd.random() < 0.3)
        elif r < 0.85 and bs.master_id is not None:
            new_set = sorted({bs.master_id} | {i for i in ids if rnd.random() < 0.5})
            cmd = C.alter_sync_state_set(name, bs.master_id, bs.master_epoch, new_set, bs.sync_state_set_epoch,
                                         now, live)
        else:
            cmd = C.clean_broker_data("c", name, [rnd.choice(ids)] if rnd.random() < 0.8 else None, True, now, live)
        sm.apply(k + 1, cmd)
        cmds.append(cmd)
    return cmds


def _replay(cmds: list[bytes]):
    """Apply commands 1..n; return (journal entries, wire state after each index, ts per index)."""
    sm = ControllerStateMachine()
    entries: list[JournalEntry] = []

    def on_event(index, ev):
        entries.append(entry_for(sm, index, 1 + index // 100, ev))

    sm.on_event(on_event)
    states, ts = {0: {}}, {0: 0}
    for i, data in enumerate(cmds, start=1):
        sm.apply(i, data)
        states[i] = {n: bs.to_wire() for n, bs in sm.sets.items()}
        ts[i] = sm.apply_time_ms
    return entries, states, ts, sm


def _upload(store: TierStore, entries, states, upto_list, snapshot_at=(), term=1, ts=None):
    """Commit events in batches ending at each index of `upto_list`; snapshots at `snapshot_at` indexes."""
    from electra.state.machine import BrokerSet

    done = store.progress().upto
    for upto in upto_list:
        batch = [e for e in entries if done < e.index <= upto]
        store.commit("events", events_table(event_rows(batch, term)), upto=upto, upto_term=1 + upto // 100,
                     uploader_term=term, expect_upto=done)
        done = upto
        if upto in snapshot_at:
            sets = [BrokerSet.from_wire(w) for w in states[upto].values()]
            store.commit("snapshots", snapshots_table(snapshot_rows(sets, upto, 1 + upto // 100, ts[upto], term)),
                         upto=upto, upto_term=1 + upto // 100, uploader_term=term, expect_upto=None)


def _rows(store: TierStore) -> list[tuple]:
    t = store.read("events").to_pylist()
    return sorted((r["index"], r["seq"], r["type"], r["payload"]) for r in t)


def _expected(entries, upto) -> list[tuple]:
    rows = event_rows([e for e in entries if e.index <= upto], 0)
    return sorted((r["index"], r["seq"], r["type"], r["payload"]) for r in rows)


def test_fence_refuses_deposed_uploader_even_when_it_checked_first(tmp_path):
    store = TierStore(tmp_path / "tier")
    store.ensure()
    entries, states, _, _ = _replay(_workload(60))
    _upload(store, entries, states, [20], term=2)
    # A new leader (term 3) claims: an uploader of term 2 is refused before writing anything.
    assert store.claim(3)["events"].upto == 20
    with pytest.raises(Fenced):
        store.commit("events", events_table(event_rows([e for e in entries if 20 < e.index <= 30], 2)),
                     upto=30, upto_term=1, uploader_term=2, expect_upto=20)
    # Check-then-commit interleaving: term 3 passes its check at version V, then term 4 claims and
    # uploads before term 3's commit lands. delta-rs's conflict check on the shared app ids rejects it.
    other = TierStore(tmp_path / "tier")

    def newer_leader_wins():
        other.claim(4)
        other.commit("events", events_table(event_rows([e for e in entries if 20 < e.index <= 40], 4)),
                     upto=40, upto_term=1, uploader_term=4, expect_upto=20)

    with pytest.raises(Fenced):
        store.commit("events", events_table(event_rows([e for e in entries if 20 < e.index <= 30], 3)),
                     upto=30, upto_term=1, uploader_term=3, expect_upto=20, before_commit=newer_leader_wins)
    p = store.progress()
    assert (p.upto, p.term) == (40, 4)
    # Same term racing itself (two uploader instances): the loser gets Conflict, then Moved.
    with pytest.raises(Conflict):
        store.commit("events", events_table([]), upto=45, upto_term=1, uploader_term=4, expect_upto=40,
                     before_commit=lambda: other.commit("events", events_table([]), upto=41, upto_term=1,
                                                        uploader_term=4, expect_upto=40))
    with pytest.raises(Moved):
        store.commit("events", events_table([]), upto=45, upto_term=1, uploader_term=4, expect_upto=40)
    # The failed commits left orphan data files; they are not part of the table.
    files = [f for f in os.listdir(tmp_path / "tier" / "events") if f.endswith(".parquet")]
    assert len(files) > len(store.table("events").file_uris())
    assert _rows(store) == _expected(entries, 40)


def test_crash_between_data_write_and_commit_redoes_the_range_once(tmp_path):
    store = TierStore(tmp_path / "tier")
    store.ensure()
    entries, states, _, _ = _replay(_workload(80))
    _upload(store, entries, states, [30])
    batch = [e for e in entries if 30 < e.index <= 60]

    class Crash(Exception):
        pass

    def write_then_die():
        # What a process killed inside write_deltalake leaves: data files, no log entry.
        pq.write_table(events_table(event_rows(batch, 1)),
                       tmp_path / "tier" / "events" / f"part-00000-{uuid.uuid4()}-c000.snappy.parquet")
        raise Crash()

    with pytest.raises(Crash):
        store.commit("events", events_table(event_rows(batch, 1)), upto=60, upto_term=1, uploader_term=1,
                     expect_upto=30, before_commit=write_then_die)
    restarted = TierStore(tmp_path / "tier")  # the uploader after a restart reads progress from the table
    assert restarted.progress().upto == 30
    assert _rows(restarted) == _expected(entries, 30)  # orphan rows do not count
    restarted.commit("events", events_table(event_rows(batch, 1)), upto=60, upto_term=1, uploader_term=1,
                     expect_upto=30)
    assert _rows(restarted) == _expected(entries, 60)  # the range exactly once
    assert len(TierReader(str(tmp_path / "tier")).files("events")) == 2


def test_time_travel_and_fold_match_replayed_state(tmp_path):
    uri = str(tmp_path / "tier")
    store = TierStore(uri)
    store.ensure()
    cmds = _workload(300)
    entries, states, ts, sm = _replay(cmds)
    assert {e.event["type"] for e in entries} >= {"ApplyBrokerId", "UpdateBrokerAddress", "ElectMaster",
                                                  "AlterSyncStateSet", "CleanBrokerData"}
    _upload(store, entries, states, [50, 120, 200, 260, 300], snapshot_at={120, 260}, ts=ts)
    reader = TierReader(uri)
    # Exact full state (check codes, next ids) at any index, from a snapshot plus events or events alone.
    for i in (0, 1, 49, 50, 119, 120, 121, 233, 260, 299, 300):
        st = reader.state_at_index(i)
        assert {n: bs.to_wire() for n, bs in st.sets.items()} == states[i], i
        assert st.complete
    assert reader.state_at_index(None).index == 300
    # As of an instant: the log prefix of entries with time <= T.
    for i in (3, 77, 120, 150, 261, 300):
        at = ts[i]
        cut = max(j for j in ts if ts[j] <= at)
        got = reader.state_at(at)
        want = {n: _bs(w).view().to_public() for n, w in states[cut].items()}
        assert got["index"] <= cut and got["complete"]
        assert {s["brokerName"]: s for s in got["brokerSets"]} == want
    assert reader.state_at(parse_time(iso(ts[150]))) == reader.state_at(ts[150])
    ev = reader.events_between(ts[100], ts[140])
    assert [(e["index"], e["type"]) for e in ev["events"]] == [(e.index, e.event["type"]) for e in entries
                                                               if ts[100] <= e.ts <= ts[140]]
    assert reader.state_at(T0 - 1)["brokerSets"] == []
    # Retention: history older than the period goes, the snapshot it rests on stays, answers stay exact.
    res = store.maintain(now_ms=ts[261] + 10, retention_ms=10, vacuum_retention_hours=0)
    assert res["base_snapshot"] == 260 and res["deleted_events"] > 0
    for i in (260, 280, 300):
        assert {n: bs.to_wire() for n, bs in reader.state_at_index(i).sets.items()} == states[i]
    assert not reader.state_at_index(100).complete  # before the retention horizon
    # Bootstrap writes a local Raft snapshot of the newest state, at the entry's index and term.
    b = bootstrap_from_tier(tmp_path / "node", uri, fsync=False)
    assert (b.index, b.term) == (300, 4)
    meta = SnapshotStore(tmp_path / "node" / "snapshots").latest()
    assert (meta.index, meta.term) == (300, 4)
    restored = ControllerStateMachine()
    with SnapshotStore(tmp_path / "node" / "snapshots").open_data(meta) as f:
        restored.restore(f)
    assert {n: bs.to_wire() for n, bs in restored.sets.items()} == states[300]
    assert bootstrap_from_tier(tmp_path / "node", uri, fsync=False) is None  # never over existing state
    quiet = TierStore(tmp_path / "tier")  # a later pass, once no event is left (a quiet cluster)
    quiet.table("events").delete("index <= 300")
    assert not reader.state_at(ts[150])["complete"]  # no event left to tell: still not an exact answer


def test_a_fresh_tier_is_complete_before_its_first_snapshot_and_not_once_retention_dropped_it(tmp_path):
    """QA: the first snapshot of a new tier is often at a leader's first entries, whose no-op has no event, so
    "the events start before the oldest snapshot" could not tell a fresh tier from one retention cut. The
    events table now says from where it holds every event (`history_from`: 0, then retention's base)."""
    uri = str(tmp_path / "tier")
    store = TierStore(uri)
    store.ensure()
    entries, states, ts, _ = _replay(_workload(60))
    assert store.history_from() == 0
    assert any(e.index == 2 for e in entries)
    _upload(store, [e for e in entries if e.index > 1], states, [2, 60], snapshot_at={2, 60}, ts=ts)  # 1: a no-op
    reader = TierReader(uri)
    assert reader.state_at(ts[1])["complete"] and reader.state_at(T0 - 1) | {"at": 0, "at_ms": 0} == {
        "at": 0, "at_ms": 0, "index": 0, "snapshot_index": None, "complete": True, "gaps": [], "brokerSets": []}
    assert reader.state_at_index(1).complete
    store.maintain(now_ms=ts[60] + 10, retention_ms=ts[60] - ts[2] - 1 + 10, vacuum_retention_hours=0)
    assert store.history_from() == 2
    assert not reader.state_at(ts[1])["complete"] and not reader.state_at_index(1).complete
    assert reader.state_at_index(2).complete and reader.state_at(ts[60])["complete"]


def _bs(wire):
    from electra.state.machine import BrokerSet

    return BrokerSet.from_wire(wire)


def test_history_cli_reads_the_tables(tmp_path, capsys):
    from electra.cli import main

    uri = str(tmp_path / "tier")
    store = TierStore(uri)
    store.ensure()
    entries, states, ts, _ = _replay(_workload(40))
    _upload(store, entries, states, [40], snapshot_at={40}, ts=ts)
    assert main(["history", "--tier-uri", uri, "--at", iso(ts[40]), "--events-from", str(ts[1]),
                 "--events-to", str(ts[40])]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["state"]["index"] == 40
    assert {s["brokerName"] for s in out["state"]["brokerSets"]} == set(states[40])
    assert len(out["events"]["events"]) == len(entries)
    capsys.readouterr()
    assert main(["history", "--tier-uri", uri, "--at", "not-a-time"]) == 2
    assert "error: --at: expected an ISO-8601 time" in capsys.readouterr().err
    assert main(["history", "--tier-uri", uri, "--at", "now", "--events-to", "-5"]) == 2
    assert "error: --events-to: the instant must lie between 1970" in capsys.readouterr().err
    # QA: an instant in the future was answered with the latest state and `complete: true`
    assert main(["history", "--tier-uri", uri, "--at", "2999-01-01"]) == 2
    assert capsys.readouterr().err == ("error: --at: the instant is in the future: the tier holds the state up "
                                       "to now; give 'now' or an earlier time\n")
    assert main(["history", "--tier-uri", uri, "--at", str(int(time.time() * 1000) + 30_000)]) == 0  # clock skew
    assert json.loads(capsys.readouterr().out)["state"]["index"] == 40
    assert main(["history", "--tier-uri", uri, "--at", "now", "--events-to", "2999-01-01"]) == 0  # a window may
    capsys.readouterr()
    assert main(["history", "--tier-uri", uri, "--at", "now"]) == 0
    assert json.loads(capsys.readouterr().out)["state"]["index"] == 40
    assert main(["history", "--tier-uri", uri, "--at", "now", "--events-from", "0", "--limit", "3"]) == 0
    events = json.loads(capsys.readouterr().out)["events"]
    assert len(events["events"]) == 3 and events["truncated"]
    with pytest.raises(SystemExit):
        main(["history", "--tier-uri", uri, "--at", "now", "--limit", "0"])
    # pages: --after the previous answer's next_after, until an answer is not truncated
    pages, after = [], None
    for _ in range(len(entries)):  # bounded: each page holds at least one event
        argv = ["history", "--tier-uri", uri, "--at", "now", "--events-from", "0", "--limit", "7"]
        assert main(argv + (["--after", after] if after else [])) == 0
        page = json.loads(capsys.readouterr().out)["events"]
        pages.append([(e["index"], e["seq"]) for e in page["events"]])
        after = page["next_after"]
        if not page["truncated"]:
            assert after is None
            break
    assert [k for p in pages for k in p] == [(e["index"], e["seq"]) for e in event_rows(entries, 0)]
    assert all(len(p) == 7 for p in pages[:-1])
    assert main(["history", "--tier-uri", uri, "--at", "now", "--events-from", "0", "--after", "3"]) == 0
    assert all(e["index"] > 3 for e in json.loads(capsys.readouterr().out)["events"]["events"])
    assert main(["history", "--tier-uri", uri, "--at", "now", "--after", "3"]) == 2
    assert "give --events-from or --events-to too" in capsys.readouterr().err
    # QA: --limit without a window was ignored where --after is refused
    assert main(["history", "--tier-uri", uri, "--at", "now", "--limit", "5"]) == 2
    assert capsys.readouterr().err == "error: --limit caps the events: give --events-from or --events-to too\n"
    for bad in ("x", "3:", ":4", "-1", "3:4:5", "1" * 19):
        with pytest.raises(SystemExit):
            main(["history", "--tier-uri", uri, "--at", "now", "--events-from", "0", "--after", bad])



def test_history_piped_into_a_reader_that_stops_early_ends_quietly(tmp_path, monkeypatch, capsys):
    """QA: `electra history ... | head` ended with "error: BrokenPipeError: [Errno 32] Broken pipe" and exit 1,
    as if the tier had failed; the reader had what it wanted: exit 141 (SIGPIPE's), as `cat` does, and no error."""
    from electra.cli import main

    uri = str(tmp_path / "tier")
    store = TierStore(uri)
    store.ensure()
    entries, states, ts, _ = _replay(_workload(40))
    _upload(store, entries, states, [40], snapshot_at={40}, ts=ts)
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before a byte is written
    with open(write_end, "w", buffering=1) as pipe:  # line by line, as to a terminal or a pipe that fills
        monkeypatch.setattr(sys, "stdout", pipe)
        assert main(["history", "--tier-uri", uri, "--at", "now"]) == 141
        monkeypatch.undo()
    assert capsys.readouterr().err == ""

def test_history_cli_says_what_it_cannot_read(tmp_path, capsys):
    """A damaged table (or an object store that cannot be reached) is one line and exit 1, not a traceback."""
    from electra.cli import main

    for which in ("events", "snapshots"):
        log = tmp_path / "tier" / which / "_delta_log"
        log.mkdir(parents=True)
        (log / "00000000000000000000.json").write_text("not a delta log\n")
    assert main(["history", "--tier-uri", str(tmp_path / "tier"), "--at", "now"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot read the tier at {tmp_path / 'tier'}: ") and "Traceback" not in err
    assert main(["history", "--tier-uri", str(tmp_path / "none"), "--at", "now"]) == 1
    assert capsys.readouterr().err == (f"error: no tier tables at {tmp_path / 'none'} "
                                       "(neither events/ nor snapshots/ is a Delta table)\n")
    # QA: a scheme delta-rs cannot open read as an empty tier
    assert main(["history", "--tier-uri", "ftp://x/y", "--at", "now"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --tier-uri: unsupported scheme ftp:// (give a local path, file://, s3://")
    for ok in ("s3://b/t", "S3A://b/t", "abfss://c@a.dfs.core.windows.net/t", "file:///t", "C:\\t", "/t"):
        check_uri(ok)
    # QA: a tier holding one of the two tables was reported as no tier at all
    for which, other in (("events", "snapshots"), ("snapshots", "events")):
        uri = tmp_path / f"half_{which}"
        TierStore(uri).ensure()
        shutil.rmtree(uri / other)
        assert main(["history", "--tier-uri", str(uri), "--at", "now"]) == 1
        assert capsys.readouterr().err == f"error: no {other} table at {uri}/{other}: found only the {which} table " \
                                          "(a tier holds both)\n"
    # QA: which of the two tables is damaged was not said
    for which in ("events", "snapshots"):
        uri = tmp_path / f"one_{which}"
        TierStore(uri).ensure()
        log = uri / which / "_delta_log"
        (log / "00000000000000000001.json").write_text('{"add": garbage}\n')
        assert main(["history", "--tier-uri", str(uri), "--at", "now"]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"error: cannot read the tier at {uri}: {which} table: ") and err.count("\n") == 1


def test_a_process_that_read_the_tier_exits_cleanly(tmp_path):
    """Read through pyarrow's dataset scan (`to_pyarrow_table`), a quarter to a third of the processes that
    read a tier of a few dozen files aborted at interpreter exit ("terminate called without an active
    exception", exit 134): `electra history` and notebooks failed after printing their answer. Ten fresh
    processes: the old read failed this test in two of three runs."""
    uri = str(tmp_path / "tier")
    store = TierStore(uri)
    store.ensure()
    entries, states, ts, _ = _replay(_workload(120))
    _upload(store, entries, states, list(range(4, 121, 4)), snapshot_at={40, 80, 120}, ts=ts)
    script = ("import sys; from electra.tiering.reader import TierReader; r = TierReader(sys.argv[1]); "
              "print(r.table('events').num_rows, r.table('snapshots').num_rows)")
    for _ in range(10):
        run = subprocess.run([sys.executable, "-c", script, uri], capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, (run.returncode, run.stderr[-2000:])
        assert run.stdout.split()[0] == str(len(event_rows(entries, 0)))


@pytest.mark.parametrize(("text", "ms"), [
    ("1700000000000", 1_700_000_000_000), (1_700_000_000_000, 1_700_000_000_000),
    ("2023-11-14T22:13:20Z", 1_700_000_000_000), ("2023-11-14T22:13:20", 1_700_000_000_000),
    ("2023-11-14T23:13:20+01:00", 1_700_000_000_000), (" 0 ", 0),
    ("2026-11-27T16:00:00.123Z", 1_795_795_200_123),  # exact (a float timestamp made it ...122)
    ("2026-11-27T16:00:00.123999Z", 1_795_795_200_123),  # microseconds floor to the millisecond
    ("20261127", 1_795_737_600_000),  # eight digits that are a date: ISO's basic form, not 1970-01-01 05:37
    ("100000000000", 100_000_000_000),  # the smallest typed epoch ms taken (1973-03-03)
])
def test_parse_time(text, ms):
    assert parse_time(text) == ms


def test_iso_is_exact_to_the_millisecond_and_round_trips():
    assert iso(253_402_300_799_999) == "9999-12-31T23:59:59.999Z"  # was .998 through a float
    assert iso(0) == "1970-01-01T00:00:00.000Z"
    for ms in (1, 999, 1_795_795_200_123, 253_402_300_799_998):
        assert parse_time(iso(ms)) == ms


def test_event_window():
    assert event_window(None, None) is None
    assert event_window(5, None) == (5, 2**62) and event_window(None, 5) == (0, 5) and event_window(5, 5) == (5, 5)
    with pytest.raises(ValueError, match="ends before it starts"):
        event_window(6, 5)


@pytest.mark.parametrize("text", ["", "yesterday", "-5", "19700101", "12345678", "2031", "1795795200", "4",
                                  "2026-13-01", "9" * 21, "10000-01-01", "0001-01-01",
                                  "99999999999999999999", "<script>", "\u00b2", "1\u00b2", "\u0661\u0662\u0663",
                                  float("inf"), float("nan"), "--1", "-+1", "+5", "--1700000000000"])
def test_parse_time_refuses_without_repeating_the_text(text):
    with pytest.raises(ValueError) as err:
        parse_time(text)
    assert not isinstance(text, str) or text.strip() not in str(err.value) or not text.strip()


def test_parse_time_now():
    assert abs(parse_time("now") - time.time() * 1000) < 60_000


def test_an_instant_past_now_and_the_clock_skew_allowance_is_refused():
    from electra.tiering.reader import CLOCK_SKEW_MS, not_in_future

    assert not_in_future(T0 + CLOCK_SKEW_MS, now_ms=T0) == T0 + CLOCK_SKEW_MS
    with pytest.raises(ValueError, match="in the future"):
        not_in_future(T0 + CLOCK_SKEW_MS + 1, now_ms=T0)


def test_reader_empty_tables(tmp_path):
    store = TierStore(tmp_path / "tier")
    store.ensure()
    r = TierReader(str(tmp_path / "tier"))
    assert r.state_at(T0)["brokerSets"] == [] and r.events_between(0, T0)["events"] == []
    assert r.state_at_index(None).index == 0 and r.files("events") == []
    assert isinstance(r.table("snapshots"), pa.Table)


def test_node_options_for_tiering():
    from electra.cli import build_parser, resolve_node_settings

    args = build_parser().parse_args(["node", "--id", "1", "--peers", "1=127.0.0.1:7001", "--data-dir", "d",
                                      "--tier-uri", "s3://bucket/electra", "--tier-options",
                                      "AWS_REGION=eu-west-1,AWS_ENDPOINT_URL=http://minio:9000",
                                      "--bootstrap-from-tier"])
    args = resolve_node_settings(args)
    assert args.tier_uri == "s3://bucket/electra" and args.bootstrap_from_tier is True
    assert args.tier_options == {"AWS_REGION": "eu-west-1", "AWS_ENDPOINT_URL": "http://minio:9000"}
    plain = resolve_node_settings(build_parser().parse_args(["node", "--id", "1", "--peers", "1=127.0.0.1:7001",
                                                             "--data-dir", "d"]))
    assert plain.tier_uri is None and plain.bootstrap_from_tier is False


def test_bootstrap_takes_the_term_of_an_entry_that_produced_no_event(tmp_path):
    """A new leader's first entry (a no-op) produces no event: the tier's newest index can be one whose term is in
    no row, only in the progress that covers it. Bootstrap must use that term, not the snapshot's before it: a
    node started with the snapshot's older term at that index never matches the leader's log again."""
    uri = str(tmp_path / "tier")
    store = TierStore(uri)
    store.ensure()
    entries, states, ts, _ = _replay(_workload(130))
    _upload(store, entries, states, [50, 120], snapshot_at={120}, ts=ts)  # the snapshot at 120 has term 2
    store.commit("events", events_table([]), upto=121, upto_term=9, uploader_term=9, expect_upto=120)
    st = TierReader(uri).state_at_index(None)
    assert (st.index, st.term) == (121, 9)
    b = bootstrap_from_tier(tmp_path / "node", uri, fsync=False)
    assert (b.index, b.term) == (121, 9)


def test_bootstrap_reads_rows_and_progress_of_one_table_version(tmp_path):
    """An upload that commits while bootstrap reads the tier must not label the rows of version V with the index
    of version V+1 (the node would silently miss the entries between)."""
    uri = str(tmp_path / "tier")
    store = TierStore(uri)
    store.ensure()
    entries, states, ts, _ = _replay(_workload(200))
    _upload(store, entries, states, [80], ts=ts)
    reader = TierReader(uri)
    read = reader.store.read
    landed = []

    def read_then_an_upload_lands(which, version=None, columns=None):
        rows = read(which, version, columns)
        if which == "events" and not landed:
            landed.append(1)
            _upload(TierStore(uri), entries, states, [150], ts=ts)
        return rows

    reader.store.read = read_then_an_upload_lands  # type: ignore[method-assign]
    st = reader.state_at_index(None)
    assert landed and {n: bs.to_wire() for n, bs in st.sets.items()} == states[st.index], st.index


def test_bootstrap_refuses_when_there_is_nothing_to_start_from(tmp_path, capsys):
    """Asked to restore from a tier that is not there (a wrong path, an unmounted volume), a node does not start
    empty (it would begin a new cluster state and create fresh tables there): it stops with the reason."""
    from electra.cli import build_parser, resolve_node_settings
    from electra.tiering.bootstrap import BootstrapError

    with pytest.raises(BootstrapError, match="no tier tables"):
        bootstrap_from_tier(tmp_path / "node", str(tmp_path / "missing"), fsync=False)
    assert not (tmp_path / "missing" / "events").exists()
    half = tmp_path / "half"  # one table lost (a partial copy, a retention job gone wrong): named, not "no tier"
    TierStore(half).ensure()
    shutil.rmtree(half / "snapshots")
    with pytest.raises(BootstrapError, match=f"no snapshots table at {half}/snapshots: found only the events table"):
        bootstrap_from_tier(tmp_path / "node", str(half), fsync=False)
    args = build_parser().parse_args(["node", "--id", "1", "--peers", "1=127.0.0.1:7101", "--data-dir",
                                      str(tmp_path / "d"), "--insecure", "--bootstrap-from-tier"])
    with pytest.raises(SystemExit) as exit_:
        resolve_node_settings(args)
    assert exit_.value.code == 2 and "--bootstrap-from-tier needs --tier-uri" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["node", "up"])
@pytest.mark.parametrize("uri, problem", [("ftp://host/tier", "unsupported scheme ftp://"),
                                          ("Ftp://host/tier", "unsupported scheme ftp://")])
def test_node_and_up_refuse_a_tier_uri_they_could_not_open(command, uri, problem, capsys, monkeypatch):
    """QA: `electra node --tier-uri ftp://...` started, and its uploader then failed as if the tier were empty."""
    from electra.cli import build_parser, resolve_node_settings

    node = ["--id", "1", "--peers", "1=127.0.0.1:7101", "--data-dir", "d", "--insecure"] if command == "node" else []
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args([command, *node, "--tier-uri", uri])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "argument --tier-uri: " in err and problem in err
    if command == "node":  # the same check for a value from the environment (or the TOML file)
        monkeypatch.setenv("ELECTRA_TIER_URI", uri)
        with pytest.raises(SystemExit) as exit_:
            resolve_node_settings(build_parser().parse_args(["node", *node]))
        assert exit_.value.code == 2 and problem in capsys.readouterr().err


def test_a_tier_failure_keeps_the_cause():
    from electra.tiering.reader import tier_failure

    exc = OSError("Kernel error -> Generic LocalFileSystem error: Unable to open file /t/_last_checkpoint\n"
                  "  ↳ Permission denied (os error 13)")
    assert tier_failure(exc) == ("OSError: Kernel error -> Generic LocalFileSystem error: Unable to open file "
                                 "/t/_last_checkpoint ... Permission denied (os error 13)")
    assert tier_failure(OSError("\x1b[31mGeneric S3 error\x1b[0m")) == "OSError: Generic S3 error"  # no colour codes
    # QA: the last frame of a native backtrace that delta-rs appends was reported as the reason
    exc = OSError("Kernel error: Json error: Encountered unexpected 'g' whilst parsing value\n   0: <unknown>\n"
                  "  12: start_thread\n             at ./nptl/pthread_create.c:442:8\n  13: clone3\n"
                  "             at ./misc/../sysdeps/unix/sysv/linux/x86_64/clone3.S:81:0\n")
    assert tier_failure(exc) == "OSError: Kernel error: Json error: Encountered unexpected 'g' whilst parsing value"


def test_a_tier_that_keeps_failing_is_retried_with_back_off_and_logged_in_one_line(caplog):
    """QA: a damaged or unreachable tier logged a 40-line traceback every second (190 MB a day)."""
    import logging

    from electra.tiering.uploader import MAX_BACKOFF_S, TierUploader

    up = TierUploader.__new__(TierUploader)
    up.cfg = SimpleNamespace(interval_s=0.5)
    assert [up._backoff(n) for n in (0, 1, 2, 3)] == [0.5, 1.0, 2.0, 4.0]
    assert up._backoff(30) == MAX_BACKOFF_S
    with caplog.at_level(logging.ERROR, logger="electra.tiering.uploader"):
        for n in (1, 2, 3):
            try:
                raise OSError("Generic S3 error\n  ↳ Connection refused")
            except OSError as exc:
                TierUploader._log_failure("tier upload round failed", exc, n)
    records = [r for r in caplog.records if r.name == "electra.tiering.uploader"]
    assert records[0].exc_info is not None and all(r.exc_info is None for r in records[1:])
    assert "3 in a row" in records[2].getMessage() and "Connection refused" in records[2].getMessage()


def test_an_uploader_stops_when_a_role_change_wakes_it_as_it_is_cancelled(tmp_path):
    """CI hung 60 s in a cluster's stop: a node's stop woke its uploader (a role change) in the same loop turn that
    cancelled it, and 3.11's `asyncio.wait_for` lost the cancellation, so the upload loop ran on."""
    import asyncio

    from electra.tiering.uploader import TierConfig, TierUploader

    woken = []
    node = SimpleNamespace(cfg=SimpleNamespace(node_id=1), core=None, applied=0, on_role_change=woken.append)

    async def main():
        up = TierUploader(node, ControllerStateMachine(), None, TierConfig(str(tmp_path / "tier"), interval_s=30))
        up.start()
        for _ in range(200):  # the tables exist and the first round ran: the loop waits to be woken
            if up.metrics["rounds"]:
                break
            await asyncio.sleep(0.05)
        assert up.metrics["rounds"] == 1
        woken[0]()  # the node's stop: its role changes, which wakes the loop ...
        task = up._task
        stopping = asyncio.ensure_future(up.stop())  # ... in the loop turn that cancels it
        done, _ = await asyncio.wait([stopping], timeout=5)
        if not done:
            task.cancel()  # (a second cancellation, arriving alone, ends the loop)
        assert done and task.cancelled(), "the uploader's loop ran on after stop()"

    asyncio.run(main())


def test_a_stop_waits_a_bounded_time_for_a_tier_call_that_does_not_return(tmp_path, monkeypatch, caplog):
    """Review: a stop waited for the tier call in flight without a bound (an object store that stopped answering),
    and a node's stop waits for its uploader first: the node never stopped."""
    import asyncio
    import logging
    import threading

    from electra.tiering import uploader as uploader_module
    from electra.tiering.uploader import TierConfig, TierUploader

    monkeypatch.setattr(uploader_module, "STOP_WAIT_S", 0.2, raising=False)
    node = SimpleNamespace(cfg=SimpleNamespace(node_id=1), core=None, applied=0, on_role_change=lambda fn: None)
    answer = threading.Event()
    calls = []

    async def main():
        up = TierUploader(node, ControllerStateMachine(), None, TierConfig(str(tmp_path / "tier"), interval_s=30))
        up.store.ensure = lambda: (calls.append(1), answer.wait(30))  # the object store does not answer
        up.start()
        for _ in range(100):
            if calls:
                break
            await asyncio.sleep(0.02)
        assert calls
        stopping = asyncio.ensure_future(up.stop())
        done, _ = await asyncio.wait([stopping], timeout=5)
        answer.set()  # (let the thread end either way)
        assert done, "stop() waited for a tier call that did not return"

    try:
        with caplog.at_level(logging.WARNING, logger="electra.tiering.uploader"):
            asyncio.run(main())
    finally:
        answer.set()
    assert "still runs after" in caplog.text


def test_history_endpoint_reads_and_encodes_off_the_event_loop_and_pages_10000_events_by_default(tmp_path,
                                                                                               monkeypatch):
    """A read-only token could hold a node's event loop (its Raft ticks) for seconds: the reader ran in a thread,
    but FastAPI encoded its answer (up to 100,000 events) on the loop. Encoding is in the thread now, and an answer
    without `limit` lists 10,000 events (`limit` still asks for up to 100,000)."""
    import threading

    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from electra.tiering import api
    from electra.tiering.reader import TierReader

    uri = str(tmp_path / "tier")
    store = TierStore(uri)
    store.ensure()
    entries, states, ts, _ = _replay(_workload(40))
    _upload(store, entries, states, [40], snapshot_at={40}, ts=ts)
    limits, encoded_on = [], []
    history, encode = TierReader.history, api._encode
    monkeypatch.setattr(TierReader, "history", lambda self, *a: limits.append(a[3]) or history(self, *a))
    monkeypatch.setattr(api, "_encode", lambda out: encoded_on.append(threading.current_thread()) or encode(out))
    app = FastAPI()
    app.include_router(api.history_router(uri))
    loop_threads = []

    @app.get("/loop")
    async def loop() -> None:
        loop_threads.append(threading.current_thread())

    with TestClient(app) as client:
        client.get("/loop")
        got = client.get("/v1/admin/history", params={"at": "now", "from": "0"})
        assert got.status_code == 200 and got.headers["content-type"] == "application/json"
        assert got.json()["state"]["index"] == 40 and len(got.json()["events"]["events"]) == len(entries)
        assert client.get("/v1/admin/history", params={"at": "now", "from": "0", "limit": "3"}).json()[
            "events"]["truncated"] is True
        assert client.get("/v1/admin/history", params={"at": "now", "from": "0", "limit": "100001"}).status_code == 422
    assert limits == [10_000, 3]
    assert len(encoded_on) == 2 and loop_threads[0] not in encoded_on


def test_bootstrap_makes_its_term_durable_before_the_snapshot_a_restart_would_trust(tmp_path, monkeypatch):
    """A crash after the snapshot and before the term: the restart skipped bootstrap (a snapshot exists) and the
    node ran at term 0 under a snapshot of term 9, below every term the tier had seen. Now the term is synced
    first; a crash after it reruns bootstrap, which keeps the term and a vote cast in it."""
    from electra.consensus.storage import LogStorage

    uri = str(tmp_path / "tier")
    store = TierStore(uri)
    store.ensure()
    entries, states, ts, _ = _replay(_workload(130))
    _upload(store, entries, states, [50, 120], snapshot_at={120}, ts=ts)
    store.commit("events", events_table([]), upto=121, upto_term=9, uploader_term=9, expect_upto=120)

    def crash(*_a, **_kw):
        raise SystemExit("power lost")

    monkeypatch.setattr(SnapshotStore, "create", crash)  # the machine stops as the snapshot is being written
    with pytest.raises(SystemExit):
        bootstrap_from_tier(tmp_path / "node", uri, fsync=False)
    monkeypatch.undo()
    log = LogStorage(tmp_path / "node" / "raft-log", fsync=False)
    rec = log.open()
    assert (rec.term, rec.last_index) == (9, 0)  # the term is durable, nothing else was written
    log.save_hard_state(9, 2)  # it voted in that term before the next start (an election with no log to send)
    log.sync()
    log.close()
    b = bootstrap_from_tier(tmp_path / "node", uri, fsync=False)
    assert (b.index, b.term, b.hard_term) == (121, 9, 9)
    log = LogStorage(tmp_path / "node" / "raft-log", fsync=False)
    rec = log.open()
    assert (rec.term, rec.vote, rec.snapshot_index) == (9, 2, 121)
    log.close()


def test_a_node_whose_term_is_below_its_snapshots_raises_it_at_start(tmp_path):
    """What an older version's bootstrap left after a crash between its snapshot and its term: hard-state term 0
    under a snapshot of term 9. The node starts at term 9 (durably), never below its own log's terms."""
    import asyncio

    from electra.consensus.node import NodeConfig, RaftNode
    from electra.consensus.storage import LogStorage

    data = tmp_path / "node"
    sm = ControllerStateMachine()
    SnapshotStore(data / "snapshots", fsync=False).create(121, 9, sm.snapshot)[1]()
    cfg = NodeConfig(node_id=1, peers={1: ("127.0.0.1", 0)}, data_dir=data, fsync=False)

    async def start_and_stop() -> int:
        node = RaftNode(cfg, ControllerStateMachine())
        await node.start()
        try:
            return node.core.term
        finally:
            await node.stop()

    assert asyncio.run(start_and_stop()) >= 9
    log = LogStorage(data / "raft-log", fsync=False)
    assert log.open().term >= 9
    log.close()
