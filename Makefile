# Two commands for a fresh machine: `make run` (whole tiny pipeline) and `make test`.
SHELL := /bin/bash
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
BIN := $(abspath $(VENV)/bin)
export PATH := $(BIN):$(PATH)
# The CPU environment, locked (`make lock` writes it from pyproject.toml; docs/architecture.md, "Environment").
LOCK := requirements.lock
# A local CPU torch wheel (when the machine has one) keeps a multi-GB CUDA build out. Where there is none, the
# same CPU build comes from PyTorch's CPU index: a file is installed only if its sha256 is the lock's.
WHEELS ?= $(wildcard /opt/wheels)
SOURCES := $(if $(WHEELS),--find-links $(WHEELS),--extra-index-url https://download.pytorch.org/whl/cpu --index-strategy unsafe-best-match)
export DO_NOT_TRACK=1
export PREFECT_SERVER_ANALYTICS_ENABLED=false
export DVC_NO_ANALYTICS=1
export GX_ANALYTICS_ENABLED=false
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export WANDB_MODE ?= offline
export TOKENIZERS_PARALLELISM=false
PROFILE ?= tiny
# Config overrides for `make run`, each passed as `npr run --set KEY=VALUE` (make run SET="npr_zero.seed=1 run.seed=1").
SET ?=

.PHONY: install install-vllm lock run test test-image lint bench clean

# Exactly the locked versions: the lock must match pyproject.toml and this Python (else one line saying
# what to run); uv (the lock's own, hash-checked) syncs the venv to the lock (every pin by its hashes, no
# resolver, anything else removed), installs the project itself with the locked build backend, and
# `verify` checks that the result is the lock.
$(VENV)/.installed: pyproject.toml $(LOCK)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) infra/envlock.py check --target cpu
	test -x $(BIN)/uv || $(PY) -m pip install -q --require-hashes --no-deps -r <($(PY) infra/envlock.py entry uv --target cpu)
	$(BIN)/uv pip sync -q --python $(PY) --require-hashes $(SOURCES) $(LOCK)
	$(BIN)/uv pip install -q --python $(PY) --no-deps --no-build-isolation -e .
	$(PY) infra/envlock.py verify --target cpu
	$(BIN)/npr plots template
	touch $@

install: $(VENV)/.installed

# The vLLM server's own environment (.venv-vllm, locked in infra/vllm/requirements.txt; [tool.npr.lock.vllm]):
# what `generation.backend: vllm` launches and the tests that start a real server use. A stage that launches
# the server installs it on first use too; `make run` does not need it.
VLLM_VENV := .venv-vllm
$(VLLM_VENV)/.installed: pyproject.toml infra/vllm/requirements.txt $(VENV)/.installed
	$(PY) infra/envlock.py install --target vllm $(if $(WHEELS),--find-links $(WHEELS),)

install-vllm: $(VLLM_VENV)/.installed

# The GPU image's versions on CPU (.venv-image, infra/gpu/image-versions.lock; [tool.npr.lock.image]): the cpu
# lock with the image's torch 2.11.0 (PyPI's CUDA 13.0 build, which runs on CPU), transformers and numpy, on
# the image's Python 3.12, plus the pinned SGLang wheel for its argument parser. `make test-image` runs the
# unit suite and tests/image in it; `make test` runs it first.
IMAGE_VENV := .venv-image
$(IMAGE_VENV)/.ready: pyproject.toml infra/gpu/image-versions.lock infra/gpu/requirements.txt $(VENV)/.installed
	$(PY) infra/envlock.py install --target image
	$(BIN)/uv pip install -q --python $(IMAGE_VENV)/bin/python --no-deps --no-build-isolation -e .
	touch $@

test-image: lint $(IMAGE_VENV)/.ready
	NPR_TEST_IMAGE=1 $(IMAGE_VENV)/bin/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadgroup \
	  --timeout=1500 tests/unit tests/image

# Re-resolve every locked environment (requirements.lock, the GPU image's infra/gpu/requirements.txt, the
# vLLM server's infra/vllm/requirements.txt and the image-versions test's infra/gpu/image-versions.lock)
# after a change to pyproject.toml's dependencies or its [tool.npr.lock.*] tables. Needs the package
# registry; the committed locks are the preferences, so only the pins the change forces move. Pass uv
# options through UV_ARGS (UV_ARGS='--upgrade-package rich').
lock:
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	test -x $(BIN)/uv || $(PY) -m pip install -q "$$($(PY) infra/envlock.py pin uv)"
	$(PY) infra/envlock.py lock $(if $(WHEELS),--find-links $(WHEELS),) $(UV_ARGS)

run: install
	$(BIN)/npr data fetch
	$(BIN)/npr run --profile $(PROFILE) $(foreach item,$(SET),--set '$(item)')

lint: install
	$(BIN)/ruff check components flows tests benchmarks

# The suite runs on two pytest-xdist workers (--dist loadgroup: a test file stays on one worker; the files
# that start Ray clusters share one, tests/conftest.py); TEST_WORKERS=0 runs it serially. Then the unit suite
# and tests/image run again under the GPU image's versions (make test-image).
TEST_WORKERS ?= 2
test: lint install-vllm $(IMAGE_VENV)/.ready
	$(BIN)/pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadgroup --timeout=1500 --durations=30 tests
	$(MAKE) --no-print-directory test-image

bench: install
	for f in benchmarks/bench_*.py; do echo "== $$f"; $(PY) $$f || exit 1; done

clean:
	rm -rf artifacts .prefect wandb
