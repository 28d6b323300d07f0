"""The two Delta tables under one base URI, and the fenced commit every upload goes through.

All methods are blocking (delta-rs); the uploader calls them on its own worker
thread. Progress lives in the table itself as Delta application transactions
(`txn` actions), so it is read from, and committed in, the same atomic log
entry as the data:

* `electra.events` / `electra.snapshots`: the Raft index the table covers
  (events: every event with index <= it; snapshots: the newest snapshot index);
* `electra.term`: the Raft term of the leader that made the last upload;
* `electra.upto_term`: the Raft term of the entry at that index (bootstrap needs it).

Fencing (docs/tiering.md): `commit()` reads these from table version V, refuses
when a higher term is recorded (`Fenced`) or the index is not where the caller
expects (`Moved`), then writes with the same application ids, reading at V.
delta-rs commits V+1 with put-if-absent; if any version after V exists it runs
its conflict checker, and a winning commit carrying a `txn` for an application
id that this commit also carries fails this one ("Concurrent transaction
failed"). Every upload carries all three ids, so no upload can land between the
check and the commit unnoticed.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import urlparse

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, QueryBuilder, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, TableNotFoundError

from .options import is_local
from .schema import EVENTS_SCHEMA, SNAPSHOTS_SCHEMA

log = logging.getLogger("electra.tiering.store")

APP_TERM = "electra.term"
APP_UPTO_TERM = "electra.upto_term"
APPS = {"events": "electra.events", "snapshots": "electra.snapshots"}
# On the events table: the Raft index after which the table holds every event (0 from its creation;
# retention moves it to the snapshot it keeps). Absent on tables created before it was recorded.
APP_HISTORY_FROM = "electra.history_from"
SCHEMAS = {"events": EVENTS_SCHEMA, "snapshots": SNAPSHOTS_SCHEMA}
# Added to an error raised while opening or reading a table, so that its one-line report (`tier_failure`)
# says which of the two tables is damaged: delta-rs's own message does not.
TABLE_NOTE = "electra.tier.table="


class Fenced(Exception):
    """A leader of a higher Raft term already committed an upload: this uploader is deposed."""

    def __init__(self, recorded_term: int, my_term: int) -> None:
        super().__init__(f"the table records uploader term {recorded_term} > {my_term}")
        self.recorded_term = recorded_term


class Moved(Exception):
    """The table's progress is not where this uploader expected it (another uploader advanced it)."""

    def __init__(self, progress: Progress) -> None:
        super().__init__(f"table progress is {progress}")
        self.progress = progress


class Conflict(Exception):
    """The commit lost a race with a concurrent upload (same application ids); nothing was committed."""


@dataclass(frozen=True)
class Progress:
    upto: int  # Raft index covered
    upto_term: int  # Raft term of the entry at `upto`
    term: int  # Raft term of the uploader of the last commit
    version: int  # Delta table version this was read from


@contextmanager
def _naming(which: str) -> Iterator[None]:
    """Notes on an error from table `which` that it came from there (`TABLE_NOTE`); the type is kept, so
    callers still catch `TableNotFoundError` and the rest as before."""
    try:
        yield
    except Exception as exc:
        exc.add_note(f"{TABLE_NOTE}{which}")
        raise


class TierStore:
    def __init__(self, uri: str | os.PathLike, storage_options: dict[str, str] | None = None) -> None:
        self.uri = str(uri).rstrip("/")
        self.storage_options = storage_options or None
        self.uris = {"events": f"{self.uri}/events", "snapshots": f"{self.uri}/snapshots"}
        self._tables: dict[str, DeltaTable] = {}

    # ------------------------------------------------------------------ tables
    def ensure(self) -> None:
        """Create both tables when missing (idempotent; a concurrent creator is fine)."""
        for which, uri in self.uris.items():
            if is_local(uri):
                os.makedirs(urlparse(uri).path if uri.startswith("file:") else uri, exist_ok=True)
            if not DeltaTable.is_deltatable(uri, storage_options=self.storage_options):
                try:
                    DeltaTable.create(uri, SCHEMAS[which], mode="ignore", name=f"electra_{which}",
                                      storage_options=self.storage_options,
                                      commit_properties=CommitProperties(
                                          app_transactions=[Transaction(APP_HISTORY_FROM, 0)])
                                      if which == "events" else None)
                except Exception:
                    if not DeltaTable.is_deltatable(uri, storage_options=self.storage_options):
                        raise

    def table(self, which: str, version: int | None = None) -> DeltaTable:
        """A handle on the newest version (cached and refreshed), or on `version` (time travel)."""
        with _naming(which):
            if version is not None:
                return DeltaTable(self.uris[which], version=version, storage_options=self.storage_options)
            dt = self._tables.get(which)
            if dt is None:
                dt = self._tables[which] = DeltaTable(self.uris[which], storage_options=self.storage_options)
            else:
                dt.update_incremental()
            return dt

    def read(self, which: str, version: int | None = None, columns: list[str] | None = None) -> pa.Table:
        """The rows of table `which` (at `version`, or the newest) as Arrow, read by delta-rs's own engine.

        Not `DeltaTable.to_pyarrow_table()`: that scans through a pyarrow dataset whose I/O threads
        call delta-rs's Python file system handler, and they can outlive the interpreter's shutdown.
        A short-lived process (`electra history`) then aborted at exit with "terminate called without
        an active exception" (exit 134) in about a third of its runs here (delta-rs#2184,
        apache/arrow#45017). The engine hands back string views; the rows are cast to the table's schema.
        """
        schema = SCHEMAS[which]
        if columns:
            schema = pa.schema([schema.field(c) for c in columns])
        names = ", ".join('"' + c.replace('"', '""') + '"' for c in schema.names)
        dt = self.table(which, version)
        with _naming(which):
            reader = QueryBuilder().register("t", dt).execute(f"SELECT {names} FROM t")
            return pa.table(reader.read_all()).cast(schema)

    def absence(self) -> str | None:
        """What is missing, in words (a half tier named as such, not as no tier at all); None if both tables are
        there."""
        missing = self.missing()
        if not missing:
            return None
        if len(missing) == len(self.uris):
            return f"no tier tables at {self.uri} (neither events/ nor snapshots/ is a Delta table)"
        found = next(w for w in self.uris if w not in missing)
        return f"no {missing[0]} table at {self.uris[missing[0]]}: found only the {found} table (a tier holds both)"

    def missing(self) -> list[str]:
        """The tables that are not there, so that a half tier is reported as such, not as no tier at all."""
        out = []
        for which in self.uris:
            try:
                self.table(which)
            except TableNotFoundError:
                out.append(which)
        return out

    @staticmethod
    def _progress(dt: DeltaTable, which: str) -> Progress:
        return Progress(dt.transaction_version(APPS[which]) or 0, dt.transaction_version(APP_UPTO_TERM) or 0,
                        dt.transaction_version(APP_TERM) or 0, dt.version())

    def history_from(self, version: int | None = None) -> int | None:
        """The Raft index after which the events table holds every event (None: a table from before
        this was recorded, whose history is judged by its rows)."""
        return self.table("events", version).transaction_version(APP_HISTORY_FROM)

    def progress(self, which: str = "events") -> Progress:
        return self._progress(self.table(which), which)

    # ------------------------------------------------------------------ the fenced commit
    def commit(self, which: str, data: pa.Table, *, upto: int, upto_term: int, uploader_term: int,
               expect_upto: int | None, before_commit: Callable[[], None] | None = None) -> Progress:
        """Append `data` and move the table's progress to `upto`, iff no higher term uploaded and the
        progress is `expect_upto` (events) or below `upto` (snapshots, `expect_upto=None`)."""
        dt = self.table(which)
        p = self._progress(dt, which)
        if p.term > uploader_term:
            raise Fenced(p.term, uploader_term)
        if (p.upto != expect_upto) if expect_upto is not None else (p.upto >= upto):
            raise Moved(p)
        if before_commit is not None:
            before_commit()  # tests: interleave another uploader, or crash, between check and commit
        props = CommitProperties(
            app_transactions=[Transaction(APPS[which], upto), Transaction(APP_TERM, uploader_term),
                              Transaction(APP_UPTO_TERM, upto_term)],
            custom_metadata={"electra.upto": str(upto), "electra.uploader_term": str(uploader_term)})
        try:
            write_deltalake(dt, data, mode="append", commit_properties=props,
                            storage_options=self.storage_options)
        except CommitFailedError as exc:
            now = self._progress(self.table(which), which)
            if now.term > uploader_term:
                raise Fenced(now.term, uploader_term) from exc
            raise Conflict(str(exc)) from exc
        return Progress(upto, upto_term, uploader_term, p.version + 1)

    def claim(self, uploader_term: int) -> dict[str, Progress]:
        """A new leader's empty commit recording its term in both tables: older leaders are fenced from now on."""
        out = {}
        for which in ("events", "snapshots"):
            p = self.progress(which)
            if p.term > uploader_term:
                raise Fenced(p.term, uploader_term)
            if p.term < uploader_term:
                empty = pa.Table.from_pylist([], schema=SCHEMAS[which])
                dt = self.table(which)
                props = CommitProperties(
                    app_transactions=[Transaction(APPS[which], p.upto), Transaction(APP_TERM, uploader_term),
                                      Transaction(APP_UPTO_TERM, p.upto_term)],
                    custom_metadata={"electra.claim": str(uploader_term)})
                try:
                    write_deltalake(dt, empty, mode="append", commit_properties=props,
                                    storage_options=self.storage_options)
                except CommitFailedError as exc:
                    now = self.progress(which)
                    if now.term > uploader_term:
                        raise Fenced(now.term, uploader_term) from exc
                    raise Conflict(str(exc)) from exc
                p = Progress(p.upto, p.upto_term, uploader_term, p.version + 1)
            out[which] = p
        return out

    # ------------------------------------------------------------------ retention
    def maintain(self, *, now_ms: int, retention_ms: int, vacuum_retention_hours: int) -> dict:
        """Drop history older than the retention period (keeping the snapshot it rests on), compact, vacuum."""
        out: dict = {"deleted_events": 0, "deleted_snapshot_rows": 0}
        snaps = self.read("snapshots", columns=["snapshot_index", "snapshot_ts_ms", "name"])
        old = [r["snapshot_index"] for r in snaps.to_pylist()
               if r["name"] is None and r["snapshot_ts_ms"] < now_ms - retention_ms]
        if old:
            base = max(old)
            res = self.table("snapshots").delete(f"snapshot_index < {base}")
            out["deleted_snapshot_rows"] = res.get("num_deleted_rows", 0)
            res = self.table("events").delete(f"index <= {base}", commit_properties=CommitProperties(
                app_transactions=[Transaction(APP_HISTORY_FROM, base)]))
            out["deleted_events"] = res.get("num_deleted_rows", 0)
            out["base_snapshot"] = base
        for which in ("events", "snapshots"):
            dt = self.table(which)
            m = dt.optimize.compact()
            out[f"{which}_files_compacted"] = m.get("numFilesRemoved", 0)
            out[f"{which}_files_vacuumed"] = len(self.table(which).vacuum(
                retention_hours=vacuum_retention_hours, enforce_retention_duration=False, dry_run=False))
        return out
