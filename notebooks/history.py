# Databricks notebook source
# MAGIC %md
# MAGIC # Controller history from the Delta tier
# MAGIC Loads the `events` and `snapshots` tables that the Electra controller leader uploads
# MAGIC (see docs/tiering.md), shows the state of every broker set as of an instant, the events
# MAGIC between two instants, and the same tables as Spark DataFrames.

# COMMAND ----------

import os

from electra.tiering.reader import TierReader, iso

TIER_URI = os.environ.get("ELECTRA_TIER_URI", ".electra/tier")
STORAGE_OPTIONS = None  # e.g. {"AWS_REGION": "eu-west-1"} for an s3:// URI
reader = TierReader(TIER_URI, STORAGE_OPTIONS)

# COMMAND ----------

# pandas via delta-rs: the newest version of each table.
events = reader.to_pandas("events").sort_values(["index", "seq"])
snapshots = reader.to_pandas("snapshots")
print(len(events), "events;", snapshots["snapshot_index"].nunique(), "snapshots")
events.groupby("type").size()

# COMMAND ----------

# State of every broker set as of an instant (ISO-8601 or epoch ms), and the events of the hour before it.
at_ms = int(events["ts_ms"].max()) if len(events) else 0
state = reader.state_at(at_ms)
print("as of", state["at"], "= Raft index", state["index"], "complete:", state["complete"])
for bs in state["brokerSets"]:
    print(bs["brokerName"], "master", bs["masterBrokerId"], "epoch", bs["masterEpoch"], "in sync", bs["syncStateSet"])
window = reader.events_between(at_ms - 3_600_000, at_ms)
print(len(window["events"]), "events since", iso(at_ms - 3_600_000), "gaps:", window["gaps"])

# COMMAND ----------

# Spark: the Parquet files of the current Delta version (no Delta jars needed), or
# spark.read.format("delta") when ELECTRA_TIER_DELTA_SPARK=1 and delta-spark resolves on the cluster.
try:
    spark  # noqa: B018 - defined on Databricks
except NameError:
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.master("local[2]").appName("electra-history").getOrCreate()
events_df = reader.spark_read(spark, "events")
events_df.groupBy("broker_set", "type").count().orderBy("broker_set", "type").show(50, truncate=False)

# COMMAND ----------

# Masters over time per broker set, from the ElectMaster events.
from pyspark.sql import functions as F  # noqa: E402

(events_df.where(F.col("type") == "ElectMaster")
 .select("broker_set", "index", F.timestamp_millis("ts_ms").alias("time"),
         F.get_json_object("payload", "$.newMasterBrokerId").alias("master"),
         F.get_json_object("payload", "$.masterEpoch").alias("epoch"))
 .orderBy("broker_set", "index").show(50, truncate=False))
