"""Evaluation commands: each ``python -m icl_lens.evals.<topic>`` writes ``reports/eval_<topic>.md``."""
