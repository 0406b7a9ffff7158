#!/usr/bin/env bash
# The built wheel, installed as the docs install it: a fresh virtualenv, the wheel and
# constraints.txt, nothing from the checkout. Run by `make wheel-check` (part of `make test`).
#
#   scripts/check_wheel.sh WHEEL                    install WHEEL with -c constraints.txt,
#                                                   then `bk-auditor --version` and
#                                                   `bk-auditor selftest` from that venv
#   scripts/check_wheel.sh --freeze FILE WHEEL      re-pin: install WHEEL with its extras
#                                                   (all but dev and spark) and no
#                                                   constraints, write `pip freeze` to FILE
#                                                   (`make constraints`)
#
# The check also fails when the install pulled a package constraints.txt does not pin, or
# pinned differently (a dependency added to pyproject.toml without `make constraints`).
# $PYTHON (default python3, 3.11 or newer) makes the virtualenv; pip's cache is reused.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1

freeze_to=""
if [ "${1:-}" = "--freeze" ]; then
  freeze_to=${2:?usage: $0 --freeze FILE WHEEL}
  shift 2
fi
wheel=${1:?usage: $0 [--freeze FILE] WHEEL}
[ -f "$wheel" ] || { echo "check_wheel: no wheel $wheel (make dist)" >&2; exit 2; }
wheel=$(cd "$(dirname "$wheel")" && pwd)/$(basename "$wheel")
repo=$(pwd)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
venv=$tmp/venv
"$PYTHON" -m venv "$venv"
pip=("$venv/bin/python" -m pip --quiet)

# The project itself is never pinned; pip, setuptools and wheel are the venv's own.
installed() { "$venv/bin/python" -m pip freeze --exclude bookkeeper-auditor | LC_ALL=C sort; }
# NAME==VERSION lines with names normalised (PEP 503), sorted: to compare pin sets.
normalised() {
  grep -v '^#' | awk -F'==' 'NF == 2 { n = tolower($1); gsub(/[-_.]+/, "-", n); print n "==" $2 }' |
    LC_ALL=C sort
}

if [ -n "$freeze_to" ]; then
  # Every extra but dev (tools) and spark (PySpark must match the cluster's Spark).
  extras=$("$venv/bin/python" -c '
import sys, tomllib
extras = tomllib.load(open(sys.argv[1], "rb"))["project"].get("optional-dependencies", {})
print(",".join(sorted(set(extras) - {"dev", "spark"})))' "$repo/pyproject.toml")
  "${pip[@]}" install "$wheel${extras:+[$extras]}"
  "${pip[@]}" check
  {
    echo "# Exact versions of bk-auditor's runtime dependencies, with the extras ${extras:-(none)}"
    echo "# (not dev, not spark: PySpark must match your Spark),"
    echo "# as resolved for Python $("$venv/bin/python" -c 'import platform; print(platform.python_version())')."
    echo "# Install with them: pip install -c constraints.txt dist/<wheel> (the Dockerfile does)."
    echo "# Regenerate after a dependency change in pyproject.toml: make constraints"
    installed
  } >"$tmp/constraints.txt"
  mv "$tmp/constraints.txt" "$freeze_to"
  echo "check_wheel: wrote $freeze_to ($(grep -vc '^#' "$freeze_to") pins)"
  exit 0
fi

start=$SECONDS
"${pip[@]}" install -c "$repo/constraints.txt" "$wheel"
"${pip[@]}" check

# Everything installed is pinned, at the pinned version.
unpinned=$(LC_ALL=C comm -23 <(installed | normalised) <(normalised <"$repo/constraints.txt"))
if [ -n "$unpinned" ]; then
  echo "check_wheel: installed but not pinned so in constraints.txt (run make constraints):" >&2
  echo "$unpinned" >&2
  exit 1
fi

# Run from an empty directory: the checkout's auditor/ must not be what is imported.
cd "$tmp"
where=$("$venv/bin/python" -c 'import auditor; print(auditor.__file__)')
case "$where" in
  "$venv"/*) ;;
  *) echo "check_wheel: auditor imported from $where, not from the wheel's venv" >&2; exit 1 ;;
esac
want="bk-auditor $("$venv/bin/python" -c '
import sys, tomllib
print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' "$repo/pyproject.toml")"
got=$("$venv/bin/bk-auditor" --version)
if [ "$got" != "$want" ]; then
  echo "check_wheel: bk-auditor --version printed '$got', expected '$want'" >&2
  exit 1
fi
"$venv/bin/bk-auditor" selftest >"$tmp/selftest.out" 2>&1 || {
  cat "$tmp/selftest.out" >&2
  echo "check_wheel: bk-auditor selftest from the installed wheel failed" >&2
  exit 1
}
# A compiled wheel (not py3-none-any: setup.py's mypyc modules): each module pyproject.toml
# lists is imported from its extension, not from a .py beside it.
built="pure Python"
case "$(basename "$wheel")" in
  *-py3-none-any.whl) ;;
  *)
    built=$("$venv/bin/python" - "$repo/pyproject.toml" <<'EOF'
import importlib, sys, tomllib
paths = tomllib.load(open(sys.argv[1], "rb"))["tool"]["bookkeeper-auditor"]["mypyc"]["modules"]
names = [p.removesuffix(".py").replace("/", ".") for p in paths]
pure = [n for n in names if str(importlib.import_module(n).__file__).endswith(".py")]
if pure:
    sys.exit("check_wheel: a compiled wheel whose modules import from source: " + ", ".join(pure))
print(f"{len(names)} modules compiled")
EOF
    )
    ;;
esac
echo "check_wheel: $(basename "$wheel") ($built) installed with constraints.txt in a fresh venv;" \
  "'$got'; selftest passed ($((SECONDS - start)) s)"
