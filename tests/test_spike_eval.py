"""The spike-flag evaluation's pieces: the question builder, the labelling, the logistic regression,
grouped folds, paired AUROC differences, threshold calibration, the verdict rule on planted signals,
the per-model thresholds the library reads, the residual recorder, and one quick run on a real model."""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

import icl_lens
from experiments import build_questions
from experiments.factual_prompts import (
    DATA_FILE,
    FEW_SHOT,
    FactualPrompt,
    declines,
    is_correct,
    is_correct_answer,
    load_factual_prompts,
    question_templates,
    stratum,
)
from experiments.spikes.answers import PROMPT_TAIL, Answered, AnswerSet, answer_all, cached_answers, save_answers
from experiments.spikes.features import reading
from icl_lens.spikes._scores import MAD_TO_SIGMA
from experiments.spikes.calibration import (
    answer_token_scores,
    calibration_split,
    check_flag,
    threshold_for_rate,
    wilson_upper,
    write_thresholds,
)
from experiments.spikes.run import DEFAULT_FLAG, QUICK_LAMBDAS, RATE, evaluate_model, main, write_detector
from experiments.spikes.summary import LOGPROB_SINGLE, LOKO_SUPERVISED
from icl_lens.spikes._detector import spike_detector
from icl_lens.spikes import _thresholds as spike_thresholds
from icl_lens.model._residual_stream import recording_residual

# ---------------------------------------------------------------- questions and labels


def test_question_file_is_what_the_builder_writes(tmp_path):
    out = tmp_path / "q.jsonl"
    build_questions.main(["--out", str(out)])
    assert out.read_text() == DATA_FILE.read_text(), "rerun python -m experiments.build_questions"
    items = load_factual_prompts()
    kinds = {i.kind for i in items}
    assert len(items) >= 1200 and len(kinds - {"invented"}) >= 20  # issue 37: at least 20 kinds, 8 of them new
    assert all(i.answers for i in items if i.kind != "invented")
    assert all(not i.answers for i in items if i.kind == "invented")
    assert sum(i.kind == "invented" for i in items) >= 40
    # questions about one country share its subject (they stay in one fold)
    france = {i.kind for i in items if i.subject == "France"}
    assert {"capital", "continent", "language", "currency"} <= france


def test_question_builder_is_deterministic_and_invents_entities():
    first, second = build_questions.build_questions(), build_questions.build_questions()
    assert first == second  # seeded arithmetic, fixed order
    real = [r for r in first if r["kind"] != "invented"]
    invented = [r for r in first if r["kind"] == "invented"]
    made_up = {r["subject"] for r in invented}
    assert len(made_up) >= 40 and not made_up & {r["subject"] for r in real}
    assert not any(name in r["prompt"] for name in made_up for r in real)  # no real question names one
    # the made-up entities are asked about in the real kinds' own question forms
    forms = ("What is the capital of", "On which continent is", "What language is spoken in",
             "What is the currency of", "Who wrote", "What is the chemical symbol for", "In what year",
             "What is a baby", "What is the opposite of", "In which country is", "In which city is", "Which sport is",
             "What is the French word for", "What sound does", "What was the nationality of", "What colour is")
    asked = {f for f in forms for r in invented if r["prompt"].startswith(f)}
    assert len(asked) >= 15 and all(any(r["prompt"].startswith(f) for r in real) for f in asked)


def test_labelling_ignores_case_accents_and_a_leading_article():
    assert is_correct(" The euro\n", ("euro",)) and is_correct(" euro", ("the euro",))
    assert is_correct(" Bogotá", ("Bogota",)) and is_correct(" BOGOTA, Colombia", ("Bogotá",))
    assert is_correct(" a kitten", ("kitten",)) and not is_correct(" another", ("other",))
    assert not is_correct(" He", ("H",)) and is_correct(" 12.", ("12",)) and not is_correct(" 123", ("12",))


def test_declining_is_correct_for_invented_subjects_only_and_strata_join_templates():
    invented = FactualPrompt("What is the capital of Veltravia?", (), "invented", "Veltravia")
    real = FactualPrompt("What is the capital of Peru?", ("Lima",), "capital", "Peru")
    for answer in (" There is no such country.\n", " I don't know", " Veltravia does not exist", " Unknown"):
        assert declines(answer) and is_correct_answer(invented, answer), answer
    assert not is_correct_answer(invented, " Veltrav City\n") and not declines(" Lima")
    assert not is_correct_answer(real, " I don't know") and is_correct_answer(real, " Lima\n")
    templates = question_templates([real, invented])
    assert stratum(invented, templates) == stratum(real, templates) == "capital"
    items = load_factual_prompts()
    templates = question_templates(items)
    # every invented question joins the real kind worded like it, except those whose subject is the whole question
    # (a template "{}" says nothing about the kind: it would put them with the arithmetic)
    assert all(stratum(i, templates) != "invented" for i in items if i.kind == "invented" and i.subject != i.prompt)
    whole = [i for i in items if i.kind == "invented" and i.subject == i.prompt]
    assert whole and all(stratum(i, templates) == "invented" for i in whole)
    assert "{}" not in templates


# ---------------------------------------------------------------- calibration and verdict on planted signals

P, NEW = 30, 3  # prompt length and generated tokens (two answer tokens, then the newline)


def _fake(i: int, kind: str, correct: bool, rng, *, spike: bool = False, patch_signal: float = 0.0,
          logprob_signal: float = 0.0, correction_signal: float = 0.0, layers: int = 3, d_model: int = 6) -> Answered:
    agree = rng.integers(0, 6)
    n = P + NEW
    base = np.array([1.0 if t % 2 == 0 else 3.0 for t in range(n)])
    norms = np.tile(base, (layers, 1)) * (1.0 if spike else rng.lognormal(0, 0.1, size=(layers, n)))
    if spike:  # answer tokens: median 2 of the window (z = 0), or an outlier with z = 5
        norms[:, P:P + 2] = 2.0 + (0.0 if correct else 5.0 * MAD_TO_SIGMA)
    norms[0, P:P + 2] *= np.exp(patch_signal * (not correct))
    logprobs = -rng.exponential(1.0, size=NEW) - logprob_signal * (not correct)
    correction = norms * 0.5 + rng.lognormal(0, 0.1, norms.shape)
    correction[1, P:P + 2] *= np.exp(correction_signal * (not correct))  # invisible to the spike score
    return Answered(
        item=FactualPrompt(f"q{i}?", ("x",), kind, f"s{i}"), completion=" x y\n", correct=correct,
        prompt_length=P, n_answer=2, norms=norms, correction_norms=correction,
        informative=np.arange(n) > 0, logprobs=logprobs, entropies=rng.exponential(1.0, size=NEW),
        hidden=rng.normal(size=(PROMPT_TAIL + NEW, d_model)), seconds=0.0,
        samples=tuple(" x y\n" if j < agree else " z\n" for j in range(5)))


def _answer_set(rng, **signal) -> AnswerSet:
    answers = [_fake(i, f"k{i % 4}", bool(rng.random() < 0.5), rng, **signal) for i in range(160)]
    return AnswerSet("fake", 3, 1, tuple(answers), 0.0)


def test_threshold_for_rate():
    scores = np.arange(1000.0)[::-1].copy()
    t = threshold_for_rate(scores, 0.05)
    m = int((scores > t).sum())
    # the largest count whose one-sided 95% Wilson bound stays at or below 5%
    assert wilson_upper(m, 1000) <= 0.05 < wilson_upper(m + 1, 1000) and 30 < m < 50
    p = m / 1000  # the bound by its formula
    z = 1.6448536269514722
    assert wilson_upper(m, 1000) == pytest.approx(
        (p + z * z / 2000 + z * np.sqrt(p * (1 - p) / 1000 + z * z / 4e6)) / (1 + z * z / 1000))
    assert threshold_for_rate(np.arange(20.0), 0.05) == 19.0  # too few tokens for any flag: the largest score
    assert (np.full(100, 2.0) > threshold_for_rate(np.full(100, 2.0), 0.05)).sum() == 0  # ties are not flagged
    # on fresh draws from the same distribution the flag rate stays under the target most of the time
    rng = np.random.default_rng(0)
    rates = [(rng.normal(size=2000) > threshold_for_rate(rng.normal(size=400), 0.05)).mean() for _ in range(200)]
    assert np.mean(np.array(rates) <= 0.05) > 0.85


def test_threshold_on_a_hand_computed_case():
    # n = 100 correct tokens scoring 1, 2, …, 100; target 5%. By hand (z = 1.645, z² = 2.7055):
    # U(1, 100) = (0.01 + 0.013528 + 1.645·√(0.000099 + 0.0000676)) / 1.027055 = 0.0436 ≤ 0.05,
    # U(2, 100) = (0.02 + 0.013528 + 1.645·√(0.000196 + 0.0000676)) / 1.027055 = 0.0586 > 0.05,
    # so one token may be flagged: the threshold is the second largest score, 99 (100 lies above it).
    assert wilson_upper(1, 100) == pytest.approx(0.0436, abs=1e-4)
    assert wilson_upper(2, 100) == pytest.approx(0.0586, abs=1e-4)
    scores = np.random.default_rng(0).permutation(np.arange(1.0, 101.0))
    assert threshold_for_rate(scores, 0.05) == 99.0
    # n = 60: even one flag is too many (U(1, 60) = 0.071), U(0, 60) = 0.043: the largest score
    assert wilson_upper(0, 60) < 0.05 < wilson_upper(1, 60)
    assert threshold_for_rate(np.arange(60.0), 0.05) == 59.0
    with pytest.raises(ValueError, match="finite"):
        threshold_for_rate(np.array([1.0, np.nan]), 0.05)


def test_flag_check_counts_by_hand():
    rng = np.random.default_rng(3)
    answers = [_fake(i, f"k{i % 3}", bool(rng.random() < 0.6), rng) for i in range(240)]
    calibrate = calibration_split(np.array([a.item.subject for a in answers]), seed=0)
    c = check_flag(answers, calibrate, window=16, statistic="mean", rate=0.05)
    scores = answer_token_scores(answers, window=16, statistic="mean")
    cal = np.concatenate([s for s, a, m in zip(scores, answers, calibrate) if a.correct and m])
    assert c.threshold == threshold_for_rate(cal, 0.05) and c.calibration_tokens == cal.size == 2 * sum(
        a.correct for a, m in zip(answers, calibrate) if m)
    right = wrong = right_flagged = wrong_flagged = answers_flagged = wrong_answers_flagged = n_wrong = 0
    for s, a, m in zip(scores, answers, calibrate):
        if m:
            continue
        flagged = int((s > c.threshold).sum())
        answers_flagged += flagged > 0
        if a.correct:
            right, right_flagged = right + s.size, right_flagged + flagged
        else:
            wrong, wrong_flagged, n_wrong = wrong + s.size, wrong_flagged + flagged, n_wrong + 1
            wrong_answers_flagged += flagged > 0
    assert c.held_out_correct_tokens == right and c.held_out_incorrect_tokens == wrong
    assert c.correct_token_flag_rate == right_flagged / right
    assert c.correct_token_flag_rate <= 0.05  # the target, on held-out correct tokens
    assert c.token_precision == wrong_flagged / (wrong_flagged + right_flagged)
    assert c.token_recall == wrong_flagged / wrong
    assert c.answer_precision == wrong_answers_flagged / answers_flagged
    assert c.answer_recall == wrong_answers_flagged / n_wrong and c.incorrect_answers == n_wrong


def test_flag_check_counts_on_planted_spikes():
    rng = np.random.default_rng(0)
    answers = [_fake(i, "k", i % 3 != 0, rng, spike=True) for i in range(60)]
    calibrate = np.arange(60) < 30
    c = check_flag(answers, calibrate, window=16, statistic="mean", rate=0.05)
    assert c.threshold == pytest.approx(0.0, abs=1e-9)
    assert c.calibration_tokens == 2 * sum(a.correct for a in answers[:30])
    assert c.correct_token_flag_rate == 0 and c.token_recall == 1 and c.token_precision == 1
    assert c.answer_precision == 1 and c.answer_recall == 1 and c.incorrect_answers == 10


def test_the_rule_follows_the_planted_signal(tmp_path):
    """A signal only the correction norms carry ships a patch detector; a signal only −log p carries ships a
    −log p detector, baselines included in the rule. The shipped file, read back by the library, scores every
    answer as the evaluation did."""
    fast = dict(folds=3, inner_folds=2, n_boot=200, seed=0, lambdas=QUICK_LAMBDAS, progress=False)
    answers = _answer_set(np.random.default_rng(1), correction_signal=3.0)
    patch = evaluate_model(answers, **fast)
    assert patch["winner"] in LOKO_SUPERVISED and "patch" in patch["winner"]
    adds = patch["patch_adds"]["beyond −log p"]["all answers"]
    assert adds.low > 0  # patch features add to −log p when only they carry the signal
    assert patch["loko_flags"][patch["winner"]].wrong_flagged > 0.3
    write_detector(tmp_path / "d.json", "fake", patch["entry"], command="test", max_new_tokens=8)
    detector = spike_detector("fake", path=tmp_path / "d.json")
    assert detector.name == patch["winner"] and detector.reads_patches and "flag from" in detector.describe()
    library = [detector.score(reading(a)) for a in answers.answers]
    np.testing.assert_allclose(library, patch["shipped_scores"], rtol=1e-9, atol=1e-9)
    logp = evaluate_model(_answer_set(np.random.default_rng(2), logprob_signal=3.0), **fast)
    assert logp["winner"] in LOGPROB_SINGLE + ("log-prob and entropy",)  # a baseline wins, and is shipped
    assert logp["patch_adds"]["beyond −log p"]["all answers"].low <= 0
    write_detector(tmp_path / "d.json", "logp", logp["entry"], command="test", max_new_tokens=8)
    shipped = spike_detector("logp", path=tmp_path / "d.json")
    assert shipped.name == logp["winner"] and not shipped.reads_patches and "fake" in json.loads(
        (tmp_path / "d.json").read_text())["models"]  # the other model's entry stays
    assert shipped.describe().startswith(f"flag from {logp['winner']}; token patches add")
    assert spike_detector("no-such-model", path=tmp_path / "d.json") is None


# ---------------------------------------------------------------- thresholds the library reads


def test_committed_thresholds_cover_both_embedded_models():
    for name in ("gemma-3-270m", "smollm2-135m"):
        t = icl_lens.spike_threshold(name)
        assert t.calibrated and np.isfinite(t.value) and t.statistic == "mean" and t.window == 16
        assert icl_lens.spike_threshold(name, window=8, statistic="max").calibrated
    assert not icl_lens.spike_threshold("gemma-3-270m", layers=[1, 2]).calibrated
    # the thresholds are the ones the committed report measured, and the default flags at most 5% of held-out
    # correct answers' tokens
    root = DATA_FILE.parents[2]
    record = json.loads((root / "reports" / "eval_spikes.json").read_text())
    data = json.loads(spike_thresholds.THRESHOLDS_FILE.read_text())
    assert data["target_correct_token_flag_rate"] == RATE == 0.05
    for name, entry in record["models"].items():
        assert data["models"][name]["command"] == entry.get("command", record["command"])
        reported = {(f["statistic"], f["window"]): f for f in entry["flags"]}
        for row in data["models"][name]["thresholds"]:
            assert row["threshold"] == reported[(row["statistic"], row["window"])]["threshold"]
        default = reported[DEFAULT_FLAG]
        assert default["correct_token_flag_rate"] <= RATE
        assert icl_lens.spike_threshold(name).value == default["threshold"]
    other = icl_lens.spike_threshold("tiny-gpt2")
    assert not other.calibrated and other.value == icl_lens.DEFAULT_SPIKE_THRESHOLD == 3.5


def test_generation_takes_the_calibrated_threshold(load, tmp_path, monkeypatch):
    model = load("tiny-gpt2")
    prompt = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen"
    gen = icl_lens.generate_with_patches(model, prompt, max_new_tokens=3)
    assert gen.spikes.threshold == 3.5 and not gen.threshold.calibrated
    assert "default; no calibration for tiny-gpt2" in gen.threshold.describe()  # the fallback says so
    path = tmp_path / "thresholds.json"
    check = check_flag([_fake(i, "k", True, np.random.default_rng(i), spike=True) for i in range(4)],
                       np.array([True, True, False, False]), window=16, statistic="mean", rate=0.05)
    write_thresholds(path, "tiny-gpt2", [check], rate=0.05, command="test", n_questions=2)
    data = json.loads(path.read_text())
    assert data["models"]["tiny-gpt2"]["thresholds"][0]["threshold"] == check.threshold
    monkeypatch.setattr(spike_thresholds, "THRESHOLDS_FILE", path)
    gen = icl_lens.generate_with_patches(model, prompt, max_new_tokens=3)
    assert gen.threshold.calibrated and gen.spikes.threshold == check.threshold
    assert "calibrated for tiny-gpt2" in gen.threshold.describe()
    expected = icl_lens.spike_scores(gen.patches, threshold=check.threshold).flags
    assert torch.equal(gen.spikes.flags, expected)
    gen = icl_lens.generate_with_patches(model, prompt, max_new_tokens=3, window=8)  # not calibrated for window 8
    assert gen.spikes.threshold == 3.5
    gen = icl_lens.generate_with_patches(model, prompt, max_new_tokens=3, threshold=1.0)
    assert gen.spikes.threshold == 1.0 and gen.threshold is None


def test_answer_cache_is_read_by_question_and_settings(tmp_path, load):
    """The cache is keyed by the model's input text: questions already answered with the same settings are read
    back (labels from the current answer key), files made with other settings are left alone, and a run whose
    questions are all cached generates nothing (tiny-llama's context is shorter than the preamble: a forward
    would fail)."""
    rng = np.random.default_rng(0)
    answers = tuple(replace(_fake(i, "k", True, rng), item=FactualPrompt(f"Where is place {i}?", ("x",), "k", f"s{i}"))
                    for i in range(4))
    head = dict(model_name="tiny-llama", n_layers=3, probe_layer=1, preamble=FEW_SHOT, max_new_tokens=8, n_samples=5)
    folder = tmp_path / "tiny-llama"
    save_answers(AnswerSet(answers=answers[:2], seconds=1.0, **head), folder / "part-a.safetensors")
    save_answers(AnswerSet(answers=answers[2:], seconds=1.0, **head), folder / "part-b.safetensors")
    save_answers(AnswerSet(answers=answers[:1], seconds=1.0, **{**head, "max_new_tokens": 4}), folder / "c.safetensors")
    found = cached_answers(folder, "tiny-llama", 8, 5, 1.0)
    assert set(found) == {a.item.text for a in answers}
    assert not cached_answers(folder, "tiny-llama", 8, 3, 1.0) and len(cached_answers(folder, "tiny-llama", 4, 5, 1.0)) == 1
    rekeyed = [replace(a.item, answers=("nowhere",)) for a in answers[::-1]]  # a changed answer key, another order
    out = answer_all(load("tiny-llama"), rekeyed, max_new_tokens=8, cache=tmp_path, n_samples=5, progress=False)
    assert [a.item for a in out.answers] == rekeyed and not any(a.correct for a in out.answers)
    assert out.seconds == sum(a.seconds for a in answers)


# ---------------------------------------------------------------- residual recorder


def test_residual_recorder_matches_a_full_forward(load):
    model = load("tiny-llama")
    prompt = "abc abd abe abf"
    ids = model.to_tokens(prompt)[0]
    with torch.no_grad():
        _, cache = model.run_with_cache(ids[None])
    with recording_residual(model, 1) as rec, torch.no_grad():
        model(ids[None])
    torch.testing.assert_close(rec.rows(), cache["blocks.1.hook_resid_pre"][0].float())
    with recording_residual(model, 1) as rec:
        gen = icl_lens.generate_with_patches(model, prompt, max_new_tokens=4)
    rows = rec.rows()
    assert rows.shape[0] == sum(gen.recomputed)
    with torch.no_grad():
        _, full = model.run_with_cache(gen.token_ids[None])
    n = gen.token_ids.numel()
    torch.testing.assert_close(rows, full["blocks.1.hook_resid_pre"][0, n - rows.shape[0]:].float(),
                               rtol=1e-4, atol=1e-5)
    assert sum(len(hp.fwd_hooks) for hp in model.hook_dict.values()) == 0
    with pytest.raises(IndexError):
        with recording_residual(model, 99):
            pass


# ---------------------------------------------------------------- one quick run on a real model


def test_quick_run_on_smollm2(tmp_path):
    out = tmp_path / "eval_spikes.md"
    thresholds = tmp_path / "thresholds.json"
    detectors = tmp_path / "detectors.json"
    main(["--models", "smollm2-135m", "--quick", "--out", str(out), "--thresholds-out", str(thresholds),
          "--detectors-out", str(detectors), "--cache", str(tmp_path / "cache")])
    text = out.read_text()
    record = json.loads(out.with_suffix(".json").read_text())
    entry = record["models"]["smollm2-135m"]
    assert entry["questions"] == 3 * len({i.kind for i in load_factual_prompts()})
    assert all(s in text for s in entry["readme_sentences"]) and all(s in text for s in record["summary"])
    assert "patch, answer + last prompt token" in entry["aurocs"]
    assert "beats hidden probe?" in text and "Prompt-only features" in text
    assert text.index("never saw (leave one kind out)") < text.index("Within sample")  # the section opens with LOKO
    assert all(f"| − {b} |" in text for b in ("−log p", "hidden probe", "sampling agreement"))  # the LOKO columns
    assert entry["shipping_rule_winner"] == entry["shipped"]["detector"]["name"]
    assert set(entry["patch_adds"]) == {"beyond −log p", "beyond the hidden state"}
    detector = spike_detector("smollm2-135m", path=detectors)
    assert detector.name == entry["shipped"]["detector"]["name"] and 0 <= detector.threshold <= 1
    rows = json.loads(thresholds.read_text())["models"]["smollm2-135m"]["thresholds"]
    assert {(r["statistic"], r["window"]) for r in rows} >= {("mean", 16), ("max", 8)}


def test_readme_states_the_measured_verdict():
    root = DATA_FILE.parents[2]
    readme = (root / "README.md").read_text()
    record = json.loads((root / "reports" / "eval_spikes.json").read_text())
    for name, entry in record["models"].items():
        for sentence in entry["readme_sentences"]:
            assert sentence in readme, f"README's spike section lacks the measured sentence for {name}: {sentence}"
    items = load_factual_prompts()
    assert f"{len(items)} labelled questions of {len({i.kind for i in items})} kinds" in readme
    for name, entry in record["models"].items():  # a model scored on part of the set says so, with the count
        if entry.get("answered_only"):
            scored = f"{name} was scored on {entry['questions']} of {len(items)} questions ({entry['kinds']} kinds)"
            assert scored in readme, f"README does not say that {name} was scored on part of the set: {scored}"
