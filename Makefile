# One venv, created on demand; every target below sets it up first.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
# The folders installed as electra.* (pyproject [tool.setuptools] package-dir).
PKG_DIRS = electra consensus state api streaming bench tiering security chaos
# Reinstall when pyproject.toml changes or a file is added, renamed or removed in a package folder:
# the strict editable install links each file, so a new module is importable only after it.
STAMP   = $(VENV)/.installed-$(shell { cat pyproject.toml; find $(PKG_DIRS) -type f -not -path '*/__pycache__/*' \
	| LC_ALL=C sort; } | cksum | cut -d' ' -f1)

.PHONY: setup test-tools run test test-slow lint sim bench-raft clean
# One recipe at a time even under make -j: setup and test-tools may both run apt-get, which holds dpkg's lock.
.NOTPARALLEL:

# What `make run` needs: a JDK and the venv.
setup: $(STAMP)

$(STAMP): pyproject.toml
	@# Spark needs a Java runtime (17+); the streaming job also compiles its local file system class
	@# (streaming/local_fs_jar.py) with javac. Install Debian's headless JDK if either is missing.
	@{ command -v java >/dev/null 2>&1 && command -v javac >/dev/null 2>&1; } || { command -v apt-get >/dev/null 2>&1 && \
		(apt-get update -qq && apt-get install -y -qq openjdk-17-jdk-headless >/dev/null) ; } || \
		{ echo "error: Spark needs Java 17+ and the job a JDK's javac (install a JDK and retry)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@# A strict editable install: build/__editable__.* is a tree of links to the sources, named as
	@# installed (electra/consensus/core.py -> consensus/core.py), which mypy and IDEs can follow;
	@# setuptools' default editable mode maps the folders with an import hook that they cannot see.
	$(PY) -m pip install -q -e ".[dev,bench,notebooks]" --config-settings editable_mode=strict
	rm -f $(VENV)/.installed-*
	touch $@

# What only the tests (and electra chaos / bench api) need, from Debian packages when missing.
test-tools:
	@# promtool checks and unit-tests deploy/monitoring/alerts.yml; systemd-analyze verifies deploy/systemd.
	@command -v promtool >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && \
		(apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus >/dev/null) ; } || \
		{ echo "error: the deploy tests need promtool (Debian package prometheus)"; exit 1; }
	@command -v systemd-analyze >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && \
		(apt-get update -qq && apt-get install -y -qq --no-install-recommends systemd >/dev/null) ; } || \
		{ echo "error: the deploy tests need systemd-analyze (Debian package systemd)"; exit 1; }
	@# The dashboard's browser test drives Debian's Chromium with playwright (no browser downloads).
	@command -v chromium >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && \
		(apt-get update -qq && apt-get install -y -qq chromium >/dev/null) ; } || \
		{ echo "error: the dashboard test needs Chromium (apt-get install chromium)"; exit 1; }
	@# electra bench api compares with etcd (Debian etcd-server 3.4) under the same load generator (wrk).
	@command -v etcd >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && \
		(apt-get update -qq && apt-get install -y -qq etcd-server >/dev/null) ; } || \
		{ echo "error: electra bench api needs etcd (apt-get install etcd-server)"; exit 1; }
	@command -v wrk >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && \
		(apt-get update -qq && apt-get install -y -qq wrk >/dev/null) ; } || \
		{ echo "error: electra bench api needs wrk (apt-get install wrk)"; exit 1; }
	@# electra chaos moves one node's wall clock with libfaketime (skipped, and said so, without it).
	@test -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 || test -e /usr/lib/faketime/libfaketime.so.1 || \
		{ command -v apt-get >/dev/null 2>&1 && (apt-get update -qq && apt-get install -y -qq faketime >/dev/null) ; } || \
		echo "warning: electra chaos will skip clock faults (apt-get install faketime)"
	@# electra chaos builds its fsync shim (slow disk, power loss) with a C compiler; its CI test needs both.
	@command -v cc >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && \
		(apt-get update -qq && apt-get install -y -qq --no-install-recommends gcc libc6-dev >/dev/null) ; } || \
		{ echo "error: electra chaos needs a C compiler for its disk shim (apt-get install gcc)"; exit 1; }

run: setup
	$(VENV)/bin/electra up --demo

lint: setup
	$(PY) -m ruff check .
	$(PY) -m mypy

test: test-tools lint
	$(PY) -m pytest -q

test-slow: test-tools lint
	$(PY) -m pytest -q --slow

sim: setup
	$(VENV)/bin/electra sim --seeds 2000

bench-raft: setup
	$(VENV)/bin/electra bench raft

clean:
	rm -rf $(VENV) .electra build *.egg-info
