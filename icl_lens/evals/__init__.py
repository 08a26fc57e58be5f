"""Evaluation commands: each writes a Markdown fragment ``reports/eval_<topic>.md``."""
