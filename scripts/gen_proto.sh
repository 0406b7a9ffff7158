#!/usr/bin/env bash
# Regenerates the committed protobuf modules in auditor/proto/ from proto/.
# Protos that declare a service also get gRPC modules (_pb2_grpc.py and its
# typed stub). With --check, generates into a scratch directory and fails if
# the committed files differ (so a .proto edit without regeneration cannot land).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
out=.
if [ "${1:-}" = "--check" ]; then
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi
dest=$( [ "$out" = . ] && echo .. || echo "$out")
bin="../$(dirname "$PY")"
protos=$(cd proto && find auditor -name '*.proto' | sort)
services=$(cd proto && grep -l '^service ' $protos || true)
(cd proto && "../$PY" -m grpc_tools.protoc -I. \
  --plugin=protoc-gen-mypy="$bin/protoc-gen-mypy" \
  --python_out="$dest" \
  --mypy_out="quiet:$dest" \
  $protos)
if [ -n "$services" ]; then
  (cd proto && "../$PY" -m grpc_tools.protoc -I. \
    --plugin=protoc-gen-mypy_grpc="$bin/protoc-gen-mypy_grpc" \
    --grpc_python_out="$dest" \
    --mypy_grpc_out="quiet:$dest" \
    $services)
fi
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
