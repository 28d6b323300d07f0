"""Reading the tiered tables: controller state as of an index or an instant, events between instants,
and loaders for pandas/pyarrow (delta-rs) and Spark.

Time travel is over Raft history, not Delta versions: the state "as of T" is the
state after the longest log prefix whose exported entries carry a proposer time
<= T. It is the newest snapshot at or below that cut plus the events after it,
folded (`schema.fold_event`). Delta's own versions are available too
(`TierReader(..., version=n)`), until vacuum removes their files.

Spark cannot write Delta here and may lack the delta-spark jars, so `spark_read`
reads the Parquet files of the current Delta version (the table's own file list,
which excludes orphan files of failed commits) with `basePath` set; with
`use_delta_spark=True` (or ELECTRA_TIER_DELTA_SPARK=1) it uses
`spark.read.format("delta")` instead, for clusters where those jars resolve.
These tables use no deletion vectors or column mapping, so the file list is exact.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc

from electra.state.machine import BrokerSet

from .schema import GAP, fold_event, sets_from_snapshot_rows
from .store import TABLE_NOTE, TierStore

MAX_TIME_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z, the last instant `iso` can write
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Typed digits below this (1973-03-03) are not an instant anyone means in epoch ms: `$(date +%s)` (seconds),
# a year (`2026`). They are refused rather than answered with an empty 1970 state. 0 stays: "the beginning".
MIN_TYPED_MS = 100_000_000_000
_MS = timedelta(milliseconds=1)


_MS_TEXT = re.compile(r"-?[0-9]{1,19}")  # ASCII digits (int() also takes '١٢٣'), one sign: int() then cannot fail


def parse_time(text: str | int | float) -> int:
    """Epoch milliseconds from a number, digits (epoch ms), `now`, or an ISO-8601 time (naive means UTC).

    ValueError, which never repeats the text, for anything else or an instant outside 1970-9999.
    """
    if isinstance(text, int | float):
        if not math.isfinite(text):
            raise ValueError("the instant must be a finite number of epoch milliseconds")
        ms = int(text)
    else:
        s = str(text).strip()
        if s.lower() == "now":
            ms = int(datetime.now(UTC).timestamp() * 1000)
        elif len(s) == 8 and s.isdecimal() and s.isascii() and _is_basic_date(s):
            ms = (datetime.strptime(s, "%Y%m%d").replace(tzinfo=UTC) - _EPOCH) // _MS  # ISO's basic date, UTC
        elif _MS_TEXT.fullmatch(s):
            ms = int(s)
            if 0 < ms < MIN_TYPED_MS:
                raise ValueError("digits alone are epoch milliseconds (13 digits today); this one would be "
                                 "before 1973: epoch seconds or a year? Give milliseconds, an ISO-8601 time "
                                 "(e.g. 2026-11-27T16:00:00Z) or 'now' (0 is the beginning)")
        else:
            try:
                dt = datetime.fromisoformat(s.replace("Z", "+00:00"))
                if dt.tzinfo is None:
                    dt = dt.replace(tzinfo=UTC)
                ms = (dt - _EPOCH) // _MS  # exact (a float timestamp turned .123 into .122)
            except (ValueError, OverflowError):
                raise ValueError("expected an ISO-8601 time (e.g. 2026-11-27T16:00:00Z), epoch milliseconds "
                                 "or 'now'") from None
    if not 0 <= ms <= MAX_TIME_MS:
        raise ValueError("the instant must lie between 1970 and the end of 9999")
    return ms


CLOCK_SKEW_MS = 60_000  # how far ahead of the reader's clock an instant may be: leaders' clocks differ a little


def not_in_future(ms: int, now_ms: int | None = None) -> int:
    """`ms` if it is not after now (plus CLOCK_SKEW_MS). ValueError otherwise: the state at a future instant
    is not known yet, and the latest state labelled with that instant and `complete` would say it is."""
    if now_ms is None:
        now_ms = int(datetime.now(UTC).timestamp() * 1000)
    if ms > now_ms + CLOCK_SKEW_MS:
        raise ValueError("the instant is in the future: the tier holds the state up to now; give 'now' or "
                         "an earlier time")
    return ms


def _is_basic_date(s: str) -> bool:
    """Eight digits that are a calendar date (YYYYMMDD, year 1971 on): ISO-8601's basic form, which
    `20261127` means to anyone typing it. As epoch milliseconds it would be 1970-01-01 05:37, an
    instant no tier holds."""
    try:
        return datetime.strptime(s, "%Y%m%d").year > 1970
    except ValueError:
        return False


def iso(ms: int) -> str:
    """`ms` as ISO-8601 UTC to the millisecond (exact: no float on the way)."""
    return (_EPOCH + ms * _MS).isoformat(timespec="milliseconds").replace("+00:00", "Z")


MAX_EVENTS = 100_000  # events in one history answer at most (`limit`; `truncated` says when more matched)
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# Where a native backtrace starts ("   0: <unknown>", "stack backtrace:"): delta-rs appends one to some errors.
_BACKTRACE = re.compile(r"^(\d+: |stack backtrace:)", re.IGNORECASE)


def tier_failure(exc: BaseException) -> str:
    """Why the tier could not be read, in one line (delta-rs and object stores raise pages of text): the first
    line says what failed, the last one usually why ("Permission denied", "Connection refused"). A native
    backtrace after them is dropped (its last frame is no reason), and the table is named when known."""
    text = _ANSI.sub("", str(exc))  # delta-rs colours some of its messages for a terminal
    lines = [ln.strip(" \t↳") for ln in text.splitlines() if ln.strip(" \t↳")] or [""]
    end = next((n for n, ln in enumerate(lines) if n and _BACKTRACE.match(ln)), len(lines))
    lines = lines[:end]
    text = lines[0][:300] + (f" ... {lines[-1][:200]}" if len(lines) > 1 else "")
    table = next((n for n in getattr(exc, "__notes__", ()) if n.startswith(TABLE_NOTE)), "")
    return f"{table.removeprefix(TABLE_NOTE)}{' table: ' if table else ''}{type(exc).__name__}: {text}"


def parse_cursor(text: str) -> tuple[int, int]:
    """A page cursor: `index:seq` (a truncated answer's `next_after`) or a Raft index alone (its events all
    come after it). ValueError, which never repeats the text, otherwise."""
    index, colon, seq = text.strip().partition(":")
    if not (index.isascii() and index.isdecimal() and len(index) <= 18
            and (not colon or (seq.isascii() and seq.isdecimal() and len(seq) <= 9))):
        raise ValueError("expected a cursor `INDEX:SEQ` (an answer's next_after) or a Raft index")
    return int(index), int(seq) if seq else 2**31 - 1  # seq is an int32 column


def event_window(events_from: int | None, events_to: int | None) -> tuple[int, int] | None:
    """The events asked for as `[from, to]` (an open end reaches the first or last event), None if neither
    end is given; ValueError if the window ends before it starts."""
    if events_from is None and events_to is None:
        return None
    lo = 0 if events_from is None else events_from
    hi = 2**62 if events_to is None else events_to
    if lo > hi:
        raise ValueError("the events' window ends before it starts")
    return lo, hi


@dataclass
class TierState:
    index: int  # the Raft index this state is at
    term: int  # Raft term of that entry (0 if unknown)
    sets: dict[str, BrokerSet]
    snapshot_index: int | None  # the snapshot the fold started from (None: from the empty state)
    gaps: list[dict] = field(default_factory=list)  # gap markers inside the folded range
    complete: bool = True  # False if a gap or the retention horizon makes the answer approximate


class TierReader:
    def __init__(self, uri: str, storage_options: dict[str, str] | None = None,
                 version: dict[str, int] | None = None) -> None:
        self.store = TierStore(uri, storage_options)
        self.version = version or {}

    def table(self, which: str) -> pa.Table:
        return self.store.read(which, self.version.get(which))

    def to_pandas(self, which: str):
        return self.table(which).to_pandas()

    # ------------------------------------------------------------------ state by index
    def state_at_index(self, index: int | None = None) -> TierState:
        """The exact state after Raft index `index` (default: everything the tables cover).

        For the default, each table's rows are read at the very version its progress was read from:
        an upload committing between the two reads would otherwise label the rows of version V with
        the index of V+1, and a node bootstrapped from that would silently lack the entries between.
        The entry's term then comes from the fold or, when the newest entries produced no event (a new
        leader's first entry), from the progress that covers exactly that index."""
        if index is not None or self.version:
            snaps, events = self.table("snapshots"), self.table("events")
            if index is None:
                index = max(pc.max(events["index"]).as_py() or 0, pc.max(snaps["snapshot_index"]).as_py() or 0)
            return self._fold(snaps, events, index)
        ev = self.store.progress("events")
        events = self.store.read("events", ev.version)
        sp = self.store.progress("snapshots")
        snaps = self.store.read("snapshots", sp.version)
        # A gap bridge commits its full snapshot before the events, so it can be ahead of them.
        index = max(ev.upto, pc.max(snaps["snapshot_index"]).as_py() or 0)
        st = self._fold(snaps, events, index)
        if st.term == 0:
            st.term = ev.upto_term if index == ev.upto else sp.upto_term if index == sp.upto else 0
        return st

    def _fold(self, snaps: pa.Table, events: pa.Table, cut: int) -> TierState:
        markers = snaps.filter(pc.and_(pc.is_null(snaps["name"]), pc.less_equal(snaps["snapshot_index"], cut)))
        snap_index, term, sets = None, 0, {}
        complete = True
        if markers.num_rows:
            snap_index = pc.max(markers["snapshot_index"]).as_py()
            rows = snaps.filter(pc.equal(snaps["snapshot_index"], snap_index)).to_pylist()
            term = rows[0]["snapshot_term"]
            sets = sets_from_snapshot_rows(rows)
        elif snaps.num_rows:
            # No snapshot at or below the cut: the empty state is a valid start only if retention
            # has not dropped the events before the oldest snapshot. The events table says so itself
            # (`history_from`: 0 until retention ran); a table from before it did is judged by its
            # rows (when retention dropped every event, none is left to say so: not exact either).
            history_from = self.store.history_from(self.version.get("events"))
            if history_from is not None:
                complete = history_from == 0
            else:
                complete = bool(events.num_rows) and (pc.min(events["index"]).as_py()
                                                      < pc.min(snaps["snapshot_index"]).as_py())
        lo = snap_index or 0
        rng = events.filter(pc.and_(pc.greater(events["index"], lo), pc.less_equal(events["index"], cut)))
        rng = rng.sort_by([("index", "ascending"), ("seq", "ascending")])
        gaps = []
        for r in rng.to_pylist():
            if r["type"] == GAP:
                gaps.append(json.loads(r["payload"]))
                continue
            fold_event(sets, r["type"], json.loads(r["payload"]), json.loads(r["state"]) if r["state"] else None)
            term = r["term"]
        if (rng["index"][-1].as_py() if rng.num_rows else lo) < cut:
            term = 0  # the entry at the cut produced no event (or no snapshot is at it): its term is not known here
        return TierState(cut, term, sets, snap_index, gaps, complete and not gaps)

    # ------------------------------------------------------------------ time travel
    def state_at(self, at_ms: int) -> dict:
        """Every broker set as of instant `at_ms` (epoch ms)."""
        snaps = self.table("snapshots")
        events = self.table("events")
        ev = events.filter(pc.and_(pc.less_equal(events["ts_ms"], at_ms), pc.not_equal(events["type"], GAP)))
        sm = snaps.filter(pc.and_(pc.is_null(snaps["name"]), pc.less_equal(snaps["snapshot_ts_ms"], at_ms)))
        cut = max(pc.max(ev["index"]).as_py() or 0, pc.max(sm["snapshot_index"]).as_py() or 0)
        st = self._fold(snaps, events, cut)
        return {"at_ms": at_ms, "at": iso(at_ms), "index": cut, "snapshot_index": st.snapshot_index,
                "complete": st.complete, "gaps": st.gaps,
                "brokerSets": [bs.view().to_public() for _, bs in sorted(st.sets.items())]}

    def events_between(self, from_ms: int, to_ms: int, limit: int = MAX_EVENTS,
                       after: tuple[int, int] | None = None) -> dict:
        """Events with from_ms <= time <= to_ms, in Raft index order, and any gap markers among them.

        `after` (index, seq) pages: only events after that one; a truncated answer's `next_after` is the
        cursor of the next page (its last event's `index:seq`)."""
        events = self.table("events")
        keep = pc.and_(pc.greater_equal(events["ts_ms"], from_ms), pc.less_equal(events["ts_ms"], to_ms))
        if after is not None:
            keep = pc.and_(keep, pc.or_(pc.greater(events["index"], after[0]),
                                        pc.and_(pc.equal(events["index"], after[0]),
                                                pc.greater(events["seq"], after[1]))))
        rng = events.filter(keep)
        rng = rng.sort_by([("index", "ascending"), ("seq", "ascending")])
        out, gaps = [], []
        for r in rng.to_pylist():
            if r["type"] == GAP:
                gaps.append(json.loads(r["payload"]))
                continue
            if len(out) < limit:
                out.append({"index": r["index"], "seq": r["seq"], "term": r["term"], "ts_ms": r["ts_ms"],
                            "time": iso(r["ts_ms"]), "type": r["type"], "cluster": r["cluster"],
                            "brokerSet": r["broker_set"], "event": json.loads(r["payload"]),
                            "state": json.loads(r["state"]) if r["state"] else None})
        truncated = len(out) < rng.num_rows - len(gaps)
        return {"from_ms": from_ms, "to_ms": to_ms, "events": out, "truncated": truncated,
                "next_after": f"{out[-1]['index']}:{out[-1]['seq']}" if truncated else None, "gaps": gaps}

    def history(self, at: str | int, events_from: str | int | None = None, events_to: str | int | None = None,
                limit: int = MAX_EVENTS, after: tuple[int, int] | None = None) -> dict:
        window = event_window(None if events_from is None else parse_time(events_from),
                              None if events_to is None else parse_time(events_to))
        out = {"state": self.state_at(parse_time(at))}
        if window is not None:
            out["events"] = self.events_between(*window, limit=limit, after=after)
        return out

    # ------------------------------------------------------------------ Spark
    def files(self, which: str) -> list[str]:
        """Parquet files of the table's current (or pinned) version: what Spark should read."""
        return self.store.table(which, self.version.get(which)).file_uris()

    def spark_read(self, spark, which: str, use_delta_spark: bool | None = None):
        if use_delta_spark is None:
            use_delta_spark = os.environ.get("ELECTRA_TIER_DELTA_SPARK", "") in ("1", "true", "yes")
        uri = self.store.uris[which]
        if use_delta_spark:
            reader = spark.read.format("delta")
            if which in self.version:
                reader = reader.option("versionAsOf", self.version[which])
            return reader.load(uri)
        files = self.files(which)
        if not files:
            return spark.createDataFrame(self.table(which).to_pandas())
        return spark.read.option("basePath", uri).parquet(*files)
