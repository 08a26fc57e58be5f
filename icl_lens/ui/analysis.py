"""What the dashboard computes for a prompt, kept apart from how it is drawn.

``PromptAnalyzer`` wraps one model and answers the dashboard's questions with the
library's results (never its own math): token patches of every layer × position
(``PatchSession``: only positions after the common token prefix with the previous
prompt are recomputed, docs/design.md §3), spike flags, the implicit trajectory of one query
(Dherin et al. 2025, arXiv 2507.16003) and one layer's attention pattern. Results are
cached by token ids, so moving a slider recomputes only what that slider shows.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

from jaxtyping import Float, Int
from torch import Tensor

from icl_lens.core.factored import gram_cosine
from icl_lens.core.patch_set import TokenPatches
from icl_lens.core.spike_scores import SpikeFlags, spike_scores
from icl_lens.dynamics.trajectory import Trajectory
from icl_lens.model.attention import attention_pattern
from icl_lens.model.incremental import PatchSession
from icl_lens.model.model_check import check_model
from icl_lens.model.prompts import PromptError, context_limit
from icl_lens.model.spike_thresholds import spike_threshold
from icl_lens.dynamics.trajectory_capture import NoContextError, trajectory

DEFAULT_MAX_TOKENS = 1024


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


class _Cache(OrderedDict):
    """A tiny LRU cache."""

    def __init__(self, size: int):
        super().__init__()
        self.size = size

    def get_or(self, key, make):
        if key in self:
            self.move_to_end(key)
            return self[key], False
        value = make()
        self[key] = value
        while len(self) > self.size:
            self.popitem(last=False)
        return value, True


class PromptAnalyzer:
    """The dashboard's computations for one model, with caches keyed by token ids."""

    def __init__(self, model, max_tokens: int | None = DEFAULT_MAX_TOKENS):
        check_model(model)
        self.model = model
        self.name = model.cfg.model_name
        self.n_ctx = context_limit(model)
        self.limit = self.n_ctx if max_tokens is None else min(self.n_ctx, int(max_tokens))
        self.session = PatchSession(model, logits=False)  # the dashboard needs no logits
        self._patches = _Cache(4)
        self._trajectories = _Cache(8)
        self._attention = _Cache(8)
        self.last_patch_stats = ""

    @property
    def n_layers(self) -> int:
        return int(self.model.cfg.n_layers)

    @property
    def n_heads(self) -> int:
        return int(self.model.cfg.n_heads)

    def encode(self, text: str) -> EncodedPrompt:
        """Token ids of ``text`` cut to the limit; ``PromptError`` if there is nothing to analyse."""
        if not text or not text.strip():
            raise PromptError("The prompt is empty (or only whitespace); type some text to analyse.")
        ids = self.model.to_tokens(text, truncate=False)[0]
        return EncodedPrompt(ids=ids[: self.limit], n_typed=int(ids.numel()), limit=self.limit)

    def patches(self, prompt: EncodedPrompt) -> tuple[TokenPatches, bool]:
        """Token patches of the prompt and whether anything was recomputed."""
        def make():
            result = self.session.update(prompt.ids)
            stats = self.session.last_stats
            self.last_patch_stats = f"{stats.recomputed} of {stats.n_positions} positions (PatchSession)"
            return result

        patches, fresh = self._patches.get_or(prompt.key, make)
        if not fresh:
            self.last_patch_stats = "cached"
        return patches, fresh

    def trajectory(self, prompt: EncodedPrompt, query: int, order: str = "prefix") -> tuple[Trajectory | str, bool]:
        """``icl_lens.trajectory`` of ``query`` in ``order`` ("prefix" or the paper's "absorb"), or a
        message saying why there is none."""
        def make():
            try:
                return trajectory(self.model, prompt.ids, query=query, order=order)
            except NoContextError as exc:
                return str(exc)
        return self._trajectories.get_or((prompt.key, query, order), make)

    def attention(self, prompt: EncodedPrompt, layer: int) -> tuple[Float[Tensor, "head query key"], bool]:
        return self._attention.get_or((prompt.key, layer), lambda: attention_pattern(self.model, prompt.ids, layer))


def spike_flags(patches: TokenPatches, threshold: float) -> SpikeFlags:
    """``icl_lens.spike_scores`` of the patches (default window and statistic) at the chosen threshold."""
    return spike_scores(patches, threshold=threshold)


def default_threshold(model_name: str) -> float:
    """The model's calibrated flag threshold for :func:`spike_flags`' statistic and window, else 3.5."""
    return spike_threshold(model_name).value


def threshold_note(model_name: str) -> str:
    """Where :func:`default_threshold` comes from, in words: calibrated for this model, or the 3.5 fallback."""
    return f"default flag threshold {spike_threshold(model_name).describe()}"


def alignment_matrix(patches: TokenPatches, layer: int) -> Float[Tensor, "pos pos"]:
    """Token × token cosine of the token patches of ``layer`` (factored, never dense)."""
    return gram_cosine(patches.u_coordinates(layer), patches.v[layer])


def timed(fn, *args, **kwargs):
    """``(fn(*args, **kwargs), seconds)``."""
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - start
