"""``python -m experiments.thought``: thought patches on the shipped tasks → ``reports/eval_thought.md``.

For each embedded model and each shipped task (``icl_lens/thought/tasks/``), on the
held-out test queries: accuracy with no instruction, with the full instruction, with
the thought patch (default settings of :mod:`icl_lens.thought._fit`), with a random
control patch of the same norms and with a steering vector at its best layer, each
with a 95% Wilson interval; the patched/full ratio with a paired bootstrap interval;
the locality of every edit; the paper's settings (kind ``both``, λ = 0, no query prefix)
beside the default (before/after); test accuracy against the number of calibration
queries; the default fitted again with ``preserve`` rows (unrelated texts kept as the
unpatched model reads them) and what that does to accuracy and locality. Results are
cached per model in JSON next to the report, so runs can be split (``--models``) and
resumed; when the default settings change, a rerun recomputes the conditions that
depend on the patch and carries the others over (the earlier row is kept beside it).

``--select``: how the default settings were chosen, with no test query involved: on
each model and selection task, fit on the first 24 train queries and score the other 8
train queries by ``KL(full ‖ patched)`` at their last token; the setting with the
lowest mean over every (model, task) wins; then, second stage, that setting with
``answer_tokens`` ∈ {0, 4, 8} and, at 8, the ridge again (``SELECT_ANSWER_GRID``), scored
by the KL at every position that predicts the answer (teacher forced). ``--diagnose``: per-layer divergence and
attention to BOS / position 1 on one task, unpatched, paper patch and default patch.
``--paper-tasks`` / ``--curve-tasks`` / ``--preserve-tasks`` restrict the before/after
rows, the curves and the preserve rows to some tasks (none with an empty list: each costs
about a table row). ``--quick``: a tiny model, one task, few calibration queries (for tests).

``--report-only``: the report from the cached results, nothing fitted.

Modules: :mod:`.settings` (the fixed settings and grids), :mod:`.rule` (the one counting rule every verdict
calls, the fresh queries' in-range / out-of-range parts, near ties), :mod:`.cache` (the per-model JSON cache), :mod:`.jobs` (what a run computes), :mod:`.sections` (the report's
sections), :mod:`.run` (the report and the command line).
"""
