"""Thought patches (arXiv 2510.08734): reduction identity, export reload, least squares, bad input, CLI.

Steering, locality, the task suite, intervals and the eval command: tests/test_thought_eval.py.
"""
from __future__ import annotations

import json
import os
from contextlib import nullcontext
import subprocess
import sys
import weakref

import pytest
import torch

from icl_lens import PromptError, ThoughtFit, thought_patch
from icl_lens.core._least_squares import gain_vector, input_map
from icl_lens.model._block_family import block_family
from icl_lens.model._greedy import greedy_continuations, last_logits
from icl_lens.model._tiny_models import TINY_NAMES
from icl_lens.thought._instruction_batches import continuation_ids, text_ids, with_bos
from icl_lens.thought._divergence import answer_kl
from icl_lens.thought._defaults import DEFAULT_ANSWER_TOKENS
from icl_lens.thought.tasks import TaskFormatError, load_task, shipped_task_paths

TINY = ("tiny-gpt2", "tiny-llama", "tiny-gemma3")
INSTRUCTION = "Remember: the secret word is banana, and 7 follows 3.\n"
TOL = {torch.float64: 1e-9, torch.float32: 1e-4}  # docs/design.md §2 equivalence targets
EXACT = dict(kind="both", ridge=0.0, query_prefix="", answer_tokens=0, preserve=())  # the paper's Algorithm 1, the query
# read right after BOS, no preserve texts


def _logits(model, instruction: str | None, query: str) -> torch.Tensor:
    ids = (text_ids(model, instruction) if instruction else []) + text_ids(model, query)
    return last_logits(model, [with_bos(model, ids)])[0]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def _final_resid(model, ids: list[int]) -> torch.Tensor:
    name = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"
    _, cache = model.run_with_cache(torch.tensor([ids]), names_filter=name)
    return cache[name][0, -1]


def _dense_outputs(model, ids: list[int]) -> dict[str, torch.Tensor]:
    """Outputs of every layer's first dense matrices (W_in/W_up, W_gate) at the last position."""
    from icl_lens.model._block_family import block_family

    family = block_family(model)
    names = [family.dense_in_out(l) for l in range(model.cfg.n_layers)]
    if family.gated:
        names += [family.dense_gate_out(l) for l in range(model.cfg.n_layers)]
    _, cache = model.run_with_cache(torch.tensor([ids]), names_filter=lambda n: n in names)
    return {n: cache[n][0, -1] for n in names}


SETTINGS = {"both": EXACT, "both+down-prefix": dict(kind="both+down", ridge=0.0, query_prefix="\n", answer_tokens=0,
                                                   preserve=())}


# The paper's kind on every block family; the default kind (with the newline prefix) on the three tiny models.
IDENTITY_CASES = [(n, "both") for n in TINY_NAMES] + [(n, "both+down-prefix") for n in TINY]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name, setting", IDENTITY_CASES)
def test_one_query_reproduces_contextual_mlp_inputs(load, name, dtype, setting):
    """One single-token calibration query, ridge 0, eta 1: the MATRIX part alone makes the query's
    first-dense outputs equal the contextual ones in every layer (matrix residual ≈ 0), and the
    patched [BOS, (prefix), x] gives the contextual logits of [BOS, I, x] — for the paper's kind
    and for both+down with the newline prefix (the prefix and BOS rows are anchors, the query row
    is interpolated exactly).

    The vector part is fitted on the block-output error, which a wrong matrix would leave to
    the vector; so the dense outputs are checked layer by layer, not only the logits.
    In float64 the logits are checked on the residual stream entering the final norm
    (≤ 1e-9): HF's Gemma 3 RMSNorm upcasts to float32 internally even in a float64 model.
    A parallel block's MLP reads N(r), which the previous layer's vector already restores:
    its matrix target A − a is rounding noise, so its relative matrix residual is not checked
    (the dense outputs still are).
    """
    model = load(name, dtype)
    patch = thought_patch(model, INSTRUCTION, ["q"], **SETTINGS[setting])
    if not block_family(model).parallel:
        assert float(patch.matrix_residual.max()) <= TOL[dtype]
    plain_ids = patch.prompt_ids("q")
    ctx_ids = with_bos(model, text_ids(model, INSTRUCTION) + text_ids(model, "q"))
    contextual_dense = _dense_outputs(model, ctx_ids)
    with patch.applied():
        patched_dense = _dense_outputs(model, plain_ids)
    unpatched_dense = _dense_outputs(model, plain_ids)
    for hook, want in contextual_dense.items():
        assert _rel(patched_dense[hook], want) <= TOL[dtype], hook
    assert max(_rel(unpatched_dense[h], w) for h, w in contextual_dense.items()) > 1e-2  # the instruction matters

    contextual = _logits(model, INSTRUCTION, "q")
    with patch.applied():
        patched = last_logits(model, [plain_ids])[0]
    assert _rel(patched, contextual) <= (1e-7 if dtype == torch.float64 else TOL[torch.float32])
    assert torch.equal(_logits(model, None, "q"), _logits(model, None, "q"))
    if dtype == torch.float64:
        with patch.applied():
            resid = _final_resid(model, plain_ids)
        assert _rel(resid, _final_resid(model, ctx_ids)) <= TOL[torch.float64]


def test_a_wrong_matrix_fails_the_dense_output_check(load):
    """The check above can fail: the same patch with its matrix replaced by its random control does."""
    from dataclasses import replace

    model = load("tiny-llama", torch.float64)
    patch = thought_patch(model, INSTRUCTION, ["q"], **EXACT)
    wrong = replace(patch, maps=patch.random_control(seed=1).maps)
    ctx = _dense_outputs(model, with_bos(model, text_ids(model, INSTRUCTION) + text_ids(model, "q")))
    with wrong.applied():
        got = _dense_outputs(model, with_bos(model, text_ids(model, "q")))
    assert max(_rel(got[h], w) for h, w in ctx.items()) > 1e-3


@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("name", ["gemma-3-270m", "smollm2-135m"])
def test_one_query_reproduces_contextual_logits_embedded(load, name, setting):
    model = load(name)
    instruction = "France: Paris\nJapan: Tokyo\n"
    query = "Italy:"
    ids = text_ids(model, query)
    query = model.tokenizer.decode(ids[-1:]) if len(ids) > 1 else query  # one token, as in the identity
    patch = thought_patch(model, instruction, [query], **SETTINGS[setting])
    contextual = _logits(model, instruction, query)
    with patch.applied():
        patched = last_logits(model, [patch.prompt_ids(query)])[0]
    assert _rel(patched, contextual) <= TOL[torch.float32]


def test_gated_mlps_get_separate_fits_and_gemma_uses_the_gain(load):
    gemma, llama, gpt2 = load("tiny-gemma3"), load("tiny-llama"), load("tiny-gpt2")
    pg = thought_patch(gemma, INSTRUCTION, ["ab", "cd"], layers=[1], kind="both")
    assert pg.vector_site == "gain" and thought_patch(llama, INSTRUCTION, ["ab"]).vector_site == "bias"
    deltas = pg.weight_deltas(1)
    assert set(deltas) == {"in", "gate"} and not torch.allclose(deltas["in"], torch.zeros_like(deltas["in"]))
    assert set(thought_patch(gpt2, INSTRUCTION, ["ab"]).weight_deltas(0)) == {"in"}
    # only the requested layer is patched
    assert float(pg.maps[0].abs().max()) == 0.0 and float(pg.vectors[2].abs().max()) == 0.0


@pytest.mark.parametrize("name", TINY_NAMES)
def test_export_reloads_in_plain_transformers(load, name, tmp_path):
    """Every family: the export of a default (``both+down``) patch reloads as the same HF class and gives the
    hook-patched logits. A family whose HF class has no slot for the vector (block_family.vector_export None)
    refuses a patch with a vector before writing anything, and exports the matrix part."""
    from transformers import AutoModelForCausalLM

    from icl_lens.thought._hf_export import VectorNotExportableError

    model = load(name)
    queries = ["dog ->", "house ->", "tree ->"]
    kind = "both+down"
    if block_family(model).vector_export is None:
        with pytest.raises(VectorNotExportableError, match="kind='matrix'"):
            thought_patch(model, INSTRUCTION, queries).save_pretrained(tmp_path / "refused")
        assert not (tmp_path / "refused").exists()
        kind = "matrix"
    patch = thought_patch(model, INSTRUCTION, queries, kind=kind)
    assert (float(patch.down_norms().max()) > 0) == (kind == "both+down")
    patch.save_pretrained(tmp_path)
    assert patch.fit == ThoughtFit(kind=kind) == ThoughtFit.load(tmp_path)  # the settings travel with the export
    hf = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert type(hf) is type(model.original_model)
    prompts = [with_bos(model, text_ids(model, q)) for q in ("sun ->", "a much longer test query ->")]
    for prompt in prompts:
        ids = torch.tensor([prompt])
        with torch.no_grad(), patch.applied():
            bridge = model(ids)[0]
        with torch.no_grad():
            plain = hf(ids).logits[0]
        assert _rel(plain, bridge) <= TOL[torch.float32]
        with torch.no_grad():
            assert _rel(model(ids)[0], bridge) > 1e-3  # the export is not the base model


@pytest.mark.parametrize("shard", [None, "64KB"])
def test_export_holds_one_edited_weight_at_a_time(load, tmp_path, monkeypatch, shard):
    """The export writes the model's own weights, then computes each edited weight and writes it over its own in
    the file before computing the next: an export never holds every layer's edited weights at once (notebook 04's
    peak memory was its export). With shards (``save_pretrained``'s ``max_shard_size``; a model above 50 GB), each
    edit lands in the shard that holds it, and the export still gives the patched logits."""
    import functools

    from transformers import AutoModelForCausalLM, PreTrainedModel

    from icl_lens.thought import _hf_export

    model = load("tiny-llama")
    patch = thought_patch(model, INSTRUCTION, ["ab", "xyz"])
    made: list[weakref.ref] = []
    write = _hf_export.write_edited

    def watch(make):
        def watched():
            assert all(r() is None for r in made), "an edited weight was still held when the next was computed"
            new = make()
            made.append(weakref.ref(new))
            return new
        return watched

    monkeypatch.setattr(_hf_export, "write_edited",
                        lambda directory, edits: write(directory, {k: watch(f) for k, f in edits.items()}))
    if shard:
        monkeypatch.setattr(PreTrainedModel, "save_pretrained",
                            functools.partialmethod(PreTrainedModel.save_pretrained, max_shard_size=shard))
    patch.save_pretrained(tmp_path)
    assert len(made) == 3 * len(patch.layers)  # gate, up and down per patched layer (the biases are new keys)
    assert len(list(tmp_path.glob("*.safetensors"))) > (5 if shard else 0)
    ids = torch.tensor([with_bos(model, text_ids(model, "sun ->"))])
    with torch.no_grad(), patch.applied():
        bridge = model(ids)[0]
    with torch.no_grad():
        assert _rel(AutoModelForCausalLM.from_pretrained(tmp_path)(ids).logits[0], bridge) <= TOL[torch.float32]


def test_export_loads_without_icl_lens(load, tmp_path):
    """A fresh interpreter that imports only transformers gets the patched logits."""
    model = load("tiny-llama")
    patch = thought_patch(model, INSTRUCTION, ["ab", "xyz"])
    patch.save_pretrained(tmp_path / "m")
    prompt = with_bos(model, text_ids(model, "hello"))
    with torch.no_grad(), patch.applied():
        expected = model(torch.tensor([prompt]))[0, -1]
    torch.save({"ids": prompt, "logits": expected}, tmp_path / "ref.pt")
    code = (
        "import sys, torch, transformers\n"
        f"m = transformers.AutoModelForCausalLM.from_pretrained({str(tmp_path / 'm')!r})\n"
        f"ref = torch.load({str(tmp_path / 'ref.pt')!r})\n"
        "out = m(torch.tensor([ref['ids']])).logits[0, -1]\n"
        "assert 'icl_lens' not in sys.modules\n"
        "print(float((out - ref['logits']).abs().max() / ref['logits'].abs().max()))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                         cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert float(res.stdout.strip().splitlines()[-1]) <= TOL[torch.float32]


def test_input_map_is_the_papers_least_squares():
    """M with Δ = W M equals (Σ W δ aᵀ)(Σ a aᵀ + λI)⁻¹ / W; ridge 0 is the min-norm pseudo-inverse."""
    gen = torch.Generator().manual_seed(0)
    d, n, d_mlp = 12, 5, 20
    a = torch.randn(n, d, generator=gen, dtype=torch.float64)
    delta = torch.randn(n, d, generator=gen, dtype=torch.float64)
    w = torch.randn(d_mlp, d, generator=gen, dtype=torch.float64)
    lam = 0.7
    paper = (w @ delta.T @ a) @ torch.linalg.inv(a.T @ a + lam * torch.eye(d, dtype=torch.float64))
    assert torch.allclose(w @ input_map(delta, a, ridge=lam), paper, atol=1e-10)
    m0 = input_map(delta, a)
    assert torch.allclose(m0 @ a.T, delta.T, atol=1e-10)  # n < d: interpolates every token
    assert torch.allclose(m0, delta.T @ torch.linalg.pinv(a).T, atol=1e-10)


def test_singular_systems_fall_back_to_the_pseudo_inverse(load):
    a = torch.zeros(3, 4, dtype=torch.float64)
    a[:, 0] = 1.0  # three identical inputs: rank 1
    delta = torch.arange(12, dtype=torch.float64).reshape(3, 4)
    m = input_map(delta, a)
    assert torch.isfinite(m).all()
    assert torch.allclose(m @ a[0], delta.mean(0), atol=1e-12)  # least squares of repeated rows
    assert torch.equal(input_map(delta, torch.zeros(3, 4, dtype=torch.float64)), torch.zeros(4, 4, dtype=torch.float64))
    g = gain_vector(delta, torch.zeros(3, 4, dtype=torch.float64))
    assert torch.equal(g, torch.zeros(4, dtype=torch.float64))
    model = load("tiny-llama", torch.float64)
    patch = thought_patch(model, INSTRUCTION, ["q", "q", "q"], **EXACT)  # duplicated calibration rows
    assert torch.isfinite(patch.maps).all() and torch.isfinite(patch.vectors).all()
    with patch.applied():
        patched = _logits(model, None, "q")
    assert _rel(patched, _logits(model, INSTRUCTION, "q")) <= TOL[torch.float64]


def test_iterations_shrink_the_residual_with_small_eta(load):
    """Sweeps with η < 1 approach the exact patch (bias site; the Gemma gain site need not, see icl_lens.thought._fit)."""
    model = load("tiny-llama", torch.float64)
    contextual = _logits(model, INSTRUCTION, "q")
    errs = []
    for it in (1, 4):
        with thought_patch(model, INSTRUCTION, ["q"], eta=0.5, iterations=it, **EXACT).applied():
            errs.append(_rel(_logits(model, None, "q"), contextual))
    assert errs[1] < errs[0]


def test_control_has_same_norms_other_directions(load):
    model = load("tiny-llama")
    patch = thought_patch(model, INSTRUCTION, ["ab", "cd", "ef"])
    control = patch.random_control(3)
    assert torch.allclose(control.matrix_norms(), patch.matrix_norms(), rtol=1e-4)
    assert torch.allclose(control.vector_norms(), patch.vector_norms(), rtol=1e-4)
    assert torch.allclose(control.down_norms(), patch.down_norms(), rtol=1e-4) and float(patch.down_norms().min()) > 0
    cos = torch.nn.functional.cosine_similarity(control.maps.flatten(1), patch.maps.flatten(1), dim=-1)
    assert float(cos.abs().max()) < 0.5
    frame = patch.to_frame()
    assert list(frame["layer"]) == list(range(model.cfg.n_layers)) and (frame["matrix_norm"] > 0).all()
    assert (frame["down_norm"] > 0).all()


@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-llama"])
def test_answer_rows_make_the_answer_positions_exact(load, name):
    """``answer_tokens``: the model's own answer under the instruction (its first tokens, up to a newline) is read
    after the query and becomes calibration rows. Fitted exactly (both+down, ridge 0, one query), the patched
    query-alone pass then predicts every answer token as the contextual pass does (KL ≈ 0 at each answer
    position); fitted at the query only, the answer positions are off."""
    model = load(name, torch.float64)
    instr, q = text_ids(model, INSTRUCTION), text_ids(model, "q")
    answer = continuation_ids(model, instr, [q], 3)[0]
    greedy = greedy_continuations(model, [with_bos(model, instr + q)], 3)[0]
    assert answer == greedy[: len(answer)] and all("\n" not in model.tokenizer.decode([t]) for t in answer[:-1])
    assert len(answer) >= 2  # else the answer positions are the query's last token only
    exact = dict(kind="both+down", ridge=0.0, query_prefix="\n", preserve=())
    rows = thought_patch(model, INSTRUCTION, ["q"], answer_tokens=3, **exact)
    plain = thought_patch(model, INSTRUCTION, ["q"], answer_tokens=0, **exact)
    assert rows.n_tokens == plain.n_tokens + len(answer) and rows.answer_tokens == 3

    def kl(patch):
        return answer_kl(model, INSTRUCTION, ["q"], patch, query_prefix="\n", answer_tokens=3)

    assert kl(rows) <= 1e-9
    assert kl(plain) > 1e-4
    assert answer_kl(model, INSTRUCTION, ["q"], plain, query_prefix="\n") <= 1e-9  # its own row: exact


@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-llama", "tiny-gemma3"])
def test_preserve_penalty_keeps_the_preserved_text_and_fades_with_its_strength(load, name):
    """``preserve``: the preserved texts' keys enter every fit as the penalty w·K₀K₀ᵀ. The stronger it is, the less
    the patched model's logits move on a preserved text; strength 0 is the plain fit exactly, and at every strength
    the query's own logits move towards the instruction's (the edit still does its job)."""
    model = load(name, torch.float64)
    kept = ["The quiet river bends past the mill.", "Seven green boxes sat on a shelf by the door."]
    setting = dict(kind="both+down", ridge=1.0, query_prefix="\n", answer_tokens=0)

    def logits(text: str, edit=None) -> torch.Tensor:
        ids = torch.tensor([with_bos(model, text_ids(model, text))])
        with torch.no_grad(), edit.applied() if edit is not None else nullcontext():
            return model(ids)[0]

    moved = {}
    for strength in (0.0, 1.0, 100.0):
        patch = thought_patch(model, INSTRUCTION, ["q", "ab"], preserve=kept, preserve_strength=strength, **setting)
        moved[strength] = sum(_rel(logits(t, patch), logits(t)) for t in kept)
        with patch.applied():
            patched = last_logits(model, [patch.prompt_ids("q")])[0]
        alone = last_logits(model, [patch.prompt_ids("q")])[0]
        full = _logits(model, INSTRUCTION, "q")
        assert float((patched - full).norm()) < float((alone - full).norm())
    plain = thought_patch(model, INSTRUCTION, ["q", "ab"], preserve=(), **setting)
    assert _rel(logits(kept[0], plain), logits(kept[0])) == pytest.approx(
        _rel(logits(kept[0], thought_patch(model, INSTRUCTION, ["q", "ab"], preserve=kept, preserve_strength=0.0,
                                            **setting)), logits(kept[0])), rel=1e-12)
    assert moved[100.0] < 0.5 * moved[1.0] < 0.5 * moved[0.0]
    from icl_lens.thought._preserve import preserve_texts

    default = thought_patch(model, INSTRUCTION, ["q", "ab"], **setting)  # preserve=None: the model's preserve texts
    given = thought_patch(model, INSTRUCTION, ["q", "ab"], preserve=preserve_texts(model), **setting)
    assert torch.equal(default.maps, given.maps) and not torch.equal(default.maps, plain.maps)
    with pytest.raises(PromptError):
        thought_patch(model, INSTRUCTION, ["q"], preserve=kept[0], preserve_strength=1.0)
    with pytest.raises(ValueError, match="preserve_strength"):
        thought_patch(model, INSTRUCTION, ["q"], preserve=kept, preserve_strength=-1.0)


class _FromTheEmbedding:
    """The fit as it was before issue 41, kept here as the reference: every read is a forward from the embedding up
    to the layer read (``L(L+1)`` blocks a sweep), and the preserve keys of every layer come from one unpatched
    forward over the texts."""

    @staticmethod
    def fitter(base):
        from icl_lens.thought._instruction_batches import read_query_tokens

        class Fitter(base):
            def read(self, names, stop):
                got = read_query_tokens(self.model, self.plain, names, edits=self.edits(), stop=stop,
                                        anchors=self.targets.anchor, batch_size=self.fit.batch_size, dtype=self.dtype)
                out = {k: got[k] for k in names}
                if self.targets.anchor:
                    out.update({f"{k}_keep": got[f"{k}_anchor"] for k in names})
                return out

            def sweep(self, layers):
                for layer in layers:
                    if "matrix" in self.parts:
                        self.fit_matrix(layer)
                    if "vector" in self.parts or "down" in self.parts:
                        self.fit_vector_and_down(layer)

        return Fitter

    @staticmethod
    def keys(base):
        from icl_lens.core._norms import rms_normalize
        from icl_lens.model._block_family import post_norm_eps
        from icl_lens.thought._instruction_batches import query_batch, read_query_tokens

        class Keys(base):
            def get(self, kind, layer):
                if not self or kind not in self.sites:
                    return None
                if not hasattr(self, "whole"):
                    names = {f"{k}{l}": site(l) for l in self.layers for k, site in self.sites.items()}
                    got = read_query_tokens(self.model, query_batch(self.model, self.keep_ids), names,
                                            dtype=self.dtype)
                    self.whole = {}
                    for key, x in got.items():
                        if key[0] == "y":
                            x = rms_normalize(x, post_norm_eps(self.model, int(key[1:]))).to(self.dtype)
                            self.whole[key] = (x * x).sum(0)
                        else:
                            self.whole[key] = x.T @ x
                return self.whole[f"{kind}{layer}"]

        return Keys


def _watch_preserved_keys(monkeypatch) -> list:
    """Every ``PreservedKeys`` the fits make from now on, in order (their cost counters are read after the fit)."""
    import icl_lens.thought._fit as fit_module
    import icl_lens.thought._preserved_keys as pk

    made = []

    class Watched(pk.PreservedKeys):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(fit_module, "PreservedKeys", Watched)
    return made


EQUAL_CASES = {  # (model, settings): the default kind with answer rows and preserve texts; a layer subset, two sweeps
    "default": dict(kind="both+down", ridge=1.0, answer_tokens=2, preserve_strength=3.0),
    "subset, two sweeps": dict(kind="both+down", ridge=1.0, eta=0.5, iterations=2, layers=[0, 2], answer_tokens=0,
                               preserve_strength=3.0),
    "paper's kind": dict(kind="both", ridge=0.5, answer_tokens=0, preserve=()),
}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("case", list(EQUAL_CASES))
@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gemma3"])
def test_one_pass_over_the_layers_gives_the_fit_from_the_embedding(load, name, case, dtype, monkeypatch):
    """The sweep takes the query-only batch (and the preserve texts) through the blocks once, each block starting from
    the residual the patched blocks before it left (issue 41): the same patch as reading every layer with a forward
    from the embedding (the reference above), to 1e-6 relative in float64 (float32: 1e-3, its noise through a
    ridge solve), with each preserve text pass run once per sweep and one layer's covariances held at a time."""
    import icl_lens.thought._fit as fit_module
    import icl_lens.thought._preserved_keys as pk

    monkeypatch.setenv(pk.CACHE_ENV, "")  # both paths read the texts (the disk cache: the test below)
    model = load(name, dtype)
    kept = ["The quiet river bends past the mill.", "Seven green boxes sat on a shelf by the door."]
    setting = {"preserve": kept, **EQUAL_CASES[case]}
    queries = ["q", "ab", "the cat"]
    made = _watch_preserved_keys(monkeypatch)
    swept = thought_patch(model, INSTRUCTION, queries, **setting)
    monkeypatch.setattr(fit_module, "_Fitter", _FromTheEmbedding.fitter(fit_module._Fitter))
    monkeypatch.setattr(fit_module, "PreservedKeys", _FromTheEmbedding.keys(pk.PreservedKeys))
    reference = thought_patch(model, INSTRUCTION, queries, **setting)
    tol = 1e-6 if dtype == torch.float64 else 1e-3
    for part in ("maps", "vectors", "down_u", "down_v"):
        a, b = getattr(swept, part), getattr(reference, part)
        assert a.shape == b.shape, part
        if b.numel():
            assert float((a - b).abs().max()) <= tol * max(float(b.abs().max()), 1e-30), part
    assert (swept.down_u.numel() > 0) == ("down" in setting["kind"])
    keys = made[-1]
    if keys:
        fit = swept.fit
        assert keys.passes == fit.iterations and len(keys._held) <= len(keys.sites)
        assert keys.blocks_run == fit.iterations * (max(fit.layers or [model.cfg.n_layers - 1]) + 1)


def test_preserved_covariances_come_back_from_disk_bit_for_bit(load, tmp_path, monkeypatch):
    """A second fit with the same weights, texts and dtype reads every layer's covariances from the disk cache (no
    pass over the texts) and makes the same patch bit for bit; other texts, a weight edited in place, or a torn file
    are computed again, and an empty ``ICL_LENS_PRESERVE_CACHE`` keeps nothing."""
    import icl_lens.thought._preserved_keys as pk

    made = _watch_preserved_keys(monkeypatch)
    monkeypatch.setenv(pk.CACHE_ENV, str(tmp_path))
    model = load("tiny-llama", torch.float64)
    setting = dict(preserve=["The quiet river bends past the mill.", "Two boxes."], preserve_strength=3.0,
                   answer_tokens=0)
    parts = ("maps", "vectors", "down_u", "down_v")

    def fit(**extra):
        got = thought_patch(model, INSTRUCTION, ["q", "ab"], **{**setting, **extra})
        return got, made[-1]

    cold, keys = fit()
    n = model.cfg.n_layers
    assert (keys.loaded, keys.passes) == (0, 1) and len(list(tmp_path.glob("*/layer*.pt"))) == n
    warm, keys = fit()
    assert (keys.loaded, keys.passes, keys.blocks_run) == (n, 0, 0)
    assert all(torch.equal(getattr(cold, p), getattr(warm, p)) for p in parts)
    folder = keys._folder

    _, keys = fit(preserve=["Another text entirely."])
    assert (keys.loaded, keys.passes) == (0, 1)

    (folder / "layer1.pt").write_bytes(b"torn")
    again, keys = fit()
    assert (keys.loaded, keys.passes) == (n - 1, 1)
    assert all(torch.equal(getattr(cold, p), getattr(again, p)) for p in parts)

    w = next(model.parameters())
    kept = w.detach().clone()
    with torch.no_grad():
        w.mul_(1.5)
    try:
        _, keys = fit()
        assert keys.loaded == 0, "a weight edited in place must not read the old weights' covariances"
    finally:
        with torch.no_grad():
            w.copy_(kept)

    monkeypatch.setenv(pk.CACHE_ENV, "")
    _, keys = fit()
    assert (keys.loaded, keys.passes) == (0, 1)


@pytest.mark.parametrize(
    "kwargs, error",
    [
        (dict(instruction="   ", queries=["a"]), PromptError),
        (dict(instruction="x", queries=[]), PromptError),
        (dict(instruction="x", queries=["a", " "]), PromptError),
        (dict(instruction="x", queries="abc"), PromptError),
        (dict(instruction="x", queries=["a"], kind="tensor"), ValueError),
        (dict(instruction="x", queries=["a"], ridge=-1.0), ValueError),
        (dict(instruction="x", queries=["a"], eta=float("nan")), ValueError),
        (dict(instruction="x", queries=["a"], layers=[7]), ValueError),
        (dict(instruction="x", queries=["a"], iterations=0), ValueError),
        (dict(instruction="x", queries=["a"], answer_tokens=-1), ValueError),
        (dict(instruction="x", queries=["a"], query_prefix=None), PromptError),
    ],
)
def test_bad_arguments_fail_fast(load, kwargs, error):
    with pytest.raises(error):
        thought_patch(load("tiny-gpt2"), **kwargs)


def _write_task(path, **overrides):
    task = {"name": "t", "instruction": "a: 1\nb: 2\n", "train": [{"query": "a:", "answer": "1"}],
            "test": [{"query": "b:", "answer": "2"}, {"query": "c:", "answer": "3"}]}
    task.update(overrides)
    task = {k: v for k, v in task.items() if v is not None}
    path.write_text("\n" + json.dumps(task) + "\n")
    return path


def test_task_files_are_validated(tmp_path):
    with pytest.raises(TaskFormatError, match=r"line 2: missing field 'instruction'"):
        load_task(_write_task(tmp_path / "a.jsonl", instruction=None))
    with pytest.raises(TaskFormatError, match=r"train\[0\]: missing field 'answer'"):
        load_task(_write_task(tmp_path / "b.jsonl", train=[{"query": "a:"}]))
    with pytest.raises(TaskFormatError, match=r"test\[0\]: field 'answer' is empty"):
        load_task(_write_task(tmp_path / "c.jsonl", test=[{"query": "b:", "answer": "  "}]))
    with pytest.raises(FileNotFoundError):
        load_task(tmp_path / "missing.jsonl")
    assert load_task(_write_task(tmp_path / "d.jsonl")).fresh == ()  # optional: files without it still load
    fresh = [{"query": "d:", "answer": "4"}]
    assert load_task(_write_task(tmp_path / "e.jsonl", fresh=fresh)).fresh == (("d:", "4"),)
    with pytest.raises(TaskFormatError, match=r"fresh\[0\]: missing field 'answer'"):
        load_task(_write_task(tmp_path / "f.jsonl", fresh=[{"query": "d:"}]))
    with pytest.raises(TaskFormatError, match=r"field 'fresh' has no examples"):
        load_task(_write_task(tmp_path / "g.jsonl", fresh=[]))
    for path in shipped_task_paths():
        task = load_task(path)
        assert task.train and task.test and not set(task.train) & set(task.test)


def test_empty_answers_are_rejected_before_any_fit(load):
    """Answers that tokenise to nothing (here: whitespace only) fail with the split and index named."""
    from icl_lens.thought._evaluate import evaluate_thought
    from icl_lens.thought.tasks import Task

    task = Task("t", "a: 1\n", (("a:", "1"),), (("b:", "2"), ("c:", " ")))
    with pytest.raises(PromptError, match=r"test\[1\] answer"):
        evaluate_thought(load("tiny-gpt2"), task)


def test_cli_json_on_a_tiny_task(tmp_path, capsys):
    from icl_lens.cli import main

    path = _write_task(tmp_path / "tiny.jsonl", train=[{"query": "a:", "answer": "1"}, {"query": "z:", "answer": "9"}])
    assert main(["thought-eval", str(path), "--model", "tiny-llama", "--json", "--n-train", "2",
                 "--distill-steps", "5"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(out) == {"task", "model", "kind", "eta", "ridge", "query_prefix", "answer_tokens", "n_train", "n_test",
                        "accuracy", "correct", "interval95", "locality_kl", "locality_kept", "agreement_with_full",
                        "gain_recovered", "steering_layer", "seconds", "continuations", "preserve", "preserve_strength",
                        "preserve_set", "split", "distill", "fit"}
    assert out["fit"]["kind"] == out["kind"] and out["fit"]["eta"] == out["eta"]  # the settings travel with it
    assert out["split"] == "test" and out["preserve_set"] == "samples+few-shot"
    assert out["task"] == "t" and out["model"] == "tiny-llama" and out["n_train"] == 2 and out["n_test"] == 2
    edited = {"patched", "distilled", "steering", "control"}
    assert set(out["accuracy"]) == {"none", "full"} | edited
    assert set(out["locality_kl"]) == set(out["locality_kept"]) == edited
    assert set(out["agreement_with_full"]) == {"none"} | edited
    assert set(out["gain_recovered"]) == edited
    assert all(v in (0.0, 0.5, 1.0) for v in out["agreement_with_full"].values())
    assert all(v > 0 for v in out["locality_kl"].values())  # every edit changes something
    assert out["kind"] == "both+down" and out["query_prefix"] == "\n" and 0 <= out["steering_layer"] < 3
    assert all(v in (0.0, 0.5, 1.0) for v in out["accuracy"].values())
    assert set(out["seconds"]) == {"patched", "distilled", "total"} and all(v > 0 for v in out["seconds"].values())
    assert {c: len(t) for c, t in out["continuations"].items()} == {c: 2 for c in out["accuracy"]}
    assert out["distill"]["steps"] == 5 and out["distill"]["last_loss"] < out["distill"]["first_loss"]
    for cond, (low, high) in out["interval95"].items():
        assert 0 <= low <= out["accuracy"][cond] <= high <= 1 and high - low > 0.3  # n = 2: wide
    assert out["answer_tokens"] == DEFAULT_ANSWER_TOKENS > 0
    assert main(["thought-eval", str(tmp_path / "nope.jsonl"), "--model", "tiny-llama"]) == 2
    assert "not found" in capsys.readouterr().err
    assert main(["thought-eval", str(path), "--model", "tiny-llama", "--answer-tokens", "-1"]) == 2
    assert "--answer-tokens must be >= 0" in capsys.readouterr().err


def test_cli_runs_only_the_conditions_asked_for(tmp_path, capsys):
    """``--conditions`` picks what runs: no distillation settings or seconds when it is left out, and the
    gain recovered only where none and full were both run."""
    from icl_lens.cli import main

    path = _write_task(tmp_path / "tiny.jsonl", train=[{"query": "a:", "answer": "1"}, {"query": "z:", "answer": "9"}])
    assert main(["thought-eval", str(path), "--model", "tiny-llama", "--json", "--conditions", "control", "none",
                 "full"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert list(out["accuracy"]) == ["none", "full", "control"]  # the evaluation's order, not the command line's
    assert set(out["locality_kl"]) == {"control"} and set(out["gain_recovered"]) == {"control"}
    assert "distill" not in out and set(out["seconds"]) == {"patched", "total"}  # the control needs the fit
    assert main(["thought-eval", str(path), "--model", "tiny-llama", "--conditions", "distilled"]) == 0
    assert "distilled" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["thought-eval", str(path), "--model", "tiny-llama", "--conditions", "finetuned"])
    assert "invalid choice: 'finetuned'" in capsys.readouterr().err

def test_accuracy_bookkeeping_against_a_hand_count(load):
    """Six test queries of three lengths; the answers are set from greedy continuations computed here
    one token at a time, and each condition's count of right answers is counted here by the boundary rule
    (:func:`answer_correct`). evaluate_thought must report those counts and keep those continuations
    (batching by length must not mix answers up)."""
    from icl_lens.thought._evaluate import answer_correct, evaluate_thought
    from icl_lens.thought.tasks import Task

    model = load("tiny-llama")
    queries = ["ab:", "cd:", "efg:", "hij:", "klmn:", "opqr:"]
    instruction = "x: 1\n"

    def greedy_text(ids: list[int], n: int) -> str:
        ids = list(ids)
        for _ in range(n):
            with torch.no_grad():
                ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
        return model.tokenizer.decode(ids[-n:])

    first = [greedy_text(with_bos(model, text_ids(model, q)), 1) for q in queries]
    answers = [first[i].strip()[:1] or "y" if i in {0, 2, 3, 5} else "\u00e9" for i in range(6)]
    n_new = max(len(text_ids(model, " " + a)) for a in answers) + 1  # the longest answer's tokens, plus one
    plain = [greedy_text(with_bos(model, text_ids(model, q)), n_new) for q in queries]
    full = [greedy_text(with_bos(model, text_ids(model, instruction) + text_ids(model, q)), n_new) for q in queries]
    task = Task("hand", instruction, (("zz:", "1"),), tuple(zip(queries, answers)))
    result = evaluate_thought(model, task, conditions=("none", "full"), query_prefix="")
    expected = {c: sum(answer_correct(t, a) for t, a in zip(texts, answers)) / 6
                for c, texts in (("none", plain), ("full", full))}
    assert result.accuracy == expected
    assert result.continuations == {"none": tuple(plain), "full": tuple(full)}
    assert result.n_test == 6 and result.n_train == 1
    for cond, texts in (("none", plain), ("full", full)):  # a right answer is given as the answer itself
        for t, a, g in zip(texts, answers, result.answers[cond]):
            assert (g == a) == answer_correct(t, a) and t.lstrip(" ").startswith(g)
    assert result.agreement_with_full == {"none": sum(a == b for a, b in zip(result.answers["none"],
                                                                             result.answers["full"])) / 6}


def test_thought_fit_is_the_documented_default_and_travels_as_a_dict():
    """``ThoughtFit()`` holds the documented defaults; to_dict/from_dict round-trip; the key changes with every
    setting but not with preserve texts the fit never reads (strength 0); bad settings fail on construction."""
    from icl_lens.thought import (DEFAULT_ANSWER_TOKENS, DEFAULT_KIND, DEFAULT_PRESERVE_STRENGTH, DEFAULT_QUERY_PREFIX,
                                  DEFAULT_RIDGE)

    fit = ThoughtFit()
    assert (fit.kind, fit.ridge, fit.query_prefix, fit.answer_tokens, fit.preserve_strength) == (
        DEFAULT_KIND, DEFAULT_RIDGE, DEFAULT_QUERY_PREFIX, DEFAULT_ANSWER_TOKENS, DEFAULT_PRESERVE_STRENGTH)
    given = fit.replace(layers=[2, 0, 2], preserve=["a", "b"], eta=1)
    assert given.layers == (0, 2) and given.preserve == ("a", "b") and given.eta == 1.0
    assert ThoughtFit.from_dict(json.loads(json.dumps(given.to_dict()))) == given
    keys = {f.key() for f in (fit, given, fit.replace(ridge=0.5), fit.replace(batch_size=8), fit.replace(preserve=()))}
    assert len(keys) == 5
    assert fit.replace(preserve_strength=0.0).key() == fit.replace(preserve_strength=0.0, preserve=("x",)).key()
    assert fit.key("another set") != fit.key() == ThoughtFit().key()  # the shipped texts a preserve=None fit reads
    with pytest.raises(TypeError, match="unknown thought-fit setting"):
        fit.replace(ridg=1.0)
    with pytest.raises(ValueError, match="not thought-fit settings"):
        ThoughtFit.from_dict({"ridge": 1.0, "lr": 2})
    with pytest.raises(PromptError):
        ThoughtFit(preserve="one text")
    with pytest.raises(ValueError, match="batch_size"):
        ThoughtFit(batch_size=0)


def test_thought_patch_takes_a_fit_and_keeps_it(load):
    """A fit object and the keyword arguments are one mechanism: the same patch either way, carrying its fit."""
    model = load("tiny-llama")
    fit = ThoughtFit(kind="both", ridge=0.5, answer_tokens=0, preserve=())
    a = thought_patch(model, INSTRUCTION, ["q", "ab"], fit)
    b = thought_patch(model, INSTRUCTION, ["q", "ab"], kind="both", ridge=0.5, answer_tokens=0, preserve=())
    c = thought_patch(model, INSTRUCTION, ["q", "ab"], ThoughtFit(), kind="both", ridge=0.5, answer_tokens=0,
                      preserve=())
    assert a.fit == b.fit == c.fit == fit and torch.equal(a.maps, b.maps) and torch.equal(a.maps, c.maps)
    with pytest.raises(TypeError, match="unknown thought-fit setting"):
        thought_patch(model, INSTRUCTION, ["q"], rigde=0.5)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gemma3"])
def test_answer_rows_are_read_while_they_are_generated(load, name, dtype, monkeypatch):
    """Issue 41: with answer rows, the fit's contextual targets are read in the greedy run that writes the answers
    (the prompts in one pass, then one token a step over the key/value cache, the last answer token read once
    more), not in a second pass over the answered prompts: the same targets as that pass (1e-9 relative in
    float64, 1e-4 in float32) and the same patch (1e-6, 1e-3), with no contextual pass left to run."""
    from dataclasses import replace

    import icl_lens.thought._fit as fit_module
    import icl_lens.thought._preserved_keys as pk
    from icl_lens.model._types import patch_dtype
    from icl_lens.thought._instruction_batches import query_batch

    monkeypatch.setenv(pk.CACHE_ENV, "")
    model = load(name, dtype)
    queries = ["q", "ab", "the cat", "ab"]
    fit = ThoughtFit.of(None, kind="both+down", ridge=1.0, answer_tokens=3, preserve=())
    family, pdtype = block_family(model), patch_dtype(model)
    cal = fit_module._calibration(model, [(INSTRUCTION, queries)], fit, family, pdtype)
    plain = query_batch(model, [q for qs in cal.queries for q in qs], prefix=cal.prefix)
    assert cal.contextual is not None and plain.n_tokens > sum(len(text_ids(model, q)) for q in queries)  # answers
    read = fit_module.read_query_tokens
    monkeypatch.setattr(fit_module, "read_query_tokens", lambda m, batch, *a, **k: (
        pytest.fail("a contextual pass ran") if batch is not plain else read(m, batch, *a, **k)))
    fused = fit_module._targets(model, family, cal, plain, fit, pdtype)
    monkeypatch.setattr(fit_module, "read_query_tokens", read)
    passed = fit_module._targets(model, family, replace(cal, contextual=None), plain, fit, pdtype)
    tol = TOL[dtype]
    for layer in range(model.cfg.n_layers):
        for a, b in ((fused.A[layer], passed.A[layer]), (fused.O[layer], passed.O[layer])):
            assert a.shape == b.shape and _rel(a, b) <= tol, layer
    patch = thought_patch(model, INSTRUCTION, queries, fit=fit)
    calibration = fit_module._calibration
    monkeypatch.setattr(fit_module, "_calibration", lambda *a, **k: replace(calibration(*a, **k), contextual=None))
    reference = thought_patch(model, INSTRUCTION, queries, fit=fit)
    for part in ("maps", "vectors", "down_u", "down_v"):
        a, b = getattr(patch, part), getattr(reference, part)
        assert a.shape == b.shape and _rel(a, b) <= (1e-6 if dtype == torch.float64 else 1e-3), part
