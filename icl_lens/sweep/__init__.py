"""Sweeps: patch norms (and optionally factors) of a JSONL file of prompts, resumable, on one or many processes.

``icl-lens sweep PROMPTS.jsonl --model M --out DIR``; ``accelerate launch --num_processes N
-m icl_lens sweep ...`` splits the prompts between processes (see README, "Sweeps"). The names
are imported on first use, so the command line checks the folder's lock before importing torch.
"""
from typing import TYPE_CHECKING

from icl_lens._lazy_exports import lazy_exports

if TYPE_CHECKING:  # the public names, imported on first use (lazy_exports reads this block)
    from icl_lens.sweep._lock import SweepLockedError, check_unlocked
    from icl_lens.sweep._parts import SweepSettingsError
    from icl_lens.sweep._rows import BadRow, SweepRow, check_prompts_file, read_rows
    from icl_lens.sweep._run import SweepResult, run_sweep

__getattr__, __dir__, __all__ = lazy_exports(globals())
