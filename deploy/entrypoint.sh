#!/bin/sh
# Container entrypoint of the Electra image.
#
#   executor    what Spark on Kubernetes starts in executor pods: the executor backend JVM,
#               configured by the SPARK_* variables Spark sets on the pod.
#   controller  `electra node` with its node id taken from the StatefulSet pod ordinal
#               (pod electra-0 is node 1, electra-1 node 2, ...), other settings from ELECTRA_* env.
#   anything else is run as given (electra ingest ..., deploy/spark-submit.sh, a shell).
set -eu

case "${1:-}" in
  executor)
    shift
    # Spark passes the executor's JVM options as SPARK_JAVA_OPT_0, SPARK_JAVA_OPT_1, ... in order.
    set --
    i=0
    while eval "[ -n \"\${SPARK_JAVA_OPT_$i+x}\" ]"; do
      eval "set -- \"\$@\" \"\$SPARK_JAVA_OPT_$i\""
      i=$((i + 1))
    done
    exec java -Xms"${SPARK_EXECUTOR_MEMORY}" -Xmx"${SPARK_EXECUTOR_MEMORY}" "$@" \
      -cp "${SPARK_HOME}/jars/*${SPARK_CLASSPATH:+:$SPARK_CLASSPATH}" \
      org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
      --driver-url "${SPARK_DRIVER_URL}" --executor-id "${SPARK_EXECUTOR_ID}" \
      --cores "${SPARK_EXECUTOR_CORES}" --app-id "${SPARK_APPLICATION_ID}" \
      --hostname "${SPARK_EXECUTOR_POD_IP}" --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID:-0}" \
      --podName "${SPARK_EXECUTOR_POD_NAME}"
    ;;
  controller)
    shift
    ordinal=${POD_NAME:-${HOSTNAME:?}}
    ordinal=${ordinal##*-}
    case "$ordinal" in
      ''|*[!0-9]*) echo "entrypoint: cannot take a node id from pod name ${POD_NAME:-$HOSTNAME}" >&2; exit 2 ;;
    esac
    ELECTRA_NODE_ID=$((ordinal + 1))
    export ELECTRA_NODE_ID
    exec electra node "$@"
    ;;
  *)
    exec "$@"
    ;;
esac
