# One venv, created on demand; every target below sets it up first.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)

.PHONY: setup run test test-slow lint sim bench-raft clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@# Spark needs a Java runtime (17+); install Debian's headless one if there is none.
	@command -v java >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && \
		(apt-get update -qq && apt-get install -y -qq openjdk-17-jre-headless >/dev/null) ; } || \
		{ echo "error: Spark needs Java 17+ (install a JRE and retry)"; exit 1; }
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
	@# electra chaos moves one node's wall clock with libfaketime (skipped, and said so, without it).
	@test -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 || test -e /usr/lib/faketime/libfaketime.so.1 || \
		{ command -v apt-get >/dev/null 2>&1 && (apt-get update -qq && apt-get install -y -qq faketime >/dev/null) ; } || \
		echo "warning: electra chaos will skip clock faults (apt-get install faketime)"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev,bench,notebooks]"
	rm -f $(VENV)/.installed-*
	touch $@

run: setup
	$(VENV)/bin/electra up --demo

lint: setup
	$(PY) -m ruff check .

test: lint
	$(PY) -m pytest -q

test-slow: lint
	$(PY) -m pytest -q --slow

sim: setup
	$(VENV)/bin/electra sim --seeds 2000

bench-raft: setup
	$(VENV)/bin/electra bench raft

clean:
	rm -rf $(VENV) .electra build *.egg-info
