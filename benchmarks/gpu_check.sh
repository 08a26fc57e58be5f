#!/usr/bin/env bash
# One prepared GPU check, at most ~5 minutes on one H200 (see benchmarks/gpu_check.py for what it measures).
#
#   bash benchmarks/gpu_check.sh                                  # CUDA, writes reports/bench_gpu.md (+ $OUT/)
#   DEVICE=cpu ICL_LENS_GPU_CHECK_QUICK=1 bash benchmarks/gpu_check.sh   # tiny sizes on CPU (tests)
#
# Environment: DEVICE (cuda), ICL_LENS_GPU_CHECK_QUICK (0), ICL_LENS_GPU_CHECK_SECONDS (budget, 240),
# ICL_LENS_GPU_CHECK_REPORT (reports/bench_gpu.md), PYTHON (python3, or .venv/bin/python when present).
# Never downloads: Python packages missing on the machine travel as wheels in .whl/ (carried), which
# are installed into /tmp/icl_lens_site; the embedded models run only when their weights are there.
set -uo pipefail
cd "$(dirname "$0")/.."
DEVICE=${DEVICE:-cuda}
QUICK=${ICL_LENS_GPU_CHECK_QUICK:-0}
BUDGET=${ICL_LENS_GPU_CHECK_SECONDS:-240}
REPORT=${ICL_LENS_GPU_CHECK_REPORT:-reports/bench_gpu.md}
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
echo "[gpu_check] $(date -u +%H:%M:%S) python: $PYTHON; device: $DEVICE; quick: $QUICK; budget: ${BUDGET}s"
# Only where the stack is missing (the device machine has torch but not transformer-lens).
if ! "$PYTHON" -c "import transformer_lens" >/dev/null 2>&1 && compgen -G ".whl/*.whl" >/dev/null; then
  echo "[gpu_check] installing carried wheels: $(ls .whl | tr '\n' ' ')"
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/icl_lens_site .whl/*.whl || { echo "[gpu_check] wheel install failed"; exit 3; }
  export PYTHONPATH=/tmp/icl_lens_site${PYTHONPATH:+:$PYTHONPATH}
fi
# transformer-lens imports `datasets` for type hints only; where it cannot import (its pyarrow too old, say),
# a stub with those names stands in, and the report says so.
if ! "$PYTHON" -c "import datasets" >/dev/null 2>&1; then
  echo "[gpu_check] datasets does not import here; using a stub for transformer-lens's type-hint imports"
  mkdir -p /tmp/icl_lens_stub/datasets
  printf 'class Dataset: pass\nclass IterableDataset: pass\ndef load_dataset(*a, **k):\n    raise RuntimeError("datasets unavailable")\n' > /tmp/icl_lens_stub/datasets/__init__.py
  for m in arrow_dataset iterable_dataset load; do echo 'from datasets import Dataset, IterableDataset, load_dataset' > /tmp/icl_lens_stub/datasets/$m.py; done
  export PYTHONPATH=/tmp/icl_lens_stub${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
"$PYTHON" -c "import torch, transformers, transformer_lens; print('[gpu_check] torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'transformers', transformers.__version__)" \
  || { echo "[gpu_check] the Python stack does not import; carry the missing wheels in .whl/"; exit 3; }
ARGS=(--device "$DEVICE" --budget "$BUDGET" --out "$REPORT" --shell)
[ "$QUICK" = "1" ] && ARGS+=(--quick)
# Hard cap: the budget stops new sections; this stops a section that runs far past it.
timeout --signal=INT $((BUDGET + 60)) "$PYTHON" benchmarks/gpu_check.py "${ARGS[@]}"
