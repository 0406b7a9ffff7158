#!/usr/bin/env bash
# Packs bookkeeper-auditor into a virtualenv archive for Spark executors (YARN, standalone):
# the "venv-pack" way of PySpark's Python package management.
#
#   deploy/spark/pack-venv.sh [DIR]        (DIR defaults to the current directory)
#
# Writes DIR/pyspark_venv/ (a virtualenv with this checkout and pyarrow installed; use
# DIR/pyspark_venv/bin/python as the driver's Python in client mode) and
# DIR/pyspark_venv.tar.gz (ship it with `--archives pyspark_venv.tar.gz#environment`
# and PYSPARK_PYTHON=./environment/bin/python; see deploy/spark/submit.sh).
#
# venv-pack does not pack the interpreter: the archive's bin/python is a link to the
# Python that made the venv ($PYTHON, default python3.11, resolved to its real path).
# Every executor host needs that same Python at that same path, and the same OS and CPU
# architecture as this machine (pyarrow and grpcio are binary wheels). Where that does
# not hold, use the container image (deploy/spark/Dockerfile) instead.
#
# The dependencies are pinned by the checkout's constraints.txt (as a release installs
# them). A DIR/pyspark_venv this script made earlier from the same pyproject.toml,
# constraints.txt, script and interpreter is kept: only the project is installed again
# (no download) and the archive packed anew, seconds instead of minutes.
set -euo pipefail

PYTHON=${PYTHON:-python3.11}
dest=$(cd "${1:-.}" && pwd)
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
venv="$dest/pyspark_venv"

"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
    echo "pack-venv: $PYTHON is older than Python 3.11; set PYTHON=/path/to/python3.11+" >&2
    exit 2
}
# Built from a copy of the sources, so the checkout gets no build/ directory.
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
cp -r "$repo/pyproject.toml" "$repo/setup.py" "$repo/MANIFEST.in" "$repo/README.md" \
    "$repo/build_support" "$repo/auditor" "$src/"
# The executors get the pure-Python package unless BK_AUDITOR_MYPYC says otherwise: a wheel
# compiled here runs only on the same Python and platform, and compiling needs mypy in the
# build (`make dist` ships the compiled wheel for systemd installs; README, "Installing").
export BK_AUDITOR_MYPYC="${BK_AUDITOR_MYPYC:-0}"

python_real=$("$PYTHON" -c 'import os, sys; print(os.path.realpath(sys.executable))')
stamp=$(cat "$repo/pyproject.toml" "$repo/constraints.txt" "${BASH_SOURCE[0]}" \
    <(echo "$python_real") | sha256sum | cut -d' ' -f1)

rm -f "$dest/pyspark_venv.tar.gz"
# A regular (not editable) install: the code must be inside the venv to travel with it.
# pyspark is not installed: the executors' Spark puts its own on the workers' path.
if [ -f "$venv/.pack-venv-stamp" ] && [ "$(cat "$venv/.pack-venv-stamp")" = "$stamp" ]; then
    "$venv/bin/python" -m pip install --quiet --no-deps --no-build-isolation \
        --force-reinstall "$src"
else
    rm -rf "$venv"
    "$PYTHON" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --upgrade pip
    # setuptools and wheel: the project's build backend, for the reinstall above.
    "$venv/bin/python" -m pip install --quiet -c "$repo/constraints.txt" \
        "$src[scan]" venv-pack 'setuptools>=77' wheel
    echo "$stamp" >"$venv/.pack-venv-stamp"
fi
"$venv/bin/venv-pack" --quiet --prefix "$venv" --output "$dest/pyspark_venv.tar.gz"
echo "pack-venv: wrote $dest/pyspark_venv.tar.gz (interpreter: $(readlink -f "$venv/bin/python"))"
