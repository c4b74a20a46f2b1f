# tidegate developer tasks (GNU make).
#
#   make demo     install the base package and run the demo (tidegate up + load through its HTTP API)
#   make test     install dev extras and test servers, run the whole test suite, then lint
#   make lint     ruff + mypy (strict, over src, tests and bench)
#   make bench    install bench extras and peers (Portkey's gateway, with npm) and run the queue,
#                 dispatch, HTTP client, gateway and change-flow benchmarks
#   make clean    remove the virtualenv, caches and local data

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

# Debian packages that hold the server binaries the test fixtures start on their own ports, and
# the headless browser the dashboard tests drive (Playwright with Debian's chromium: Playwright's
# own browser downloads are never used).
REDIS_PKG := redis-server
POSTGRES_PKG := postgresql
CHROMIUM_PKG := chromium

# Portkey's gateway, a peer in bench/gateway.py: a Node package, installed with npm into a folder
# git ignores, for the benchmarks only (never by `make test` or the dev extra).
PEERS_DIR := bench/.peers
PORTKEY_VERSION := 1.15.2

.PHONY: help venv servers peers test lint demo bench clean

help:
	@echo "make demo | test | lint | bench | servers | peers | venv | clean"

# ---------------------------------------------------------------- virtualenv

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# One stamp per install flavour: each re-runs only when pyproject.toml changes, so repeated
# `make test` calls do not hit the package index.
$(VENV)/.stamp-dev: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	@touch $@

$(VENV)/.stamp-base: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	@touch $@

$(VENV)/.stamp-bench: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[dev,bench]"
	@touch $@

venv: $(VENV)/.stamp-dev

# ---------------------------------------------------------------- server binaries

# The tests start their own redis-server and PostgreSQL (initdb/pg_ctl) on free ports and drive
# /usr/bin/chromium headless; this only makes sure the binaries exist. `apt-get update` runs only
# when an install fails without it, because on a machine with fresh package lists it is slow and
# useless.
servers:
	@missing=""; \
	command -v redis-server >/dev/null 2>&1 || missing="$$missing $(REDIS_PKG)"; \
	compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || missing="$$missing $(POSTGRES_PKG)"; \
	[ -x /usr/bin/chromium ] || missing="$$missing $(CHROMIUM_PKG)"; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" != 0 ]; then \
		echo "missing test server packages:$$missing" >&2; \
		echo "install them with: sudo apt-get install -y$$missing" >&2; \
		exit 1; \
	fi; \
	export DEBIAN_FRONTEND=noninteractive; \
	echo "installing test server packages:$$missing"; \
	apt-get install -y --no-install-recommends $$missing \
		|| { apt-get update && apt-get install -y --no-install-recommends $$missing; }

# ---------------------------------------------------------------- benchmark peers

# The package's one install script is patch-package, which applies the patches of Portkey's own
# repository; the package ships none, so install scripts are skipped.
$(PEERS_DIR)/.stamp-portkey-$(PORTKEY_VERSION):
	@for tool in node npm; do \
		if ! command -v $$tool >/dev/null 2>&1; then \
			echo "$$tool is missing: Portkey's gateway (a peer in bench/gateway.py) needs Node.js and npm" >&2; \
			echo "install them with: sudo apt-get install -y nodejs npm" >&2; \
			exit 1; \
		fi; \
	done
	mkdir -p $(PEERS_DIR)
	npm install --prefix $(PEERS_DIR) --no-audit --no-fund --ignore-scripts --save-exact \
		@portkey-ai/gateway@$(PORTKEY_VERSION)
	@touch $@

peers: $(PEERS_DIR)/.stamp-portkey-$(PORTKEY_VERSION)

# ---------------------------------------------------------------- checks

# pytest exit code 5 means "no tests collected": that is a broken suite, never a pass, so it is
# named here and the exit code goes through unchanged.
test: venv servers
	@rc=0; $(BIN)/python -m pytest -q --durations=25 || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing" >&2; fi; \
	exit $$rc
	$(MAKE) --no-print-directory lint

lint: venv
	$(BIN)/ruff check src tests bench
	$(BIN)/mypy

# ---------------------------------------------------------------- running

demo: $(VENV)/.stamp-base
	$(BIN)/tidegate demo

bench: $(VENV)/.stamp-bench servers peers
	$(BIN)/python bench/queue.py
	$(BIN)/python bench/dispatch.py
	$(BIN)/python bench/http_client.py
	$(BIN)/python bench/gateway.py
	$(BIN)/python bench/sync.py
	$(BIN)/python bench/recs.py
	$(BIN)/python bench/recs_quality.py --months 3

clean:
	rm -rf $(VENV) $(PEERS_DIR) .pytest_cache .mypy_cache .ruff_cache .hypothesis .tidegate build dist
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
