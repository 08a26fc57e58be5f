"""Helpers of the workshop notebooks (not part of the icl_lens package): claims tables and readers of
the committed reports (:mod:`.claims`), and the exercise checks (:mod:`.exercise_checks`). The notebooks
run with ``notebooks/`` as their working directory (JupyterLab, Binder, ``make lab``, the notebook
tests), so ``from workshop.claims import ...`` finds them."""
