# Two entry points do all set-up on a fresh Debian machine: `make demo` and `make test`.
# Every step is idempotent and skips itself when its stamp is newer than its inputs.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP_SYS := $(VENV)/.stamp-system
STAMP_PY := $(VENV)/.stamp-python
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
ZK_JAR := /usr/share/java/zookeeper.jar

.PHONY: all demo test static lint typecheck layers proto proto-check promtool promtool-check chromium zsh etcd unit bench soak clean system venv fuzz
.PHONY: dist wheel-check constraints interop interop-jars

all: test

# --- set-up -----------------------------------------------------------------

system: $(STAMP_SYS)
$(STAMP_SYS):
	@if [ ! -f $(ZK_JAR) ] || ! command -v java >/dev/null 2>&1 || ! command -v openssl >/dev/null 2>&1 || ! $(PYTHON) -c 'import ensurepip, venv' >/dev/null 2>&1; then \
	  echo "installing Debian packages: zookeeper, a Java runtime, python3-venv, openssl"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends \
	    zookeeper default-jre-headless python3-venv openssl >/dev/null; \
	fi
	@$(MAKE) --no-print-directory promtool
	@mkdir -p $(VENV)
	@touch $@

# promtool checks the alerting rules; Debian ships it in the `prometheus` package.
promtool:
	@if ! command -v promtool >/dev/null 2>&1; then \
	  echo "installing Debian package: prometheus (for promtool)"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends \
	    prometheus >/dev/null; \
	fi

# Headless Chromium renders the daemon's HTML page in tests/integration/test_http_page_browser.py.
chromium:
	@if ! command -v chromium >/dev/null 2>&1; then \
	  echo "installing Debian package: chromium (for the HTML page's browser test)"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends \
	    chromium >/dev/null; \
	fi

# zsh runs the generated completion script in tests/unit/test_cli_docs.py.
zsh:
	@if ! command -v zsh >/dev/null 2>&1; then \
	  echo "installing Debian package: zsh (for the zsh completion's test)"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends \
	    zsh >/dev/null; \
	fi

# A throwaway etcd (auditor/testing/etcdserver.py) serves the etcd adapter's tests and the demo.
etcd:
	@if [ ! -x /usr/bin/etcd ]; then \
	  echo "installing Debian package: etcd-server (for the etcd adapter's tests)"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends \
	    etcd-server >/dev/null; \
	fi

venv: $(STAMP_PY)
$(STAMP_PY): $(STAMP_SYS) pyproject.toml
	@[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -q --upgrade pip
	@$(PY) -m pip install -q -e '.[dev,spark]'
	@touch $@

# Real Apache BookKeeper for the interop suite (tests/interop): each pinned pom's artifacts
# and their dependencies (tests/interop/bookkeeper/pom.xml: BookKeeper itself;
# tests/interop/pulsar/pom.xml: Pulsar's metadata driver with it; tests/interop/broker/pom.xml:
# a Pulsar broker), copied once from Maven
# Central into an ignored cache. A second run downloads nothing (a stamp newer than its pom);
# a failed fetch fails the run with Maven's one error line, and is tried afresh (-U) next time.
INTEROP_CACHE := .cache/interop
INTEROP_SETS := bookkeeper pulsar broker
INTEROP_STAMPS := $(foreach set,$(INTEROP_SETS),$(INTEROP_CACHE)/$(set)/.stamp)
MAVEN_DEPENDENCY_PLUGIN := org.apache.maven.plugins:maven-dependency-plugin:3.6.1

interop-jars: $(INTEROP_STAMPS)
$(INTEROP_CACHE)/%/.stamp: tests/interop/%/pom.xml
	@command -v mvn >/dev/null 2>&1 && command -v javac >/dev/null 2>&1 || { \
	  echo "installing Debian packages: maven, default-jdk-headless (the interop suite's jars and Java programs)"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends \
	    maven default-jdk-headless >/dev/null; }
	@rm -rf $(INTEROP_CACHE)/$*/jars && mkdir -p $(INTEROP_CACHE)/$*/jars
	@mvn -B -q -U -f $< $(MAVEN_DEPENDENCY_PLUGIN):copy-dependencies \
	  -DoutputDirectory=$(abspath $(INTEROP_CACHE)/$*/jars) >$(INTEROP_CACHE)/$*/mvn.log 2>&1 || { \
	  echo "interop: fetching $*'s jars from Maven Central failed: $$({ grep -m1 -E 'ERROR' $(INTEROP_CACHE)/$*/mvn.log || tail -1 $(INTEROP_CACHE)/$*/mvn.log; } | sed 's/\x1b\[[0-9;]*m//g')"; \
	  exit 1; }
	@echo "interop: $$(ls $(INTEROP_CACHE)/$*/jars | wc -l) jars in $(INTEROP_CACHE)/$*/jars"
	@touch $@

# The interop suite alone: real bookies, the Java client, Java AutoRecovery, a Pulsar broker
# (see docs/interop.md).
interop: $(STAMP_PY) interop-jars
	@$(PY) -m pytest -q tests/interop

# --- the two commands ---------------------------------------------------------

# `make demo DURATION=60` stops by itself after 60 s; without it, Ctrl-C stops it.
# `make demo STORE=etcd` runs it on etcd (Pulsar's driver, `metadata-store:etcd:`).
demo: $(STAMP_PY) etcd
	@$(VENV)/bin/bk-auditor demo $(if $(DURATION),--duration $(DURATION)) $(if $(STORE),--store $(STORE))

# The static checks run beside the tests (two jobs), after everything both need is
# installed; pytest's workers start with the interop suite (one worker) and the unit tests.
test: $(STAMP_PY) chromium zsh etcd promtool interop-jars
	@$(MAKE) --no-print-directory -j2 static unit

static: lint typecheck layers proto-check promtool-check wheel-check

lint: $(STAMP_PY)
	@$(VENV)/bin/ruff check auditor tests bench setup.py build_support
	@$(VENV)/bin/ruff format --check auditor tests bench setup.py build_support

typecheck: $(STAMP_PY)
	@$(VENV)/bin/mypy

# The layer contract in pyproject.toml (lower never imports higher); module cycles are
# refused by tests/unit/test_layers.py.
layers: $(STAMP_PY)
	@$(VENV)/bin/lint-imports --no-cache >/dev/null || $(VENV)/bin/lint-imports --no-cache

proto: $(STAMP_PY)
	@PYTHON=$(PY) scripts/gen_proto.sh

proto-check: $(STAMP_PY)
	@PYTHON=$(PY) scripts/gen_proto.sh --check

# The alerting rules parse, and every alert fires and stays quiet when it should.
promtool-check: promtool
	@promtool check rules deploy/prometheus/alerts.yaml >/dev/null
	@cd deploy/prometheus && promtool test rules alerts_test.yaml
	@promtool check rules deploy/prometheus/java-compat-rules.yaml >/dev/null
	@cd deploy/prometheus && promtool test rules java-compat-rules_test.yaml

# The suite on PYTEST_WORKERS processes (pytest-xdist): most tests wait on servers, JVMs,
# sockets and timers, so more workers than the two cores pay. --dist loadgroup keeps an
# xdist_group on one worker (tests/interop, the real bookies' JVMs: see tests/conftest.py).
# PYTEST_WORKERS=0 runs it in this one process, in file order.
PYTEST_WORKERS ?= 2
unit: $(STAMP_PY) chromium zsh etcd interop-jars
	@$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadgroup

# --- release ------------------------------------------------------------------------
# pyproject.toml's `version` (the one source of truth) names the artefacts.
VERSION := $(shell sed -n 's/^version = "\(.*\)"$$/\1/p' pyproject.toml)
# The wheel's name depends on the build: bookkeeper_auditor-VERSION-py3-none-any.whl (pure
# Python), or -cp311-cp311-linux_x86_64.whl and the like where a C compiler compiled the
# modules of pyproject.toml's [tool.bookkeeper-auditor.mypyc] (build_support/backend.py).
# BK_AUDITOR_MYPYC=0 make dist builds the pure wheel anyway. dist/.stamp stands for both.
DIST_STAMP := dist/.stamp
# (A shell glob when the recipe runs: make's own wildcard may not see a file a recipe made.)
WHEEL = "$$(ls dist/bookkeeper_auditor-$(VERSION)-*.whl | head -n 1)"
DIST_SRC := pyproject.toml setup.py README.md MANIFEST.in constraints.txt \
	$(shell find auditor proto build_support -type f ! -path '*/__pycache__/*' ! -name '*.so' 2>/dev/null)

# dist/: the sdist, and the wheel built from that sdist (so the sdist is known to build).
dist: $(DIST_STAMP)
$(DIST_STAMP): $(STAMP_PY) $(DIST_SRC)
	@rm -f dist/bookkeeper_auditor-* $@
	@$(PY) -m build -q --outdir dist . >$(VENV)/build.log 2>&1 || { cat $(VENV)/build.log; exit 1; }
	@touch $@
	@echo "dist: $$(cd dist && echo bookkeeper_auditor-$(VERSION)*)"

# The wheel as the docs install it: a fresh virtualenv, the wheel with -c constraints.txt,
# then `bk-auditor --version` and `bk-auditor selftest` from it, and for a compiled wheel
# that its compiled modules are what is imported (scripts/check_wheel.sh).
wheel-check: dist
	@PYTHON=$(PYTHON) scripts/check_wheel.sh $(WHEEL)

# Re-pins constraints.txt: the wheel's dependencies and its extras' (all but dev and spark),
# resolved afresh in a new virtualenv. Run it after changing dependencies in pyproject.toml.
constraints: dist
	@PYTHON=$(PYTHON) scripts/check_wheel.sh --freeze constraints.txt $(WHEEL)

# One JSON line per figure on stdout, progress on stderr; see bench/README.md.
# BENCH_N=100000 (ledgers), BENCH_ONLY=scrutiny,memory,... (figures), BENCH_PROFILE=DIR (py-spy).
bench: $(STAMP_PY) etcd
	@$(PY) -m bench

# Three daemons, a ZooKeeper and six bookies under random faults; see docs/reliability.md.
# SOAK_MINUTES=20 (duration), SOAK_SEED=1 (same seed, same schedule), SOAK_SEEDS=1,2,3 or
# 1-5 (one full run per seed in SOAK_DIR/seed-N, a combined summary and one PASS/FAIL),
# SOAK_ONLY=host_restart,... (draw only these fault kinds), SOAK_WORKER=real|simulated
# (the daemons' own replication workers repair, or the driver's stand-in), SOAK_DIR.
soak: $(STAMP_PY)
	@$(PY) -m soak

# Long fuzzing with atheris (libFuzzer), which `make test` does not install: each harness
# in fuzz/ runs for FUZZ_SECONDS; corpus and crash inputs stay in FUZZ_DIR/<target>/.
# `make test` runs the same targets through hypothesis (tests/fuzz). See fuzz/README.md.
FUZZ_SECONDS ?= 60
FUZZ_DIR ?= /tmp/bk-auditor-fuzz
FUZZ_TARGETS ?= metadata frames availability racks config

fuzz: $(STAMP_PY)
	@$(PY) -c 'import atheris' 2>/dev/null || $(PY) -m pip install -q atheris
	@for t in $(FUZZ_TARGETS); do \
	  mkdir -p $(FUZZ_DIR)/$$t/corpus || exit 1; \
	  echo "fuzz: $$t for $(FUZZ_SECONDS) s (corpus and crashes in $(FUZZ_DIR)/$$t)"; \
	  $(PY) fuzz/fuzz_$$t.py $(FUZZ_DIR)/$$t/corpus -max_total_time=$(FUZZ_SECONDS) \
	    -timeout=10 -rss_limit_mb=2048 -artifact_prefix=$(FUZZ_DIR)/$$t/ \
	    -print_final_stats=1 >$(FUZZ_DIR)/$$t/log 2>&1 || { tail -40 $(FUZZ_DIR)/$$t/log; exit 1; }; \
	  grep -E '^(Done|stat::(number_of_executed_units|peak_rss_mb))' $(FUZZ_DIR)/$$t/log; \
	done

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
	rm -rf dist build bookkeeper_auditor.egg-info
