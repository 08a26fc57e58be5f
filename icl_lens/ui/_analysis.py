"""What the dashboard computes for a prompt, kept apart from how it is drawn.

``PromptAnalyzer`` wraps one model and answers the dashboard's questions with the
library's results (never its own math): token patches of every layer × position
(``PatchSession``: only positions after the common token prefix with the previous
prompt are recomputed, docs/design.md §3), spike flags, the implicit trajectory of one query
(Dherin et al. 2025, arXiv 2507.16003; first at a few log-spaced prefix lengths, then in
full), one layer's attention pattern, and who wrote the query's patch (heads × context tokens,
docs/design.md §7). Results are cached by token ids, so moving a slider recomputes only what that
slider shows.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, fields, is_dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

from icl_lens.core._factored import gram_cosine
from icl_lens.patches._patch_set import TokenPatches
from icl_lens.spikes._scores import SpikeFlags, spike_scores
from icl_lens.dynamics._trajectory import Trajectory
from icl_lens.model._attention import attention_pattern
from icl_lens.model._block_family import block_family
from icl_lens.patches._attribution import PatchAttribution, PatchWrites, patch_attribution
from icl_lens.patches._incremental import PatchSession
from icl_lens.model._model_check import check_model
from icl_lens.model._prompts import bos_id, context_limit, encode_prompt, tokenize
from icl_lens.model._reading import ForwardAbandoned
from icl_lens.model._reading import abandoned_when as abandon_forward
from icl_lens.spikes._detector import spike_detector
from icl_lens.spikes._thresholds import spike_threshold
from icl_lens.dynamics._prefix_variants import log_spaced_steps
from icl_lens.dynamics._trajectory_capture import NoContextError, trajectory

DEFAULT_MAX_TOKENS = 1024
COARSE_POINTS = 8  # context lengths of the trajectory's first drawing (log-spaced, 1 and n among them)
DEFAULT_CACHE_BYTES = 512 * 2**20  # the analysis caches together (patches, trajectories, attention)


@dataclass(frozen=True, eq=False)
class EncodedPrompt:
    """Token ids of the prompt as analysed (cut to the limit) and the notice if cut."""

    ids: Int[Tensor, " pos"]
    n_typed: int
    limit: int

    @property
    def cut(self) -> bool:
        return self.n_typed > self.ids.numel()

    @property
    def key(self) -> tuple[int, ...]:
        return tuple(self.ids.tolist())

    def notice(self, model_name: str, n_ctx: int) -> str:
        if not self.cut:
            return ""
        why = "its context length" if self.limit == n_ctx else f"the dashboard's max_tokens (model context {n_ctx})"
        return (f"The prompt has {self.n_typed} tokens; {model_name} is shown on the first {self.limit} "
                f"({why}). The rest was cut.")


def held_bytes(value) -> int:
    """Bytes of tensor memory ``value`` holds: each distinct tensor storage once, found in tensors,
    tuples, lists, dicts and dataclass fields (a TokenPatches, a Trajectory)."""
    seen: dict[int, int] = {}

    def walk(x) -> None:
        if isinstance(x, Tensor):
            storage = x.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
        elif isinstance(x, (tuple, list)):
            for item in x:
                walk(item)
        elif isinstance(x, dict):
            for item in x.values():
                walk(item)
        elif is_dataclass(x) and not isinstance(x, type):
            for f in fields(x):
                walk(getattr(x, f.name))

    walk(value)
    return sum(seen.values())


class ByteCappedCache(OrderedDict):
    """A least-recently-used cache capped in bytes of tensor memory (:func:`held_bytes` of each entry).

    ``total_bytes`` never exceeds ``cap_bytes``: older entries are evicted first, and an entry
    larger than the whole cap is returned but not kept.
    """

    def __init__(self, cap_bytes: int):
        super().__init__()
        if int(cap_bytes) < 0:
            raise ValueError(f"cache_bytes must be >= 0, got {cap_bytes}")
        self.cap_bytes = int(cap_bytes)
        self.total_bytes = 0
        self._sizes: dict = {}

    def get_or(self, key, make):
        if key in self:
            self.move_to_end(key)
            return self[key], False
        value = make()
        size = held_bytes(value)
        if size <= self.cap_bytes:
            while self and self.total_bytes + size > self.cap_bytes:
                old, _ = self.popitem(last=False)
                self.total_bytes -= self._sizes.pop(old)
            self[key] = value
            self._sizes[key] = size
            self.total_bytes += size
        return value, True

    def clear(self) -> None:
        super().clear()
        self._sizes.clear()
        self.total_bytes = 0


Superseded = ForwardAbandoned  # a newer request arrived while a computation ran: it was abandoned (nothing cached)


def abandoned_when(model, stale: Callable[[], bool] | None):
    """Within the block, a forward of ``model`` raises :class:`Superseded` at the next block
    boundary once ``stale()`` is true (a keystroke never waits behind a stale forward)."""
    family = block_family(model)
    return abandon_forward(model, stale, [family.resid_pre(layer) for layer in range(model.cfg.n_layers)])


def _common_prefix(a: Tensor, b: Tensor) -> int:
    m = min(a.numel(), b.numel())
    diff = torch.nonzero(a[:m] != b[:m])
    return int(diff[0]) if len(diff) else m


class PromptAnalyzer:
    """The dashboard's computations for one model, with one cache keyed by token ids and capped in bytes.

    ``cache_bytes`` caps the tensor memory the cache holds (patches, trajectories, attention
    patterns together; default :data:`DEFAULT_CACHE_BYTES`, 512 MiB): least recently used
    entries go first, so memory stays flat however long the session types.
    """

    def __init__(self, model, max_tokens: int | None = DEFAULT_MAX_TOKENS, cache_bytes: int = DEFAULT_CACHE_BYTES):
        check_model(model)
        self.model = model
        self.name = model.cfg.model_name
        self.n_ctx = context_limit(model)
        self.limit = self.n_ctx if max_tokens is None else min(self.n_ctx, int(max_tokens))
        # the figures need no logits; the predictions put the last row through the unembedding afterwards
        self.session = PatchSession(model, logits="lazy")
        self.cache = ByteCappedCache(cache_bytes)
        self._last_attention: dict[int, tuple[Tensor, Tensor]] = {}  # layer -> (ids, pattern), the newest
        self.last_patch_stats = ""

    @property
    def n_layers(self) -> int:
        return int(self.model.cfg.n_layers)

    @property
    def n_heads(self) -> int:
        return int(self.model.cfg.n_heads)

    def encode(self, text: str) -> EncodedPrompt:
        """Token ids of ``text`` cut to the limit, tokenised and checked once per keystroke (every computation below
        takes these ids as they are); ``PromptError`` if there is nothing to analyse."""
        ids = tokenize(self.model, text)
        return EncodedPrompt(ids=encode_prompt(self.model, ids[: self.limit]), n_typed=int(ids.numel()),
                             limit=self.limit)

    def patches(self, prompt: EncodedPrompt) -> tuple[TokenPatches, bool]:
        """Token patches of the prompt and whether anything was recomputed."""
        def make():
            result = self.session.update(prompt.ids)
            stats = self.session.last_stats
            self.last_patch_stats = f"{stats.recomputed} of {stats.n_positions} positions (PatchSession)"
            return result

        patches, fresh = self.cache.get_or(("patches", prompt.key), make)
        if not fresh:
            self.last_patch_stats = "cached"
        return patches, fresh

    def coarse_steps(self, prompt: EncodedPrompt, query: int) -> tuple[int, ...] | None:
        """The prefix lengths of the trajectory's first, coarse drawing (:func:`log_spaced_steps`), or None when
        they would be nearly all of them (a short context: the full trajectory is drawn at once)."""
        first_context = int(bos_id(self.model) is not None and int(prompt.ids[0]) == bos_id(self.model))
        n = query - first_context
        if n < 1:
            return None
        steps = log_spaced_steps(n, COARSE_POINTS)
        return steps if 2 * len(steps) <= n + 1 else None

    def has_trajectory(self, prompt: EncodedPrompt, query: int, order: str = "prefix",
                       layers: tuple[int, ...] | None = None) -> bool:
        """Whether the full trajectory is in the cache already."""
        return ("trajectory", tuple(prompt.ids[: query + 1].tolist()), order, layers, None) in self.cache

    def trajectory(self, prompt: EncodedPrompt, query: int, order: str = "prefix",
                   layers: tuple[int, ...] | None = None,
                   stale: Callable[[], bool] | None = None,
                   steps: tuple[int, ...] | None = None, readout: bool = False) -> tuple[Trajectory | str, bool]:
        """``icl_lens.trajectory`` of ``query`` in ``order`` ("prefix" or the paper's "absorb") for
        ``layers`` (None: all), or a message saying why there is none.

        Only what is shown is computed: the tokens up to the query (a pinned query keeps its
        trajectory while text is typed after it), the layers asked for (the forward stops after
        the last), ``R δ`` instead of the d_mlp-sized output factors (``compact=True``: the same
        norms, cosines and fits), and the prompt prefix's keys and values come from the
        PatchSession when it holds them. ``stale()`` true aborts the forward with :class:`Superseded`.
        ``steps``: the coarse trajectory at these prefix lengths only (:meth:`coarse_steps`), compact too:
        phase 1's norms built ``R`` already, and ``R δ`` costs d_model floats per step where ``W δ`` costs two
        d_mlp-sized products (a fifth of the coarse drawing on Gemma 3 270M at 64 tokens). The full trajectory
        (``steps=None``) of a prompt whose coarse one is cached computes only the other steps and joins them
        (:meth:`~icl_lens.dynamics._trajectory.Trajectory.joined`).
        ``readout``: a trajectory computed here in prefix order with step 0 also keeps the step-0 copy's input
        to the unembedding (``Trajectory.kept_only_hidden``): the predictions' unpatched kept-only row, for the
        last layer's MLP of the copies instead of a forward of its own. A cached trajectory is returned as it is.
        """
        ids = prompt.ids[: query + 1]
        key = ("trajectory", tuple(ids.tolist()), order, layers)
        drawn = None if steps is not None else self.coarse_steps(prompt, query)
        coarse = None if drawn is None else self.cache.get(key + (drawn,))
        coarse = coarse if isinstance(coarse, Trajectory) else None  # not cached, or a no-context message

        def make():
            todo = steps
            if coarse is not None:  # refining: only the steps the coarse drawing lacks
                held = set(coarse.step_lengths)
                todo = tuple(i for i in range(coarse.n_context + 1) if i not in held)
            try:
                with abandoned_when(self.model, stale):
                    part = trajectory(self.model, ids, query=query, order=order, layers=layers, session=self.session,
                                      compact=True, steps=todo,
                                      readout=readout and order == "prefix" and (todo is None or todo[:1] == (0,)))
            except NoContextError as exc:
                return str(exc)
            return part if coarse is None else coarse.joined(part)
        return self.cache.get_or(key + (steps,), make)

    def attribution(self, prompt: EncodedPrompt, query: int,
                    stale: Callable[[], bool] | None = None) -> tuple[PatchAttribution, bool]:
        """``icl_lens.patch_attribution`` of ``query`` at every layer: the query token alone runs, over the
        PatchSession's keys and values of the tokens before it. ``stale()`` true aborts with :class:`Superseded`."""
        ids = prompt.ids[: query + 1]

        def make():
            with abandoned_when(self.model, stale):
                return patch_attribution(self.model, ids, query, session=self.session)
        return self.cache.get_or(("attribution", tuple(ids.tolist())), make)

    def writes(self, attribution: PatchAttribution, layer: int, k: int) -> tuple[PatchWrites, bool]:
        """What the patch and the correction of ``attribution``'s query write at ``layer`` (top ``k`` tokens)."""
        key = ("writes", tuple(attribution.token_ids[: attribution.position + 1].tolist()), layer, k)
        return self.cache.get_or(key, lambda: attribution.writes(self.model, layers=layer, k=k))

    def attention(self, prompt: EncodedPrompt, layer: int,
                  stale: Callable[[], bool] | None = None) -> tuple[Float[Tensor, "head query key"], bool]:
        """Attention pattern of every head of ``layer``. Rows of the longest token prefix shared with
        the layer's previous pattern are kept (attention is causal); the others are computed from
        the PatchSession's cached keys, for the new positions only."""
        def make():
            ids = prompt.ids
            old = self._last_attention.get(layer)
            p = 0 if old is None else min(_common_prefix(old[0], ids), ids.numel() - 1)
            past = self.session.prefix_cache(ids, p) if p > 0 else None
            with abandoned_when(self.model, stale):
                if past is None:
                    pattern = attention_pattern(self.model, ids, layer)
                else:
                    rows = attention_pattern(self.model, ids, layer, past=past[0])
                    top = torch.nn.functional.pad(old[1][:, :p, :p], (0, ids.numel() - p))
                    pattern = torch.cat([top, rows], dim=1)
            self._last_attention[layer] = (ids, pattern)
            return pattern
        return self.cache.get_or(("attention", prompt.key, layer), make)


def spike_flags(patches: TokenPatches, threshold: float) -> SpikeFlags:
    """``icl_lens.spike_scores`` of the patches (default window and statistic) at the chosen threshold."""
    return spike_scores(patches, threshold=threshold)


def default_threshold(model_name: str) -> float:
    """The model's calibrated flag threshold for :func:`spike_flags`' statistic and window, else 3.5."""
    return spike_threshold(model_name).value


SPIKE_MEANING = ("A spike mark means this token's patch norm jumps above the tokens just before it (the context "
                 "changes the model's weights unusually much there); a mark alone does not say the answer is wrong.")


def threshold_note(model_name: str) -> str:
    """Where :func:`default_threshold` comes from, in words (calibrated for this model, or the 3.5 fallback),
    and, where the model has a shipped wrong-answer detector, its one line: what the flag is computed from and
    what token patches add on unseen kinds, with the numbers. A flag that reads no token patch (−log p, the hidden
    state, sampling agreement) leaves the patch norms and spike marks on screen as exploration."""
    note = f"{SPIKE_MEANING} Default flag threshold {spike_threshold(model_name).describe()}"
    detector = spike_detector(model_name)
    if detector is None:
        return note
    if not detector.reads_patches:
        return (f"Wrong-answer {detector.describe()}. Patch norms and spike marks are exploration, not the error "
                f"flag. ({note})")
    return f"Wrong-answer {detector.describe()}. ({note})"


def alignment_matrix(patches: TokenPatches, layer: int) -> Float[Tensor, "pos pos"]:
    """Token × token cosine of the token patches of model layer ``layer`` (factored, never dense)."""
    return gram_cosine(patches.u_coordinates(layer), patches.v[patches.layer_row(layer)])


def timed(fn, *args, **kwargs):
    """``(fn(*args, **kwargs), seconds)``."""
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - start
