"""What every report fragment (``reports/eval_*.md``, ``reports/bench_*.md``) shares.

The machine line is read from the machine at the time of the run (CPUs usable by this
process and their model, torch threads, load average, the GPU when one is used), the
command line from the arguments given, so no fragment carries a typed-in description.
"""
from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path

import pandas as pd
import torch


def cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo``, else what :mod:`platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> float:
    """One-minute load average (NaN where the system has none)."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def machine(device: str = "cpu", load_before: float | None = None) -> str:
    """One line describing what ran the measurement, now.

    ``load_before``: the load average taken when the measurement started; the line then
    gives it next to the current one.
    """
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = f"{load_average():.1f}" if load_before is None else f"{load_before:.1f} before / {load_average():.1f} after"
    text = (f"{usable} CPU cores usable of {os.cpu_count()} ({cpu_model()}, {platform.machine()} {platform.system()}), "
            f"torch {torch.__version__} with {torch.get_num_threads()} thread(s), Python {platform.python_version()}, "
            f"load average {load}")
    if str(device).startswith("cuda"):
        text += f"; GPU {torch.cuda.get_device_name(device)}"
    return text


def command(prefix: str, argv: list[str] | None = None) -> str:
    """The command that produced a fragment: ``prefix`` and its arguments (``sys.argv[1:]`` when None)."""
    return " ".join([prefix, *(sys.argv[1:] if argv is None else argv)])


def write_fragment(path, lines: list[str]) -> str:
    """Write ``lines`` as one Markdown fragment (parent folders created); returns the text."""
    text = "\n".join(lines).rstrip("\n") + "\n"
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return text


def _plain(x):
    """JSON for what ``json`` cannot write itself: numbers (numpy, torch scalars) as floats, the rest as text."""
    try:
        return float(x)
    except (TypeError, ValueError):
        return str(x)


def write_json(markdown_path, data) -> Path:
    """Write ``data`` as JSON beside the Markdown fragment ``markdown_path`` (same stem, ``.json``)."""
    path = Path(markdown_path).with_suffix(".json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=_plain) + "\n", encoding="utf-8")
    return path


def markdown_table(df: pd.DataFrame, digits: int = 4) -> str:
    """A GitHub table; floats in ``digits`` significant digits (scientific when small)."""
    def fmt(x):
        if isinstance(x, float):
            return f"{x:.{digits}g}" if x == 0 or 1e-3 <= abs(x) < 1e5 else f"{x:.2e}"
        return str(x)
    head = "| " + " | ".join(map(str, df.columns)) + " |"
    sep = "|" + "|".join("---" for _ in df.columns) + "|"
    body = ["| " + " | ".join(fmt(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([head, sep, *body])


# --- the one-screen summary of EVAL.md, computed from the reports' JSON ------------------------------------------

NOT_TESTED = "not tested here"
QUANTISATION = ("Both embedded language models (gemma-3-270m, smollm2-135m) are 4-bit GGUF checkpoints dequantised "
                "to float32.")
SECTIONS = {"lab": "#icl-lab-linear-regression-experiments-attention-vs-parametric-and-recurrent-layers",
            "alignment": "#implicit-vs-explicit-finetuning-the-papers-protocol",
            "thought": "#thought-patches-prompts-turned-into-weights-issues-5-14-22",
            "spikes": "#spike-flags-do-token-patches-tell-correct-answers-from-wrong-ones"}


def _read(root: Path, name: str) -> dict | None:
    try:
        return json.loads((Path(root) / name).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _ci(d: dict, digits: int = 3, key: str = "mean", sign: str = "+") -> str:
    """``mean [low, high]`` of ``d[key]``; the bounds are ``key_low``/``key_high`` where present, else ``low``/``high``."""
    low, high = d.get(f"{key}_low", d.get("low")), d.get(f"{key}_high", d.get("high"))
    f = f"{sign}.{digits}f"
    return f"{d[key]:{f}} [{low:{f}}, {high:{f}}]"


def _row(claim: str, paper: str, verdict: str, number: str, topic: str) -> dict:
    """One summary row; ``topic`` (a key of :data:`SECTIONS`) names the EVAL.md section it links to."""
    return {"claim": claim, "paper": paper, "verdict": verdict, "number": number, "topic": topic,
            "section": SECTIONS[topic]}


ALIGNMENT_SUMMARY = {"reproduced": "reproduced", "reproduced only in": "partly", "not reproduced": "not",
                     "undecided": NOT_TESTED}


def _alignment_rows(fa: dict | None) -> list[dict]:
    """The alignment claim by the rules of :mod:`experiments.lab_rules`, recomputed from the per-seed cells of the
    report's JSON (the same function and numbers as the report's own reading), and the language models' row."""
    from experiments import lab_rules

    claim, paper = "Implicit updates align with SGD on the same examples (lab regression)", "Dherin et al. 2025, §4–5"
    ext = ("… the same protocol on the two language models (this project's extension; the paper ran regression only)",
           "extension of Dherin et al. 2025")
    if not fa or not fa.get("lab"):
        return [_row(claim, paper, NOT_TESTED, "–", "alignment"), _row(*ext, NOT_TESTED, "–", "alignment")]
    out = []
    main = fa.get("main_models") or list(fa["lab"])
    cells = lab_rules.claim_cells(fa["lab"], main)
    if cells:
        wording = lab_rules.claim_wording(cells)
        paper_cells = lab_rules.claim_cells(fa["lab"], ("single_block",))
        seeds = sorted({len(s) for s, _ in cells.values()})
        number = (f"{wording['sentence']}"
                  + (f"; the paper's model alone: {lab_rules.claim_wording(paper_cells)['sentence']}" if paper_cells else "")
                  + f"; {'–'.join(map(str, (seeds[0], seeds[-1]) if len(seeds) > 1 else seeds))} seed(s) per model")
        out.append(_row(claim, paper, ALIGNMENT_SUMMARY[wording["verdict"]], number, "alignment"))
    else:
        out.append(_row(claim, paper, NOT_TESTED, "–", "alignment"))
    aligned, weak = fa.get("aligned_threshold", 0.5), fa.get("weak_threshold", 0.1)
    cs = []
    for name, entry in fa.get("lm", {}).items():
        rows = {(r["comparison"], r["order"], r["kind"]): r for r in entry.get("alignment", {}).get("summary", [])}
        for order in ("absorb", "prefix"):
            for kind in ("cumulative", "step"):
                if ("sgd", order, kind) in rows and ("control", order, kind) in rows:
                    cs.append((f"{name} {order} {kind}", rows[("sgd", order, kind)], rows[("control", order, kind)]))
    if not cs:
        out.append(_row(*ext, NOT_TESTED, "–", "alignment"))
        return out
    above = [c for c in cs if c[1]["low"] > max(c[2]["high"], 0.0)]  # one model each: the unit is the prompt
    holds = [c for c in above if c[1]["mean"] >= aligned]
    grade = ("reproduced" if len(holds) == len(cs) else
             "partly" if holds or any(c[1]["mean"] >= weak for c in above) else "not")
    best = max(above or cs, key=lambda c: c[1]["mean"])
    low, high = min(c[1]["mean"] for c in cs), max(c[1]["mean"] for c in cs)
    number = (f"{'best cell above its control' if above else 'no cell above its control; highest'}: {best[0]} "
              f"{_ci(best[1])} (control {best[2]['mean']:+.3f}); {len(above)} of {len(cs)} model × order × kind "
              f"cells above their control (interval over prompts), means {low:+.3f}…{high:+.3f}")
    out.append(_row(*ext, grade, number, "alignment"))
    return out


def _lab_rows(lab: dict | None) -> list[dict]:
    sec = "lab"
    names = [("A context acts on the MLP as a rank-1 update of its first matrix (plus the skip correction)",
              "Dherin et al. 2025, §3"),
             ("Attention's implicit weights settle as the context grows, a recurrent layer's do not",
              "Dherin et al. 2025, §5"),
             ("A fixed-state parametric layer can learn in context with constant memory (delta rule)",
              "McDermott, Heath, Parhi 2026"),
             ("Softmax / linear attention are kernel regressions; the delta rule's update is a gradient step",
              "McDermott, Heath, Parhi 2026")]
    if not lab:
        return [_row(c, p, NOT_TESTED, "–", sec) for c, p in names]
    rules = lab["rules"]
    out = []
    eq = lab["equivalence"]
    worst = {d: max(max(r["rel_error_prediction"], r["rel_error_residual"]) for r in eq if r["dtype"] == d)
             for d in {r["dtype"] for r in eq}}
    exact = worst.get("float64", 1.0) < rules["exact"]["float64"]
    out.append(_row(*names[0], "reproduced" if exact else "not",
                    f"worst relative error {worst.get('float64', float('nan')):.1e} (float64), 4 contextual layers", sec))
    conv = {r["arch"]: r for r in lab["convergence"]["summary"]}
    trend = lab["convergence"].get("trend") or {}
    if "softmax" in trend and "gru" in trend:
        from experiments import lab_rules

        claim = lab_rules.settling_claim({a: e["slopes"] for a, e in trend.items()})
        verdict = {"reproduced": "reproduced", "partly": "partly", "not": "not"}[claim["verdict"]]
        slope = lambda a: (f"{claim[a]['interval']['mean']:+.2f} [{claim[a]['interval']['low']:+.2f}, "  # noqa: E731
                           f"{claim[a]['interval']['high']:+.2f}]" if claim[a]["interval"] else "1 seed")
        ns = trend["softmax"]["ns"]
        out.append(_row(*names[1], verdict,
                        f"slope of log drift(n→2n) vs log n, n = {ns[0]}…{ns[-1]} (inside the trained length, whole "
                        f"update): softmax {slope('softmax')} ({claim['softmax']['verdict']}), GRU {slope('gru')} "
                        f"({claim['gru']['verdict']}); converges: interval ≤ {lab_rules.TREND_SLOPE}; partly: softmax's "
                        f"slopes below the GRU's (Welch); seeds: softmax {len(trend['softmax']['seeds'])}, GRU "
                        f"{len(trend['gru']['seeds'])}", sec))
    else:
        out.append(_row(*names[1], NOT_TESTED, "–", sec))
    mem = {(r["arch"], r["context_length"]): r["state_bytes"] for r in lab["memory_cost"]}
    lengths = sorted({t for _, t in mem})
    if "delta" in conv and ("delta", lengths[0]) in mem:
        constant = mem[("delta", lengths[0])] == mem[("delta", lengths[-1])]
        mse = conv["delta"]["norm_mse_at_n_train"]
        ok = constant and mse < rules["learns"]
        out.append(_row(*names[2], "reproduced" if ok else "not",
                        f"delta rule in-context MSE {mse:.3f} at {lab['convergence']['n_train']} pairs (softmax "
                        f"{conv['softmax']['norm_mse_at_n_train']:.3f}); state {mem[('delta', lengths[-1])]} bytes at "
                        f"{lengths[-1]} tokens ({'constant' if constant else 'growing'})", sec))
    else:
        out.append(_row(*names[2], NOT_TESTED, "–", sec))
    worst_id = max(r["max_rel_error"] for r in lab["attention_regression"])
    out.append(_row(*names[3], "reproduced" if worst_id < rules["exact"]["float64"] else "not",
                    f"worst relative error {worst_id:.1e} (float64)", sec))
    tp = sorted(lab["thought_patch"], key=lambda r: r["K"])
    if tp:
        last = tp[-1]
        below = last["test_mse"] < last["no_context_test_mse"]
        out.append(_row("A static thought patch fitted on K calibration queries generalises to fresh queries (lab)",
                        "Mazzawi, Dherin et al. 2025, Algorithm 1",
                        ("reproduced" if below and last["test_mse"] < 2 * last["contextual_test_mse"] else
                         "partly" if below else "not"),
                        f"test MSE {last['test_mse']:.3f} at K={last['K']} vs no context {last['no_context_test_mse']:.3f}"
                        f" and the prompt in context {last['contextual_test_mse']:.3f}", sec))
    return out


def _thought_rows(root: Path) -> list[dict]:
    """Counted only where a row is scored by the boundary verdict (it keeps whole continuations); rows of
    the earlier starts-with verdict are named apart and never counted. The current default's rows only (keyed by its
    fit, ``experiments.thought.cache.row_key``); the fresh queries (``fresh/…``, scored once by the frozen default) are
    read where a model has them (their in-range queries: ``experiments.thought.rule.in_range``), else the test
    queries; every count by the report's one rule, ``experiments.thought.rule.target_rule``. *reproduced* needs every
    task of every model measured and met; *not*: measured and none met; otherwise *partly*."""
    from experiments.thought.cache import row_key
    from experiments.thought.rule import in_range, target_rule
    from experiments.thought.settings import ELIGIBLE, RATIO_LOWER, TARGET, default_fit

    claim = "A thought patch fitted from an instruction reproduces its effect on the language models"
    paper = "Mazzawi, Dherin et al. 2025"
    caches = {path.name[len("eval_thought."):-len(".json")]: _read(root, path.name) or {}
              for path in sorted(Path(root).glob("eval_thought.*.json"))}
    met, total, tasks, parts = 0, 0, 0, []
    for model, data in caches.items():
        fresh, test = row_key("fresh", default_fit(), ""), row_key("table", default_fit(), "")
        split = fresh if any(k.startswith(fresh) for k in data) else test
        rows = [r for k, r in data.items() if k.startswith(split) and isinstance(r, dict)
                and isinstance(r.get("accuracy"), dict) and {"full", "patched"} <= set(r["accuracy"])]
        tasks += len(rows)
        new = [r for r in rows if "continuations" in r]
        rules = [target_rule(p) for r in new if (p := in_range(r)) is not None]
        eligible = [x for x in rules if x.eligible]
        k = sum(x.met for x in eligible)
        met, total = met + k, total + len(eligible)
        parts.append(f"{model}: {k} of {len(eligible)} measured on the "
                     f"{'fresh queries in range' if split == fresh else 'test queries'} "
                     f"({len(rows) - len(new)} of {len(rows)} tasks only under the earlier starts-with "
                     "verdict, not counted)")
    if not total:
        return [_row(claim, paper, NOT_TESTED, "–", "thought"), _equal_distill_row(caches)]
    verdict = ("reproduced" if met == total == tasks else "not" if met == 0 else "partly")
    return [_row(claim, paper, verdict, f"patched accuracy ≥ {TARGET} × full instruction with the paired bootstrap "
                 f"95% lower bound ≥ {RATIO_LOWER} (boundary verdict, tasks where the full instruction reaches "
                 f"{ELIGIBLE:.0%}), " + "; ".join(parts), "thought"), _equal_distill_row(caches)]


def _equal_distill_row(caches: dict[str, dict]) -> dict:
    """The thought patch against context distillation on equal terms (issue 38), from the thought reports' rows by
    model (``caches``), counted by the report's own function (``experiments.thought.method.equal_distill_counts``);
    *reproduced* needs all three (accuracy, locality, time) on every pair, *not*: on none."""
    from experiments.thought.method import equal_distill_counts, equal_distill_pairs, equal_distill_sentence
    from icl_lens.thought.tasks import SHIPPED_TASKS

    claim = ("A thought patch is as accurate and as local as context distillation on equal terms (the same preserve "
             "term, its weight and steps chosen by the same rule), in no more time")
    paper = "icl_lens's comparison (issue 38)"
    counts = equal_distill_counts(equal_distill_pairs(caches, list(caches), list(SHIPPED_TASKS)))
    if not counts["pairs"]:
        return _row(claim, paper, NOT_TESTED, "–", "thought")
    verdict = "reproduced" if counts["all"] == counts["pairs"] else "not" if counts["all"] == 0 else "partly"
    return _row(claim, paper, verdict, f"{equal_distill_sentence(counts)}; all three on {counts['all']} of "
                f"{counts['pairs']} (distillation's selection runs not counted in its time)", "thought")


def _spike_rows(spikes: dict | None) -> list[dict]:
    """Four claims per model, read from ``eval_spikes.json`` (leave one kind out, issue 37): do token patches add
    anything beyond −log p and beyond the hidden state (nested paired differences), does the shipped ``p_wrong``
    rank as well as −log p, and does its flag meet the within-stratum target."""
    models = (spikes or {}).get("models", {})
    beyond_logp = ("Token patches add to the answer's −log p in telling wrong answers, on kinds of question never seen",
                   "this project's hypothesis (after Dherin et al. 2025)")
    beyond_hidden = ("… and add to a hidden-state probe", "this project's hypothesis")
    ranks = ("The shipped p_wrong ranks wrong answers on unseen kinds at least as well as −log p",
             "icl_lens's target (issue 37)")
    flag = ("The shipped flag, on unseen kinds, flags ≤ 5% of correct answers in every stratum and wrong ones at a "
            "rate whose interval lies above that", "icl_lens's target (issues 24, 37)")
    rows = {beyond_logp: [], beyond_hidden: [], ranks: [], flag: []}
    for model, entry in models.items():
        adds = entry.get("patch_adds") or {}
        for claim, label in ((beyond_logp, "beyond −log p"), (beyond_hidden, "beyond the hidden state")):
            d, nc = (adds.get(label) or {}).get("all answers"), (adds.get(label) or {}).get("no copied answer")
            if isinstance(d, dict) and "difference" in d:
                extra = "" if not isinstance(nc, dict) else f" (no copied answer {_ci(nc, key='difference')})"
                rows[claim].append((d["low"] > 0, f"{model} {_ci(d, key='difference')}{extra}"))
        det = (entry.get("shipped") or {}).get("detector") or {}
        if det.get("auroc_unseen_kinds") is not None:
            lo, hi = det["auroc_unseen_kinds_interval"]
            d = (det.get("versus") or {}).get("−log p")
            versus = "it is the −log p baseline" if d is None else f"− {det['baseline']} {_ci(d, key='difference')}"
            rows[ranks].append((bool(det["ranks_as_well_as_neglogp"]),
                                f"{model}: {det['name']} {det['auroc_unseen_kinds']:.3f} [{lo:.3f}, {hi:.3f}], "
                                f"{versus}"))
        unseen = (entry.get("shipped") or {}).get("unseen_kinds") or {}
        if "meets_within" in unseen:
            rows[flag].append((bool(unseen["meets_within"]),
                               f"{model}: correct ≤ 5% in {unseen['strata_correct_ok']} of "
                               f"{unseen['strata_with_correct']} strata (largest {unseen['max_correct_flagged']:.1%}), "
                               f"wrong-rate interval > 5% in {unseen['strata_wrong_ok']} of "
                               f"{unseen['strata_with_wrong']}; pooled correct {unseen['correct_flagged']:.1%}, "
                               f"wrong {unseen['wrong_flagged']:.1%}"))
    out = []
    for (claim, paper), found in rows.items():
        if not found:
            out.append(_row(claim, paper, NOT_TESTED, "–", "spikes"))
            continue
        met = [ok for ok, _ in found]
        verdict = "reproduced" if all(met) else "not" if not any(met) else "partly"
        out.append(_row(claim, paper, verdict, "; ".join(text for _, text in found), "spikes"))
    return out


def claims_summary(root: str | Path = "reports") -> list[dict]:
    """One row per claim (paper and section → verdict → key number with its interval → section), read from the
    reports' JSON only; a report that is missing makes its rows *not tested here*."""
    root = Path(root)
    return [*_lab_rows(_read(root, "eval_lab.json")),
            *_alignment_rows(_read(root, "eval_finetune_alignment.json")),
            *_thought_rows(root), *_spike_rows(_read(root, "eval_spikes.json"))]


def write_summary(root: str | Path = "reports") -> str:
    """``reports/eval_summary.md`` and ``.json`` from :func:`claims_summary` (regenerate after any report changes)."""
    rows = claims_summary(root)
    lines = ["## Summary: every claim, its verdict and its number", "",
             "Generated from the reports' JSON by `experiments.report.write_summary` (run by "
             "`python -m experiments.assemble_reports`). Verdicts: reproduced / partly / not / not tested here, by the rule "
             f"of each section. {QUANTISATION}", "",
             "| claim | paper | verdict | key number [95% interval] | section |", "|---|---|---|---|---|"]
    lines += [f"| {r['claim']} | {r['paper']} | **{r['verdict']}** | {r['number']} | [link]({r['section']}) |" for r in rows]
    Path(root, "eval_summary.json").write_text(json.dumps({"rows": rows, "quantisation": QUANTISATION}, indent=1) + "\n",
                                               encoding="utf-8")
    return write_fragment(Path(root) / "eval_summary.md", lines)
