"""Spark (local, no Delta jars) reads the tier tables through `TierReader.spark_read`: the Delta file list."""

from __future__ import annotations

import uuid

import pyarrow.parquet as pq
import pytest

from electra.state.journal import JournalEntry
from electra.state.machine import BrokerSet
from electra.tiering.reader import TierReader
from electra.tiering.schema import event_rows, events_table, snapshot_rows, snapshots_table
from electra.tiering.store import TierStore

pytestmark = pytest.mark.integration


def test_spark_reads_events_and_snapshots_without_orphans(tmp_path):
    from pyspark.sql import SparkSession

    uri = str(tmp_path / "tier")
    store = TierStore(uri)
    store.ensure()
    entries = [JournalEntry(i, 1, 1000 + i, {"type": "ApplyBrokerId", "brokerName": f"b{i % 3}", "newBrokerId": i,
                                              "registerCheckCode": f"a;{i}"}, "c", None) for i in range(1, 31)]
    for lo in (0, 10, 20):
        store.commit("events", events_table(event_rows(entries[lo:lo + 10], 1)), upto=lo + 10, upto_term=1,
                     uploader_term=1, expect_upto=lo)
    sets = [BrokerSet("c", "b0", 3, {1: ("a:1", "a:1;1"), 2: ("a:2", "a:2;2")}, 1, 1, {1, 2}, 2)]
    store.commit("snapshots", snapshots_table(snapshot_rows(sets, 30, 1, 1030, 1)), upto=30, upto_term=1,
                 uploader_term=1, expect_upto=None)
    # An orphan file (a failed commit's data) sits in the directory; readers must not see it.
    pq.write_table(events_table(event_rows(entries[:5], 9)),
                   tmp_path / "tier" / "events" / f"part-00000-{uuid.uuid4()}-c000.snappy.parquet")
    reader = TierReader(uri)
    spark = (SparkSession.builder.master("local[1]").appName("tier-reader-test")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "1").getOrCreate())
    try:
        ev = reader.spark_read(spark, "events", use_delta_spark=False)
        assert ev.count() == 30
        assert sorted(r["index"] for r in ev.select("index").collect()) == list(range(1, 31))
        snap = reader.spark_read(spark, "snapshots", use_delta_spark=False)
        rows = {r["name"]: r for r in snap.collect()}
        assert rows[None]["sets_count"] == 1 and list(rows["b0"]["broker_addrs"]) == ["a:1", "a:2"]
    finally:
        spark.stop()
