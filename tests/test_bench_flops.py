"""The benchmarks' arithmetic count (benchmarks/common.py ``flops``) against counts done by hand, and their operator
breakdown (``op_times``, ``op_difference``) against a planted extra operator."""
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "benchmarks"))
from common import flops, op_difference, op_times  # noqa: E402


def test_flops_counts_matrix_products_by_hand():
    layer = torch.nn.Linear(12, 7, bias=False)
    x = torch.randn(5, 12)
    assert flops(lambda: layer(x)) == 2 * 5 * 12 * 7
    y = torch.randn(7, 3)
    assert flops(lambda: layer(x) @ y) == 2 * 5 * 12 * 7 + 2 * 5 * 7 * 3


def test_op_difference_finds_the_operator_one_call_does_more_of():
    """The planted work (1,000 subtractions of a 512 × 512 matrix, tens of milliseconds) outweighs any jitter of the
    one small product both calls share, so the order does not rest on a timing race (CI once saw the product of a
    256 × 256 matrix, the first one the profiler timed, outweigh 100 subtractions)."""
    x, z = torch.randn(64, 64), torch.randn(512, 512)

    def base():
        return x @ x

    def more():
        y = z
        for _ in range(1000):
            y = y - z  # the planted extra work
        return x @ x, y

    base(), more()  # warm both before the profiler times them
    ours, theirs = op_times(more), op_times(base)
    assert ours["aten::sub"][1] == 1000 and "aten::sub" not in theirs
    assert ours["aten::mm"][1] == theirs["aten::mm"][1] == 1
    sub, *_ = op_difference(ours, theirs, top=1)  # the largest difference first
    assert sub["op"] == "aten::sub" and sub["calls"] == 1000 and sub["calls_other"] == 0
    assert sub["seconds"] > 0 == sub["seconds_other"]
    reverse = next(o for o in op_difference(theirs, ours, top=3) if o["op"] == "aten::sub")
    assert reverse["calls"] == 0 and reverse["calls_other"] == 1000


def test_op_difference_orders_by_the_size_of_the_difference_either_way():
    """The ordering alone, on tables written by hand: a larger difference comes first whichever table holds more."""
    a = {"aten::mm": (0.010, 1), "aten::sub": (0.002, 100), "aten::add": (0.001, 3)}
    b = {"aten::mm": (0.004, 1), "aten::add": (0.0015, 3), "aten::mul": (0.003, 2)}
    assert [o["op"] for o in op_difference(a, b, top=4)] == ["aten::mm", "aten::mul", "aten::sub", "aten::add"]
    assert [o["op"] for o in op_difference(b, a, top=2)] == ["aten::mm", "aten::mul"]
    mul = op_difference(a, b, top=4)[1]
    assert mul == {"op": "aten::mul", "seconds": 0.0, "calls": 0, "seconds_other": 0.003, "calls_other": 2}


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


def test_the_floor_with_reads_reads_what_the_capture_reads(load):
    """bench_patches' *read* floor hooks the capture's own sites (a capture that read a sixth site, or a floor that
    lost one, would time another pass), and its four floor calls run, in one forward and in query chunks."""
    sys.path.insert(0, str(pathlib.Path(__file__).parents[1]))
    from bench_patches import floor_calls, read_sites

    from icl_lens.model import block_family
    from icl_lens.model._tiny_models import TINY_NAMES
    from icl_lens.patches._capture import LayerCapture, empty_factors
    for name in TINY_NAMES:
        model = load(name)
        capture = LayerCapture(model, block_family(model), None, True, True, empty_factors(model, 4, "cpu", batch=1),
                               q=4)
        assert read_sites(model) == [site for site, _ in capture.all_hooks()], name
    model = load("tiny-llama")  # rotary: no position table to run out of at 520 tokens
    for n in (6, 520):  # 520: past QUERY_CHUNK, the chunked floor
        for call in floor_calls(model, torch.randint(3, model.cfg.d_vocab, (n,))):
            call()
