"""The equivalence check in chunks of positions (issue 26): same report, bounded logits.

:func:`icl_lens.verify_equivalence` never unembeds more than ``chunk_size`` contextual
positions (nor more than ``batch_size`` kept-only rows) at once, and its report equals the
one of the whole-prompt check: full contextual logits compared with every query's kept-only
logits in one piece.
"""
import pytest
import torch

from icl_lens import token_patches, verify_equivalence
from icl_lens.patches._kept_only import kept_only_logits
from icl_lens.model._prompts import encode_prompt
from icl_lens.model._reading import activations_captured

PROMPT = "In-context learning: the cat sat on the mat, then the cat sat on the hat."


def _whole_prompt_report(model, patches):
    """The check as it was before chunking: every position's logits held at once."""
    ids = encode_prompt(model, PROMPT)
    with torch.no_grad():
        contextual = model(ids[None])[0]
    kept = kept_only_logits(model, ids, patches, list(range(ids.numel())))
    return (kept - contextual).abs().amax(-1).cpu(), float(contextual.abs().max())


# tiny-gemma2 soft-caps its final logits: the chunked readout must apply the cap too.
@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-llama", "tiny-gemma2", "tiny-gemma3"])
def test_chunked_report_equals_the_whole_prompt_check(load, name):
    model = load(name, torch.float64)
    patches = token_patches(model, PROMPT)
    err, max_logit = _whole_prompt_report(model, patches)
    one_chunk = verify_equivalence(model, PROMPT, patches, chunk_size=10_000)
    assert torch.equal(one_chunk.max_abs_err, err) and one_chunk.max_abs_logit == max_logit
    small = verify_equivalence(model, PROMPT, patches, chunk_size=3, batch_size=2)
    # Other batch shapes round differently in the last bits, nothing more.
    assert small.max_abs_err.shape == err.shape
    assert torch.allclose(small.max_abs_err, err, rtol=0, atol=1e-12 * max_logit)
    assert small.max_abs_logit == pytest.approx(max_logit, rel=1e-12)
    assert small.relative_error <= 1e-9


def test_no_more_than_a_chunk_of_positions_is_unembedded_at_once(load):
    model = load("tiny-llama", torch.float32)
    patches = token_patches(model, PROMPT)
    rows = []
    with activations_captured(model, [("unembed.hook_out", lambda x, hook: rows.append(x.shape[:-1].numel()))]):
        report = verify_equivalence(model, PROMPT, patches, chunk_size=5, batch_size=4)
    assert report.max_abs_err.shape == (patches.n_positions,)
    assert sum(rows) == 2 * patches.n_positions  # each position: contextual once, kept-only once
    assert max(rows) <= 5


def test_chunk_size_must_be_positive(load):
    with pytest.raises(ValueError, match="chunk_size"):
        verify_equivalence(load("tiny-llama"), PROMPT, chunk_size=0)
