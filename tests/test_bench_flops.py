"""The benchmarks' arithmetic count (benchmarks/common.py ``flops``) against counts done by hand."""
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "benchmarks"))
from common import flops  # noqa: E402


def test_flops_counts_matrix_products_by_hand():
    layer = torch.nn.Linear(12, 7, bias=False)
    x = torch.randn(5, 12)
    assert flops(lambda: layer(x)) == 2 * 5 * 12 * 7
    y = torch.randn(7, 3)
    assert flops(lambda: layer(x) @ y) == 2 * 5 * 12 * 7 + 2 * 5 * 7 * 3


def test_patches_do_the_forward_arithmetic_less_the_unembedding_and_last_mlp(load):
    """The bound behind the benchmark's arithmetic ratio: every layer's attention and every MLP but the last,
    plus at most one more output projection per layer (the kept-only attention); no unembedding."""
    from icl_lens import token_patches

    for name, n_dense in (("tiny-llama", 3), ("tiny-gpt2", 2)):
        model = load(name)
        ids = torch.arange(3, 35)
        ids[0] = model.tokenizer.bos_token_id
        c, n = model.cfg, len(ids)
        f_fwd, f_patch = flops(lambda: model(ids[None])), flops(lambda: token_patches(model, ids))
        floor = f_fwd - 2 * n * c.d_model * c.d_vocab - 2 * n * n_dense * c.d_model * c.d_mlp
        extra_projection = 2 * n * c.n_heads * c.d_head * c.d_model * c.n_layers
        assert floor <= f_patch <= floor + extra_projection, (name, f_fwd, f_patch, floor)
