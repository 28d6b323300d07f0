# One venv, created on demand; every target below sets it up first.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)

.PHONY: setup run test test-slow lint sim bench-raft clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev,bench]"
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
