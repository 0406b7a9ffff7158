#!/usr/bin/env bash
# Runs `bk-auditor scan` (or `snapshot`) with spark-submit on YARN or a standalone Spark
# cluster, the executors' Python and code coming from the archive deploy/spark/pack-venv.sh
# made. Client mode: the driver runs here, so the exit code (0 clean, 1 violations,
# 2 could not run) is this script's, and the report is printed here.
#
#   MASTER=spark://spark-master:7077 deploy/spark/submit.sh \
#       scan --engine spark --zk zk1:2181,zk2:2181 --out /mnt/scans/2026-11-22
#
# Everything after the script's name is bk-auditor's command line (see docs/spark.md).
#
# Environment:
#   MASTER        spark-submit --master (required): yarn, spark://HOST:7077, ...
#   VENV_DIR      where pack-venv.sh wrote pyspark_venv/ and pyspark_venv.tar.gz
#                 (default: the current directory)
#   SPARK_SUBMIT  the spark-submit to run (default: spark-submit on PATH); use the one of
#                 the Spark version the cluster runs
#   SUBMIT_OPTS   more spark-submit options, split on spaces
#                 (e.g. "--num-executors 8 --executor-cores 2 --executor-memory 2g")
set -euo pipefail

: "${MASTER:?set MASTER to the cluster manager URL (yarn, spark://HOST:7077, ...)}"
[ -d "${VENV_DIR:-.}" ] || { echo "submit: VENV_DIR ${VENV_DIR:-.} is not a directory" >&2; exit 2; }
venv_dir=$(cd "${VENV_DIR:-.}" && pwd)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
[ -f "$venv_dir/pyspark_venv.tar.gz" ] || {
    echo "submit: no $venv_dir/pyspark_venv.tar.gz; run deploy/spark/pack-venv.sh first" >&2
    exit 2
}
[ "$#" -gt 0 ] || {
    echo "submit: give bk-auditor's arguments, e.g. scan --engine spark --zk ... --out DIR" >&2
    exit 2
}

# The driver runs the unpacked venv here; executors run the copy Spark unpacks next to
# them as ./environment (the name after '#').
export PYSPARK_DRIVER_PYTHON="$venv_dir/pyspark_venv/bin/python"
export PYSPARK_PYTHON=./environment/bin/python

# shellcheck disable=SC2086  # SUBMIT_OPTS is a list of options on purpose
exec "${SPARK_SUBMIT:-spark-submit}" \
    --master "$MASTER" \
    --deploy-mode client \
    --archives "$venv_dir/pyspark_venv.tar.gz#environment" \
    ${SUBMIT_OPTS:-} \
    "$here/scan_job.py" "$@"
