"""The leader's uploader: applied events and state snapshots into the Delta tables.

One asyncio task per node; it only uploads while this node is the leader of a
term in which it has committed an entry. Every Delta call runs on the
uploader's own worker thread, so the Raft loop never waits for storage. A round:

1. on a new term, `claim` the tables (an empty commit recording the term: from
   then on a deposed leader's commit is refused) and read the table's progress
   `uploaded` (the resume point; the table, not this node, is the truth);
2. `upto = min(applied, commit)`; the journal's events in (uploaded, upto];
3. one fenced commit of those rows moving progress to `upto` (also when there
   are no rows, so the lag metric measures entries, not events);
4. if due, a snapshot of the state at exactly `upto`, captured on the loop in
   step 2, committed after the events;
5. if due, retention (delete history older than the period), compaction, vacuum.

When the journal cannot cover the resume point (`JournalGap`: a restarted node
restored a newer snapshot), the uploader rebuilds the missing events by folding
the tables to the state at `uploaded` and re-applying the retained Raft log
entries after it on a scratch state machine. Only when the log no longer holds
them either does it write an explicit, counted gap marker, after a full snapshot.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from electra.consensus.core import Role
from electra.state.journal import EventJournal, JournalEntry, JournalGap, entry_for
from electra.state.machine import ControllerStateMachine

from .reader import TierReader, tier_failure
from .schema import event_rows, events_table, gap_row, snapshot_rows, snapshots_table
from .store import Conflict, Fenced, Moved, TierStore

log = logging.getLogger("electra.tiering.uploader")

MAX_BACKOFF_S = 60.0  # rounds that keep failing (a damaged or unreachable tier) are retried at most this far apart
STOP_WAIT_S = 10.0  # how long a stop waits for a tier call in flight (an object store that stopped answering)


@dataclass
class TierConfig:
    uri: str
    storage_options: dict[str, str] | None = None
    interval_s: float = 1.0  # upload round period (the batching window)
    batch_events: int = 50_000  # events per commit at most
    snapshot_every_s: float = 300.0
    snapshot_every_entries: int = 100_000
    retention_days: float = 30.0
    maintenance_every_s: float = 3600.0
    vacuum_retention_hours: int = 168  # unreferenced files younger than this are kept (Delta's default)


class TierUploader:
    def __init__(self, node, sm: ControllerStateMachine, journal: EventJournal, cfg: TierConfig, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.node = node
        self.sm = sm
        self.journal = journal
        self.cfg = cfg
        self.clock = clock
        self.store = TierStore(cfg.uri, cfg.storage_options)
        self._exec = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"tier-{node.cfg.node_id}")
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._in_thread: Future | None = None  # the last tier call handed to `_exec`
        self.active_term = 0  # the term this node claimed the tables in (0: not uploading)
        self.fenced_term = 0  # a term in which the tables refused us
        self.uploaded = 0  # events progress of the table, as last read or committed
        self.snapshot_uploaded = 0
        self._synced_wall = clock()  # when the state that `uploaded` reflects was captured
        self._last_snapshot_wall = 0.0
        self._last_maintenance_wall = clock()
        self.before_commit: Callable[[], None] | None = None  # test hook (see TierStore.commit)
        self.metrics = {"rounds": 0, "commits": 0, "events_uploaded": 0, "snapshots_uploaded": 0, "claims": 0,
                        "fenced": 0, "conflicts": 0, "errors": 0, "gaps": 0, "gap_entries": 0,
                        "rebuilt_events": 0, "maintenance_runs": 0}
        node.on_role_change(lambda *_: self._wake.set())

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"tier-upload-{self.node.cfg.node_id}")

    async def stop(self) -> None:
        """Cancel the loop, then wait up to STOP_WAIT_S for the tier call in flight: its thread cannot be
        interrupted, and a node's stop must not hang on an object store that stopped answering (the call, if
        it ends later, commits at most what this term's leader may: a newer leader's claim fences it)."""
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._exec.shutdown(wait=False, cancel_futures=True)
        busy = self._in_thread
        if busy is not None and not busy.done():
            done, _ = await asyncio.wait([asyncio.wrap_future(busy)], timeout=STOP_WAIT_S)
            if not done:
                log.warning("tier: a call to %s still runs after %.0fs; stopping without waiting for it",
                            self.cfg.uri, STOP_WAIT_S)

    async def _thread(self, fn, *args):
        self._in_thread = self._exec.submit(fn, *args)
        return await asyncio.wrap_future(self._in_thread)

    async def _run(self) -> None:
        failures = 0
        while True:
            try:
                await self._thread(self.store.ensure)
                break
            except Exception as exc:
                failures += 1
                self._log_failure(f"cannot create the tier tables at {self.cfg.uri}", exc, failures)
                await asyncio.sleep(self._backoff(failures))
        failures = 0
        while True:
            try:
                await self.round()
                if failures:
                    log.warning("tier uploads work again after %d failed rounds", failures)
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.metrics["errors"] += 1
                failures += 1
                self._log_failure("tier upload round failed", exc, failures)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._backoff(failures)):
                    await self._wake.wait()

    def _backoff(self, failures: int) -> float:
        """The wait before the next round: the interval, doubled per failure in a row up to MAX_BACKOFF_S."""
        if not failures:
            return self.cfg.interval_s
        return min(MAX_BACKOFF_S, max(1.0, self.cfg.interval_s) * 2 ** min(failures - 1, 16))

    @staticmethod
    def _log_failure(what: str, exc: Exception, failures: int) -> None:
        """The first failure of a run with its traceback, later ones in one line (a damaged or unreachable tier
        logged some 40 lines a second: 190 MB a day); the errors counter counts them all."""
        if failures == 1:
            log.error("%s (retrying with back-off)", what, exc_info=exc)
        else:
            log.error("%s again (%d in a row): %s", what, failures, tier_failure(exc))

    # ------------------------------------------------------------------ state
    def _leading(self) -> int:
        """The current term if this node is a leader that committed in it, else 0."""
        core = self.node.core
        if core is None or core.role != Role.LEADER or not core.committed_in_term():
            return 0
        return core.term

    def lag_entries(self) -> int:
        return max(0, self.node.applied - self.uploaded) if self.active_term else 0

    def lag_seconds(self) -> float:
        return max(0.0, self.clock() - self._synced_wall) if self.lag_entries() else 0.0

    # ------------------------------------------------------------------ one round
    async def round(self) -> None:
        self.metrics["rounds"] += 1
        term = self._leading()
        if term == 0 or term <= self.fenced_term:
            self.active_term = 0
            return
        if self.active_term != term:
            try:
                prog = await self._thread(self.store.claim, term)
            except Fenced as exc:
                self._fenced(term, exc)
                return
            except Conflict:
                self.metrics["conflicts"] += 1
                return
            self.metrics["claims"] += 1
            self.uploaded, self.snapshot_uploaded = prog["events"].upto, prog["snapshots"].upto
            self.active_term = term
            log.info("node %d uploads to %s from index %d (term %d)", self.node.cfg.node_id, self.cfg.uri,
                     self.uploaded, term)
        await self._upload(term)
        if self.clock() - self._last_maintenance_wall >= self.cfg.maintenance_every_s and self._leading() == term:
            await self.maintain()

    def _fenced(self, term: int, exc: Fenced) -> None:
        self.metrics["fenced"] += 1
        self.fenced_term, self.active_term = term, 0
        log.warning("node %d: tier upload fenced in term %d (%s)", self.node.cfg.node_id, term, exc)

    async def _upload(self, term: int) -> None:
        node, core = self.node, self.node.core
        captured = self.clock()
        upto = min(node.applied, core.commit)
        if upto <= self.uploaded:
            self._synced_wall = captured
            return
        pre_snapshot = None
        try:
            entries = self.journal.since(self.uploaded, limit=self.cfg.batch_events)
        except JournalGap as gap:
            entries, pre_snapshot = await self._bridge_gap(gap, term, upto)
            if self._leading() != term:
                return
            upto = min(node.applied, core.commit)  # the bridge awaited; capture again
            entries = entries + self.journal.since(max(self.uploaded, self.journal.floor), self.cfg.batch_events)
        entries = [e for e in entries if e.index <= upto]
        if len(entries) >= self.cfg.batch_events:  # cut the batch at an entry boundary
            upto = entries[-1].index - 1
            entries = [e for e in entries if e.index <= upto]
        upto_term = core.term_at(upto) or (entries[-1].term if entries else 0)
        gap = [pre_snapshot.pop("gap_row")] if pre_snapshot is not None else []
        snap = None
        due = (self.clock() - self._last_snapshot_wall >= self.cfg.snapshot_every_s
               or upto - self.snapshot_uploaded >= self.cfg.snapshot_every_entries)
        if pre_snapshot is None and due and upto == node.applied and upto > self.snapshot_uploaded:
            snap = (upto, upto_term, snapshot_rows(self.sm.sets.values(), upto, upto_term,
                                                   self.sm.apply_time_ms or int(captured * 1000), term))
        try:
            if pre_snapshot is not None:  # gap path: the full snapshot lands before the gap marker
                await self._thread(self._commit_snapshot, *pre_snapshot["snap"], term)
            expect = self.uploaded
            # Rows are serialized on the worker thread too (journal entries are immutable).
            await self._thread(lambda: self.store.commit(
                "events", events_table(gap + event_rows(entries, term)), upto=upto, upto_term=upto_term,
                uploader_term=term, expect_upto=expect, before_commit=self.before_commit))
            self.uploaded = upto
            self._synced_wall = captured
            self.metrics["commits"] += 1
            self.metrics["events_uploaded"] += len(entries)
            if snap is not None:
                await self._thread(self._commit_snapshot, *snap, term)
        except Fenced as exc:
            self._fenced(term, exc)
        except (Moved, Conflict) as exc:
            self.metrics["conflicts"] += 1
            p = await self._thread(self.store.progress, "events")
            log.warning("node %d: upload of (%d, %d] lost a race (%s); table progress is %d", node.cfg.node_id,
                        self.uploaded, upto, type(exc).__name__, p.upto)
            self.uploaded = p.upto

    def _commit_snapshot(self, index: int, index_term: int, rows: list[dict], term: int) -> None:
        try:
            self.store.commit("snapshots", snapshots_table(rows), upto=index, upto_term=index_term,
                              uploader_term=term, expect_upto=None)
        except Moved as exc:  # a newer snapshot is there already
            self.snapshot_uploaded = exc.progress.upto
            return
        self.snapshot_uploaded = index
        self._last_snapshot_wall = self.clock()
        self.metrics["snapshots_uploaded"] += 1

    # ------------------------------------------------------------------ gaps
    async def _bridge_gap(self, gap: JournalGap, term: int, upto: int) -> tuple[list[JournalEntry], dict | None]:
        """Events in (uploaded, journal floor]: rebuilt from the tables plus the Raft log, else a gap marker."""
        core = self.node.core
        after, floor = self.uploaded, self.journal.floor
        if core.offset <= after and floor <= core.last_index():
            log_slice = [(i, core.term_at(i), core.log_data[i - core.offset - 1]) for i in range(after + 1, floor + 1)]
            try:
                rebuilt = await self._thread(self._replay, after, log_slice)
            except Exception as exc:
                log.warning("node %d: cannot rebuild events (%d, %d]: %r", self.node.cfg.node_id, after, floor, exc)
            else:
                self.metrics["rebuilt_events"] += len(rebuilt)
                log.info("node %d: rebuilt %d events in (%d, %d] from the tier and the Raft log",
                         self.node.cfg.node_id, len(rebuilt), after, floor)
                return rebuilt, None
        # Last resort: a counted gap marker, after a full snapshot of the current state.
        index = self.node.applied
        index_term = core.term_at(index) or 0
        now_ms = int(self.clock() * 1000)
        self.metrics["gaps"] += 1
        self.metrics["gap_entries"] += floor - after
        log.error("node %d: events (%d, %d] are neither in the journal nor in the Raft log; writing a gap marker "
                  "and a full snapshot at %d", self.node.cfg.node_id, after, floor, index)
        snap = (index, index_term, snapshot_rows(self.sm.sets.values(), index, index_term, now_ms, term))
        return [], {"snap": snap, "gap_row": gap_row(after, floor, core.term_at(floor) or 0, now_ms, term)}

    def _replay(self, after: int, log_slice: list[tuple[int, int, bytes]]) -> list[JournalEntry]:
        st = TierReader(self.cfg.uri, self.cfg.storage_options).state_at_index(after)
        if not st.complete:
            raise RuntimeError(f"the tier's state at {after} is not exact (gaps {st.gaps})")
        sm = ControllerStateMachine()
        sm.sets, sm.applied = st.sets, after
        out: list[JournalEntry] = []
        terms = {}

        def on_event(index: int, ev: dict) -> None:
            out.append(entry_for(sm, index, terms[index], ev))

        sm.on_event(on_event)
        for index, term, data in log_slice:
            terms[index] = term or 0
            if data:
                sm.apply(index, data)
        return out

    # ------------------------------------------------------------------ retention
    async def maintain(self) -> dict:
        self._last_maintenance_wall = self.clock()
        res = await self._thread(lambda: self.store.maintain(
            now_ms=int(self.clock() * 1000), retention_ms=int(self.cfg.retention_days * 86_400_000),
            vacuum_retention_hours=self.cfg.vacuum_retention_hours))
        self.metrics["maintenance_runs"] += 1
        log.info("tier maintenance: %s", res)
        return res

    # ------------------------------------------------------------------ metrics
    def collector(self) -> TierCollector:
        return TierCollector(self)


class TierCollector:
    """Prometheus view of the uploader, read at scrape time."""

    def __init__(self, up: TierUploader) -> None:
        self.up = up

    def collect(self):
        up = self.up
        yield GaugeMetricFamily("electra_tier_upload_lag_entries",
                                "applied index minus the index uploaded to the tier (leader; 0 elsewhere)",
                                value=up.lag_entries())
        yield GaugeMetricFamily("electra_tier_upload_lag_seconds",
                                "age of the state the tier reflects while it lags (leader)", value=up.lag_seconds())
        yield GaugeMetricFamily("electra_tier_uploaded_index", "events table progress (Raft index)",
                                value=up.uploaded)
        yield GaugeMetricFamily("electra_tier_snapshot_index", "newest snapshot in the tier (Raft index)",
                                value=up.snapshot_uploaded)
        yield GaugeMetricFamily("electra_tier_uploading", "1 while this node uploads", value=1 if up.active_term else 0)
        m = CounterMetricFamily("electra_tier", "uploader counters", labels=["what"])  # exported as electra_tier_total
        for k, v in up.metrics.items():
            m.add_metric([k], v)
        yield m
