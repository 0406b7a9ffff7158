#!/usr/bin/env bash
# Runs `bk-auditor scan` (or `snapshot`) on Kubernetes with spark-submit in cluster mode:
# driver and executors are pods of the image deploy/spark/Dockerfile builds, in the
# namespace deploy/spark/k8s sets up (kubectl apply -k deploy/spark/k8s first).
#
#   K8S_API=https://10.0.0.1:6443 deploy/spark/submit-k8s.sh \
#       scan --engine spark \
#       --metadata-service-uri 'zk+hierarchical://zookeeper-0.zookeeper:2181;zookeeper-1.zookeeper:2181/ledgers' \
#       --config /etc/bk-auditor/auditor.toml --out /scans/scan-$(date -u +%Y%m%dT%H%M%SZ)
#
# Everything after the script's name is bk-auditor's command line, as the driver pod runs
# it: paths are the pods' (/etc/bk-auditor from the ConfigMap, /scans the shared volume).
# spark-submit waits for the driver to finish; the script then exits with the driver
# container's exit code: 0 clean, 1 violations, 2 could not run (kubectl must be set up
# for the same cluster and namespace).
#
# Environment (defaults in brackets):
#   K8S_API         the API server URL (required); `kubectl cluster-info` shows it
#   NAMESPACE       [bookkeeper]
#   IMAGE           [bk-auditor-spark:0.1.0] as pushed to a registry the nodes pull from
#   EXECUTORS       [4] executor pods
#   EXECUTOR_CORES  [2] task slots per executor
#   EXECUTOR_MEMORY [2g]
#   DRIVER_MEMORY   [2g]
#   SPARK_SUBMIT    [spark-submit] from a Spark distribution of the image's Spark version
#   SUBMIT_OPTS     more spark-submit options, split on spaces
set -euo pipefail

: "${K8S_API:?set K8S_API to the Kubernetes API server URL, e.g. https://10.0.0.1:6443}"
NAMESPACE=${NAMESPACE:-bookkeeper}
IMAGE=${IMAGE:-bk-auditor-spark:0.1.0}
EXECUTORS=${EXECUTORS:-4}
EXECUTOR_CORES=${EXECUTOR_CORES:-2}
EXECUTOR_MEMORY=${EXECUTOR_MEMORY:-2g}
DRIVER_MEMORY=${DRIVER_MEMORY:-2g}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
[ "$#" -gt 0 ] || {
    echo "submit-k8s: give bk-auditor's arguments, e.g. scan --engine spark --zk ... --out /scans/DIR" >&2
    exit 2
}
case "$1" in
    scan | snapshot) ;;
    *)
        echo "submit-k8s: the first argument is the command, scan or snapshot; got '$1'" >&2
        exit 2
        ;;
esac
driver_pod="bk-auditor-$1-$(date -u +%Y%m%d%H%M%S)-driver"

# spark.default.parallelism: every task slot of the job. The scan splits
# checks.bookie_max_in_flight by it, and by default plans two id ranges per slot; left
# unset it is the cores registered when the scan plans (at least 2). Dynamic allocation
# stays off for the same reason: executors added later would exceed the split cap.
submitted=0
# shellcheck disable=SC2086  # SUBMIT_OPTS is a list of options on purpose
"${SPARK_SUBMIT:-spark-submit}" \
    --master "k8s://$K8S_API" \
    --deploy-mode cluster \
    --conf spark.kubernetes.namespace="$NAMESPACE" \
    --conf spark.kubernetes.authenticate.driver.serviceAccountName=bk-auditor-spark \
    --conf spark.kubernetes.container.image="$IMAGE" \
    --conf spark.kubernetes.driver.pod.name="$driver_pod" \
    --conf spark.kubernetes.driver.podTemplateFile="$here/k8s/pod-template.yaml" \
    --conf spark.kubernetes.executor.podTemplateFile="$here/k8s/pod-template.yaml" \
    --conf spark.driver.port=7078 \
    --conf spark.blockManager.port=7079 \
    --conf spark.driver.memory="$DRIVER_MEMORY" \
    --conf spark.executor.instances="$EXECUTORS" \
    --conf spark.executor.cores="$EXECUTOR_CORES" \
    --conf spark.executor.memory="$EXECUTOR_MEMORY" \
    --conf spark.default.parallelism="$((EXECUTORS * EXECUTOR_CORES))" \
    --conf spark.dynamicAllocation.enabled=false \
    ${SUBMIT_OPTS:-} \
    local:///opt/bk-auditor/scan_job.py "$@" || submitted=$?

# The scan's own exit code is the driver container's; spark-submit's says only whether
# the submission and the wait worked.
code=$(kubectl --namespace "$NAMESPACE" get pod "$driver_pod" \
    -o jsonpath='{.status.containerStatuses[0].state.terminated.exitCode}' 2>/dev/null) || code=""
if [ -z "$code" ]; then
    echo "submit-k8s: no finished driver pod $driver_pod (spark-submit exited $submitted)" >&2
    exit 2
fi
echo "submit-k8s: driver $driver_pod exited $code; logs: kubectl -n $NAMESPACE logs $driver_pod" >&2
exit "$code"
