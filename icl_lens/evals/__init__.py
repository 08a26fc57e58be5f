"""Evaluation commands that write Markdown fragments ``reports/eval_<topic>.md``."""
