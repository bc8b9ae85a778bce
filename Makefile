# drover developer tasks. A fresh machine needs only make and python3.11 (or a python3 that
# is 3.11 or newer): `make test` builds .venv first.
SHELL := /bin/bash
.DEFAULT_GOAL := test

VENV  := .venv
BIN   := $(VENV)/bin
PY    := $(BIN)/python
# Touched after a successful install; older than pyproject.toml means reinstall.
STAMP := $(VENV)/.installed

.PHONY: install proto lint test dev cluster cluster-stop bench chaos clean distclean typecheck

install: $(STAMP)

$(STAMP): pyproject.toml
	@if ! $(PY) -m pip --version >/dev/null 2>&1; then \
	    if command -v python3.11 >/dev/null 2>&1; then boot=python3.11; else boot=python3; fi; \
	    echo "creating $(VENV) with $$boot"; \
	    $$boot -m venv --clear $(VENV) || { \
	        echo "could not create $(VENV) (on Debian/Ubuntu: apt-get install python3.11-venv)" >&2; \
	        exit 1; }; \
	fi
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -e '.[dev]'
	@touch $@

# Regenerates the checked-in modules and stubs beside the .proto files (imported as drover.v1.*).
proto: install
	PATH=$(CURDIR)/$(BIN):$$PATH $(PY) -m grpc_tools.protoc -I proto \
	    --python_out=proto --grpc_python_out=proto \
	    --mypy_out=proto --mypy_grpc_out=proto \
	    proto/drover/v1/*.proto

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	@$(MAKE) --no-print-directory typecheck

# mypy follows neither setuptools' package-dir mapping nor the editable install's import
# hook, so it reads the drover namespace through a tree of symlinks that mirrors it
# (build/typecheck/drover: proto/drover's entries, plus server/, scheduler/ and client_agent/
# as drover/server, drover/scheduler and drover/client). Directory links, so new modules
# need no rebuild; the sed turns the tree's paths in mypy's messages back into repo paths.
TYPECHECK_TREE := build/typecheck

typecheck: install
	@mkdir -p $(TYPECHECK_TREE)/drover
	@find $(TYPECHECK_TREE)/drover -maxdepth 1 -type l ! -exec test -e {} \; -delete
	@for entry in proto/drover/*; do \
	    name=$${entry##*/}; [[ $$name == __pycache__ ]] && continue; \
	    ln -sfn ../../../$$entry $(TYPECHECK_TREE)/drover/$$name; \
	done
	@ln -sfn ../../../server $(TYPECHECK_TREE)/drover/server
	@ln -sfn ../../../scheduler $(TYPECHECK_TREE)/drover/scheduler
	@ln -sfn ../../../client_agent $(TYPECHECK_TREE)/drover/client
	@set -o pipefail; $(BIN)/mypy | sed -E \
	    -e 's#^$(TYPECHECK_TREE)/drover/client/#client_agent/#' \
	    -e 's#^$(TYPECHECK_TREE)/drover/(server|scheduler)/#\1/#' \
	    -e 's#^$(TYPECHECK_TREE)/drover/#proto/drover/#'

test: install lint
	$(BIN)/pytest -q -m "not chaos and not bench" -p no:cacheprovider --durations=25

# One dev agent on 127.0.0.1:4646 with the demo job; Ctrl-C stops it.
dev: install
	bash deploy/dev.sh

# Three servers on free loopback ports in the background (.cluster/); `make cluster-stop` ends them.
cluster: install
	$(PY) deploy/cluster.py start --clients 2

cluster-stop:
	$(PY) deploy/cluster.py stop

bench: install
	$(PY) -m tests.bench.run

# The chaos extra (matplotlib, for the report's PNG timeline) is installed here only:
# `make test`'s short chaos run goes without it and says the plot was skipped.
CHAOS_STAMP := $(VENV)/.installed-chaos

$(CHAOS_STAMP): $(STAMP)
	$(PY) -m pip install -e '.[dev,chaos]'
	@touch $@

chaos: $(CHAOS_STAMP)
	$(BIN)/pytest -q -m chaos

# Stops a running local cluster first, so no agent is left writing into a removed directory.
clean:
	@if [ -f .cluster/cluster.json ] && [ -x $(PY) ]; then $(PY) deploy/cluster.py stop; fi
	rm -rf .cluster build dist .pytest_cache .mypy_cache .ruff_cache .hypothesis
	find . -path ./$(VENV) -prune -o -type d -name __pycache__ -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) *.egg-info
