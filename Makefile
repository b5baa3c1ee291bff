# `make run` and `make test` install whatever is missing into .venv first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# A CPU build of torch is installed first where no NVIDIA GPU is present, so pip never
# pulls the multi-GB CUDA build for a laptop. Override TORCH_SPEC / TORCH_INDEX if needed,
# e.g. TORCH_INDEX=--index-url=https://download.pytorch.org/whl/cpu
TORCH_SPEC  ?= torch==2.13.0
TORCH_INDEX ?=
STAMP  := $(VENV)/.installed

.PHONY: install run test clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then \
	  echo "NVIDIA GPU found: installing the default (CUDA) torch build"; \
	else \
	  echo "No GPU: installing the CPU torch build ($(TORCH_SPEC))"; \
	  $(PY) -m pip install --quiet $(TORCH_INDEX) "$(TORCH_SPEC)"; \
	fi
	$(PY) -m pip install --quiet -e ".[test]"
	@touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/ablate run

# Two workers, one per core: the suite is CPU-bound (most commands run in the test's process,
# tests/conftest.py run_ablate). TEST_WORKERS=0 runs the suite in one process.
TEST_WORKERS ?= 2

test: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) tests

# runs/ holds your results: `make clean` never touches it.
clean:
	rm -rf $(VENV) .pytest_cache
