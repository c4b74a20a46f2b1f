# tidegate developer tasks (GNU make).
#
#   make demo         install the base package from the lock and run the demo (tidegate up + load)
#   make test         install the dev environment from the lock and the test servers, run the whole
#                     test suite, then lint
#   make lint         ruff + mypy (strict, over src, tests, bench and docs/hooks) + the docs build
#   make docs         build the documentation site into site/ (mkdocs build --strict)
#   make bench        install the bench environment from the lock and peers (Portkey's gateway, with
#                     npm) and run the queue, dispatch, HTTP client, gateway and change-flow benchmarks
#   make lock         re-resolve uv.lock after a change to pyproject.toml (pins kept where they fit)
#   make lock-upgrade re-resolve uv.lock to the newest releases the ranges admit
#   make lock-check   fail when uv.lock is out of date with pyproject.toml (CI runs it)
#   make test-lowest  the test suite on the lowest versions pyproject.toml admits (own venv)
#   make test-latest  the test suite on the newest releases, ignoring the lock (own venv): a canary
#   make dist         build the wheel and sdist into dist/ and check them with twine
#   make clean        remove the virtualenvs, caches and local data

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

.PHONY: help servers peers test test-lowest test-latest lint docs dist demo bench clean lock lock-upgrade lock-check FORCE

help:
	@sed -n '3,17s/^#//p' $(firstword $(MAKEFILE_LIST))

# ---------------------------------------------------------------- environments

# Every environment is installed from uv.lock, the one lock of all extras (exact versions and
# hashes), so a fresh machine runs the combination CI ran. uv itself is pinned and bootstrapped
# with pip into a folder of its own; it never downloads a Python (the machine's $(PYTHON) is used).
UV_VERSION := 0.13.9
TOOLS := .tools
UV := $(TOOLS)/bin/uv
export UV_PYTHON_DOWNLOADS := never
export UV_PROJECT_ENVIRONMENT := $(VENV)
UV_SYNC := $(UV) sync --locked --quiet --python $(PYTHON)

$(UV):
	$(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/python -m pip install --quiet uv==$(UV_VERSION)

# `uv sync` makes .venv exactly the named flavour (it removes what the flavour does not list), and
# costs a fraction of a second when nothing changed, so each target syncs on every run.
.PHONY: venv venv-base venv-bench
venv: | $(UV)
	$(UV_SYNC) --extra dev

venv-base: | $(UV)
	$(UV_SYNC)

venv-bench: | $(UV)
	$(UV_SYNC) --extra dev --extra bench

lock: | $(UV)
	$(UV) lock --python $(PYTHON)

lock-upgrade: | $(UV)
	$(UV) lock --upgrade --python $(PYTHON)

lock-check: | $(UV)
	@$(UV) lock --check --python $(PYTHON) || { \
		echo "uv.lock is out of date with pyproject.toml: run 'make lock' and commit uv.lock" >&2; exit 1; }

# The ranges in pyproject.toml are the package's promise to its users, so both ends are tested,
# each in a venv of its own resolved afresh (uv.lock is neither read nor written): the lowest
# version of every direct dependency, and the newest release of everything.
ALT_VENVS := .venv-lowest .venv-latest

.venv-lowest/.resolved: RESOLUTION := lowest-direct
.venv-latest/.resolved: RESOLUTION := highest
.venv-latest/.resolved: FORCE
$(addsuffix /.resolved,$(ALT_VENVS)): pyproject.toml | $(UV)
	$(UV) venv --quiet --allow-existing --python $(PYTHON) $(@D)
	$(UV) pip compile --quiet pyproject.toml --extra dev --resolution $(RESOLUTION) \
		--python $(@D)/bin/python --output-file $(@D)/requirements.txt
	$(UV) pip sync --quiet --python $(@D)/bin/python $(@D)/requirements.txt
	$(UV) pip install --quiet --python $(@D)/bin/python --no-deps -e .
	@touch $@

FORCE:

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
# named here and the exit code goes through unchanged. $(1) is the venv's bin folder.
define run_pytest
	@rc=0; $(1)/python -m pytest -q --durations=25 || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing" >&2; fi; \
	exit $$rc
endef

test: venv servers
	$(call run_pytest,$(BIN))
	$(MAKE) --no-print-directory lint

# Lint runs on the locked tools only: ruff and mypy releases change what they report, which says
# nothing about the package's ranges.
test-lowest: .venv-lowest/.resolved servers
	$(call run_pytest,.venv-lowest/bin)

test-latest: .venv-latest/.resolved servers
	$(call run_pytest,.venv-latest/bin)

lint: venv
	$(BIN)/ruff check src tests bench docs/hooks
	$(BIN)/mypy
	$(MAKE) --no-print-directory docs

# The site is built with --strict: a broken link or anchor, a page missing from the nav, or a
# reference the hooks cannot generate fails the build. Its code examples are run by
# tests/test_docs_examples.py, in the test suite.
# Material for MkDocs prints a banner about its support horizon on every build; it says nothing
# about this site, so it is turned off.
docs: venv
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

dist: venv
	rm -rf dist
	$(BIN)/python -m build --outdir dist
	$(BIN)/twine check --strict dist/*

# ---------------------------------------------------------------- running

demo: venv-base
	$(BIN)/tidegate demo

bench: venv-bench servers peers
	$(BIN)/python -m bench.queues
	$(BIN)/python -m bench.dispatch
	$(BIN)/python -m bench.http_client
	$(BIN)/python -m bench.contract
	$(BIN)/python -m bench.gateway
	$(BIN)/python -m bench.sync
	$(BIN)/python -m bench.recs
	$(BIN)/python -m bench.recs_quality --months 3

# Not part of `bench` (30 minutes): `tidegate up` at 200 req/s of mixed traffic, its memory and
# data folder sampled every 30 s (python -m bench.soak --help for shorter runs).
.PHONY: soak
soak: venv-bench
	$(BIN)/python -m bench.soak

clean:
	rm -rf $(VENV) $(ALT_VENVS) $(TOOLS) $(PEERS_DIR) .pytest_cache .mypy_cache .ruff_cache .hypothesis .tidegate build dist site
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
