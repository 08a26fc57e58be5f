"""Sweeps: patch norms (and optionally factors) of a JSONL file of prompts, resumable, on one or many processes.

``icl-lens sweep PROMPTS.jsonl --model M --out DIR``; ``accelerate launch --num_processes N
-m icl_lens sweep ...`` splits the prompts between processes (see README, "Sweeps").
"""
from icl_lens.sweep._lock import SweepLockedError
from icl_lens.sweep._parts import SweepSettingsError
from icl_lens.sweep._rows import BadRow, SweepRow, read_rows
from icl_lens.sweep._run import SweepResult, run_sweep

__all__ = ["BadRow", "SweepLockedError", "SweepResult", "SweepRow", "SweepSettingsError", "read_rows", "run_sweep"]
