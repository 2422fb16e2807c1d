# Two commands for a fresh machine: `make run` (whole tiny pipeline) and `make test`.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(abspath $(VENV)/bin)
export PATH := $(BIN):$(PATH)
# A local CPU torch wheel (when the machine has one) keeps pip from pulling a multi-GB CUDA build.
WHEELS := $(wildcard /opt/wheels)
PIP_FLAGS := $(if $(WHEELS),--find-links $(WHEELS),)
export DO_NOT_TRACK=1
export PREFECT_SERVER_ANALYTICS_ENABLED=false
export DVC_NO_ANALYTICS=1
export GX_ANALYTICS_ENABLED=false
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export WANDB_MODE ?= offline
export TOKENIZERS_PARALLELISM=false
PROFILE ?= tiny

.PHONY: install run test lint bench clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(PIP_FLAGS) -e '.[dev]'
	$(BIN)/npr plots template
	touch $@

install: $(VENV)/.installed

run: install
	$(BIN)/npr data fetch
	$(BIN)/npr run --profile $(PROFILE)

lint: install
	$(BIN)/ruff check components flows tests benchmarks

test: lint
	$(BIN)/pytest -q -p no:cacheprovider --timeout=1500 tests

bench: install
	for f in benchmarks/bench_*.py; do echo "== $$f"; $(PY) $$f || exit 1; done

clean:
	rm -rf artifacts .prefect wandb
