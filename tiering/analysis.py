"""Failover analysis over the tier's `events` table (pandas), for notebooks/failover_analysis.ipynb.

What the events table can tell about failovers: every ElectMaster event carries the new master (or
none, when no replica could take over), the master epoch, and the proposer's time (for elections the
streaming job proposes, the instant it judged the old master dead). From consecutive elections of a set:

* `tenure_s`: how long the previous master held the set (from its election until the set lost it or
  this election replaced it);
* `masterless_s`: how long the set had no master: from an election that found no candidate
  (`newMasterElected: false`) to the next one that did (0 when the handover was direct).

Detection latency (old master's last heartbeat -> election) is not in the table: heartbeats are not
Raft entries. `electra bench failover` measures it end to end, and the streaming job logs it per
proposal (`detect_ms`).
"""

from __future__ import annotations

import json

import pandas as pd

ELECTIONS_COLUMNS = ["broker_set", "index", "ts_ms", "time", "elected", "master", "epoch", "previous_master"]
FAILOVER_COLUMNS = ["broker_set", "time", "from_master", "to_master", "epoch", "tenure_s", "masterless_s"]


def elections(events: pd.DataFrame) -> pd.DataFrame:
    """One row per ElectMaster event in Raft order: who became master (None if nobody) and who was before."""
    ev = events[events["type"] == "ElectMaster"].sort_values(["index", "seq"])
    rows, current = [], {}
    for r in ev.itertuples(index=False):
        payload = json.loads(r.payload)
        elected = bool(payload.get("newMasterElected"))
        master = payload.get("newMasterBrokerId") if elected else None
        rows.append({"broker_set": r.broker_set, "index": int(r.index), "ts_ms": int(r.ts_ms),
                     "time": pd.to_datetime(int(r.ts_ms), unit="ms", utc=True), "elected": elected,
                     "master": master, "epoch": int(payload.get("masterEpoch", 0)),
                     "previous_master": current.get(r.broker_set)})
        current[r.broker_set] = master
    # nullable integers: "no master" stays <NA> instead of turning the broker ids into floats
    return pd.DataFrame(rows, columns=ELECTIONS_COLUMNS).astype({"master": "Int64", "previous_master": "Int64"})


def failovers(elections_df: pd.DataFrame) -> pd.DataFrame:
    """Elections that handed a set from one master to another, with the old master's tenure and the
    time the set spent without a master on the way."""
    rows = []
    for name, group in elections_df.groupby("broker_set", sort=True):
        took_over = None  # ts_ms the current master was elected
        last_master, lost_at = None, None  # the set's last master; when it lost it (None: it still holds it)
        for r in group.sort_values("index").itertuples(index=False):
            if not r.elected:
                if lost_at is None:
                    lost_at = r.ts_ms
                continue
            if last_master is not None and r.master != last_master:  # r.master is set: r.elected
                rows.append({"broker_set": name, "time": r.time, "from_master": last_master, "to_master": r.master,
                             "epoch": r.epoch, "tenure_s": ((lost_at or r.ts_ms) - took_over) / 1000,
                             "masterless_s": (r.ts_ms - lost_at) / 1000 if lost_at is not None else 0.0})
            if r.master != last_master or lost_at is not None:
                took_over = r.ts_ms
            last_master, lost_at = r.master, None
    return pd.DataFrame(rows, columns=FAILOVER_COLUMNS).astype({"from_master": "Int64", "to_master": "Int64"})


def failovers_per_window(failovers_df: pd.DataFrame, window: str = "1min") -> pd.Series:
    """Failovers across all sets per time window (a storm shows as a spike)."""
    if failovers_df.empty:
        return pd.Series(dtype="int64")
    return failovers_df.set_index("time").resample(window).size()
