"""Implicit trajectory W₀..Wₙ of one query from ONE batched forward (docs/design.md §3).

Dherin et al. 2025 (arXiv 2507.16003, §3). For query ``t`` and each context prefix
length i = 0..n, the token patch of every layer is computed for the kept set
``{BOS, c₁..cᵢ, t}`` (docs/design.md §2) in a "contextual" pass that sees only that prefix:

    r       = query residual entering the block (depends on i beyond layer 0)
    attn_C  = attention output of the query over keys {BOS, c₁..cᵢ, t}
    attn_0  = the same scores renormalised over {BOS, t}, times the same values
    A = ln2(r + attn_C),  a = ln2(r + attn_0)  (per block family),  u = W (A − a),  v = a/‖a‖²,
    correction = attn_C − attn_0

All n+1 prefix variants run as n+1 copies of the query appended to the prompt prefix
``x₀..x_{t−1}`` in one sequence (:mod:`icl_lens.dynamics._prefix_variants`): the copies share
the prefix's keys and values (attention is causal, so ``c_j`` has the same keys and
values in every prefix forward), each copy masked to its prefix plus itself, at the
query's original position id. Sliding-window layers keep their window in original
positions (:func:`icl_lens.patches._kept_only.kept_only_masks`). The forward stops
after the last requested layer's MLP input: no unembedding. Cost ≈ one forward over
``t + n + 1`` tokens instead of n forwards over the prompt.
"""
from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from icl_lens.core._kept_attention import bos_and_self_output, kept_set_output
from icl_lens.patches._patch_set import TokenPatches
from icl_lens.dynamics._prefix_variants import PrefixVariantLayout, absorb_layout, prefix_variant_layout
from icl_lens.dynamics._trajectory import Trajectory
from icl_lens.model._block_family import BlockFamily, block_family
from icl_lens.patches._capture import ZeroNormWarning, dense_weights, layer_factors
from icl_lens.patches._kept_only import kept_only_logits, kept_only_masks, patches_applied
from icl_lens.patches._token_patches import token_patches
from icl_lens.model._prompts import bos_id, encode_prompt, str_tokens
from icl_lens.model._reading import activations_captured
from icl_lens.model._types import patch_dtype

if TYPE_CHECKING:
    from icl_lens.model._types import Model


Prompt = str | Sequence[int] | Int[Tensor, " pos"]


class QueryPositionError(ValueError):
    """The query position lies outside the prompt."""


class NoContextError(ValueError):
    """The query has no context tokens to learn from (first token, or right after a kept BOS)."""


@dataclass(frozen=True)
class QuerySetup:
    """Validated token ids, query position and context layout of one trajectory request."""

    ids: Int[Tensor, " pos"]
    query: int
    kept_bos: bool
    first_context: int

    @property
    def context_positions(self) -> tuple[int, ...]:
        return tuple(range(self.first_context, self.query))

    def prefix_ids(self, step: int) -> Int[Tensor, " pos"]:
        """Positions of the prefix-``step`` input ``[BOS, c₁..c_step, x_t]`` (original position ids)."""
        kept = list(range(self.first_context + step)) + [self.query]
        return torch.tensor(kept, device=self.ids.device)


def resolve_query(model, prompt: Prompt, query: int) -> QuerySetup:
    """Encode ``prompt`` and check that ``query`` is a position with at least one context token."""
    ids = encode_prompt(model, prompt)
    n = ids.numel()
    if not isinstance(query, int) or isinstance(query, bool):
        raise QueryPositionError(f"query must be an int position, got {query!r}")
    if not -n <= query < n:
        raise QueryPositionError(f"query position {query} is outside the prompt of {n} tokens (valid: {-n}..{n - 1})")
    t = query % n
    bos = bos_id(model)
    kept_bos = bool(bos is not None and int(ids[0]) == bos)
    first_context = 1 if kept_bos else 0
    if t - first_context < 1:
        what = "the BOS token it keeps" if kept_bos else "no earlier token"
        raise NoContextError(
            f"query position {t} has no context: before it there is only {what}. Pick a later query "
            f"(at least position {first_context + 1})."
        )
    return QuerySetup(ids=ids, query=t, kept_bos=kept_bos, first_context=first_context)


def variant_attention_mask(model, layout: PrefixVariantLayout):
    """Additive attention mask(s) of the shared-prefix sequence: its visibility, plus sliding windows."""
    dtype = model.cfg.dtype
    neg = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=layout.positions.device)
    zero = torch.zeros((), dtype=dtype, device=layout.positions.device)
    visible = layout.visible[None, None]
    windowed = kept_only_masks(model, layout.positions[None])
    if windowed is None:
        return torch.where(visible, zero, neg)
    if isinstance(windowed, Tensor):
        return torch.where(visible, windowed, neg)
    return {kind: torch.where(visible, mask, neg) for kind, mask in windowed.items()}


class _TrajectoryCapture:
    """Hook callbacks that compute the query copies' patch factors while the forward runs."""

    def __init__(self, model, family: BlockFamily, layout: PrefixVariantLayout, kept_bos: bool,
                 out: dict[str, Tensor], row_of_layer: dict[int, int], zero_first: bool,
                 offset: int = 0, bos_values: dict[int, Tensor] | None = None, weights=None):
        self.model, self.family, self.kept_bos, self.zero_first = model, family, kept_bos, zero_first
        self.rows, self.kept = layout.copy_rows(), layout.kept
        # offset > 0: the first ``offset`` positions sit in a key/value cache, the forward's rows start there
        self.offset, self.bos_values = offset, bos_values or {}
        self.weights = weights  # DenseWeights: u_in holds R δ (compact); None: the layer's own dense weights
        if offset:
            self.rows = slice(self.rows.start - offset, self.rows.stop - offset)
        self.out, self.row_of_layer = out, row_of_layer
        self.dtype = patch_dtype(model)
        self.state: dict[str, Tensor] = {}
        self.reentered = False

    def hooks(self, layer: int) -> list[tuple[str, object]]:
        f = self.family
        return [
            (f.resid_pre(layer), self._store("r", copies_only=True)),
            (f.values(layer), self._store("values", copies_only=False)),
            (f.scores(layer), lambda x, hook, layer=layer: self._attend(x, hook, layer)),
            (f.attn_out(layer), self._store("attn_C", copies_only=True)),
            (f.mlp_input(layer), lambda x, hook, layer=layer: self._patch(x, layer)),
        ]

    def _store(self, key: str, *, copies_only: bool):
        def hook(x, hook):
            if not self.reentered:  # layer_factors' own call of ln2 may fire this hook point again
                self.state[key] = (x[0, self.rows] if copies_only else x[0]).detach()
        return hook

    def _attend(self, scores: Tensor, hook, layer: int) -> None:
        self.layer = layer
        if self.kept is not None:  # absorb order: the query row renormalised over each step's kept set
            self.state["z0"] = kept_set_output(scores[0, :, self.rows].detach(), self.state.pop("values"), self.kept)
            return
        # Kept set {BOS, t} of each copy: its own key (the diagonal) and key 0.
        bos_value = self.bos_values[self.layer][0] if self.offset else None
        z0 = bos_and_self_output(scores[0].detach(), self.state.pop("values"), keep_bos=self.kept_bos,
                                 offset=self.offset, bos_value=bos_value)
        self.state["z0"] = z0[self.rows]

    @torch.no_grad()
    def _patch(self, mlp_in: Tensor, layer: int) -> None:
        if self.reentered:  # layer_factors' own call of the pre-MLP norm fires this hook point again
            return
        r, attn_C, z0 = self.state.pop("r"), self.state.pop("attn_C"), self.state.pop("z0")
        if layer in self.row_of_layer:
            f = layer_factors(self, layer, r, attn_C, z0, mlp_in[0, self.rows].detach(),
                              "MLP input (context prefix)", weights=None if self.weights is None else {"in": self.weights.r(layer)})
            # Step 0 keeps exactly {BOS, t}: nothing is removed, the patch is zero by definition.
            keep = torch.ones(f["u_in"].shape[0], 1, dtype=self.dtype, device=f["u_in"].device)
            if self.zero_first:
                keep[0] = 0
            k = self.row_of_layer[layer]
            self.out["u_in"][k] = f["u_in"] * keep
            if self.out["u_gate"] is not None:
                self.out["u_gate"][k] = f["u_gate"] * keep
            self.out["v"][k] = f["v"]
            self.out["correction"][k] = f["correction"] * keep
            self.out["zero_input"][k] = f["zero"] & (keep[:, 0] > 0)


def _resolve_layers(model, layers: Sequence[int] | None) -> tuple[int, ...]:
    n_layers = model.cfg.n_layers
    if layers is None:
        return tuple(range(n_layers))
    out = []
    for layer in layers:
        if not -n_layers <= int(layer) < n_layers:
            raise ValueError(f"layer {layer} does not exist (the model has {n_layers} layers)")
        out.append(int(layer) % n_layers)
    if not out:
        raise ValueError("layers is empty; pass None for all layers")
    return tuple(sorted(set(out)))


def _capture_layout(model, ids: Tensor, layout: PrefixVariantLayout, kept_bos: bool,
                    wanted: tuple[int, ...], *, zero_first: bool, past=None, compact: bool = False,
                    readout: bool = False) -> dict[str, Tensor]:
    """One hooked forward of ``layout``'s sequence; patch factors of its query copies for ``wanted`` layers.

    ``past``: ``(cache, bos_values)`` holding the keys and values of the sequence's first
    ``layout.query`` positions (the prompt prefix, :meth:`PatchSession.prefix_cache`); the
    forward then runs the query copies only. ``compact``: ``u_in`` holds ``R δ`` (:class:`Trajectory`).
    ``readout``: the forward runs on to the unembedding's input and keeps the first copy's row there
    (``out["readout"]``).
    """
    family = block_family(model)
    cfg, dtype, device = model.cfg, patch_dtype(model), ids.device
    steps, k = layout.n_steps, len(wanted)
    out = {
        "u_in": torch.zeros(k, steps, cfg.d_model if compact else cfg.d_mlp, dtype=dtype, device=device),
        "u_gate": torch.zeros(k, steps, cfg.d_mlp, dtype=dtype, device=device) if family.gated and not compact else None,
        "v": torch.zeros(k, steps, cfg.d_model, dtype=dtype, device=device),
        "correction": torch.zeros(k, steps, cfg.d_model, dtype=dtype, device=device),
        "zero_input": torch.zeros(k, steps, dtype=torch.bool, device=device),
    }
    skip = 0 if past is None else layout.query
    capture = _TrajectoryCapture(model, family, layout, kept_bos, out, {layer: row for row, layer in enumerate(wanted)},
                                 zero_first=zero_first, offset=skip, bos_values=None if past is None else past[1],
                                 weights=dense_weights(model) if compact else None)
    fwd_hooks = [h for layer in range(wanted[-1] + 1) for h in capture.hooks(layer)]
    stop = family.mlp_input(wanted[-1])
    if readout:
        stop = "unembed.hook_in"
        fwd_hooks.append((stop, lambda x, hook: out.__setitem__("readout", x[0, capture.rows][0].detach())))
    mask = variant_attention_mask(model, layout)
    kwargs = {}
    if past is not None:  # the prefix rows are in the cache: keep the copies' rows of the mask(s)
        mask = {k: m[..., skip:, :] for k, m in mask.items()} if isinstance(mask, dict) else mask[..., skip:, :]
        kwargs["past_key_values"] = past[0]
    positions = layout.positions[skip:]
    with torch.no_grad(), activations_captured(model, fwd_hooks, stop_after=stop):
        model(ids[positions][None], return_type=None, position_ids=positions[None], attention_mask=mask, **kwargs)
    return out


def _finish(model, setup: QuerySetup, wanted: tuple[int, ...], out: dict[str, Tensor], order: str = "prefix",
            compact: bool = False, steps: tuple[int, ...] | None = None) -> Trajectory:
    zero = out["zero_input"]
    if zero.any():
        where = ", ".join(f"layer {wanted[int(l)]} step {int(s) if steps is None else steps[int(s)]}"
                          for l, s in torch.nonzero(zero)[:10])
        warnings.warn(f"kept-only MLP input has zero norm at {where}; those patches are set to zero "
                      f"(pseudo-inverse convention) and are not exact", ZeroNormWarning, stacklevel=3)
    return Trajectory(
        tokens=str_tokens(model, setup.ids), query=setup.query, layers=wanted,
        context_positions=setup.context_positions,
        u_in=out["u_in"], u_gate=out["u_gate"], v=out["v"], correction=out["correction"],
        model_name=model.cfg.model_name, kept_bos=setup.kept_bos, order=order, compact=compact, steps=steps,
        kept_only_hidden=out.get("readout"),
    )


ORDERS = ("prefix", "absorb")


def trajectory(model: Model, prompt: Prompt, *, query: int = -1, layers: Sequence[int] | None = None,
               order: str = "prefix", session=None, compact: bool = False,
               steps: Sequence[int] | None = None, readout: bool = False) -> Trajectory:
    """Implicit weights W₀..Wₙ of query ``query`` as its context is consumed (docs/design.md §3).

    ``prompt``: text or token ids. ``query``: position (negative counts from the end).
    The context is every token strictly between the kept BOS (when the prompt starts
    with the tokenizer's BOS) and the query. ``layers``: which layers to return (default
    all); the forward stops after the last of them.

    ``order="prefix"``: ``Wᵢ`` makes ``[BOS, x_t]`` reproduce the output with context
    ``c₁..cᵢ``; one batched forward over the prompt prefix plus n+1 query copies.
    ``order="absorb"`` (the paper's): ``Wᵢ`` absorbs ``c₁..cᵢ`` while ``c_{i+1}..cₙ`` stay in
    context; it is the query's patch for the kept set ``{BOS, c_{i+1}..cₙ, t}``, and
    ``[BOS, c_{i+1}..cₙ, x_t]`` with it (and the kept context tokens' own patches for the
    same removal) reproduces the full-context output. One forward over the prompt up to
    ``t``. Both orders give ``W₀ = W`` and the same ``Wₙ`` (the query's token patch).

    ``session``: a :class:`~icl_lens.patches._incremental.PatchSession` of ``model`` whose last
    prompt starts with ``x₀..x_{t−1}``: the prefix order then reuses its keys and values
    and runs the n+1 query copies only (the same result, about half the forward).
    ``compact=True``: keep ``R δ`` (d_model floats) instead of the d_mlp-sized output factors
    (:class:`Trajectory`): the same norms, cosines and fits for a fraction of the work and
    memory; what the dashboard draws.
    ``steps``: compute ``Wᵢ`` for these prefix lengths i only (increasing, in 0..n; e.g.
    :func:`~icl_lens.dynamics._prefix_variants.log_spaced_steps`): the same ``Wᵢ`` as the full
    trajectory's (each variant sees only its own prefix), for the cost of ``len(steps)`` copies.
    ``readout=True`` (prefix order, step 0 among the steps): the forward runs on to the unembedding and keeps
    the step-0 copy's input to it, :attr:`Trajectory.kept_only_hidden`. That copy reads its kept set
    ``{BOS, x_t}`` only, with ``W₀ = W``: it is the unpatched kept-only forward, whose next-token logits
    (:func:`icl_lens.model._greedy.unembedded`) the dashboard shows beside the contextual ones, here for the
    last layer's MLP of the copies instead of a forward of its own.
    """
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    if readout and (order != "prefix" or (steps is not None and (len(steps) == 0 or int(steps[0]) != 0))):
        raise ValueError("readout=True needs the prefix order and step 0 among the steps (its copy is the kept-only "
                         "forward)")
    setup = resolve_query(model, prompt, query)
    wanted = _resolve_layers(model, layers)
    make = prefix_variant_layout if order == "prefix" else absorb_layout
    layout = make(setup.query, setup.first_context, device=setup.ids.device, steps=steps)
    if steps is not None:
        steps = tuple(int(s) for s in steps)
    past = None
    if session is not None and order == "prefix":
        if session.model is not model:
            raise ValueError("the session belongs to another model")
        past = session.prefix_cache(setup.ids, setup.query)
    out = _capture_layout(model, setup.ids, layout, setup.kept_bos, wanted, zero_first=steps is None or steps[0] == 0,
                          past=past, compact=compact, readout=readout)
    if steps == tuple(range(setup.query - setup.first_context + 1)):
        steps = None  # every step: the full trajectory
    return _finish(model, setup, wanted, out, order, compact, steps)


def trajectory_naive(model, prompt: Prompt, *, query: int = -1, layers: Sequence[int] | None = None) -> Trajectory:
    """Reference method: the same trajectory from n+1 separate forwards, one per prefix ``[BOS, c₁..cᵢ, x_t]``.

    Costs O(n²) tokens; kept for benchmarks and as an independent check of :func:`trajectory`.
    """
    setup = resolve_query(model, prompt, query)
    wanted = _resolve_layers(model, layers)
    device, t, b = setup.ids.device, setup.query, setup.first_context
    parts = []
    for i in range(t - b + 1):
        positions = setup.prefix_ids(i)
        visible = torch.ones(positions.numel(), positions.numel(), dtype=torch.bool, device=device).tril()
        layout = PrefixVariantLayout(query=b + i, first_context=b, positions=positions, visible=visible)
        parts.append(_capture_layout(model, setup.ids, layout, setup.kept_bos, wanted, zero_first=i == 0))
    out = {key: None if parts[0][key] is None else torch.cat([p[key] for p in parts], dim=1) for key in parts[0]}
    return _finish(model, setup, wanted, out)


def steps_as_patches(traj: Trajectory) -> TokenPatches:
    """The trajectory's steps as a :class:`TokenPatches` whose "positions" are steps i = 0..n.

    Lets :func:`~icl_lens.patches._kept_only.patches_applied` apply ``Wᵢ`` (source
    index i) to the query of a kept-only input. Needs every layer.
    """
    traj._every_step("applying a trajectory")
    steps = traj.n_context + 1
    if traj.compact:
        raise ValueError("a compact trajectory cannot be applied: compute it with compact=False")
    if len(traj.layers) != traj.v.shape[0] or traj.layers != tuple(range(len(traj.layers))):
        raise ValueError("applying a trajectory needs every layer: compute it with layers=None")
    return TokenPatches(
        model_name=traj.model_name, tokens=traj.step_tokens(), token_ids=torch.zeros(steps, dtype=torch.long),
        stored_u_in=traj.u_in, stored_u_gate=traj.u_gate, v=traj.v, correction=traj.correction,
        kept=torch.eye(steps, dtype=torch.bool), kept_bos=traj.kept_bos,
        zero_input=torch.zeros(len(traj.layers), steps, dtype=torch.bool),
    )


@dataclass(frozen=True, eq=False)
class TrajectoryCheck:
    """Per step: max |logit difference| between ``[BOS, x_t]`` with ``Wᵢ`` and the prefix-i forward."""

    steps: tuple[int, ...]
    max_abs_err: Float[Tensor, " step"]
    max_abs_logit: Float[Tensor, " step"]

    @property
    def relative_error(self) -> float:
        """Worst step's error divided by that step's largest |logit|."""
        return float((self.max_abs_err / self.max_abs_logit).max())

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame({"step": list(self.steps), "max_abs_err": self.max_abs_err.double().numpy(),
                             "relative_err": (self.max_abs_err / self.max_abs_logit).double().numpy()})


@torch.no_grad()
def verify_trajectory(model: Model, prompt: Prompt, traj: Trajectory | None = None, *, query: int = -1,
                      steps: Sequence[int] | None = None, order: str = "prefix") -> TrajectoryCheck:
    """The exactness identity of each trajectory step, in the trajectory's order.

    ``prefix``: patched ``[BOS, x_t]`` with ``Wᵢ`` vs the forward on ``[BOS, c₁..cᵢ, x_t]``.
    ``absorb``: ``[BOS, c_{i+1}..cₙ, x_t]`` with ``Wᵢ`` at the query and every kept context
    token's own token patch for the removal of ``c₁..cᵢ`` (:func:`~icl_lens.patches._token_patches.token_patches`)
    vs the full-context forward. Each forward runs on the kept tokens only, every token
    at its original position id (sliding windows measured in original positions).
    ``order`` is used only when ``traj`` is None.
    """
    if traj is not None and traj.compact:
        raise ValueError("a compact trajectory cannot be checked: compute it with compact=False")
    if traj is not None:
        traj._every_step("verify_trajectory")
    setup = resolve_query(model, prompt, traj.query if traj is not None else query)
    if traj is None:
        traj = trajectory(model, setup.ids, query=setup.query, order=order)
    if traj.query != setup.query or traj.tokens != str_tokens(model, setup.ids):
        raise ValueError("the trajectory was computed for a different prompt or query")
    steps = tuple(range(traj.n_context + 1)) if steps is None else tuple(int(s) for s in steps)
    if any(not 0 <= s <= traj.n_context for s in steps):
        raise ValueError(f"steps must lie in 0..{traj.n_context}")
    if traj.order == "absorb":
        return _verify_absorb(model, setup, traj, steps)
    patches = steps_as_patches(traj)
    ids, t = setup.ids, setup.query
    kept = torch.tensor(([0] if setup.kept_bos else []) + [t], device=ids.device)
    sources = torch.tensor([([-1] if setup.kept_bos else []) + [s] for s in steps], device=ids.device)
    pos = kept[None].expand(len(steps), -1)
    with patches_applied(model, patches, sources):
        patched = model(ids[pos], position_ids=pos, attention_mask=kept_only_masks(model, pos))[:, -1]
    errs, scales = [], []
    for row, s in enumerate(steps):
        p = setup.prefix_ids(s)[None]
        reference = model(ids[p], position_ids=p, attention_mask=kept_only_masks(model, p))[0, -1]
        errs.append((patched[row] - reference).abs().max())
        scales.append(reference.abs().max())
    return TrajectoryCheck(steps=steps, max_abs_err=torch.stack(errs).cpu(), max_abs_logit=torch.stack(scales).cpu())


def _verify_absorb(model, setup: QuerySetup, traj: Trajectory, steps: tuple[int, ...]) -> TrajectoryCheck:
    if traj.layers != tuple(range(model.cfg.n_layers)):
        raise ValueError("checking a trajectory needs every layer: compute it with layers=None")
    ids, t, b = setup.ids[: setup.query + 1], setup.query, setup.first_context
    reference = model(ids[None])[0, -1]
    errs = []
    for s in steps:
        others = token_patches(model, ids, remove=range(b, b + s))
        factors = {}
        for name, field in (("u_in", "stored_u_in"), ("u_gate", "stored_u_gate"), ("v", "v"),
                            ("correction", "correction")):
            own = getattr(others, name)  # u of every position: the query's is replaced by the step's
            if own is not None:
                own = own.clone()
                own[:, t] = getattr(traj, name)[:, s].to(own.dtype)
            factors[field] = own
        patched = kept_only_logits(model, ids, replace(others, **factors), [t])[0]
        errs.append((patched - reference).abs().max())
    scale = reference.abs().max()
    return TrajectoryCheck(steps=steps, max_abs_err=torch.stack(errs).cpu(), max_abs_logit=scale.expand(len(steps)).cpu())
