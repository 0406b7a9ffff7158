#!/usr/bin/env bash
# Regenerates the committed protobuf modules in auditor/proto/ from proto/.
# With --check, generates into a scratch directory and fails if the committed
# files differ (so a .proto edit without regeneration cannot land).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
out=.
if [ "${1:-}" = "--check" ]; then
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi
protos=$(cd proto && find auditor -name '*.proto' | sort)
(cd proto && "../$PY" -m grpc_tools.protoc -I. \
  --plugin=protoc-gen-mypy="../$(dirname "$PY")/protoc-gen-mypy" \
  --plugin=protoc-gen-mypy_grpc="../$(dirname "$PY")/protoc-gen-mypy_grpc" \
  --python_out="$( [ "$out" = . ] && echo .. || echo "$out")" \
  --mypy_out="$( [ "$out" = . ] && echo .. || echo "$out")" \
  $protos)
if [ "${1:-}" = "--check" ]; then
  status=0
  for f in $(cd "$out" && find auditor -name '*_pb2*.py*' | sort); do
    if ! cmp -s "$out/$f" "$f"; then
      echo "generated code is stale: $f (run: make proto)" >&2
      status=1
    fi
  done
  exit $status
fi
