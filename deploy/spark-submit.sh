#!/usr/bin/env bash
# Submit the Electra streaming job to a Spark cluster (or run it locally with MASTER=local[2]).
#
# Required:  BOOTSTRAP    Kafka bootstrap servers, host:port[,host:port]
#            CONTROLLERS  controller HTTP endpoints, h:p,h:p,h:p
#            CHECKPOINT   checkpoint directory on storage every node sees (hdfs://, s3a://, or a shared path)
# Optional:  MASTER (default local[2]), DEPLOY_MODE (client), TRIGGER_MS (1000), SHUFFLE_PARTITIONS (8),
#            TOPIC_PREFIX (''), SOURCE (auto|kafka|python, default auto), HWM_FIX (false on real Kafka),
#            PYSPARK_PYTHON (the Python with `electra` installed, same path on every node),
#            KAFKA_PACKAGE (e.g. org.apache.spark:spark-sql-kafka-0-10_2.13:4.1.0 to use Spark's own source),
#            EXTRA_ARGS (more spark-submit arguments), JOB_ARGS (more job arguments),
#            LOCAL_FS_JAR (the java.nio local file system's jar; default: built or found, '' for Hadoop's).
set -euo pipefail

: "${BOOTSTRAP:?set BOOTSTRAP=host:port[,host:port]}"
: "${CONTROLLERS:?set CONTROLLERS=h:p,h:p,h:p}"
: "${CHECKPOINT:?set CHECKPOINT to a durable directory}"
MASTER=${MASTER:-local[2]}
DEPLOY_MODE=${DEPLOY_MODE:-client}
TRIGGER_MS=${TRIGGER_MS:-1000}
SHUFFLE_PARTITIONS=${SHUFFLE_PARTITIONS:-8}
TOPIC_PREFIX=${TOPIC_PREFIX:-}
SOURCE=${SOURCE:-auto}
HWM_FIX=${HWM_FIX:-false}
PYSPARK_PYTHON=${PYSPARK_PYTHON:-$(command -v python3)}
SPARK_SUBMIT=${SPARK_SUBMIT:-spark-submit}

here=$(cd "$(dirname "$0")" && pwd)
entry="$here/run_job.py"

args=(--master "$MASTER" --deploy-mode "$DEPLOY_MODE" --name electra-streaming
      --conf "spark.pyspark.python=$PYSPARK_PYTHON"
      --conf "spark.pyspark.driver.python=$PYSPARK_PYTHON"
      --conf "spark.sql.streaming.stateStore.providerClass=org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
      --conf "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled=true"
      --conf "spark.sql.shuffle.partitions=$SHUFFLE_PARTITIONS")
# Checkpoint files without a chmod process each (streaming/local_fs_jar.py): the image ships the jar
# (ELECTRA_CACHE_DIR); elsewhere it is compiled once if a JDK is there. Driver and executors load it from
# the same path (the same image, or the same install on every node, like PYSPARK_PYTHON). LOCAL_FS_JAR=''
# keeps Hadoop's own local file system.
LOCAL_FS_JAR=${LOCAL_FS_JAR-$("$PYSPARK_PYTHON" -m electra.streaming.local_fs_jar 2>/dev/null || true)}
if [[ -n "$LOCAL_FS_JAR" ]]; then
  args+=(--conf "spark.driver.extraClassPath=$LOCAL_FS_JAR" --conf "spark.executor.extraClassPath=$LOCAL_FS_JAR"
         --conf "spark.hadoop.fs.file.impl=electra.hadoop.NioLocalFileSystem"
         --conf "spark.hadoop.fs.AbstractFileSystem.file.impl=electra.hadoop.NioLocalFs")
fi
if [[ -n "${KAFKA_PACKAGE:-}" ]]; then
  args+=(--packages "$KAFKA_PACKAGE")
fi
job=(--bootstrap "$BOOTSTRAP" --controllers "$CONTROLLERS" --checkpoint "$CHECKPOINT"
     --trigger-ms "$TRIGGER_MS" --shuffle-partitions "$SHUFFLE_PARTITIONS" --topic-prefix "$TOPIC_PREFIX"
     --source "$SOURCE")
if [[ "$HWM_FIX" != "true" ]]; then
  job+=(--no-hwm-fix)
fi
# SIGTERM/SIGINT to this script are forwarded to the Python driver only (a child of the spark-submit
# JVM), which stops the query after the batch in flight and then Spark; a signal to the JVM itself
# would run its shutdown hooks first and fail the query mid-batch.
# shellcheck disable=SC2086
"$SPARK_SUBMIT" "${args[@]}" ${EXTRA_ARGS:-} "$entry" "${job[@]}" ${JOB_ARGS:-} &
submit=$!
forward() {
  local child
  for child in $(pgrep -P "$submit" -f "$entry" 2>/dev/null); do
    kill -TERM "$child" 2>/dev/null || true
  done
}
trap forward TERM INT
rc=0
while kill -0 "$submit" 2>/dev/null; do
  wait "$submit" && rc=0 || rc=$?
done
exit "$rc"
