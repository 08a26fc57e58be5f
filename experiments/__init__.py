"""Evaluation and report commands, outside the installed package: each ``python -m experiments.<name>``
(run from the repository root) writes ``reports/eval_<name>.md`` and ``reports/eval_<name>.json``.

``thought`` (thought patches on the shipped tasks), ``spikes`` (spike flags against wrong answers),
``finetune_alignment`` (implicit against explicit finetuning), ``lab`` (the ICL-lab experiments),
``build_questions`` (the labelled questions of ``experiments/data/``), ``build_tasks`` (the thought-patch
task files shipped in ``icl_lens/thought/tasks/``); ``report`` holds the helpers every report shares
(also used by ``benchmarks/``).
"""
