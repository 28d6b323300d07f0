"""Row layouts of the two Delta tables, and folding rows back into controller state.

`events`: one row per applied event (Raft index, position within the entry,
entry term, proposer time, RocketMQ event type, cluster, broker set, payload
JSON, the set's public state right after the event), plus explicit `Gap` marker
rows when events could not be produced (see docs/tiering.md).

`snapshots`: per exported snapshot one marker row (`name` null, carrying the
number of sets) and one row per broker set with the full `BrokerSet` (ids,
addresses, register check codes, next id, master, epochs, sync-state set).

Every state change of the controller state machine produces an event whose
`state` is the set right after it, so a snapshot at S plus the events in (S, I]
folds into the exact state at I (`fold_event`), check codes and next broker id
included (they follow from ApplyBrokerId payloads).
"""

from __future__ import annotations

import json
from collections.abc import Iterable

import pyarrow as pa

from electra.state.journal import JournalEntry
from electra.state.machine import BrokerSet

GAP = "Gap"

EVENTS_SCHEMA = pa.schema([
    ("index", pa.int64()), ("seq", pa.int32()), ("term", pa.int64()), ("ts_ms", pa.int64()),
    ("type", pa.string()), ("cluster", pa.string()), ("broker_set", pa.string()),
    ("payload", pa.string()), ("state", pa.string()), ("uploader_term", pa.int64()),
])

SNAPSHOTS_SCHEMA = pa.schema([
    ("snapshot_index", pa.int64()), ("snapshot_term", pa.int64()), ("snapshot_ts_ms", pa.int64()),
    ("uploader_term", pa.int64()), ("sets_count", pa.int32()),
    ("cluster", pa.string()), ("name", pa.string()), ("next_broker_id", pa.int64()),
    ("master_id", pa.int64()), ("master_epoch", pa.int64()),
    ("sync_state_set", pa.list_(pa.int64())), ("sync_state_set_epoch", pa.int64()),
    ("broker_ids", pa.list_(pa.int64())), ("broker_addrs", pa.list_(pa.string())),
    ("check_codes", pa.list_(pa.string())),
])


def _dumps(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def event_rows(entries: Iterable[JournalEntry], uploader_term: int) -> list[dict]:
    rows, last, seq = [], None, 0
    for e in entries:
        seq = seq + 1 if e.index == last else 0
        last = e.index
        rows.append({"index": e.index, "seq": seq, "term": e.term, "ts_ms": e.ts, "type": e.event.get("type"),
                     "cluster": e.cluster, "broker_set": e.event.get("brokerName"), "payload": _dumps(e.event),
                     "state": None if e.state is None else _dumps(e.state.to_public()), "uploader_term": uploader_term})
    return rows


def gap_row(after: int, upto: int, term: int, ts_ms: int, uploader_term: int) -> dict:
    """Events in (after, upto] are missing from the table; a full snapshot follows the gap."""
    return {"index": upto, "seq": -1, "term": term, "ts_ms": ts_ms, "type": GAP, "cluster": None,
            "broker_set": None, "payload": _dumps({"from": after, "to": upto}), "state": None,
            "uploader_term": uploader_term}


def events_table(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=EVENTS_SCHEMA)


def snapshot_rows(sets: Iterable[BrokerSet], index: int, term: int, ts_ms: int, uploader_term: int) -> list[dict]:
    sets = list(sets)
    head = {"snapshot_index": index, "snapshot_term": term, "snapshot_ts_ms": ts_ms, "uploader_term": uploader_term}
    rows = [{**head, "sets_count": len(sets), "cluster": None, "name": None, "next_broker_id": None,
             "master_id": None, "master_epoch": None, "sync_state_set": None, "sync_state_set_epoch": None,
             "broker_ids": None, "broker_addrs": None, "check_codes": None}]
    for bs in sorted(sets, key=lambda b: b.name):
        ids = sorted(bs.brokers)
        rows.append({**head, "sets_count": len(sets), "cluster": bs.cluster, "name": bs.name,
                     "next_broker_id": bs.next_broker_id, "master_id": bs.master_id,
                     "master_epoch": bs.master_epoch, "sync_state_set": sorted(bs.sync_state_set),
                     "sync_state_set_epoch": bs.sync_state_set_epoch, "broker_ids": ids,
                     "broker_addrs": [bs.brokers[i][0] for i in ids], "check_codes": [bs.brokers[i][1] for i in ids]})
    return rows


def snapshots_table(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=SNAPSHOTS_SCHEMA)


def sets_from_snapshot_rows(rows: Iterable[dict]) -> dict[str, BrokerSet]:
    out = {}
    for r in rows:
        if r["name"] is None:
            continue
        brokers = {i: (a, c) for i, a, c in zip(r["broker_ids"], r["broker_addrs"], r["check_codes"], strict=True)}
        out[r["name"]] = BrokerSet(r["cluster"], r["name"], r["next_broker_id"], brokers, r["master_id"],
                                   r["master_epoch"], set(r["sync_state_set"]), r["sync_state_set_epoch"])
    return out


def fold_event(sets: dict[str, BrokerSet], etype: str, payload: dict, state: dict | None) -> None:
    """Apply one event row to `sets` (in Raft index order)."""
    if etype == GAP:
        return
    name = payload.get("brokerName")
    old = sets.get(name)
    if state is None:
        sets.pop(name, None)
        return
    codes = {i: c for i, (_, c) in old.brokers.items()} if old else {}
    nxt = old.next_broker_id if old else 1
    if etype == "ApplyBrokerId":
        codes[int(payload["newBrokerId"])] = payload["registerCheckCode"]
        nxt += 1
    brokers = {int(i): (a, codes.get(int(i), "")) for i, a in state["brokers"].items()}
    sets[name] = BrokerSet(state["clusterName"], name, nxt, brokers, state["masterBrokerId"], state["masterEpoch"],
                           set(state["syncStateSet"]), state["syncStateSetEpoch"])
