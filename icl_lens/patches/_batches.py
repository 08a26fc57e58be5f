"""Many prompts at once: right-padded batches through the one capture (docs/design.md §2).

Row ``b`` of a batch holds prompt ``b``'s ids followed by padding. The attention mask
hides the padded keys; with right padding every real token keeps its position ids
``0..n_b−1`` and its causal prefix, so each row is computed exactly as the prompt alone
(its own kept sets, its own BOS handling) and equals the single-prompt result up to
rounding. Prompts are sorted by length before batching to keep padding small.

**Norms without factors** (:func:`patch_norms`). The patch norm is
``‖ΔW‖_F = ‖U δ‖·‖v‖`` with ``U = [W_gate; W_in]`` (``W_in`` alone for plain MLPs),
``δ = A − a`` and ``‖v‖ = 1/‖a‖`` (Dherin et al. 2025, arXiv 2507.16003). With the thin
QR factorisation ``U = Q R`` (``Q`` orthonormal columns, ``R`` upper triangular
``d_model × d_model``), ``‖U δ‖ = ‖R δ‖``: the norms need one ``d_model × d_model``
product per token instead of the ``d_mlp × d_model`` products of the factors, and no
``δ``/``v`` is kept. ``R`` is computed once per layer in float64 and cached per model
(:func:`icl_lens.patches._capture.dense_weights`, renewed if the weights change in place);
:meth:`icl_lens.patches._patch_set.TokenPatches.norms` uses the same ``R``.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Int
from torch import Tensor

from icl_lens.core._kept_attention import default_kept_mask, removal_kept_mask
from icl_lens.patches._memory import QUERY_CHUNK
from icl_lens.patches._patch_set import TokenPatches, norm_frame
from icl_lens.model._block_family import block_family
from icl_lens.patches._capture import (
    LayerCapture,
    dense_weights,
    empty_factors,
    is_bos_kept,
    removed_mask,
    run_capture,
    run_capture_in_chunks,
    warn_zero_inputs,
)
from icl_lens.model._prompts import PromptError, encode_prompts, pad_id, right_padded, str_tokens
from icl_lens.model._types import patch_dtype

if TYPE_CHECKING:
    from icl_lens.model._types import Model

def is_prompt_list(prompt) -> bool:
    """Whether ``prompt`` is a list of prompts (texts or id sequences) rather than one prompt."""
    if isinstance(prompt, (str, Tensor)) or not isinstance(prompt, (list, tuple)) or len(prompt) == 0:
        return False  # an empty list is an empty prompt (no tokens)
    return all(isinstance(p, (str, Tensor, list, tuple)) for p in prompt)


@dataclass(frozen=True, eq=False)
class PromptBatch:
    """Right-padded prompts with per-row kept sets (``kept`` only for explicit removals)."""

    ids: Int[Tensor, "batch pos"]
    lengths: Int[Tensor, " batch"]
    keep_bos: Bool[Tensor, " batch"]
    kept: Bool[Tensor, "batch pos pos"] | None

    @property
    def attention_mask(self) -> Int[Tensor, "batch pos"] | None:
        """``None`` when no row is padded (the forward is then the plain one)."""
        n = self.ids.shape[1]
        if bool((self.lengths == n).all()):
            return None
        return (torch.arange(n)[None] < self.lengths[:, None]).long().to(self.ids.device)


def prompt_batch(model, ids: Sequence[Tensor], *, remove=None, keep_bos: bool = True) -> PromptBatch:
    """One batch of already-encoded prompts (``remove`` applies to each prompt's positions)."""
    device = ids[0].device
    lengths = torch.tensor([len(x) for x in ids])
    bos = torch.tensor([is_bos_kept(model, x, keep_bos) for x in ids])
    kept = None
    if remove is not None:
        n = int(lengths.max())
        kept = torch.eye(n, dtype=torch.bool, device=device).repeat(len(ids), 1, 1)
        for b, x in enumerate(ids):
            kept[b, : len(x), : len(x)] = removal_kept_mask(len(x), removed_mask(remove, len(x), device))
    return PromptBatch(right_padded(ids, pad_id(model), device), lengths, bos, kept)


def length_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Prompt indices grouped into batches of similar length (longest first; ties in order): the one batching of
    many prompts (the sweeps form theirs with it too)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [order[i: i + batch_size] for i in range(0, len(order), batch_size)]


def selected_layers(model, layers: Iterable[int] | None) -> tuple[int, ...]:
    """The model layers ``layers`` names (negative as Python's), sorted and deduplicated; ``None``: all."""
    n = model.cfg.n_layers
    if layers is None:
        return tuple(range(n))
    layers = [layers] if isinstance(layers, int) else list(layers)
    out = sorted({int(layer) % n for layer in layers if -n <= int(layer) < n})
    bad = [layer for layer in layers if not -n <= int(layer) < n]
    if bad or not out:
        raise ValueError(f"layers must be in 0..{n - 1} (the model has {n} layers); got {list(layers)}")
    return tuple(out)


def output_device(model) -> torch.device:
    """Where results are gathered: the model's device, or the CPU for a model split over devices."""
    dmap = getattr(getattr(model, "original_model", None), "hf_device_map", None)
    if dmap and len({str(d) for d in dmap.values()}) > 1:
        return torch.device("cpu")
    return torch.device(model.cfg.device)


def _progress(total: int, enabled: bool, desc: str):
    from tqdm.auto import tqdm

    return tqdm(total=total, disable=not enabled, desc=desc, unit="prompt")


def check_query_chunk(query_chunk) -> None:
    """``ValueError`` unless ``query_chunk`` is a positive int or None (a bool is refused)."""
    if query_chunk is not None and (isinstance(query_chunk, bool) or not isinstance(query_chunk, int)
                                    or query_chunk < 1):
        raise ValueError(f"query_chunk must be a positive number of tokens or None, got {query_chunk!r}")


def capture_batch(model, family, batch: PromptBatch, out: dict, keep_bos, layers: Sequence[int],
                  query_chunk: int | None, *, default_kept: bool = True, norm_weights=None) -> None:
    """Fill ``out`` with the batch's factors (or norms, with ``norm_weights``): one prompt longer than
    ``query_chunk`` with the default kept sets in forwards of that many queries
    (:func:`~icl_lens.patches._capture.run_capture_in_chunks`), anything else in one forward."""
    n = batch.ids.shape[1]
    if query_chunk is not None and batch.ids.shape[0] == 1 and batch.kept is None and n > query_chunk:
        run_capture_in_chunks(model, family, batch.ids, keep_bos, out, query_chunk, layers, norm_weights=norm_weights)
        return
    capture = LayerCapture(model, family, batch.kept, default_kept, keep_bos, out, q=n, lengths=batch.lengths,
                           layers=layers, norm_weights=norm_weights)
    run_capture(model, capture, batch.ids, batch.attention_mask)


def batched_token_patches(model, prompts: Sequence, *, remove=None, keep_bos: bool = True, batch_size: int = 16,
                          progress: bool = False, layers: Iterable[int] | None = None,
                          query_chunk: int | None = QUERY_CHUNK) -> list[TokenPatches]:
    """:func:`icl_lens.token_patches` for a list of prompts (one :class:`TokenPatches` each, in order).

    ``layers``: only these layers are computed, and each forward stops after the last of them.
    ``query_chunk``: a prompt longer than this, in a batch of its own and with the default kept sets, runs in
    forwards of ``query_chunk`` queries over the cached keys and values of the positions before them
    (:func:`~icl_lens.patches._capture.run_capture_in_chunks`); ``None``: one forward whatever the length.
    """
    check_query_chunk(query_chunk)
    family = block_family(model)
    wanted = selected_layers(model, layers)
    ids = encode_prompts(model, prompts)
    name = model.cfg.model_name
    results: list[TokenPatches | None] = [None] * len(ids)
    dev = output_device(model)
    weights = dense_weights(model)
    with _progress(len(ids), progress, "token patches") as bar:
        for chunk in length_batches([len(x) for x in ids], batch_size):
            batch = prompt_batch(model, [ids[i] for i in chunk], remove=remove, keep_bos=keep_bos)
            n = batch.ids.shape[1]
            out = empty_factors(model, n, dev, batch=len(chunk), layers=wanted, zeroed=False)
            keep_bos_arg = bool(batch.keep_bos[0]) if len(chunk) == 1 else batch.keep_bos
            capture_batch(model, family, batch, out, keep_bos_arg, wanted, query_chunk, default_kept=remove is None)
            for row, i in enumerate(chunk):
                m = int(batch.lengths[row])
                take = (lambda t: t[:, 0]) if len(chunk) == 1 else (lambda t, m=m, row=row: t[:, row, :m].clone())
                if remove is None:
                    kept = default_kept_mask(m, keep_bos=bool(batch.keep_bos[row]), device=ids[i].device)
                else:
                    kept = batch.kept[row, :m, :m].clone()
                factors = {k: take(v) for k, v in out.items()}
                warn_zero_inputs(factors["zero_input"], prompt=i if len(ids) > 1 else None)
                results[i] = TokenPatches(
                    model_name=name, tokens=str_tokens(model, ids[i]), token_ids=ids[i].cpu(),
                    delta=factors["delta"], weights=weights, v=factors["v"],
                    correction=factors["correction"], kept=kept, kept_bos=bool(batch.keep_bos[row]),
                    zero_input=factors["zero_input"], layers=wanted)
            bar.update(len(chunk))
    return results  # type: ignore[return-value]


def iter_patch_norms(model, prompts: Sequence, *, batch_size: int = 16, layers: Iterable[int] | None = None,
                     keep_bos: bool = True, query_chunk: int | None = QUERY_CHUNK,
                     ) -> Iterator[tuple[list[int], list[dict[str, np.ndarray]]]]:
    """Per batch: the prompt indices and, for each, ``layer``/``position``/``norm``/``correction_norm`` arrays.

    Memory stays O(batch · layers · tokens · (d_model + d_mlp)) whatever the number of prompts. Ids already
    encoded (:func:`~icl_lens.model.encode_prompt`) are taken as they are. ``query_chunk``: as
    :func:`batched_token_patches`'.
    """
    check_query_chunk(query_chunk)
    family = block_family(model)
    ids = encode_prompts(model, prompts)
    wanted = selected_layers(model, layers)
    weights = dense_weights(model)
    dev = output_device(model)
    for chunk in length_batches([len(x) for x in ids], batch_size):
        batch = prompt_batch(model, [ids[i] for i in chunk], keep_bos=keep_bos)
        n, k = batch.ids.shape[1], len(wanted)
        out = {key: torch.zeros(k, len(chunk), n, dtype=patch_dtype(model), device=dev)
               for key in ("norm", "correction_norm")}
        out["zero_input"] = torch.zeros(k, len(chunk), n, dtype=torch.bool, device=dev)
        keep_bos_arg = bool(batch.keep_bos[0]) if len(chunk) == 1 else batch.keep_bos
        capture_batch(model, family, batch, out, keep_bos_arg, wanted, query_chunk, norm_weights=weights)
        rows = []
        for row, i in enumerate(chunk):
            m = int(batch.lengths[row])
            warn_zero_inputs(out["zero_input"][:, row, :m], prompt=i if len(ids) > 1 else None)
            rows.append({
                "layer": np.repeat(np.asarray(wanted), m),
                "position": np.tile(np.arange(m), k),
                "norm": out["norm"][:, row, :m].double().cpu().numpy().reshape(-1),
                "correction_norm": out["correction_norm"][:, row, :m].double().cpu().numpy().reshape(-1),
            })
        yield chunk, rows


def patch_norms(model: Model, prompts: Sequence, *, batch_size: int = 16, layers: Iterable[int] | None = None,
                progress: bool = True, keep_bos: bool = True, query_chunk: int | None = QUERY_CHUNK) -> pd.DataFrame:
    """Patch and correction norms of many prompts as one tidy table, keeping no factors.

    Columns ``prompt`` (index into ``prompts``), ``layer``, ``position``, ``token``, ``norm``
    (``‖ΔW‖_F``, docs/design.md §2), ``correction_norm``. Same numbers as
    ``token_patches(model, p).to_frame()`` for each prompt, up to rounding. ``query_chunk``: as
    :func:`icl_lens.token_patches`'.
    """
    if isinstance(prompts, (list, tuple)) and len(prompts) == 0:
        raise PromptError("the list of prompts is empty")
    if not is_prompt_list(prompts):
        prompts = [prompts]
    ids = encode_prompts(model, prompts)
    frames: list[pd.DataFrame | None] = [None] * len(ids)
    with _progress(len(ids), progress, "patch norms") as bar:
        for chunk, rows in iter_patch_norms(model, ids, batch_size=batch_size, layers=layers, keep_bos=keep_bos,
                                             query_chunk=query_chunk):
            for i, cols in zip(chunk, rows):
                frames[i] = norm_frame(tokens=str_tokens(model, ids[i]), **cols)
                frames[i].insert(0, "prompt", i)
            bar.update(len(chunk))
    return pd.concat(frames, ignore_index=True)
