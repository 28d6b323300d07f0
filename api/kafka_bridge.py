"""The controller node's two links to Kafka: it publishes applied events and consumes liveness.

`EventsPublisher` runs on every node and publishes only while this node leads: every
event the state machine applied, with its Raft index and term and the set's
resulting state, to the one-partition events topic, in index order. On becoming
leader (and after any Kafka error) it reads the topic's last record and resumes
right after that index, so leader changes leave neither gaps nor repeats in the
normal case. Two leaders can overlap briefly (a deposed leader that has not heard
of its successor yet); both publish the same entries for the same indexes, since
the log is the same, and consumers drop any index they have already seen. When
the journal no longer holds the events after the topic's last index (the topic
was lost with a Kafka restart, or this node restarted from a snapshot), the
publisher writes one `Resync` record per broker set with its current state
instead of inventing history.

`LivenessConsumer` runs on every node: it follows the liveness topic written by
the streaming job and keeps the node's `LivenessTable`, which broker- and
admin-triggered requests copy into their commands.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from electra.consensus.core import Role
from electra.security.kafka_settings import kafka_client_kwargs
from electra.state.journal import JournalEntry, JournalGap
from electra.state.liveness import BrokerLiveInfo
from electra.streaming import records
from electra.streaming.kafka_io import end_offsets, ensure_topics, last_record, topic_partitions

from .connection_loss import Connected, Disconnected, Unvouched

if TYPE_CHECKING:
    from .controller import Controller

log = logging.getLogger("electra.api.kafka")


# How long a fetch of the liveness topic may wait for records: a crashed broker's `disconnected` record waits
# for it, on its way to the connection-loss lane, when the topic is quiet. kafka-python's default (500 ms)
# put 132 ms at the median and 257 ms at worst between produce and consume on tansu here; 200 ms puts 31 and
# 80 ms, for 28 ms of CPU a second per node while the topic is idle (consumer and tansu; 16 with 500 ms).
LIVENESS_FETCH_WAIT_MS = 200


class EventsPublisher:
    def __init__(self, svc: Controller, bootstrap: str, topics: records.Topics, *,
                 batch: int = 5000, hwm_fix: bool = True) -> None:
        self.svc = svc
        self.bootstrap = bootstrap
        self.topics = topics
        self.topic = topics.events
        self.batch = batch
        self.hwm_fix = hwm_fix
        self.published_index = 0  # last index known to be in the topic (while leading)
        self.stats = {"published": 0, "resyncs": 0, "errors": 0}
        self._producer: KafkaProducer | None = None
        self._building: asyncio.Future[KafkaProducer] | None = None  # a producer its thread is still constructing
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="events-publisher")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        building, self._building = self._building, None
        if building is not None and self._producer is None:  # the task left while its thread built one
            with contextlib.suppress(Exception):
                self._producer = await building
        if self._producer is not None:
            await asyncio.to_thread(self._producer.close, 5)

    def _leading(self, term: int) -> bool:
        node = self.svc.node
        return node.role == Role.LEADER and node.core is not None and node.core.term == term

    async def _run(self) -> None:
        backoff = 0.2
        while True:
            node = self.svc.node
            if node.role != Role.LEADER or node.core is None:
                await asyncio.sleep(0.1)
                continue
            term = node.core.term
            try:
                await self._lead(term)
                backoff = 0.2
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.stats["errors"] += 1
                log.warning("events publisher: %s; retrying in %.1fs", exc, backoff)
                producer, self._producer = self._producer, None  # start over with a fresh connection
                if producer is not None:
                    await asyncio.to_thread(producer.close, 1)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    async def _lead(self, term: int) -> None:
        """Publish from the topic's last index while this node leads in `term`."""
        # bounded: its thread cannot be cancelled, and a stopping node waits for it (the loop retries instead)
        await asyncio.to_thread(ensure_topics, self.bootstrap, self.topics.partitions(), 5.0)
        if self._producer is None:
            # Shielded: a thread cannot be cancelled, so a stop arriving meanwhile leaves the build running
            # and `stop()` closes what it returns (its sender thread and sockets would otherwise outlive us).
            self._building = asyncio.ensure_future(asyncio.to_thread(
                KafkaProducer, bootstrap_servers=self.bootstrap, client_id="electra-events", acks="all",
                # Not idempotent: an idempotent producer dies for good when Kafka comes back without its
                # producer state (tansu restarts empty). Duplicates are harmless: records carry the index.
                enable_idempotence=False, linger_ms=2, retries=5, max_block_ms=5000, request_timeout_ms=5000,
                delivery_timeout_ms=15_000, metrics_enabled=False, **kafka_client_kwargs()))
            self._producer = await asyncio.shield(self._building)
            self._building = None
        last = await asyncio.to_thread(self._last_published_index)
        self.published_index = last
        log.info("events publisher: leading in term %d; topic %s ends at index %d", term, self.topic, last)
        journal = self.svc.journal
        while self._leading(term):
            try:
                entries = journal.since(last, self.batch)
            except JournalGap as gap:
                entries = self._resync_entries()
                self.stats["resyncs"] += 1
                log.warning("events publisher: %s; publishing the state of %d broker sets instead (Resync)",
                            gap, len(entries))
            if not entries:
                await journal.wait(0.5)
                continue
            if not self._leading(term):
                return
            await asyncio.to_thread(self._produce, entries)
            last = entries[-1].index
            self.published_index = last
            self.stats["published"] += len(entries)

    def _resync_entries(self) -> list[JournalEntry]:
        """Every broker set's current state, stamped with the applied index (taken on the loop: consistent)."""
        sm = self.svc.sm
        index = self.svc.node.applied
        term = self.svc.node.core.term_at(index) or self.svc.node.core.term
        now = self.svc.now_ms()
        return [JournalEntry(index, term, now, {"type": "Resync", "brokerName": name}, bs.cluster, bs.view())
                for name, bs in sorted(sm.sets.items())] or [
                JournalEntry(index, term, now, {"type": "Resync", "brokerName": None}, None, None)]

    def _produce(self, entries: list[JournalEntry]) -> None:
        p = self._producer
        futures = []
        for e in entries:
            value = records.event_record(e.index, e.term, e.ts, e.event, e.public_state(), e.cluster)
            key = (e.event.get("brokerName") or "").encode()
            futures.append(p.send(self.topic, key=key, value=records.encode(value), partition=0))
        p.flush(timeout=10)
        for f in futures:
            f.get(timeout=0)  # raises the delivery error, if any

    def _last_published_index(self) -> int:
        consumer = KafkaConsumer(bootstrap_servers=self.bootstrap, client_id="electra-events-tail",
                                 enable_auto_commit=False, request_timeout_ms=5000, **kafka_client_kwargs())
        try:
            rec = last_record(consumer, TopicPartition(self.topic, 0), hwm_fix=self.hwm_fix)
        finally:
            consumer.close()
        return records.decode(rec.value)["index"] if rec is not None else 0


@dataclass(frozen=True, slots=True)
class GraceStated:
    """The streaming job's disconnect grace, as a liveness record states it (`records.liveness_grace_ms`)."""

    ms: int


class LivenessConsumer:
    """Follows the liveness topic in a thread and applies its records on the event loop: the job's view of
    every set's brokers, and the ingest workers' `disconnected` records (api/connection_loss.py)."""

    def __init__(self, svc: Controller, bootstrap: str, topic: str = records.LIVENESS, *,
                 replay_s: float = 120.0, reset_check_s: float = 3.0, hwm_fix: bool = True) -> None:
        self.svc = svc
        self.bootstrap = bootstrap
        self.topic = topic
        self.replay_s = replay_s
        self.reset_check_s = reset_check_s  # quiet this long: check whether the topic was truncated
        self.hwm_fix = hwm_fix
        self.stats = {"records": 0, "bad_records": 0, "last_record_ms": 0, "rewinds": 0, "disconnects": 0,
                      "silences": 0, "sessions_opened": 0, "sessions_unvouched": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="liveness-consumer", daemon=True)
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread.start()

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.to_thread(self._thread.join, 10)

    def _run(self) -> None:
        backoff = 0.2
        while not self._stop.is_set():
            try:
                self._follow()
                backoff = 0.2
            except Exception as exc:
                log.warning("liveness consumer: %s; retrying in %.1fs", exc, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)

    def _follow(self) -> None:
        consumer = KafkaConsumer(bootstrap_servers=self.bootstrap, client_id="electra-liveness",
                                 enable_auto_commit=False, auto_offset_reset="earliest", request_timeout_ms=5000,
                                 fetch_max_wait_ms=LIVENESS_FETCH_WAIT_MS, metrics_enabled=False,
                                 **kafka_client_kwargs())
        probe = KafkaConsumer(bootstrap_servers=self.bootstrap, client_id="electra-liveness-probe",
                              enable_auto_commit=False, request_timeout_ms=5000, metrics_enabled=False,
                              **kafka_client_kwargs())
        try:
            tps = topic_partitions(consumer, self.topic)
            consumer.assign(tps)
            # Older records only describe brokers that have timed out since: start a little before now.
            since = int((time.time() - self.replay_s) * 1000)
            try:
                starts = consumer.offsets_for_times({tp: since for tp in tps})
            except Exception:
                starts = {}
            for tp in tps:
                if starts.get(tp) is not None:
                    consumer.seek(tp, starts[tp].offset)
                else:
                    consumer.seek_to_beginning(tp)
            quiet_since = time.monotonic()
            while not self._stop.is_set():
                polled = consumer.poll(timeout_ms=200, max_records=20_000)
                if polled:
                    quiet_since = time.monotonic()
                elif time.monotonic() - quiet_since > self.reset_check_s:
                    quiet_since = time.monotonic()
                    self._rewind_if_truncated(consumer, probe, tps)
                batch = [s for msgs in polled.values() for m in msgs for s in self._items_of(m.value)]
                if batch:
                    self._loop.call_soon_threadsafe(self._apply, batch)
        finally:
            consumer.close()
            probe.close()

    def _items_of(self, value: bytes) -> list:
        """What one liveness-topic record holds: the job's sets, each (cluster, set, its brokers' records), and
        the grace it states (`GraceStated`); or an ingest worker's `Disconnected` (a session's end or silence),
        `Connected` (a session's opening heartbeat) or `Unvouched` (a session it stopped speaking for without either;
        api/connection_loss.py).

        A record or a set that does not decode is counted in `bad_records` and skipped.
        """
        try:
            d = records.decode(value)
        except ValueError:
            d = None
        for kind, parse in ((records.is_disconnected, Disconnected.from_record), (records.is_silent,
                            Disconnected.from_silent), (records.is_connected, Connected.from_record),
                           (records.is_unvouched, Unvouched.from_record)):
            if kind(d):
                try:
                    return [parse(d)]
                except ValueError:
                    self.stats["bad_records"] += 1
                    return []
        sets = records.liveness_sets(d)
        if not sets:
            self.stats["bad_records"] += 1
        grace = records.liveness_grace_ms(d)
        out: list = [] if grace is None else [GraceStated(grace)]
        for d in sets:
            try:
                out.append((d["clusterName"], d["brokerName"], [BrokerLiveInfo.from_wire(b) for b in d["brokers"]]))
            except (ValueError, KeyError, TypeError):
                self.stats["bad_records"] += 1
        return out

    def _rewind_if_truncated(self, consumer: KafkaConsumer, probe: KafkaConsumer, tps: list) -> None:
        """After Kafka lost its data (tansu restarts empty) our position lies past the new end, and a
        fetch there just returns nothing: start again from the new beginning."""
        ends = end_offsets(probe, tps, hwm_fix=self.hwm_fix)
        for tp in tps:
            if consumer.position(tp) > ends[tp]:
                log.warning("liveness topic %s[%d] ends at %d, before our position %d (Kafka lost data?); "
                            "reading it from the beginning", tp.topic, tp.partition, ends[tp], consumer.position(tp))
                consumer.seek_to_beginning(tp)
                self.stats["rewinds"] += 1

    def _apply(self, batch: list) -> None:
        table = self.svc.liveness
        newest = 0
        sets = 0
        disconnects = []
        for item in batch:
            if type(item) is tuple:
                cluster, name, infos = item
                sets += 1
                for info in infos:
                    table.put(cluster, name, info)
                    newest = max(newest, info.last_update_ms)
            elif type(item) is GraceStated:
                table.disconnect_grace_ms = item.ms
            elif type(item) is Connected:  # a session opened: a heartbeat, not the job's view (no horizon)
                i = item.info
                table.on_heartbeat(item.cluster, item.name, i.broker_id, i.broker_addr, i.last_update_ms,
                                   timeout_ms=i.timeout_ms, epoch=i.epoch, max_offset=i.max_offset,
                                   confirm_offset=i.confirm_offset, priority=i.priority)
                table.session_opened(item.cluster, item.name, i.broker_id, i.last_update_ms)
                self.stats["sessions_opened"] += 1
            elif type(item) is Unvouched:  # that session no longer speaks for its broker (nothing is failed over)
                table.session_ended(item.cluster, item.name, item.broker_id, item.opened_ms)
                self.stats["sessions_unvouched"] += 1
            else:
                disconnects.append(item)
                # its session vouches for the broker no more, whatever the lane then makes of the record
                table.session_ended(item.cluster, item.name, item.broker_id, item.opened_ms)
        if disconnects:  # after the batch's heartbeats: one stamped after a disconnect means it reconnected
            silences = sum(d.reason == records.SILENT for d in disconnects)
            self.stats["disconnects"] += len(disconnects) - silences
            self.stats["silences"] += silences
            self.svc.connection_loss.on_disconnects(disconnects, self.svc.now_ms())
        if newest:
            # The records' newest ingest stamp is the job's data horizon as far as this node knows
            # (LivenessTable.judge_at). Never past this node's clock: a stamp from a clock running
            # ahead, or a forged one, must not hold the horizon where the clock cannot catch up.
            table.advance_horizon(min(newest, self.svc.now_ms()))
        if sets:  # the job's records only: the ingest workers' say nothing about whether the job is alive
            self.stats["records"] += sets
            self.stats["last_record_ms"] = self.svc.now_ms()
        if newest:
            self.svc.connection_loss.on_view()  # what waits for the job's view is looked at again now
